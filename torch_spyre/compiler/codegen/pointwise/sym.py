"""Symbolic scratchpad tensors: instructions are emitted over named buffers (``ld<gid>.<parity>``,
``st<gid>``, ``v<gid>``, ``iota``, ``xiota``, ...) whose offsets the liveness plan fixes after emission."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

from ....program import Instruction, Scalar, SpTensor, row_major_strides
from ...kernel_ir import LoweringError
from .analysis import Box
from .values import itemsize


@dataclass(frozen=True)
class Sym:
    """A scratchpad tensor inside planned buffer ``buf`` (``rel`` bytes in)."""

    buf: str
    rel: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def end(self) -> int:
        """One past the last byte the view can touch (``SpTensor.byte_span``'s end)."""
        return self.rel + _span_end(self.dtype, self.shape, self.strides)

    def place(self, base: dict[str, int]) -> SpTensor:
        # The generator builds every Sym's shape and strides as tuples of Python ints (boxes' refined
        # shapes are, and strides derive from them): the checked constructor's normalisation is skipped.
        return SpTensor.exact(base[self.buf] + self.rel, self.dtype, self.shape, self.strides)


@dataclass
class SymInstr:
    cls: type
    args: dict[str, Any]
    tile_step: int  # position within its tile's schedule (liveness)

    def syms(self) -> list[Sym]:
        out = []
        for v in self.args.values():
            if isinstance(v, Sym):
                out.append(v)
            elif isinstance(v, tuple):
                out.extend(x for x in v if isinstance(x, Sym))
        return out

    def place(self, base: dict[str, int]) -> Instruction:
        args = {}
        for k, v in self.args.items():
            if type(v) is Sym:
                v = v.place(base) if k != "sp_offset" else base[v.buf] + v.rel
            elif type(v) is tuple and any(type(x) is Sym for x in v):
                v = tuple(x.place(base) if type(x) is Sym else x for x in v)
            args[k] = v
        return self.cls(**args)


@lru_cache(maxsize=1 << 16)
def _span_end(dt: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """``SpTensor(0, dt, shape, strides).byte_span()[1]``: the plan asks it of every operand of every
    instruction, and a program's views have few distinct shapes."""
    return SpTensor(0, dt, shape, strides).byte_span()[1]


def dense(buf: str, dt: str, tile_shape: tuple[int, ...], box: Box, bcast: Iterable[int] = ()) -> Sym:
    """View of a box inside a row-major buffer over ``tile_shape`` (dims in ``bcast`` broadcast)."""
    key = ("dense", tile_shape, tuple(bcast))
    found = box.memo.get(key)
    if found is None:
        strides = list(row_major_strides(tile_shape))
        for d in set(bcast):
            strides[d] = 0
        rel = sum(o * st for o, st in zip(box.origin, strides))
        found = box.memo[key] = (rel, _carried(strides, box))
    rel, (shape, strides) = found
    return Sym(buf, rel * itemsize(dt), dt, shape, strides)


def strided(buf: str, dt: str, strides: list[int], rel: int, box: Box) -> Sym:
    """View of a box in buffer ``buf``: element ``rel`` at the box's origin, ``strides`` per tile dim
    (elements), carried over to the box's refined (mixed-radix) axes."""
    shape, out = _carried(strides, box)
    return Sym(buf, rel * itemsize(dt), dt, shape, out)


def _carried(strides: list[int], box: Box) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The box's refined shape and ``strides`` (per tile dim) carried over to its refined axes: a pure
    function of the two, kept in the box's memo (emission asks for it per value of every box)."""
    key = ("carried", tuple(strides))
    found = box.memo.get(key)
    if found is None:
        shape, axes = box.refined
        out = [0] * len(shape)
        for d, ax in enumerate(axes):
            step = strides[d]
            for a in reversed(ax):  # innermost part first: mixed radix
                out[a] = step
                step *= shape[a]
        found = box.memo[key] = (shape, tuple(out))
    return found


def fit_input(x: Sym | Scalar, dst: Sym) -> Sym | Scalar:
    if isinstance(x, Scalar) or x.shape == dst.shape:
        return x
    raise LoweringError(f"internal: operand view {x.shape} does not match {dst.shape}")
