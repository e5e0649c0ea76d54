"""The PE arrays (MatMul, fp32 accumulation) and the vector unit (Elementwise, Reduce) on scratchpad
views; what each vector op computes is :mod:`torch_spyre.card.vector_ops`."""

from __future__ import annotations

import numpy as np

from ...program import BINARY_OPS, REDUCE_OPS, TERNARY_OPS, UNARY_OPS, Elementwise, MatMul, Reduce, Scalar, SpTensor
from .. import vector_ops
from .state import CoreState


class ComputeUnits:
    """Mixed into the execution; reads and writes through :class:`~.access.ScratchpadAccess`."""

    def _matmul(self, st: CoreState, ins: MatMul) -> bool:
        a = self._read(st, ins.a, "a")
        b = self._read(st, ins.b, "b")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or ins.out.shape != (a.shape[0], b.shape[1]):
            raise self._fail(st, f"matmul shapes do not agree: out{list(ins.out.shape)} = "
                                 f"a{list(a.shape)} @ b{list(b.shape)}")
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            # The PE arrays accumulate in fp32: an fp32 GEMM over the decoded values.
            result = np.matmul(a.astype(np.float32, copy=False), b.astype(np.float32, copy=False))
        else:
            result = np.matmul(a.astype(np.int64, copy=False), b.astype(np.int64, copy=False))
        if ins.accumulate:
            result = result + self._read(st, ins.out, "out (accumulate)")
        self._write(st, ins.out, result)
        return True

    def _elementwise(self, st: CoreState, ins: Elementwise) -> bool:
        op = ins.op
        arity = 1 if op in UNARY_OPS else 2 if op in BINARY_OPS else 3 if op in TERNARY_OPS else None
        if arity is None:
            raise self._fail(st, f"unknown elementwise op {op!r}")
        if len(ins.inputs) != arity:
            raise self._fail(st, f"{op} takes {arity} input(s), got {len(ins.inputs)}")
        if op == "copy" and all(isinstance(x, SpTensor) for x in ins.inputs) and ins.inputs[0].dtype == ins.out.dtype:
            # A copy moves bits (keeps NaN payloads, int64 exactly).
            src = ins.inputs[0]
            bits = np.array(self._view(st, src, "input 0"))
            self._require_written(st, self._mask_view(st, src), src.offset, "input 0")
            view = self._view(st, ins.out, "out")
            view[...] = np.broadcast_to(bits, view.shape)
            self._mark_written(st, self._mask_view(st, ins.out), ins.out.byte_span()[1])
            return True
        values = [self._operand_value(st, x, k) for k, x in enumerate(ins.inputs)]
        values = vector_ops.promote(op, values)
        with np.errstate(all="ignore"):
            result = self._apply(st, op, values)
        self._write(st, ins.out, np.broadcast_to(result, ins.out.shape))
        return True

    def _operand_value(self, st: CoreState, x: SpTensor | Scalar, k: int) -> np.ndarray:
        if isinstance(x, Scalar):
            return vector_ops.scalar(x.value)
        if x.shape != st.instrs[st.pc].out.shape:
            raise self._fail(st, f"input {k} has shape {list(x.shape)} but out has {list(st.instrs[st.pc].out.shape)}; "
                                 "broadcast with stride-0 views of out's shape")
        return self._read(st, x, f"input {k}")

    def _apply(self, st: CoreState, op: str, values: list[np.ndarray]) -> np.ndarray:
        if op in vector_ops.BINARY:
            problem = vector_ops.integer_operand_error(op, *values)
            if problem:
                raise self._fail(st, problem)
        return vector_ops.ELEMENTWISE[op](*values)

    def _reduce(self, st: CoreState, ins: Reduce) -> bool:
        if ins.op not in REDUCE_OPS:
            raise self._fail(st, f"unknown reduce op {ins.op!r}")
        x = self._read(st, ins.inp, "inp")
        if not 0 <= ins.axis < x.ndim:
            raise self._fail(st, f"reduce axis {ins.axis} is out of range for a {x.ndim}-d input")
        if x.dtype == np.bool_:
            x = x.astype(np.int64)
        reduce, combine = vector_ops.REDUCE[ins.op]
        with np.errstate(all="ignore"):
            result = reduce(x, axis=ins.axis, keepdims=True)  # fp32 stays fp32: fp32 accumulation
            if ins.accumulate:
                result = combine(self._read(st, ins.out, "out (accumulate)"), result)
        if result.shape != ins.out.shape:
            raise self._fail(st, f"reduce out has shape {list(ins.out.shape)}, expected {list(result.shape)}")
        self._write(st, ins.out, result)
        return True
