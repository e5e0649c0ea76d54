"""Prepare a program once, launch it many times: symbolic addresses patched in three steps.

A :class:`~torch_spyre.program.Program` names its tensors symbolically (``Addr(operand, offset)`` in
its DMA instructions). Like IBM's runtime, we do the expensive work once, in :func:`prepare`:

- validate the program against the card (``card.validate``);
- time it (``card.timing.time_program``): timing is data-independent, so one result serves every launch;
- build the *patch-location table*: for every DMA instruction, (core, instruction index, operand
  index, byte offset) in flat numpy arrays, and preallocate the per-core address arrays that
  ``card.execute`` reads.

and each :func:`launch` only does what depends on the arguments:

1. resolve every operand to the device address of the memory bound to it, with checks (bound, big
   enough, aligned, live memory on this card) that raise :class:`BindingError` before anything changes;
2. compute the patch set, vectorized: ``base[operand index] + offset``;
3. apply it into the prepared address arrays (one scatter), execute functionally, and advance the
   stream's simulated clock by the prepared timing. The first launch runs the checked executor, which
   proves the program's data-independent properties; later launches run the fast one
   (``card.execute.proof``).

IBM's runtime does step 3 on the device (a correction blob DMA'd to the program region, applied by a
prologue); here the "program region" is the prepared address arrays.
"""

from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Union

import numpy as np

from ..errors import SpyreError
from ..card.execute import ExecutionError, ProvedExecutor, dram_addr
from ..card.memory import Allocation, InvalidAddressError
from ..card.timing import time_program
from ..card.validate import validate
from ..program import STICK_BYTES, Program
from . import stream as _stream
from . import timing_only as _timing_only


class BindingError(SpyreError, ValueError):
    """A launch argument that cannot be bound to a program operand. Nothing was executed."""

    def __init__(self, program: str, operand: str | None, message: str):
        self.program, self.operand = program, operand
        where = f"launch of {program!r}" + (f", operand {operand!r}" if operand is not None else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class DeviceBuffer:
    """A region of device memory to bind to an operand: ``nbytes`` at device ``address``.

    ``card`` (optional) says which card the address belongs to, so that binding it to a program
    prepared for another card is refused rather than silently aliasing that card's memory.
    """

    address: int
    nbytes: int
    card: int | None = None


Binding = Union[DeviceBuffer, Allocation, "tuple[int, int]"]


# ---------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class PatchTable:
    """Where each DMA instruction's device address goes, as flat arrays (one row per DMA instruction).

    ``slot`` indexes the flat address array that backs every core's address array, so applying a
    patch set is a single numpy scatter whatever the number of cores.
    """

    core: np.ndarray  # int32
    index: np.ndarray  # int64, instruction index within its core
    operand: np.ndarray  # int64, index into PreparedProgram.operand_names
    offset: np.ndarray  # int64, byte offset into the operand
    slot: np.ndarray  # int64, position in the flat address array

    def __len__(self) -> int:
        return int(self.core.size)


@dataclass(eq=False)
class PreparedProgram:
    """A program validated and timed for one card, with its patch table and address arrays."""

    program: Program
    card: Any  # torch_spyre.card.Card
    timing: Any  # torch_spyre.card.timing.ProgramTiming, computed once
    operand_names: tuple[str, ...]
    operand_nbytes: np.ndarray  # int64, bytes each operand must be bound to
    patches: PatchTable
    dma_addresses: dict[int, np.ndarray]  # core -> int64 per instruction (views into _flat)
    _flat: np.ndarray
    # Runs the program: checked at the first launch (which proves it), fast at the later ones.
    executor: ProvedExecutor
    # The timing figures every launch reports, summarized once (details of each WorkRecord).
    kernel_details: dict[str, Any] = field(default_factory=dict)
    launches: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def duration(self) -> float:
        """Simulated seconds one launch occupies the card's cores."""
        return float(self.timing.total_s)

    def renamed(self, program: Program) -> "PreparedProgram":
        """This prepared program launched as ``program``: the same instructions, its operands in the same
        order, under other names (a kernel of the same content). It shares the executor (a program proved
        once stays proved; its errors name the first program's operands), the patch table, the address
        arrays and their lock; bindings, timing and launch details use the new names."""
        timing = replace(self.timing, program_name=program.name)
        names = tuple(o.name for o in program.operands)
        return replace(self, program=program, timing=timing, operand_names=names,
                       kernel_details=_kernel_details(program, timing), launches=0)

    def __repr__(self) -> str:
        return (f"<PreparedProgram {self.name!r} on spyre:{self.card.index}: {len(self.operand_names)} operands, "
                f"{len(self.patches)} patch locations, {self.duration * 1e6:.3f} us per launch>")


def prepare(program: Program, card: Any) -> PreparedProgram:
    """Validate, time and index ``program`` for ``card``; the result can be launched many times.

    The prepared program keeps a reference to ``program``: do not modify it afterwards (prepare a new one).
    """
    validate(program, card.config)
    timing = time_program(program, card.config)
    names = tuple(o.name for o in program.operands)
    starts = _core_starts(program)
    flat, per_core = _address_arrays(program, starts)
    patches = _patch_table(program, {n: i for i, n in enumerate(names)}, starts)
    return PreparedProgram(
        program=program,
        card=card,
        timing=timing,
        operand_names=names,
        operand_nbytes=np.array([o.nbytes for o in program.operands], dtype=np.int64),
        patches=patches,
        dma_addresses=per_core,
        _flat=flat,
        executor=ProvedExecutor(program, card, names),
        kernel_details=_kernel_details(program, timing),
    )


def _core_starts(program: Program) -> dict[int, int]:
    """Where each core's instructions start in the flat address array (cores in sorted order)."""
    starts, pos = {}, 0
    for core in sorted(program.cores):
        starts[core] = pos
        pos += len(program.cores[core])
    return starts


def _address_arrays(program: Program, starts: dict[int, int]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """One flat int64 array for all instructions, and per-core views of it (what execute() reads).
    Entries of non-DMA instructions stay 0, as in ``card.execute.resolve_addresses``."""
    total = sum(len(ins) for ins in program.cores.values())
    flat = np.zeros(total, dtype=np.int64)
    per_core = {c: flat[s : s + len(program.cores[c])] for c, s in starts.items()}
    return flat, per_core


def _patch_table(program: Program, operand_index: dict[str, int], core_starts: dict[int, int]) -> PatchTable:
    rows = []
    for core, i, ins in program.instructions():
        addr = dram_addr(ins)
        if addr is not None:
            # validate() has already refused Addr operands that the program does not declare.
            rows.append((core, i, operand_index[addr.operand], addr.offset, core_starts[core] + i))
    cols = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return PatchTable(
        core=cols[:, 0].astype(np.int32),
        index=cols[:, 1].copy(),
        operand=cols[:, 2].copy(),
        offset=cols[:, 3].copy(),
        slot=cols[:, 4].copy(),
    )


def _kernel_details(program: Program, timing: Any) -> dict[str, Any]:
    """What every launch of this program tells stream listeners (the profiler), computed once."""
    return {
        "program": program.name,
        "timing": timing,
        "flops": float(timing.flops),
        "bytes": dict(timing.bytes),
        "dram_bytes": float(timing.bytes["dram_read"] + timing.bytes["dram_write"]),
        "roofline_bound": float(timing.roofline_s),
        "roofline_fraction": float(timing.roofline_fraction),
        "program_bound": float(timing.program_bound_s),
        "bottleneck": timing.bottleneck,
        "cores": len(program.cores),
    }


# ---------------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------------
_launch_ids = itertools.count(1)


@dataclass(eq=False)
class LaunchRecord:
    """What one launch did: when it ran (simulated device time) and how well, per the card's timing."""

    program: str
    card: int
    stream_id: int
    launch_id: int
    start: float  # simulated seconds on the card's clock
    end: float
    timing: Any  # the prepared ProgramTiming
    stats: Any  # ExecutionStats from the functional execution; None when it was skipped (timing-only)
    addresses: dict[str, int]  # operand -> device address it was bound to

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def busy(self) -> dict[int, dict[str, float]]:
        """Per core, per engine: simulated seconds the engine was busy."""
        return self.timing.busy_s

    @property
    def utilization(self) -> dict[int, dict[str, float]]:
        """Per core, per engine: busy time / launch duration."""
        return self.timing.utilization

    @property
    def bytes(self) -> dict[str, int]:
        """Bytes moved at each level: dram_read, dram_write, ring, reduce_ring, sp_read, sp_write."""
        return self.timing.bytes

    @property
    def flops(self) -> float:
        return self.timing.flops

    @property
    def roofline_bound(self) -> float:
        """The op roofline: the least time the chip allows for this op, fixed cost included (seconds)."""
        return self.timing.roofline_s

    @property
    def roofline_fraction(self) -> float:
        """roofline_bound / actual time: 1.0 means the program runs at the op roofline."""
        return self.timing.roofline_fraction

    @property
    def bottleneck(self) -> str:
        return self.timing.bottleneck

    def summary(self) -> str:
        head = (f"launch #{self.launch_id} {self.program!r} on spyre:{self.card} stream {self.stream_id}: "
                f"device time {self.start * 1e6:.3f} -> {self.end * 1e6:.3f} us ({self.duration * 1e6:.3f} us)")
        return head + "\n" + self.timing.summary()

    def __repr__(self) -> str:
        return (f"<LaunchRecord #{self.launch_id} {self.program!r} spyre:{self.card} "
                f"[{self.start * 1e6:.3f}, {self.end * 1e6:.3f}] us, {self.roofline_fraction:.1%} of roofline>")


def launch(prepared: PreparedProgram, bindings: Mapping[str, Binding], stream: _stream.Stream | None = None) -> LaunchRecord:
    """Run ``prepared`` on its card with ``bindings`` (operand name -> device memory), queued on ``stream``.

    Results are in device memory when this returns; the returned record says when, in simulated device
    time, the card ran the program. A bad binding raises :class:`BindingError` and changes nothing. A
    program that fails while executing (``card.execute.ExecutionError``) does not advance the clock, but
    may have written part of its outputs, as a faulting kernel would on a real card.
    """
    card = prepared.card
    stream = _resolve_stream(prepared, stream)
    bases, allocs = _resolve(prepared, bindings)  # step 1: every check happens here
    patch = compute_patch(prepared, bases)  # step 2
    with prepared._lock:  # the address arrays are shared by every launch of this prepared program
        apply_patch(prepared, patch)  # step 3
        if _timing_only.skip_launch(card.memory, prepared.program.operands, bases, allocs):
            stats = None  # timing-only (or inputs without data): the clock advances, nothing is computed
        else:
            try:
                stats = prepared.executor.run(prepared.dma_addresses, bases, prepared.operand_nbytes)
            except ExecutionError as e:
                raise _named(e, prepared) from e
        prepared.launches += 1
    launch_id = next(_launch_ids)
    rec = stream.enqueue(prepared.name, prepared.duration, kind="kernel", resource="compute",
                         details={**prepared.kernel_details, "launch_id": launch_id})
    return LaunchRecord(prepared.name, card.index, stream.stream_id, launch_id, rec.start, rec.end,
                        prepared.timing, stats, dict(zip(prepared.operand_names, bases.tolist())))


def _named(error: ExecutionError, prepared: PreparedProgram) -> ExecutionError:
    """``error`` of a shared executor (:meth:`PreparedProgram.renamed`) in this launch's names: the kernel
    that failed, and its operands where the message names the first kernel's."""
    shared_names = prepared.executor.operand_names
    if prepared.executor.program.name == prepared.name and shared_names == prepared.operand_names:
        return error
    own = dict(zip(shared_names, prepared.operand_names))
    text = re.sub(r"%([A-Za-z_][\w.]*)", lambda m: "%" + own.get(m.group(1), m.group(1)), str(error))
    return type(error)(f"{prepared.name}: {text}")


def _resolve_stream(prepared: PreparedProgram, stream: _stream.Stream | None) -> _stream.Stream:
    card = prepared.card.index
    if stream is None:
        return _stream.current_stream(card)
    if stream.card != card:
        raise BindingError(prepared.name, None,
                           f"the stream is on spyre:{stream.card} but the program was prepared for spyre:{card}; "
                           f"pass a stream of spyre:{card} (or prepare the program for spyre:{stream.card})")
    return stream


# --- step 1: resolve ---------------------------------------------------------------------------
def resolve_bindings(prepared: PreparedProgram, bindings: Mapping[str, Binding]) -> np.ndarray:
    """Step 1: the device base address of every operand (int64, in operand order), checked."""
    return _resolve(prepared, bindings)[0]


def _resolve(prepared: PreparedProgram, bindings: Mapping[str, Binding]) -> tuple[np.ndarray, list[Allocation]]:
    """:func:`resolve_bindings`, and the live allocation each operand lies in (found by its liveness check;
    ``skip_launch`` reads them instead of looking each up again)."""
    names = prepared.operand_names
    if len(bindings) != len(names) or not all(n in bindings for n in names):
        _check_operand_names(prepared, bindings)
    needs = prepared.operand_nbytes.tolist()
    addresses, allocs = [], []
    for name, need in zip(names, needs):
        address, found = _resolve_one(prepared, name, need, bindings[name])
        addresses.append(address)
        allocs.append(found)
    return np.array(addresses, dtype=np.int64), allocs


def _check_operand_names(prepared: PreparedProgram, bindings: Mapping[str, Binding]) -> None:
    missing = [n for n in prepared.operand_names if n not in bindings]
    if missing:
        raise BindingError(prepared.name, missing[0],
                           f"not bound; operands missing a binding: {', '.join(missing)}. "
                           f"Bind every operand ({', '.join(prepared.operand_names)}) to device memory.")
    unknown = sorted(set(bindings) - set(prepared.operand_names))
    if unknown:
        raise BindingError(prepared.name, unknown[0],
                           f"the program has no such operand (unknown: {', '.join(unknown)}); "
                           f"its operands are {', '.join(prepared.operand_names)}")


def _resolve_one(prepared: PreparedProgram, name: str, need: int, value: Binding) -> tuple[int, Allocation]:
    """The device address ``value`` stands for, after checking it can hold operand ``name``, and the live
    allocation it lies in."""
    if type(value) is Allocation and need <= value.nbytes and prepared.card.memory.holds(value) \
            and not value.address % STICK_BYTES:
        return value.address, value  # a whole live allocation of this card, big enough: every check below passes
    address, nbytes, alloc = _as_region(prepared, name, value)
    card = prepared.card.index
    if isinstance(value, DeviceBuffer) and value.card is not None and value.card != card:
        raise BindingError(prepared.name, name,
                           f"the buffer is on spyre:{value.card} but the program was prepared for spyre:{card}; "
                           f"copy the data to spyre:{card} or prepare the program for spyre:{value.card}")
    if address % STICK_BYTES:
        raise BindingError(prepared.name, name,
                           f"device address {address:#x} is not {STICK_BYTES}-byte aligned; DMA moves whole "
                           f"sticks, so bind the start of a stick (e.g. the allocation itself)")
    if nbytes < need:
        raise BindingError(prepared.name, name,
                           f"needs {need} bytes but the buffer bound to it has {nbytes}; allocate at least {need} bytes")
    return address, _check_live(prepared, name, address, need, alloc)


def _check_live(prepared: PreparedProgram, name: str, address: int, need: int, alloc: Allocation | None) -> Allocation:
    """``need`` bytes from ``address`` must lie inside one live allocation of the program's card (and be
    ``alloc`` itself when the caller passed an Allocation); that allocation."""
    card = prepared.card.index
    try:
        found, offset = prepared.card.memory.find(address)
    except InvalidAddressError:
        raise BindingError(prepared.name, name,
                           f"device address {address:#x} is not live memory on spyre:{card} (freed, never "
                           f"allocated, or another card's); bind an allocation that is alive on spyre:{card}") from None
    if alloc is not None and found is not alloc:
        # Same address, different block: the caller's allocation belongs to another card whose address
        # range overlaps this one's (or it was freed and its range handed out again).
        raise BindingError(prepared.name, name,
                           f"the allocation at {address:#x} is no longer live on spyre:{card} (it belongs to "
                           f"another card, or it was freed); bind an allocation that is alive on spyre:{card}")
    if offset + need > found.nbytes:
        raise BindingError(prepared.name, name,
                           f"needs {need} bytes from {address:#x}, but the live allocation there "
                           f"[{found.address:#x}, {found.end:#x}) ends {offset + need - found.nbytes} bytes too soon")
    return found


def _as_region(prepared: PreparedProgram, name: str, value: Binding) -> tuple[int, int, Allocation | None]:
    """(address, nbytes, the Allocation if one was passed) for any accepted kind of binding."""
    if isinstance(value, Allocation):
        return int(value.address), int(value.nbytes), value
    if isinstance(value, DeviceBuffer):
        return int(value.address), int(value.nbytes), None
    if isinstance(value, tuple) and len(value) == 2:
        return int(value[0]), int(value[1]), None
    raise BindingError(prepared.name, name,
                       f"cannot bind a {type(value).__name__}; pass a DeviceBuffer(address, nbytes), "
                       f"an (address, nbytes) tuple or a card memory Allocation")


# --- steps 2 and 3: compute and apply the patch set ---------------------------------------------
def compute_patch(prepared: PreparedProgram, bases: np.ndarray) -> np.ndarray:
    """Step 2: the absolute device address of every DMA instruction (one per patch-table row)."""
    table = prepared.patches
    return bases[table.operand] + table.offset


def apply_patch(prepared: PreparedProgram, patch: np.ndarray) -> None:
    """Step 3: write the patch set into the address arrays execute() reads (one scatter)."""
    prepared._flat[prepared.patches.slot] = patch
