"""Reductions: accumulators initialised to the op's identity and updated by one ``Reduce`` per reduced
view axis (fp32 for floating values, int64 for integers), constants folded into them in place, and the
core's iota of reduction positions that argmax/argmin compare against."""

from __future__ import annotations

import math

import numpy as np

from ....program import Elementwise, Reduce, Scalar, row_major_strides
from .analysis import Box, Chunk
from .schedule import Step
from .sym import Sym, SymInstr, dense, strided
from .values import REDUCE_IDENTITY, Value, acc_dtype, itemsize


class Reducer:
    """The reduction half of :class:`~.generator.PointwiseGenerator`'s emission (a mixin)."""

    # --- reduction positions (argmax/argmin) -----------------------------------------------------------
    def _iota_dtype(self) -> str:
        return next(v.sp_dtype for v in self.dag.values if v.op == "rindex")

    def _iota_view(self, s: Step, box: Box) -> Sym:
        """The linear reduction position of every element of a box: a view of the core's iota, which
        holds the positions of the current reduction chunk (broadcast over the x dims)."""
        nx = len(s.chunk.xs)
        rstr = row_major_strides(self.spec.r_sizes)
        rel = sum(o * st for o, st in zip(box.origin[nx:], rstr))
        return strided("iota", self._iota_dtype(), [0] * nx + list(rstr), rel, box)

    def _ensure_iota(self, ch: Chunk, out: list[SymInstr]) -> None:
        """Make the core's iota hold the positions of chunk ``ch``: built once per core by doubling
        (0, then [0, k) + k for k = 1, 2, 4, ...: log2(n) instructions, n element-ops), then shifted
        by one add when a chunk starts at another position."""
        dt, n = self._iota_dtype(), self._iota_span
        first = sum(o * st for o, st in zip(ch.ro, row_major_strides(self.spec.r_sizes)))
        isz = itemsize(dt)
        run = lambda k, m: Sym("iota", k * isz, dt, (m,), (1,))  # noqa: E731
        if self._iota_base is None:
            self._fill_iota("iota", dt, 0, n, out)
            self._iota_base = 0
        if first != self._iota_base:
            self._add(out, Elementwise, op="add", out=run(0, n), inputs=(run(0, n), Scalar(first - self._iota_base)))
            self._iota_base = first


    # --- reductions -----------------------------------------------------------------------------------
    def _emit_reduction(self, v: Value, s: Step, bxs: list[Box], out: list[SymInstr]) -> None:
        ch = s.chunk
        nx, nr = len(ch.xs), len(ch.rs)
        dt = acc_dtype(v)
        if all(o == 0 for o in ch.ro):  # first chunk of this pass: the identity
            full_acc = Box(tuple(0 for _ in ch.xs), tuple(ch.xs), {}, {}, {})
            ident = REDUCE_IDENTITY[v.attrs["reduction"]]
            if dt != "float32" and math.isinf(ident):
                ident = -(1 << 62) if ident < 0 else (1 << 62)
            self._add(out, Elementwise, op="copy", out=dense(f"v{v.gid}", dt, tuple(ch.xs), full_acc),
                      inputs=(Scalar(ident),))
        for box in bxs:
            src = self.view(v.args[0], s, box)
            shape, axes = box.refined
            acc = dense(f"v{v.gid}", dt, tuple(ch.xs) + (1,) * nr, box, range(nx, nx + nr))
            r_axes = [ax for d in range(nx, nx + nr) for ax in axes[d]]
            if isinstance(src, Scalar):  # a constant over this box (e.g. a masked-out region)
                self._reduce_constant(v, src, box, acc, r_axes, out)
                continue
            r_axes = [a for a in r_axes if shape[a] > 1] or r_axes[-1:]
            cur = src
            cur_shape = list(shape)
            for k, ax in enumerate(reversed(r_axes)):
                cur_shape[ax] = 1
                last = k == len(r_axes) - 1
                if last:
                    dst = _reduced(acc, tuple(cur_shape))
                    self._add(out, Reduce, op=v.attrs["reduction"], out=dst, inp=cur, axis=ax, accumulate=True)
                else:
                    tmp = Sym(f"t{v.gid}.{k % 2}", 0, dt, tuple(cur_shape), row_major_strides(cur_shape))
                    self._add(out, Reduce, op=v.attrs["reduction"], out=tmp, inp=cur, axis=ax, accumulate=False)
                    cur = tmp

    def _reduce_constant(self, v: Value, c: Scalar, box: Box, acc: Sym, r_axes: list[int], out: list[SymInstr]) -> None:
        """Fold a constant over the box's reduced elements into the accumulator, in place."""
        shape, _ = box.refined
        n = math.prod(shape[a] for a in r_axes)
        view = _reduced(acc, tuple(1 if a in r_axes else shape[a] for a in range(len(shape))))
        kind = v.attrs["reduction"]
        if kind == "sum":
            op, value = "add", c.value * n
        elif kind == "prod":
            op, value = "mul", float(np.float32(c.value) ** np.float32(n))
        else:
            op, value = ("maximum" if kind == "max" else "minimum"), c.value
        self._add(out, Elementwise, op=op, out=view, inputs=(view, Scalar(value)))


def _reduced(acc: Sym, shape: tuple[int, ...]) -> Sym:
    """The accumulator ``acc`` seen with the reduced axes' sizes 1 (``shape``): those axes stride 0."""
    return Sym(acc.buf, acc.rel, acc.dtype, shape, tuple(0 if shape[i] == 1 else acc.strides[i] for i in range(len(shape))))
