"""Functional execution of a Spyre program on the simulated card, with the checks real hardware skips.

Each core owns a real scratchpad (``config.scratchpad_bytes`` of ``np.uint8``). Data moves only through
DMA (device memory <-> scratchpad) and the ring (scratchpad -> scratchpad); compute instructions read
and write strided views of the scratchpad, vectorized with numpy over whole views.

Besides computing results, execution catches what a real card would turn into silent garbage, and
raises :class:`ExecutionError` naming the core and the instruction:

- a scratchpad access outside the plannable scratchpad;
- a read of scratchpad bytes that nothing wrote in this execution (a written-mask per byte);
- a DMA whose device range is not inside one live allocation;
- two cores touching the same device sticks, at least one writing, with no happens-before between
  them (vector clocks; Signal/Wait, RingSend/RingRecv and Barrier order cores);
- a ring transfer racing with the receiver's other uses of its destination bytes (or with another
  transfer into them): a use neither happening before the send nor after the RingRecv, checked from
  happens-before alone after the run (``scratchpad_races``), so not depending on the core order;
- a gather index outside ``[0, num_rows)``;
- a deadlock: every unfinished core blocked, each named with what it waits for.

Cores run one at a time, each until it blocks on Wait/RingRecv/Barrier, round-robin. A RingSend copies
its bytes into the destination scratchpad at once but marks them written only when the receiver's
RingRecv completes: until then the receiver may neither read nor write them.

That is the *checked* executor, the reference. Once a checked run has proved a program (none of its
checks depends on data), later runs of it go to the *fast* executor (``fast``, ``schedule``), which
gives the same bits with a few array operations per lockstep round; ``proof`` decides which runs where
(``TORCH_SPYRE_CHECK=1`` checks every run, ``=compare`` runs both and compares).

Time is not computed here (see card/timing); :class:`ExecutionStats` only counts work.

Modules: ``driver`` (the run loop, deadlocks, ``execute``, ``resolve_addresses``), ``dma`` (the DMA
engine), ``compute`` (PE arrays and vector unit), ``ring`` (ring and sync), ``access`` (scratchpad
bounds and written-byte checks), ``races`` (the device-memory race check), ``scratchpad_races`` (ring
transfers against the receiver's uses), ``proof`` (checked or fast), ``schedule``, ``chains`` and ``fast`` (the
fast executor), ``state`` (per-core state, scratchpads, ``ExecutionError``), ``stats`` (``ExecutionStats``). The vector ops' semantics are
:mod:`torch_spyre.card.vector_ops`.
"""

from ...program import dram_addr
from ..vector_ops import BOOL_RESULT_OPS, FLOAT_DTYPES, FLOAT_RESULT_OPS, NP_DTYPES
from .driver import execute, resolve_addresses
from .fast import FastPlan
from .proof import CHECK_ENV, FastExecutionMismatch, ProvedExecutor, check_mode
from .state import ExecutionError
from .stats import ENGINES, ExecutionStats

__all__ = [
    "BOOL_RESULT_OPS", "CHECK_ENV", "ENGINES", "ExecutionError", "ExecutionStats", "FLOAT_DTYPES",
    "FLOAT_RESULT_OPS", "FastExecutionMismatch", "FastPlan", "NP_DTYPES", "ProvedExecutor", "check_mode",
    "dram_addr", "execute", "resolve_addresses",
]
