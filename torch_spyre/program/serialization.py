"""The program file format (JSON): encoding, and decoding that checks the type of every field, so a
corrupt file raises :class:`ProgramError` naming the core, the instruction and the field, never a
TypeError later."""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields
from typing import Any, Union

from .errors import ProgramError
from .instructions import (
    INSTRUCTION_TYPES,
    Barrier,
    DmaGather,
    DmaLoad,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Reduce,
    RingRecv,
    RingSend,
    Signal,
    Wait,
)
from .operands import Addr, DmaPattern, Operand, Scalar, SpTensor

FORMAT_VERSION = 1


def encode_program(program: Any) -> dict[str, Any]:
    """A :class:`~torch_spyre.program.Program` as plain JSON data."""
    return {
        "format": "spyre-program",
        "version": FORMAT_VERSION,
        "name": program.name,
        "operands": [asdict(o) for o in program.operands],
        "cores": {str(c): [_encode(i) for i in ins] for c, ins in sorted(program.cores.items())},
        "metadata": program.metadata,
    }


def decode_program(data: Any) -> tuple[str, list[Operand], dict[int, list[Instruction]], dict[str, Any]]:
    """The fields of a program (name, operands, cores, metadata) from JSON data, every one checked."""
    if not isinstance(data, dict) or data.get("format") != "spyre-program":
        raise ProgramError("not a Spyre program (missing 'format': 'spyre-program')")
    if data.get("version") != FORMAT_VERSION:
        raise ProgramError(f"unsupported program format version {data.get('version')!r}; this build reads {FORMAT_VERSION}")
    for key in ("name", "operands", "cores"):
        if key not in data:
            raise ProgramError(f"malformed program: missing field {key!r}")
    name = _check_field(data["name"], "str", "name")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ProgramError(f"malformed program: field 'metadata' must be an object, got {_show(metadata)}")
    if not isinstance(data["operands"], list):
        raise ProgramError(f"malformed program: field 'operands' must be a list, got {_show(data['operands'])}")
    operands = [_decode_operand(k, o) for k, o in enumerate(data["operands"])]
    if not isinstance(data["cores"], dict):
        raise ProgramError(f"malformed program: field 'cores' must be an object of core id -> instructions, "
                           f"got {_show(data['cores'])}")
    cores: dict[int, list[Instruction]] = {}
    for c, ins in data["cores"].items():
        core = _core_id(c)
        if core in cores:
            raise ProgramError(f"malformed program: core {core} is given twice")
        if not isinstance(ins, list):
            raise ProgramError(f"malformed program: the instructions of core {core} must be a list, got {_show(ins)}",
                               core)
        cores[core] = []
        for idx, d in enumerate(ins):
            try:
                cores[core].append(_decode(d))
            except ProgramError as e:
                # Say where in the file the bad instruction is.
                raise ProgramError(str(e), core, idx) from None
    return name, operands, cores, dict(metadata)


def _encode(value: Any) -> Any:
    if isinstance(value, Instruction):
        out = {"instr": value.OP}
        for f in fields(value):
            out[f.name] = _encode(getattr(value, f.name))
        return out
    if isinstance(value, (Addr, SpTensor, Scalar, DmaPattern)):
        out = {"kind": type(value).__name__}
        for f in fields(value):
            out[f.name] = _encode(getattr(value, f.name))
        return out
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


_VALUE_TYPES = {cls.__name__: cls for cls in (Addr, SpTensor, Scalar, DmaPattern)}

# The type of every field of every record a program file holds. A spec is "int" (an int, not a bool),
# "str", "bool", "number" (an int or a float, not a bool), "ints" (a list of ints), ("opt", spec)
# (the spec or null), ("obj", kind, ...) (an object of one of those value kinds), ("objs", kind, ...)
# (a list of such objects).
_Spec = Union[str, tuple]
_OBJ_SPECS: dict[type, dict[str, _Spec]] = {
    Addr: {"operand": "str", "offset": "int"},
    SpTensor: {"offset": "int", "dtype": "str", "shape": "ints", "strides": ("opt", "ints")},
    Scalar: {"value": "number"},
    DmaPattern: {"shape": "ints", "dram_strides": "ints", "sp_strides": "ints"},
    DmaLoad: {"src": ("obj", "Addr"), "sp_offset": "int", "pattern": ("obj", "DmaPattern")},
    DmaStore: {"dst": ("obj", "Addr"), "sp_offset": "int", "pattern": ("obj", "DmaPattern")},
    DmaGather: {"src": ("obj", "Addr"), "index": ("obj", "SpTensor"), "row_stride": "int", "row_sticks": "int",
                "sp_offset": "int", "num_rows": "int"},
    MatMul: {"out": ("obj", "SpTensor"), "a": ("obj", "SpTensor"), "b": ("obj", "SpTensor"), "accumulate": "bool"},
    Elementwise: {"op": "str", "out": ("obj", "SpTensor"), "inputs": ("objs", "SpTensor", "Scalar")},
    Reduce: {"op": "str", "out": ("obj", "SpTensor"), "inp": ("obj", "SpTensor"), "axis": "int", "accumulate": "bool"},
    RingSend: {"dst_core": "int", "src_offset": "int", "dst_offset": "int", "nbytes": "int", "tag": "int",
               "network": "str"},
    RingRecv: {"src_core": "int", "tag": "int"},
    Barrier: {"tag": "int", "cores": ("opt", "ints")},
    Signal: {"dst_core": "int", "tag": "int"},
    Wait: {"src_core": "int", "tag": "int"},
    Operand: {"name": "str", "nbytes": "int", "access": "str", "device_dtype": ("opt", "str"),
              "host_shape": ("opt", "ints"), "stick_dim": ("opt", "int")},
}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(spec: _Spec) -> str:
    if isinstance(spec, tuple):
        if spec[0] == "opt":
            return f"{_describe(spec[1])} or null"
        kinds = " or ".join(spec[1:])
        return f"a {kinds} object" if spec[0] == "obj" else f"a list of {kinds} objects"
    return {"int": "an int", "str": "a string", "bool": "a bool (true or false)", "number": "a number",
            "ints": "a list of ints"}[spec]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_field(value: Any, spec: _Spec, path: str) -> Any:
    """``value`` decoded according to ``spec``; ProgramError naming ``path`` if it does not fit."""
    def bad() -> ProgramError:
        return ProgramError(f"field '{path}' must be {_describe(spec)}, got {_show(value)}")

    if isinstance(spec, tuple):
        if spec[0] == "opt":
            if value is None:
                return None
            if isinstance(spec[1], str):  # a plain type: the message names both alternatives
                try:
                    return _check_field(value, spec[1], path)
                except ProgramError:
                    raise bad() from None
            return _check_field(value, spec[1], path)
        if spec[0] == "obj":
            return _decode_object(value, spec[1:], path)
        if not isinstance(value, list):
            raise bad()
        return tuple(_decode_object(v, spec[1:], f"{path}[{k}]") for k, v in enumerate(value))
    if spec == "int":
        ok = _is_int(value)
    elif spec == "str":
        ok = isinstance(value, str)
    elif spec == "bool":
        ok = isinstance(value, bool)
    elif spec == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:  # ints
        ok = isinstance(value, list) and all(_is_int(v) for v in value)
        value = tuple(value) if ok else value
    if not ok:
        raise bad()
    return value


def _fields_of(cls: type, record: dict[str, Any], skip: str | None, path: str, what: str) -> dict[str, Any]:
    """The constructor arguments of ``cls`` from ``record``: every field typed, none missing, none extra."""
    specs = _OBJ_SPECS[cls]
    prefix = f"{path}." if path else ""
    unknown = [k for k in record if k != skip and k not in specs]
    if unknown:
        raise ProgramError(f"cannot decode {what}: unknown field {unknown[0]!r}{' in ' + repr(path) if path else ''}; "
                           f"{cls.__name__} has {', '.join(specs)}")
    defaults = {f.name for f in fields(cls) if f.default is not MISSING}
    missing = [k for k in specs if k not in record and k not in defaults]
    if missing:
        raise ProgramError(f"cannot decode {what}: missing field {prefix}{missing[0]!r} of {cls.__name__}")
    return {k: _check_field(v, specs[k], prefix + k) for k, v in record.items() if k != skip}


def _decode_object(value: Any, kinds: tuple[str, ...], path: str) -> Any:
    if not isinstance(value, dict):
        raise ProgramError(f"field '{path}' must be {_describe(('obj', *kinds))}, got {_show(value)}")
    kind = value.get("kind")
    if kind not in kinds:
        raise ProgramError(f"unknown value kind {_show(kind)} in field '{path}'; expected {' or '.join(kinds)}")
    cls = _VALUE_TYPES[kind]
    return cls(**_fields_of(cls, value, "kind", path, "instruction"))


def _decode(d: Any) -> Instruction:
    if not isinstance(d, dict) or not isinstance(d.get("instr"), str) or d["instr"] not in INSTRUCTION_TYPES:
        raise ProgramError(f"unknown instruction {_show(d.get('instr') if isinstance(d, dict) else d)}; "
                           f"known: {', '.join(INSTRUCTION_TYPES)}")
    cls = INSTRUCTION_TYPES[d["instr"]]
    return cls(**_fields_of(cls, d, "instr", "", "instruction"))


def _decode_operand(k: int, o: Any) -> Operand:
    try:
        if not isinstance(o, dict):
            raise ProgramError(f"must be an object, got {_show(o)}")
        return Operand(**_fields_of(Operand, o, None, "", "operand"))
    except ProgramError as e:
        raise ProgramError(f"operand {k}: {e}") from None


def _core_id(key: Any) -> int:
    """A core id as the file has it: the decimal string of a non-negative int."""
    if not isinstance(key, str) or not key.isdecimal() or not key.isascii():
        raise ProgramError(f"malformed program: core id {_show(key)} is not a non-negative integer")
    return int(key)
