"""Pointwise and reduction kernels -> Spyre programs.

Input: a :class:`~torch_spyre.compiler.kernel_ir.KernelSpec` and, for every buffer it names, the view
of the bound tensor (:class:`~torch_spyre.compiler.access.TensorView`, built with ``TensorView.whole``:
the allocation's stick layout + the tensor's storage offset).
Output: a :class:`~torch_spyre.program.Program` whose ``metadata["decisions"]`` is the kernel's
:class:`~torch_spyre.compiler.decisions.KernelDecisions`.

How a kernel runs on the card
-----------------------------
- The outer iteration space (``x``) is divided over the cores in boxes (``PointwiseGenerator._divide``
  with ``tiling.split_counts`` / ``tiling.core_boxes``); every output stick belongs to one core
  (checked numerically), a core never reaches past ``core_address_span_bytes``.
- Each core walks its box in *tiles* (x box x reduction chunk) sized so that the scratchpad plan fits
  ``scratchpad_plannable_bytes`` (:func:`scratchpad.plan` by liveness). Input sticks of the next chunk
  are loaded while the current one is computed (two buffers per input).
- Inside a tile every access is analysed numerically (``access.py``); the tile is cut into *boxes*
  where every access is one strided view, every static mask is constant and every loop index used as
  data is affine (it is read from the core's iota of consecutive integers), and each op of the DAG
  becomes one vector instruction per box (op-major, so intermediate buffers live only while needed).
- Reductions accumulate in fp32 into an outer buffer (initialised to the op's identity), one ``Reduce``
  per reduced view axis; ops that need a reduction's result run in a later *phase* (a second pass over
  the chunk, from scratchpad when the whole reduction fits in one chunk).
- Stores go to staging sticks in scratchpad and are DMA'd out; sticks a tile only partly writes are
  loaded first (read-modify-write), padding included.

The modules, in the order a kernel goes through them:

- ``values.py``: the DAG's values, compute dtypes, the op-lowering tables;
- ``dag.py``: the kernel's nodes as one DAG (lowering, CSE, index values used as data, extents, phases,
  guards);
- ``tiling.py``: loop variables over a box, the work division over the cores, tiles and their shrinking;
- ``analysis.py``: the numeric analysis of a chunk's accesses and its cut into boxes;
- ``schedule.py``: which values each step of a tile computes;
- ``sym.py``: symbolic scratchpad tensors, placed by the liveness plan after emission;
- ``emit.py`` / ``reduce.py``: instruction emission (values, index iota, loads, stores / reductions,
  reduction-position iota);
- ``fold.py``: constant folding with the card's own arithmetic;
- ``generator.py``: the driver (aliases, division, tile search, plan, decisions) and :func:`generate`.
"""

from __future__ import annotations

from .generator import PointwiseGenerator, generate
from .values import AddressSpanError

# The generator a KernelSpec names in ``spec.generator``: pointwise/reduction kernels leave it empty.
GENERATOR = ""

__all__ = ["GENERATOR", "AddressSpanError", "PointwiseGenerator", "generate"]
