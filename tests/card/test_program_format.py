"""The program format: lossless JSON round trips (in memory and through a file), the printed form, and
clear errors for corrupt or truncated program files."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


from benchmarks.programs import ALL_BUILDERS  # noqa: E402
from torch_spyre.program import (  # noqa: E402
    FORMAT_VERSION,
    Addr,
    Barrier,
    DmaGather,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    MatMul,
    Operand,
    Program,
    ProgramError,
    Reduce,
    RingRecv,
    RingSend,
    Scalar,
    Signal,
    SpTensor,
    Wait,
    format_instruction,
)


def every_instruction_program() -> Program:
    """One of each instruction, with every optional field set away from its default somewhere."""
    a = SpTensor(0, "dlfloat16", (8, 64))
    f = SpTensor(1024, "float32", (8, 64), (64, 1))
    col = SpTensor(4096, "float32", (8, 1))
    idx = SpTensor(8192, "int64", (4,))
    return Program(
        "every_instruction",
        [
            Operand("x", 1024, "in", "dlfloat16", (8, 64), 1),
            Operand("y", 1024, "out"),
            Operand("table", 128 * 16, "inout", "dlfloat16", (16, 64), 1),
        ],
        {
            0: [
                DmaLoad(Addr("x"), 0, DmaPattern.contiguous(8)),
                DmaGather(Addr("table", 128), idx, row_stride=128, row_sticks=1, sp_offset=16384, num_rows=15),
                MatMul(SpTensor(12288, "float32", (8, 8)), a, SpTensor(0, "dlfloat16", (64, 8), (1, 64)), accumulate=True),
                Elementwise("fma", f, (a, Scalar(2.0), Scalar(1))),
                Elementwise("where", f, (SpTensor(20000, "bool", (8, 64), (0, 1)), f, Scalar(float("-inf")))),
                Reduce("max", col, f, axis=1, accumulate=True),
                RingSend(1, 0, 0, 1024, tag=3, network="reduce"),
                Signal(1, tag=4),
                Barrier(5, cores=(1, 0)),
                Barrier(6),
                DmaStore(Addr("y", 0), 0, DmaPattern((2, 4), (512, 128), (128, 256))),
            ],
            1: [RingRecv(0, tag=3), Wait(0, tag=4), Barrier(5, cores=(0, 1)), Barrier(6)],
        },
        {"source": ["aten.exp", "aten.mm"], "note": "hand-made"},
    )


PROGRAMS = {"every_instruction": every_instruction_program, **{k: lambda k=k: ALL_BUILDERS[k]().program for k in ALL_BUILDERS}}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_json_round_trip_is_lossless(name):
    prog = PROGRAMS[name]()
    back = Program.from_json(prog.to_json())
    assert back == prog
    assert back.to_json() == prog.to_json()


def test_round_trip_through_a_file(tmp_path):
    prog = every_instruction_program()
    path = tmp_path / "p.spyre.json"
    prog.save(str(path))
    back = Program.load(str(path))
    assert back == prog
    # Types survive exactly: tuples stay tuples, ints stay ints, the int scalar stays an int.
    ins = back.cores[0]
    assert isinstance(ins[2].b.strides, tuple) and ins[2].accumulate is True
    assert ins[3].inputs[2] == Scalar(1) and isinstance(ins[3].inputs[2].value, int)
    assert isinstance(ins[3].inputs[1].value, float)
    assert ins[4].inputs[2].value == float("-inf")
    assert ins[8].cores == (0, 1) and ins[9].cores is None
    assert back.operands[0].host_shape == (8, 64) and back.metadata["note"] == "hand-made"


def test_file_is_readable_json_with_format_tag(tmp_path):
    path = tmp_path / "p.json"
    every_instruction_program().save(str(path))
    data = json.loads(path.read_text())
    assert data["format"] == "spyre-program" and data["version"] == FORMAT_VERSION
    assert data["cores"]["0"][0] == {
        "instr": "dma_load", "src": {"kind": "Addr", "operand": "x", "offset": 0}, "sp_offset": 0,
        "pattern": {"kind": "DmaPattern", "shape": [8], "dram_strides": [128], "sp_strides": [128]},
    }


def test_printed_form():
    text = str(every_instruction_program())
    lines = text.splitlines()
    assert lines[0] == "program every_instruction"
    assert lines[1] == "  operand %x: 1024 bytes, in, dlfloat16[8, 64] stick_dim=1"
    assert lines[2] == "  operand %y: 1024 bytes, out"
    assert "core 0:" in lines and "core 1:" in lines
    assert "     0  dma_load   sp[0x0] <- %x+0 sticks[8] dram[128] sp[128]" in lines
    expected_fragments = [
        "dma_gather sp[0x4000] <- %table+128[sp[0x2000]:int64[4]/[1]] row=1 sticks stride=128 rows=15",
        "matmul     sp[0x3000]:float32[8, 8]/[8, 1] += sp[0x0]:dlfloat16[8, 64]/[64, 1] @ sp[0x0]:dlfloat16[64, 8]/[1, 64]",
        "fma        sp[0x400]:float32[8, 64]/[64, 1] = sp[0x0]:dlfloat16[8, 64]/[64, 1], 2.0, 1",
        "reduce.max  sp[0x1000]:float32[8, 1]/[1, 1] += sp[0x400]:float32[8, 64]/[64, 1] axis=1",
        "ring_send  -> core 1 sp[0x0] <- sp[0x0] 1024 bytes tag=3 net=reduce",
        "signal     -> core 1 tag=4",
        "barrier    tag=5 cores=[0, 1]",
        "barrier    tag=6 cores=all",
        "dma_store  %y+0 <- sp[0x0] sticks[2, 4] dram[512, 128] sp[128, 256]",
        "ring_recv  <- core 0 tag=3",
        "wait       <- core 0 tag=4",
    ]
    for frag in expected_fragments:
        assert frag in text, frag


def test_format_instruction_for_every_type():
    for ins in every_instruction_program().cores[0]:
        line = format_instruction(ins)
        assert line and "\n" not in line and not line.startswith(type(ins).__name__ + "(")


# --- corrupt files -----------------------------------------------------------------------------------
def test_truncated_file(tmp_path):
    path = tmp_path / "p.json"
    text = every_instruction_program().to_json(indent=1)
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ProgramError, match="program file is not valid JSON"):
        Program.load(str(path))


def test_binary_garbage(tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProgramError, match="not valid JSON"):
        Program.load(str(path))


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda d: d.pop("format"), "not a Spyre program"),
        (lambda d: d.update(version=99), "unsupported program format version 99; this build reads 1"),
        (lambda d: d.pop("operands"), "malformed program: missing field 'operands'"),
        (lambda d: d["operands"][0].pop("nbytes"), "operand 0: cannot decode operand: missing field 'nbytes' of Operand"),
        (lambda d: d["cores"]["0"][3].update(instr="conv2d"), r"core 0, instruction 3: unknown instruction 'conv2d'; known: dma_load"),
        (lambda d: d["cores"]["0"][2].pop("a"), r"core 0, instruction 2: cannot decode instruction: .*'a'"),
        (lambda d: d["cores"]["0"][3]["inputs"][1].update(kind="Tensor"),
         r"core 0, instruction 3: unknown value kind 'Tensor' in field 'inputs\[1\]'; expected SpTensor or Scalar"),
        (lambda d: d["cores"]["0"][0].update(bogus=1), r"core 0, instruction 0: cannot decode instruction: .*bogus"),
        (lambda d: d.update(cores={"zero": []}), r"malformed program: core id 'zero' is not a non-negative integer"),
    ],
    ids=["no-format", "version", "no-operands", "operand-field", "unknown-instr", "missing-field", "value-kind",
         "extra-field", "core-id"],
)
def test_corrupt_program_data(mutate, pattern):
    data = every_instruction_program().to_dict()
    data = json.loads(json.dumps(data))
    mutate(data)
    with pytest.raises(ProgramError, match=pattern):
        Program.from_json(json.dumps(data))


def test_not_an_object():
    with pytest.raises(ProgramError, match="not a Spyre program"):
        Program.from_json("[1, 2, 3]")


def test_loaded_program_executes_like_the_original(tmp_path):
    import torch

    from benchmarks.programs import run_on_card
    from torch_spyre.card import Card, load_config

    built = ALL_BUILDERS["matmul_ksplit"]()
    path = tmp_path / "ksplit.json"
    built.program.save(str(path))
    card = Card(0, load_config(environ={}))
    inputs = built.make_inputs(3)
    original, _ = run_on_card(card, built.program, inputs)
    loaded, _ = run_on_card(card, Program.load(str(path)), inputs)
    assert torch.equal(original["c"], loaded["c"])


# --- every field is type-checked while decoding ---------------------------------------------------------
@pytest.mark.parametrize(
    "path, value, message",
    [
        (("0", 0, "sp_offset"), "x", "core 0, instruction 0: field 'sp_offset' must be an int, got 'x'"),
        (("0", 0, "sp_offset"), 1.5, "core 0, instruction 0: field 'sp_offset' must be an int, got 1.5"),
        (("0", 0, "sp_offset"), None, "core 0, instruction 0: field 'sp_offset' must be an int, got None"),
        (("0", 0, "sp_offset"), True, "core 0, instruction 0: field 'sp_offset' must be an int, got True"),
        (("0", 0, "src", "offset"), "0", "core 0, instruction 0: field 'src.offset' must be an int, got '0'"),
        (("0", 0, "src", "operand"), 3, "core 0, instruction 0: field 'src.operand' must be a string, got 3"),
        (("0", 0, "pattern", "shape"), [8, "x"],
         "core 0, instruction 0: field 'pattern.shape' must be a list of ints, got [8, 'x']"),
        (("0", 0, "pattern", "dram_strides"), 128,
         "core 0, instruction 0: field 'pattern.dram_strides' must be a list of ints, got 128"),
        (("0", 0, "pattern"), [8], "core 0, instruction 0: field 'pattern' must be a DmaPattern object, got [8]"),
        (("0", 2, "accumulate"), 1, "core 0, instruction 2: field 'accumulate' must be a bool (true or false), got 1"),
        (("0", 2, "a", "dtype"), None, "core 0, instruction 2: field 'a.dtype' must be a string, got None"),
        (("0", 2, "b", "strides"), [1, False],
         "core 0, instruction 2: field 'b.strides' must be a list of ints or null, got [1, False]"),
        (("0", 3, "inputs", 1, "value"), "2.0", "core 0, instruction 3: field 'inputs[1].value' must be a number, got '2.0'"),
        (("0", 3, "inputs", 1, "value"), True, "core 0, instruction 3: field 'inputs[1].value' must be a number, got True"),
        (("0", 3, "inputs"), {}, "core 0, instruction 3: field 'inputs' must be a list of SpTensor or Scalar objects, got {}"),
        (("0", 3, "op"), 7, "core 0, instruction 3: field 'op' must be a string, got 7"),
        (("0", 5, "axis"), 1.0, "core 0, instruction 5: field 'axis' must be an int, got 1.0"),
        (("0", 6, "tag"), "3", "core 0, instruction 6: field 'tag' must be an int, got '3'"),
        (("0", 6, "network"), None, "core 0, instruction 6: field 'network' must be a string, got None"),
        (("0", 8, "cores"), [0, "1"], "core 0, instruction 8: field 'cores' must be a list of ints or null, got [0, '1']"),
        (("1", 0, "src_core"), [0], "core 1, instruction 0: field 'src_core' must be an int, got [0]"),
        (("0", 1, "num_rows"), 15.0, "core 0, instruction 1: field 'num_rows' must be an int, got 15.0"),
    ],
)
def test_wrong_field_types_name_core_instruction_and_field(path, value, message):
    data = json.loads(every_instruction_program().to_json())
    target = data["cores"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ProgramError) as err:
        Program.from_json(json.dumps(data))
    assert str(err.value) == message


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["operands"][0].update(nbytes="1024"), "operand 0: field 'nbytes' must be an int, got '1024'"),
        (lambda d: d["operands"][0].update(host_shape=[8, None]),
         "operand 0: field 'host_shape' must be a list of ints or null, got [8, None]"),
        (lambda d: d["operands"].append(5), "operand 3: must be an object, got 5"),
        (lambda d: d.update(name=5), "field 'name' must be a string, got 5"),
        (lambda d: d.update(cores=[]), "malformed program: field 'cores' must be an object"),
        (lambda d: d["cores"].update({"2": {}}), "core 2: malformed program: the instructions of core 2 must be a list"),
        (lambda d: d["cores"].update({"-1": []}), "malformed program: core id '-1' is not a non-negative integer"),
        (lambda d: d.update(metadata=[1]), "malformed program: field 'metadata' must be an object, got [1]"),
    ],
)
def test_wrong_types_outside_instructions(mutate, message):
    data = json.loads(every_instruction_program().to_json())
    mutate(data)
    with pytest.raises(ProgramError) as err:
        Program.from_json(json.dumps(data))
    assert str(err.value).startswith(message)


# --- fuzz: single corrupted fields of real programs give ProgramError and nothing else -----------------
_FUZZ_PROGRAMS = ("elementwise", "row_reduce", "matmul_ksplit", "all_to_all", "softmax_scratchpad",
                  "minilm_attention", "minilm_ln1")
_SERIALIZED = {}


def _serialized(name: str) -> dict:
    if name not in _SERIALIZED:
        _SERIALIZED[name] = ALL_BUILDERS[name]().program.to_dict()
    return json.loads(json.dumps(_SERIALIZED[name]))


def _leaves(node, path=()):
    """Every place in the JSON tree a value sits: (path to its container, key)."""
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return
    for key, value in items:
        yield path, key
        yield from _leaves(value, path + (key,))


_WRONG_VALUES = st.one_of(
    st.sampled_from(["x", "", "dma_load", "SpTensor", "Addr", "dlfloat16", "float32", "add", "data", "reduce", "out"]),
    st.sampled_from([1.5, -0.0, float("inf"), float("nan"), None, True, False, [], {}, [1, "x"], [[1]], {"kind": "Addr"}]),
    st.integers(-(2 ** 70), 2 ** 70),
    st.sampled_from([0, -1, 1, 127, 128, -128, 2 ** 31, 2 ** 63, 2 ** 64 + 128]),
    st.lists(st.integers(-3, 2 ** 20), max_size=4),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(_FUZZ_PROGRAMS), pick=st.integers(0, 10 ** 9), value=_WRONG_VALUES,
       action=st.sampled_from(["replace", "replace", "replace", "delete"]))
def test_corrupted_field_gives_program_error_only(name, pick, value, action):
    from torch_spyre.card.config import CardConfig
    from torch_spyre.card.validate import validate

    data = _serialized(name)
    places = list(_leaves(data))
    path, key = places[pick % len(places)]
    container = data
    for k in path:
        container = container[k]
    if action == "delete":
        del container[key]
    else:
        container[key] = value
    try:
        text = json.dumps(data)
    except ValueError:
        return
    try:
        program = Program.from_json(text)
        validate(program, CardConfig())
    except ProgramError:
        pass
