"""Spyre programs: per-core instruction streams over sticks. The contract between compiler and card.

A :class:`Program` declares its tensor operands by name (symbolic addresses) and gives each core a list
of instructions. Device memory is only touched by DMA instructions, in whole 128-byte sticks, at
``Addr(operand, byte offset)``; the runtime patches operand base addresses in at launch. Everything
else works on the core's scratchpad, addressed in bytes from 0.

Instruction families (see docs/program-format.md for the full reference):
- DMA:     ``DmaLoad``, ``DmaStore`` (strided stick patterns), ``DmaGather`` (rows picked by an index
           tensor held in scratchpad);
- compute: ``MatMul`` (PE arrays, fp32 accumulation), ``Elementwise`` (vector unit, incl.
           transcendentals and dtype casts), ``Reduce`` (vector unit);
- ring:    ``RingSend`` / ``RingRecv`` (scratchpad to scratchpad between cores, a token per transfer);
- sync:    ``Barrier`` (a group of cores), ``Signal`` / ``Wait`` (a token between two cores).

Programs are plain data: this module only builds, validates, serializes and prints them.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar, Iterator, Union

from .errors import SpyreError

STICK_BYTES = 128
FORMAT_VERSION = 1

# Element types a scratchpad tensor may have, and their sizes in bytes.
SP_DTYPES: dict[str, int] = {
    "dlfloat16": 2,
    "float32": 4,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

UNARY_OPS = frozenset(
    {
        "copy", "cast", "neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh",
        "sigmoid", "erf", "sin", "cos", "floor", "ceil", "round", "sign", "logical_not", "square",
        "gelu", "gelu_tanh", "silu",
    }
)
BINARY_OPS = frozenset(
    {
        "add", "sub", "mul", "div", "maximum", "minimum", "pow", "lt", "le", "gt", "ge", "eq", "ne",
        "logical_and", "logical_or", "remainder", "floordiv",
    }
)
TERNARY_OPS = frozenset({"where", "fma"})
# Ops the vector unit computes with its slower transcendental path (timing only).
TRANSCENDENTAL_OPS = frozenset(
    {"exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "sin", "cos", "pow", "div",
     "gelu", "gelu_tanh", "silu"}
)
REDUCE_OPS = frozenset({"sum", "max", "min", "prod"})


def row_major_strides(shape) -> tuple[int, ...]:
    """Element strides of a contiguous row-major array (torch's rule: a size-0 dim counts as 1)."""
    strides, acc = [], 1
    for s in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


class ProgramError(SpyreError, ValueError):
    """A malformed program. The message names the core and the instruction."""

    def __init__(self, message: str, core: int | None = None, index: int | None = None, instr: Any = None):
        self.core, self.index, self.instr = core, index, instr
        where = ""
        if core is not None:
            where = f"core {core}"
            if index is not None:
                where += f", instruction {index}"
                if instr is not None:
                    where += f" ({format_instruction(instr)})"
            where += ": "
        super().__init__(where + message)


# ---------------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Operand:
    """A tensor argument: ``nbytes`` of device memory bound at launch. ``access`` is in, out or inout."""

    name: str
    nbytes: int
    access: str = "in"
    # Optional description of the data (for printing and for launch-time checks).
    device_dtype: str | None = None
    host_shape: tuple[int, ...] | None = None
    stick_dim: int | None = None


@dataclass(frozen=True)
class Addr:
    """A symbolic device address: ``offset`` bytes into operand ``operand``."""

    operand: str
    offset: int = 0


@dataclass(frozen=True)
class SpTensor:
    """A strided view of scratchpad bytes: element (i0, i1, ...) sits at
    ``offset + itemsize * sum(i_d * strides[d])``. Stride 0 broadcasts."""

    offset: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None  # elements; None = row-major contiguous

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.strides is None:
            object.__setattr__(self, "strides", row_major_strides(self.shape))
        else:
            object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))

    @property
    def itemsize(self) -> int:
        return SP_DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def byte_span(self) -> tuple[int, int]:
        """[start, end) of the bytes the view can touch (conservative for strided views)."""
        if self.numel == 0:
            return self.offset, self.offset
        lo = hi = 0
        for s, st in zip(self.shape, self.strides):
            if st >= 0:
                hi += (s - 1) * st
            else:
                lo += (s - 1) * st
        return self.offset + lo * self.itemsize, self.offset + (hi + 1) * self.itemsize


@dataclass(frozen=True)
class Scalar:
    """An immediate value for an elementwise op."""

    value: float


@dataclass(frozen=True)
class DmaPattern:
    """Nested loops moving one 128-byte stick per iteration. ``dram_strides`` and ``sp_strides`` are
    in bytes, one per loop; a DRAM stride of 128 on the innermost loop is a contiguous burst."""

    shape: tuple[int, ...]
    dram_strides: tuple[int, ...]
    sp_strides: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("shape", "dram_strides", "sp_strides"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))

    @property
    def sticks(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.sticks * STICK_BYTES

    @staticmethod
    def contiguous(n_sticks: int) -> "DmaPattern":
        return DmaPattern((n_sticks,), (STICK_BYTES,), (STICK_BYTES,))

    def span(self, strides: tuple[int, ...]) -> tuple[int, int]:
        """[lo, hi) byte offsets reached relative to the base, for one side's strides."""
        if self.sticks == 0:
            return 0, 0
        lo = hi = 0
        for s, st in zip(self.shape, strides):
            if st >= 0:
                hi += (s - 1) * st
            else:
                lo += (s - 1) * st
        return lo, hi + STICK_BYTES


# ---------------------------------------------------------------------------------------------
# Instructions
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instruction:
    OP: ClassVar[str] = ""
    ENGINE: ClassVar[str] = ""  # "dma", "pe", "vector", "ring", "sync"


@dataclass(frozen=True)
class DmaLoad(Instruction):
    """Device memory -> scratchpad."""

    OP: ClassVar[str] = "dma_load"
    ENGINE: ClassVar[str] = "dma"
    src: Addr
    sp_offset: int
    pattern: DmaPattern


@dataclass(frozen=True)
class DmaStore(Instruction):
    """Scratchpad -> device memory."""

    OP: ClassVar[str] = "dma_store"
    ENGINE: ClassVar[str] = "dma"
    dst: Addr
    sp_offset: int
    pattern: DmaPattern


@dataclass(frozen=True)
class DmaGather(Instruction):
    """For each of the ``index.numel`` indices i held in scratchpad, load ``row_sticks`` contiguous
    sticks from ``src + i * row_stride`` (bytes) to ``sp_offset + n * row_sticks * 128``."""

    OP: ClassVar[str] = "dma_gather"
    ENGINE: ClassVar[str] = "dma"
    src: Addr
    index: SpTensor
    row_stride: int
    row_sticks: int
    sp_offset: int
    num_rows: int  # rows that exist at src: an index outside [0, num_rows) is an error


@dataclass(frozen=True)
class MatMul(Instruction):
    """out[M, N] (+)= a[M, K] @ b[K, N] on the PE arrays, accumulating in fp32; the result is rounded
    to out's dtype when written."""

    OP: ClassVar[str] = "matmul"
    ENGINE: ClassVar[str] = "pe"
    out: SpTensor
    a: SpTensor
    b: SpTensor
    accumulate: bool = False


@dataclass(frozen=True)
class Elementwise(Instruction):
    """out = op(*inputs) on the vector unit, computed in fp32 (integers in their own type) and rounded
    to out's dtype. Inputs broadcast through stride-0 views; ``cast`` converts dtype."""

    OP: ClassVar[str] = "elementwise"
    ENGINE: ClassVar[str] = "vector"
    op: str
    out: SpTensor
    inputs: tuple[Union[SpTensor, Scalar], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))


@dataclass(frozen=True)
class Reduce(Instruction):
    """out = op over ``axis`` of inp, accumulated in fp32; out has inp's shape with ``axis`` of size 1.
    With ``accumulate`` the result is combined with out's current value (same op)."""

    OP: ClassVar[str] = "reduce"
    ENGINE: ClassVar[str] = "vector"
    op: str
    out: SpTensor
    inp: SpTensor
    axis: int
    accumulate: bool = False


@dataclass(frozen=True)
class RingSend(Instruction):
    """Copy ``nbytes`` from this core's scratchpad to ``dst_core``'s scratchpad over the ring
    (``network`` "data" is the 128 B/cycle ring, "reduce" the 32 B/cycle reduction ring). The
    receiver's matching ``RingRecv(src_core=this core, tag)`` completes when the data has arrived."""

    OP: ClassVar[str] = "ring_send"
    ENGINE: ClassVar[str] = "ring"
    dst_core: int
    src_offset: int
    dst_offset: int
    nbytes: int
    tag: int
    network: str = "data"


@dataclass(frozen=True)
class RingRecv(Instruction):
    OP: ClassVar[str] = "ring_recv"
    ENGINE: ClassVar[str] = "ring"
    src_core: int
    tag: int


@dataclass(frozen=True)
class Barrier(Instruction):
    """Every core in ``cores`` (None: all cores that have instructions) waits here for the others."""

    OP: ClassVar[str] = "barrier"
    ENGINE: ClassVar[str] = "sync"
    tag: int
    cores: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.cores is not None:
            object.__setattr__(self, "cores", tuple(sorted(self.cores)))


@dataclass(frozen=True)
class Signal(Instruction):
    OP: ClassVar[str] = "signal"
    ENGINE: ClassVar[str] = "sync"
    dst_core: int
    tag: int


@dataclass(frozen=True)
class Wait(Instruction):
    OP: ClassVar[str] = "wait"
    ENGINE: ClassVar[str] = "sync"
    src_core: int
    tag: int


def dram_spans(instructions: "list[Instruction]") -> dict[str, tuple[int, int]]:
    """Per operand, the [lo, hi) byte range of device memory that strided DMA loads and stores reach:
    what one core addresses in a kernel (bounded by config.core_address_span_bytes)."""
    spans: dict[str, list[int]] = {}
    for i in instructions:
        if isinstance(i, (DmaLoad, DmaStore)):
            addr = i.src if isinstance(i, DmaLoad) else i.dst
            lo, hi = i.pattern.span(i.pattern.dram_strides)
            cur = spans.setdefault(addr.operand, [addr.offset + lo, addr.offset + hi])
            cur[0], cur[1] = min(cur[0], addr.offset + lo), max(cur[1], addr.offset + hi)
    return {name: (lo, hi) for name, (lo, hi) in spans.items()}


INSTRUCTION_TYPES: dict[str, type[Instruction]] = {
    cls.OP: cls for cls in (DmaLoad, DmaStore, DmaGather, MatMul, Elementwise, Reduce, RingSend, RingRecv, Barrier, Signal, Wait)
}


# ---------------------------------------------------------------------------------------------
# Program
# ---------------------------------------------------------------------------------------------
@dataclass
class Program:
    name: str
    operands: list[Operand]
    cores: dict[int, list[Instruction]]
    # Free-form provenance (source ATen ops, compiler decisions); carried through serialization.
    metadata: dict[str, Any] = field(default_factory=dict)

    def operand(self, name: str) -> Operand:
        for o in self.operands:
            if o.name == name:
                return o
        raise KeyError(name)

    def instructions(self) -> Iterator[tuple[int, int, Instruction]]:
        for core in sorted(self.cores):
            for i, ins in enumerate(self.cores[core]):
                yield core, i, ins

    # --- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "spyre-program",
            "version": FORMAT_VERSION,
            "name": self.name,
            "operands": [asdict(o) for o in self.operands],
            "cores": {str(c): [_encode(i) for i in ins] for c, ins in sorted(self.cores.items())},
            "metadata": self.metadata,
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Program":
        """Decode a program, checking the type of every field: a corrupt file raises :class:`ProgramError`
        naming the core, the instruction and the field, never a TypeError later."""
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
        return cls(name, operands, cores, dict(metadata))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Program":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProgramError(f"program file is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json(indent=1))

    @classmethod
    def load(cls, path: str) -> "Program":
        with open(path, "rb") as f:
            return cls.from_json(f.read())

    # --- printing -------------------------------------------------------------------------------
    def format(self) -> str:
        lines = [f"program {self.name}"]
        for o in self.operands:
            desc = f"  operand %{o.name}: {o.nbytes} bytes, {o.access}"
            if o.device_dtype:
                desc += f", {o.device_dtype}{list(o.host_shape or ())} stick_dim={o.stick_dim}"
            lines.append(desc)
        for core, ins in sorted(self.cores.items()):
            lines.append(f"core {core}:")
            for i, instr in enumerate(ins):
                lines.append(f"  {i:4d}  {format_instruction(instr)}")
        return "\n".join(lines)

    __str__ = format


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


def format_instruction(ins: Any) -> str:
    """One line a person can read, e.g. ``dma_load sp[0x0] <- %x+0 sticks(4,16) dram(2048,128) sp(2048,128)``."""
    if isinstance(ins, DmaLoad):
        return f"dma_load   sp[{ins.sp_offset:#x}] <- {_fmt_addr(ins.src)} {_fmt_pattern(ins.pattern)}"
    if isinstance(ins, DmaStore):
        return f"dma_store  {_fmt_addr(ins.dst)} <- sp[{ins.sp_offset:#x}] {_fmt_pattern(ins.pattern)}"
    if isinstance(ins, DmaGather):
        return (f"dma_gather sp[{ins.sp_offset:#x}] <- {_fmt_addr(ins.src)}[{_fmt_sp(ins.index)}] "
                f"row={ins.row_sticks} sticks stride={ins.row_stride} rows={ins.num_rows}")
    if isinstance(ins, MatMul):
        acc = " +=" if ins.accumulate else " ="
        return f"matmul     {_fmt_sp(ins.out)}{acc} {_fmt_sp(ins.a)} @ {_fmt_sp(ins.b)}"
    if isinstance(ins, Elementwise):
        args = ", ".join(_fmt_sp(a) if isinstance(a, SpTensor) else repr(a.value) for a in ins.inputs)
        return f"{ins.op:<10} {_fmt_sp(ins.out)} = {args}"
    if isinstance(ins, Reduce):
        acc = " +=" if ins.accumulate else " ="
        return f"reduce.{ins.op:<4} {_fmt_sp(ins.out)}{acc} {_fmt_sp(ins.inp)} axis={ins.axis}"
    if isinstance(ins, RingSend):
        return (f"ring_send  -> core {ins.dst_core} sp[{ins.dst_offset:#x}] <- sp[{ins.src_offset:#x}] "
                f"{ins.nbytes} bytes tag={ins.tag} net={ins.network}")
    if isinstance(ins, RingRecv):
        return f"ring_recv  <- core {ins.src_core} tag={ins.tag}"
    if isinstance(ins, Barrier):
        return f"barrier    tag={ins.tag} cores={'all' if ins.cores is None else list(ins.cores)}"
    if isinstance(ins, Signal):
        return f"signal     -> core {ins.dst_core} tag={ins.tag}"
    if isinstance(ins, Wait):
        return f"wait       <- core {ins.src_core} tag={ins.tag}"
    return repr(ins)


def _fmt_addr(a: Addr) -> str:
    return f"%{a.operand}+{a.offset}"


def _fmt_pattern(p: DmaPattern) -> str:
    return f"sticks{list(p.shape)} dram{list(p.dram_strides)} sp{list(p.sp_strides)}"


def _fmt_sp(t: SpTensor) -> str:
    return f"sp[{t.offset:#x}]:{t.dtype}{list(t.shape)}/{list(t.strides)}"
