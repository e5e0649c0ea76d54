"""The small base of a generator's per-core instruction emitter: views into its planned scratchpad
buffers and elementwise instructions with scalar operands.

A generator plans its scratchpad once (``compiler/scratchpad.py``: buffer name -> byte offset) and
emits each core's instructions into ``ins``; ``sp(name, dtype, shape, strides, elem_offset)`` is the
:class:`SpTensor` view of a planned buffer, ``ew(op, out, *inputs)`` appends an :class:`Elementwise`
whose plain numbers become :class:`Scalar` operands (:func:`elementwise` builds one without appending).
"""

from __future__ import annotations

from torch_spyre.program import SP_DTYPES, Elementwise, Instruction, Scalar, SpTensor


def elementwise(op: str, out: SpTensor, *inputs: SpTensor | int | float) -> Elementwise:
    """``out = op(*inputs)``; numbers are scalar operands."""
    return Elementwise(op, out, tuple(x if isinstance(x, SpTensor) else Scalar(x) for x in inputs))


class Emitter:
    """One core's instruction stream over the planned scratchpad buffers ``buf`` (name -> byte offset)."""

    def __init__(self, buf: dict[str, int]):
        self.buf = buf
        self.ins: list[Instruction] = []

    def sp(self, name: str, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
           elem_offset: int = 0) -> SpTensor:
        """A view of buffer ``name`` starting ``elem_offset`` elements of ``dtype`` in."""
        return SpTensor(self.buf[name] + elem_offset * SP_DTYPES[dtype], dtype, shape, strides)

    def ew(self, op: str, out: SpTensor, *inputs: SpTensor | int | float) -> None:
        self.ins.append(elementwise(op, out, *inputs))
