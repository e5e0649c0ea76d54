"""Symbolic scratchpad tensors: instructions are emitted over named buffers (``ld<gid>.<parity>``,
``st<gid>``, ``v<gid>``, ``iota``, ...) whose offsets the liveness plan fixes after emission."""

from __future__ import annotations

from dataclasses import dataclass
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
        t = SpTensor(self.rel, self.dtype, self.shape, self.strides)
        return t.byte_span()[1]

    def place(self, base: dict[str, int]) -> SpTensor:
        return SpTensor(base[self.buf] + self.rel, self.dtype, self.shape, self.strides)


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
            if isinstance(v, Sym):
                v = v.place(base) if k != "sp_offset" else base[v.buf] + v.rel
            elif isinstance(v, tuple) and any(isinstance(x, Sym) for x in v):
                v = tuple(x.place(base) if isinstance(x, Sym) else x for x in v)
            args[k] = v
        return self.cls(**args)


def dense(buf: str, dt: str, tile_shape: tuple[int, ...], box: Box, bcast: Iterable[int] = ()) -> Sym:
    """View of a box inside a row-major buffer over ``tile_shape`` (dims in ``bcast`` broadcast)."""
    strides = list(row_major_strides(tile_shape))
    for d in set(bcast):
        strides[d] = 0
    return strided(buf, dt, strides, sum(o * st for o, st in zip(box.origin, strides)), box)


def strided(buf: str, dt: str, strides: list[int], rel: int, box: Box) -> Sym:
    """View of a box in buffer ``buf``: element ``rel`` at the box's origin, ``strides`` per tile dim
    (elements), carried over to the box's refined (mixed-radix) axes."""
    rel *= itemsize(dt)
    shape, axes = box.refined
    out = [0] * len(shape)
    for d, ax in enumerate(axes):
        step = strides[d]
        for a in reversed(ax):  # innermost part first: mixed radix
            out[a] = step
            step *= shape[a]
    return Sym(buf, rel, dt, shape, tuple(out))



def fit_input(x: Sym | Scalar, dst: Sym) -> Sym | Scalar:
    if isinstance(x, Scalar) or x.shape == dst.shape:
        return x
    raise LoweringError(f"internal: operand view {x.shape} does not match {dst.shape}")
