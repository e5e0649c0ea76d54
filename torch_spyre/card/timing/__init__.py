"""Event-driven timing of a Spyre program on the simulated card.

Timing depends only on the program (never on data or on the addresses bound at launch), so the runtime
computes it once per prepared program and reuses it. Every figure comes from :class:`CardConfig`.

The model
---------
*Engines.* Each core has a DMA engine with a read and a write channel, its PE arrays (``corelets_in_use``
of them, a MatMul is split across them), a vector unit and a ring port with one lane per direction.
Instructions issue in program order and each engine runs its own instructions in order, asynchronously
from the others.

*Dependencies.* An instruction starts when its engine is free and every earlier instruction of the same
core that touches overlapping scratchpad bytes in a conflicting way (RAW, WAR, WAW) has finished; DMA on
overlapping bytes of one operand is ordered the same way (symbolically: operand and offset). That alone
gives double-buffering overlap: a load into buffer B runs while the vector unit works on buffer A.
Across cores: ``Wait`` starts after the matching ``Signal`` has travelled the ring; ``RingRecv`` after the
matching ``RingSend`` has delivered its bytes (and later readers of those bytes depend on the RingRecv);
``Barrier`` releases its group once every member has arrived. ``Signal`` and ``Barrier`` first wait for all
earlier work of their core (a fence: what was written must be visible); ``Wait`` and ``Barrier`` hold back
every later instruction of their core.

*Work.* MatMul: weight-stationary tiles of ``pe_rows`` x (``pe_cols`` x SIMD width), each streaming the M
rows of activations plus a systolic fill and drain of ``pe_rows + pe_cols + mac_latency_cycles`` cycles.
Vector ops: one 128-byte stick per cycle per corelet for 2-byte types (so fp32 takes twice as long), plus
``vector_transcendental_cycles`` extra cycles per stick for transcendental ops. Sync: ring hop latency.

*Transfers.* DMA and ring sends are fluid flows: after a fixed latency (``dram_latency_s`` for DMA, hop
latency x hops for the ring) their bytes move at a rate recomputed at every start/finish event by max-min
fair sharing (progressive filling) of the resources on their path:

- LPDDR5: one resource shared by all cores. A byte read costs 1/(peak x read efficiency) of its time, a
  byte written 1/(peak x write efficiency), and each byte pays a read/write turnaround penalty in
  proportion to the share of active DRAM flows going the other way, sized so that an even mix achieves
  ``dram_mixed_efficiency``. Strided patterns pay ``dram_run_overhead_bytes`` per contiguous run.
- ring links: a bidirectional ring of ``num_cores`` stops, one link per neighbouring pair and direction,
  ``ring_bytes_per_cycle x clock x ring_efficiency`` each; transfers take the shortest direction (clockwise
  on a tie). DRAM traffic rides the ring between a core and the memory interface at ``memory_ring_stop``.
  ``RingSend(network="reduce")`` uses a separate ring of ``reduction_ring_bytes_per_cycle`` links.
- a DMA flow is also capped by its core's DMA engine (``dma_bytes_per_cycle``), a ring flow by one link's
  bandwidth (the port's injection rate).

A kernel costs ``kernel_fixed_cost_s`` on top of its instructions; it is modelled as a prologue, so the
first instruction starts at ``fixed_cost_s``.

*Yardstick.* ``ProgramTiming.roofline_s`` is the *op roofline* (``roofline``): the op's flops at the whole
chip's peak or its compulsory bytes at DRAM bandwidth, plus the fixed cost; every "of roofline" figure
(profiler, ``spyre run``, ``spyre estimate``, benchmarks) is measured against it. The program's own bound
(its bytes, its cores) is ``program_bound_s``.

Modules: ``coster`` (one instruction's cost), ``graph`` (dependencies and hazards), ``sharing`` (the
fluid max-min sharing), ``simulation`` (the event loop), ``accounting`` and ``report`` (the figures and
:class:`ProgramTiming`), ``roofline`` (the op roofline), ``memo`` (finished timings, reused for a program
seen before up to operand names: a compiled model repeats its kernels once per layer), ``timer``
(:func:`time_program`).
"""

from .coster import network_path
from .report import ENGINES, Interval, ProgramTiming
from .roofline import OpWork, op_roofline_s
from .timer import time_program

_ring_path = network_path  # the name tests/card/test_handwritten_timing.py imports

__all__ = ["ENGINES", "Interval", "OpWork", "ProgramTiming", "op_roofline_s", "network_path", "time_program"]
