"""The fast executor: a proved program run as a few large array operations, giving bit for bit what the
checked executor (``driver``) computes.

What the checked executor proves about a program does not depend on the data (bounds, reads of unwritten
bytes, races, deadlocks), so once one checked run has passed, later runs skip those checks (see
``proof``). What is left is the work itself, planned once here:

- the data instructions in :func:`~.schedule.lockstep_rounds` order; each round's alike instructions of
  cores ``c0, c0 + s, c0 + 2s, ...`` (whose device offsets also step evenly) run as *one* numpy operation
  over a strided view spanning those cores' scratchpads (one block, a row per core);
- a DMA is one strided copy between that view and the device buffer, whatever the number of cores;
- DLFloat16 is decoded and rounded once per batched tensor, not per core or per stick, and not again
  where the bits were decoded already: when every core's tile of a batched read holds the same bits, one
  core's tile is decoded and broadcast over the cores axis (a read-only, stride-0 view); a tile whose
  bits equal those of a tile an earlier step decoded (one nothing has rewritten since: known at planning;
  or this very tile before steps rewrote it, whose raw bits are copied to compare with) takes its
  values. The bits are compared at every run, until they once differ (for tiles big enough to pay);
- consecutive alike vector instructions of one core are first joined into one (``runs``);
- a matmul's K loop (a chain of accumulating MatMuls into one out tile) runs as one step reading its A
  and B tiles straight from the device memory its DMA loads (and ring sends) brought them from, and the
  DMA loads and ring sends whose scratchpad bytes nothing then reads are dropped (``chains``). A binding
  where an operand the chains read overlaps one the program stores to runs a plan without chains.

Bit identity: an elementwise op's result for one element does not depend on where it sits in the array
(``tests/card/test_vector_ops.py`` checks it for each op, NaNs included; every computed NaN is written as
one NaN); a batched matmul is numpy's stack of one single-threaded BLAS GEMM per core, of the checked
executor's shapes (a stride-0 batch operand too: numpy decides BLAS per item from the item's strides),
and a chain's products are such a stack over (cores, k), summed in the steps' order with each step's own
add. Reductions and the ops torch computes (``vector_ops.POSITION_DEPENDENT_OPS``) run core
by core on the checked executor's very shapes: how an array is walked decides the order of numpy's sums,
which NaN a max returns, and how torch rounds an array's tail.
A single core's instruction uses exactly the checked executor's views. What depends on data is still
checked: gather indices and integer division by zero.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import numpy as np

from ...program import STICK_BYTES, DmaGather, DmaLoad, DmaStore, Elementwise, MatMul, Program, Reduce, RingSend, Scalar, SpTensor
from .. import vector_ops
from .dma import gather_index_problem, gather_rows
from .chains import Chain, DeviceTile, DeviceTileReader, Fusion, equal_bits, plan_fusion, segments
from .driver import single_threaded_pools
from .runs import joined_cores
from .schedule import Group, lockstep_rounds
from .state import ExecutionError, Scratchpads, scratchpads

Step = Callable[[Any, dict], None]  # (device memory, dma_addresses) -> None
# Earlier decoded tiles a read compares its bits with at its first run (per core; then only the one that
# matched): bounds the first run's comparisons where many tiles share a shape.
SAME_BITS_CANDIDATES = 8
# A core's tile smaller than this is decoded without looking for the same bits elsewhere: there the
# comparisons' fixed costs outweigh the decode (the encode at one-pass "high": 3 % less CPU with it).
SAME_BITS_MIN_ELEMENTS = 4096


class FastPlan:
    """A proved program, planned for one card's scratchpads: run it with :meth:`run`."""

    def __init__(self, program: Program, card: Any, fuse: bool = True):
        self.program = program
        # Runs of alike vector instructions joined (``runs``): index (core, i) is into these lists, and
        # ``origin[core][i]`` is that instruction's index in the program (DMA addresses, errors).
        self.cores, self.origin = joined_cores(program)
        self.pads: Scratchpads = scratchpads(card)
        self.steps: list[Step] = []
        # Decoded DLFloat16 tiles shared by the steps of one run (see :meth:`_reader`): slot -> array.
        self._slots: list[np.ndarray | None] = []
        # Counted over all runs, to show the decoding work (tests, benchmarks): elements decoded, batched
        # reads whose cores held identical bits (decoded as one core's tile), and cores' tiles whose values
        # came from an earlier read holding the same bits (see :meth:`_reader`).
        self.decoded_elements = 0
        self.replicated_reads = 0
        self.reused_tiles = 0
        self._fresh: dict[tuple, int] = {}  # tile key -> its slot, while nothing has written its bytes
        self._fresh_on: dict[int, dict[tuple, tuple[int, int]]] = {}  # core -> {tile key: byte span}
        self._fresh_by_geometry: dict[tuple, dict[tuple, int]] = {}  # (shape, strides) -> {fresh key: slot}
        self._stale: dict[tuple, list[int]] = {}  # tile key -> its earlier slots, whose bytes were rewritten
        # Slots whose raw bits later reads of the rewritten tile compare with: slot -> this run's copy,
        # and how many reads still compare with it.
        self._bits: dict[int, np.ndarray | None] = {}
        self._bits_users: dict[int, int] = {}
        # Each DMA'd operand's allocation is found once per run, not per DMA step (see :meth:`_regions_of`):
        # operand index -> one of its DMAs (core, program index, byte offset into the operand), and that
        # run's (host buffer, byte offset of the operand's base in it).
        self._operand_index = {o.name: j for j, o in enumerate(program.operands)}
        self._dma_of: dict[int, tuple[int, int, int]] = {}
        self._regions: list[tuple[np.ndarray, int] | None] = [None] * len(program.operands)
        self._device_tiles: dict = {}  # one run's chain tiles decoded from device memory (``chains``)
        self.device_readers: list[DeviceTileReader] = []  # the chains' (what they keep: ``kept_bytes``)
        groups = [(group, self._units(group)) for rounds in lockstep_rounds(program, self.cores) for group in rounds]
        # Matmul K loops as one step, and the DMA loads and ring sends nothing then reads dropped
        # (``chains``); planned for programs with matmuls, the only ones that have such loops.
        has_matmul = any(isinstance(i, MatMul) for _, _, i in program.instructions())
        fusion = plan_fusion(program, self.cores, [runs for _, runs in groups], self.pads.block.shape[0],
                             self.pads.nbytes) if fuse and has_matmul else Fusion()
        self.chain_operands = frozenset(fusion.operands)  # read from device memory by chains
        self.chains, self.dropped_steps = len(fusion.chains), len(fusion.dead)
        for g, (group, runs) in enumerate(groups):
            for u, step in enumerate(self._plan(group, runs, fusion, g)):
                if step is not None and (g, u) not in fusion.dead:
                    self.steps.append(step)
        # BLAS (matmul) and torch's kernels (the position-dependent ops) split work over threads, which
        # can change a result's bits: they run on one thread, as in the checked executor. Limiting the
        # pools costs ~0.3 ms, more than a small program's whole run, so only these programs pay it.
        self.single_threaded = has_matmul or any(isinstance(i, Elementwise) and i.op in vector_ops.POSITION_DEPENDENT_OPS
                                                 for _, _, i in program.instructions())

    @property
    def kept_bytes(self) -> int:
        """Host bytes the chains' readers keep across runs (``chains.DeviceTileReader``)."""
        return sum(r.kept_bytes for r in self.device_readers)

    @property
    def tile_decodes(self) -> int:
        """DLFloat16 tiles a run decodes (a tile read again before anything rewrites it is decoded once)."""
        return len(self._slots)

    def valid_for(self, card: Any) -> bool:
        """False once the card's scratchpads were remade (another configuration): plan again."""
        return scratchpads(card) is self.pads

    def run(self, memory: Any, dma_addresses: dict[int, np.ndarray]) -> None:
        """Execute on device ``memory`` with each DMA's patched address in ``dma_addresses[core][index]``."""
        # IEEE specials are silent on the vector unit (as in the checked executor): one errstate for the run.
        with self.pads.lock, (single_threaded_pools() if self.single_threaded else contextlib.nullcontext()), \
                np.errstate(all="ignore"):
            try:
                self._regions_of(memory, dma_addresses)
                for step in self.steps:
                    step(memory, dma_addresses)
            finally:
                self._slots[:] = [None] * len(self._slots)
                self._bits.update(dict.fromkeys(self._bits))
                self._regions[:] = [None] * len(self._regions)
                self._device_tiles.clear()

    def _regions_of(self, memory: Any, dma_addresses: dict) -> None:
        """Where each DMA'd operand lies in host memory this run. Binding proved every operand inside one
        live allocation (``runtime.launch``), so one lookup per operand serves all of its DMAs."""
        regions = self._regions
        for j, (core, index, offset) in self._dma_of.items():
            base = int(dma_addresses[core][index]) - offset
            alloc, off = memory.find(base)
            regions[j] = (alloc.buffer, off)

    # --- planning --------------------------------------------------------------------------------
    def _units(self, group: Group) -> list[list[tuple[int, int]]]:
        """How a group's members split into steps: one list of (core, index) per step."""
        members = group.members
        ins0 = self.cores[members[0][0]][members[0][1]]
        if isinstance(ins0, (DmaLoad, DmaStore)):
            if not ins0.pattern.sticks:
                return []
            strides = ins0.pattern.dram_strides + ins0.pattern.sp_strides
            if 0 in strides:  # several sticks onto one: keep the checked executor's exact copy, core by core
                return [[m] for m in members]
            offsets = [(ins.src if isinstance(ins, DmaLoad) else ins.dst).offset
                       for ins in (self.cores[c][i] for c, i in members)]
            return [[members[j] for j in run] for run in even_runs([c for c, _ in members], offsets)]
        if isinstance(ins0, RingSend):
            return [list(members)]
        if isinstance(ins0, (DmaGather, Reduce)) or (isinstance(ins0, Elementwise) and ins0.op in vector_ops.POSITION_DEPENDENT_OPS):
            # Per core, on the checked executor's shapes: how numpy's reductions walk an array decides the
            # order of their sums and which NaN (its sign) a max returns, and torch's kernels round an
            # array's tail differently. (A gather reads its own indices.)
            return [[m] for m in members]
        return [[members[j] for j in run] for run in even_runs([c for c, _ in members])]

    def _plan(self, group: Group, runs: list[list[tuple[int, int]]], fusion: Fusion, g: int) -> list[Step | None]:
        """One step per unit of ``runs`` (None: a chain member run by the chain's step)."""
        members = group.members
        ins0 = self.cores[members[0][0]][members[0][1]]
        if isinstance(ins0, (DmaLoad, DmaStore)):
            if not runs:
                return []
            if isinstance(ins0, DmaLoad):
                self._wrote([c for c, _ in members], *ins0.pattern.sp_range(ins0.sp_offset))
            return [self._dma(run, ins0, [self.cores[c][i] for c, i in run]) for run in runs]
        if isinstance(ins0, DmaGather):
            return [self._gather(*run[0]) for run in runs]
        if isinstance(ins0, RingSend):
            return [self._ring_send([(c, self.cores[c][i].dst_core) for c, i in run], ins0) for run in runs]
        if isinstance(ins0, MatMul):
            steps: list[Step | None] = []
            for u, run in enumerate(runs):
                chain = fusion.chains.get((g, u))
                if chain is not None:
                    steps.append(self._chain(run, chain))
                elif (g, u) in fusion.fused:
                    self._wrote_tensor(run, ins0.out)
                    steps.append(None)
                else:
                    steps.append(self._matmul(run, ins0))
            return steps
        make = {Elementwise: self._elementwise, Reduce: self._reduce}[type(ins0)]
        return [make(run, ins0) for run in runs]

    def _pad_view(self, run: Sequence[tuple[int, int]], offset: int, shape: tuple, strides: tuple,
                  dtype: np.dtype) -> np.ndarray:
        """The scratchpad bytes at ``offset`` of every core in ``run`` as one array: (cores, *shape), or
        just ``shape`` for a single core (the checked executor's own view)."""
        pads = self.pads
        c0 = run[0][0]
        base = c0 * pads.nbytes + offset
        if len(run) == 1:
            return np.ndarray(shape, dtype, buffer=pads.block, offset=base, strides=strides)
        step = (run[1][0] - c0) * pads.nbytes
        return np.ndarray((len(run), *shape), dtype, buffer=pads.block, offset=base, strides=(step, *strides))

    def _tensor(self, run: Sequence[tuple[int, int]], t: SpTensor) -> np.ndarray:
        isz = t.itemsize
        return self._pad_view(run, t.offset, t.shape, tuple(s * isz for s in t.strides), vector_ops.NP_DTYPES[t.dtype])

    # --- reads and writes: decoded tiles shared across steps ------------------------------------------
    def _reader(self, run: Sequence[tuple[int, int]], t: SpTensor) -> Callable[[], np.ndarray]:
        """A function giving ``t``'s values for computing (see :func:`_read`). A DLFloat16 tile is decoded
        once and shared by the later steps reading the same tile, until a step writes any of its bytes:
        the program is static, so which reads may share is known here, at planning (a matmul's weight
        tile reused for every row tile, or its resident A tile, is decoded once per run)."""
        view = self._tensor(run, t)
        if t.dtype != "dlfloat16":
            return lambda: _read(view, t.dtype)
        key = (tuple(c for c, _ in run), t.offset, t.shape, t.strides)
        slots = self._slots
        slot = self._fresh.get(key)
        if slot is not None:
            return lambda: slots[slot]
        slot = len(slots)
        slots.append(None)
        # Earlier tiles of this geometry whose bytes nothing has rewritten: one may hold the same bits.
        big = view.size >= SAME_BITS_MIN_ELEMENTS * len(run) and view.size > 0
        earlier = self._same_bits_candidates(run, t) if big else None
        # This very tile, decoded before steps rewrote its bytes (often with the same bits: a weight tile
        # loaded again, into a buffer that takes turns): their raw bits are kept to compare with.
        before = self._stale.get(key, [])[::-1][:SAME_BITS_CANDIDATES] if big else []
        bits, users = self._bits, self._bits_users
        for b in before:
            bits[b] = None
            users[b] = users.get(b, 0) + 1
        self._fresh[key] = slot
        self._fresh_by_geometry.setdefault(key[2:], {})[key] = slot
        span = t.byte_span()
        for c in key[0]:
            self._fresh_on.setdefault(c, {})[key] = span

        # A broadcast view (a bias over rows): decode each distinct element once, then broadcast.
        compact = view[tuple(slice(0, 1) if st == 0 else slice(None) for st in view.strides)] \
            if 0 in view.strides and view.size else view
        shape = view.shape
        batched = len(run) > 1
        per_core = [view[j] for j in range(len(run))] if batched else [view]
        # Several cores often hold the very same bits (a matmul's A tile, loaded by every core owning an
        # N slice): then one core's tile is decoded and broadcast over the cores axis. And a core's tile
        # often holds bits an earlier step of the run decoded (an A tile passed on over the ring, a weight
        # tile loaded again): its values are taken from there. The bits decide at every run (a comparison
        # costs ~1/10 of a decode); a read seen to differ once stops paying for the comparison.
        alike = batched and big

        def decode() -> np.ndarray:
            values = find()
            if slot in bits:
                bits[slot] = np.array(view)
            slots[slot] = values
            return values

        def find() -> np.ndarray:
            nonlocal alike, earlier, before
            if before:
                for k, b in enumerate(before):
                    old = bits[b]
                    if old is not None and equal_bits(view, old):
                        self._stop_comparing(before[:k] + before[k + 1:])
                        before = [b]  # the one that matched is the one to compare next run
                        self.reused_tiles += len(run)
                        return slots[b]
                if all(bits[b] is not None for b in before):  # all seen to differ: stop comparing
                    self._stop_comparing(before)
                    before = []
            one = not batched  # one core's tile to find: the read's, or every core's when they are alike
            if alike:
                if (compact == compact[:1]).all():
                    one = True
                    self.replicated_reads += 1
                else:
                    alike = False
            if earlier:
                tiles = []
                for j in range(1 if one else len(run)):
                    hit = _same_bits(per_core[j], earlier[j], slots)
                    if hit is None:
                        earlier = None
                        break
                    earlier[j] = [earlier[j][hit[0]]]  # the tile that matched is the one to compare next run
                    tiles.append(hit[1])
                else:
                    self.reused_tiles += len(tiles)
                    return tiles[0] if not batched else np.broadcast_to(tiles[0], shape) if one else np.stack(tiles)
            part = compact[:1] if one and batched else compact
            values = vector_ops.decode(part, "dlfloat16")
            self.decoded_elements += values.size
            if part is not view:  # read-only, stride 0: no step writes what it reads
                values = np.broadcast_to(values, shape)
            return values

        return decode

    def _stop_comparing(self, slots: Sequence[int]) -> None:
        """A read stops comparing with these slots' raw bits: a slot no read compares with is not copied."""
        for b in slots:
            self._bits_users[b] -= 1
            if not self._bits_users[b]:
                del self._bits_users[b], self._bits[b]

    def _same_bits_candidates(self, run: Sequence[tuple[int, int]], t: SpTensor) -> list[list[tuple]]:
        """For each core of ``run``: the tiles of ``t``'s shape and strides decoded by earlier reads whose
        bytes no step has rewritten since (nearest first, at most ``SAME_BITS_CANDIDATES``), as
        (slot, that core's index in the slot's values or None for a single core's, the tile's view)."""
        strides = tuple(s * t.itemsize for s in t.strides)
        dtype = vector_ops.NP_DTYPES[t.dtype]
        found = []
        for key, slot in reversed(self._fresh_by_geometry.get((t.shape, t.strides), {}).items()):
            for j, c in enumerate(key[0]):
                found.append((slot, j if len(key[0]) > 1 else None,
                              self._pad_view([(c, 0)], key[1], t.shape, strides, dtype)))
                if len(found) == SAME_BITS_CANDIDATES:
                    return [list(found) for _ in run]
        return [list(found) for _ in run]

    def _wrote(self, cores: Sequence[int], lo: int, hi: int) -> None:
        """The step being planned writes scratchpad bytes [lo, hi) of ``cores``: tiles decoded from them
        are stale for the steps after it."""
        for c in cores:
            for key, (klo, khi) in list(self._fresh_on.get(c, {}).items()):
                if klo < hi and lo < khi:
                    stale = self._fresh.pop(key, None)
                    if stale is not None:
                        self._stale.setdefault(key, []).append(stale)
                    self._fresh_by_geometry[key[2:]].pop(key, None)
                    for k in key[0]:
                        self._fresh_on[k].pop(key, None)

    def _wrote_tensor(self, run: Sequence[tuple[int, int]], t: SpTensor) -> None:
        self._wrote([c for c, _ in run], *t.byte_span())

    # --- DMA ---------------------------------------------------------------------------------------
    def _dma(self, run, ins0, instrs) -> Step:
        p = ins0.pattern
        load = isinstance(ins0, DmaLoad)
        c0, i0 = run[0][0], self.origin[run[0][0]][run[0][1]]
        addr = instrs[0].src if load else instrs[0].dst  # the run's first (ins0 is its group's first)
        operand = self._operand_index[addr.operand]
        self._dma_of.setdefault(operand, (c0, i0, addr.offset))
        if len(run) == 1:
            shape, strides = p.shape, p.dram_strides
        else:
            offsets = [(ins.src if load else ins.dst).offset for ins in instrs]
            shape, strides = (len(run), *p.shape), (offsets[1] - offsets[0], *p.dram_strides)
        pad = self._pad_view(run, ins0.sp_offset, p.shape, p.sp_strides, np.dtype(np.uint8))
        # A stick moves as 16 8-byte words when every stride allows: numpy copies 8x fewer elements (a
        # copy moves the same bytes whatever the element type).
        word = 8 if all(st % 8 == 0 for st in (*pad.strides, *strides)) else 1
        dtype = np.dtype(np.uint64 if word == 8 else np.uint8)
        pad = np.ndarray((*pad.shape, STICK_BYTES // word), dtype, buffer=self.pads.block,
                         offset=_byte_offset(pad, self.pads.block), strides=(*pad.strides, word))
        shape, strides = (*shape, STICK_BYTES // word), (*strides, word)
        rel = addr.offset  # where the first core's DMA starts, from the operand's base (strides may be negative)
        regions = self._regions

        def dma(memory: Any, dma_addresses: dict) -> None:
            buffer, base = regions[operand]
            dram = np.ndarray(shape, dtype, buffer=buffer, offset=base + rel, strides=strides)
            if load:
                pad[...] = dram
            else:
                dram[...] = pad

        return dma

    def _gather(self, core: int, index: int) -> Step:
        ins: DmaGather = self.cores[core][index]
        index = self.origin[core][index]
        program = self.program
        run = [(core, index)]
        idx_view = self._tensor(run, ins.index)
        sp = self.pads.block[core]
        self._wrote([core], *ins.sp_range())

        def gather(memory: Any, dma_addresses: dict) -> None:
            values = vector_ops.decode(idx_view, ins.index.dtype).reshape(-1)
            problem = gather_index_problem(values, ins, program)
            if problem:
                raise ExecutionError(problem, core, index, ins)
            if values.size:
                alloc, off = memory.find(int(dma_addresses[core][index]))
                gather_rows(sp, alloc.buffer, off, ins, values)

        return gather

    def _ring_send(self, pairs: list[tuple[int, int]], ins0: RingSend) -> Step:
        block = self.pads.block
        self._wrote([d for _, d in pairs], ins0.dst_offset, ins0.dst_offset + ins0.nbytes)
        src = slice(ins0.src_offset, ins0.src_offset + ins0.nbytes)
        dst = slice(ins0.dst_offset, ins0.dst_offset + ins0.nbytes)

        def ring_send(memory: Any, dma_addresses: dict) -> None:
            for c, d in pairs:
                block[d, dst] = block[c, src]

        return ring_send

    # --- compute -----------------------------------------------------------------------------------
    def _elementwise(self, run, ins: Elementwise) -> Step:
        out = self._tensor(run, ins.out)
        op, out_dtype = ins.op, ins.out.dtype
        first = ins.inputs[0]
        if op == "copy" and isinstance(first, SpTensor) and first.dtype == out_dtype:
            src = self._tensor(run, first)
            self._wrote_tensor(run, ins.out)
            (slo, shi), (olo, ohi) = first.byte_span(), ins.out.byte_span()
            if first.shape == ins.out.shape and (shi <= olo or ohi <= slo):
                # Disjoint bytes of the same shape: the copy reads each source byte before any is written.
                def copy_disjoint(memory: Any, dma_addresses: dict) -> None:
                    out[...] = src

                return copy_disjoint

            def copy_bits(memory: Any, dma_addresses: dict) -> None:  # a copy moves bits
                out[...] = np.broadcast_to(np.array(src), out.shape)

            return copy_bits
        fn = vector_ops.ELEMENTWISE[op]
        binary = op in vector_ops.BINARY
        if _computes_in_fp32(ins):
            return self._fp32_elementwise(run, ins, out, fn)
        readers = [_constant(vector_ops.scalar(x.value)) if isinstance(x, Scalar) else self._reader(run, x)
                   for x in ins.inputs]
        self._wrote_tensor(run, ins.out)

        def elementwise(memory: Any, dma_addresses: dict) -> None:
            values = [read() for read in readers]
            values = vector_ops.promote(op, values)
            if binary:
                self._integer_check(run, ins, values)
            out[...] = vector_ops.encode(fn(*values), out_dtype)  # numpy broadcasts a smaller result

        return elementwise

    def _fp32_elementwise(self, run, ins: Elementwise, out: np.ndarray, fn: Callable) -> Step:
        """An op on floats computed in fp32 (see :func:`_computes_in_fp32`): ``promote`` would change
        nothing and no integer check applies, so the step skips both, and reads an fp32 tensor as the
        scratchpad view itself (the vector ops never write their inputs)."""
        values = [np.asarray(vector_ops.scalar(x.value), dtype=np.float32) if isinstance(x, Scalar)
                  else self._tensor(run, x) if x.dtype == "float32" else None for x in ins.inputs]
        readers = [None if v is not None else self._reader(run, x) for v, x in zip(values, ins.inputs)]
        self._wrote_tensor(run, ins.out)
        out_dtype = ins.out.dtype
        encode = vector_ops.encode
        if all(r is None for r in readers) and out_dtype == "float32" and ins.out.numel:
            nan = vector_ops.DEFAULT_NAN

            def fp32_views(memory: Any, dma_addresses: dict) -> None:
                result = fn(*values)
                if np.isnan(result.min()):  # min propagates NaN: one cheap pass when there is none
                    result = np.where(np.isnan(result), nan, result)
                out[...] = result

            return fp32_views

        def fp32_elementwise(memory: Any, dma_addresses: dict) -> None:
            out[...] = encode(fn(*[v if r is None else r() for v, r in zip(values, readers)]), out_dtype)

        return fp32_elementwise

    def _integer_check(self, run, ins: Elementwise, values: list[np.ndarray]) -> None:
        problem = vector_ops.integer_operand_error(ins.op, *values)
        if problem is None:
            return
        if len(run) > 1:  # name the first core whose values are bad
            for j, (core, index) in enumerate(run):
                if vector_ops.integer_operand_error(ins.op, *(v[j] if v.ndim else v for v in values)):
                    raise ExecutionError(problem, core, self.origin[core][index], ins)
        raise ExecutionError(problem, run[0][0], self.origin[run[0][0]][run[0][1]], ins)

    def _matmul(self, run, ins: MatMul) -> Step:
        read_a, read_b, read_out = self._reader(run, ins.a), self._reader(run, ins.b), self._reader(run, ins.out)
        out, dout = self._tensor(run, ins.out), ins.out.dtype
        self._wrote_tensor(run, ins.out)
        floats = ins.a.dtype in vector_ops.FLOAT_DTYPES or ins.b.dtype in vector_ops.FLOAT_DTYPES
        kind = np.float32 if floats else np.int64
        if (ins.a.dtype in vector_ops.FLOAT_DTYPES and ins.b.dtype in vector_ops.FLOAT_DTYPES
                and dout == "float32" and ins.out.numel):
            # The float matmuls' common case: the reads are fp32 already and ``encode`` to fp32 only
            # writes every NaN as one NaN; inlined here (thousands of small steps per forward).
            nan, accumulate = vector_ops.DEFAULT_NAN, ins.accumulate

            def matmul_fp32(memory: Any, dma_addresses: dict) -> None:
                result = np.matmul(read_a(), read_b())
                if accumulate:
                    np.add(result, read_out(), out=result)
                if np.isnan(result.min()):
                    result = np.where(np.isnan(result), nan, result)
                out[...] = result

            return matmul_fp32

        def matmul(memory: Any, dma_addresses: dict) -> None:
            result = np.matmul(read_a().astype(kind, copy=False), read_b().astype(kind, copy=False))
            if ins.accumulate:
                np.add(result, read_out(), out=result)  # result is the step's own array
            out[...] = vector_ops.encode(result, dout)

        return matmul

    def _chain(self, run, chain: Chain) -> Step:
        """A matmul K loop as one step (``chains``): every member's A and B tile decoded from device
        memory (:class:`chains.DeviceTileReader`), their products as numpy's stacks of one single-threaded
        GEMM per (core, member), of the very shapes and contiguity each member's step has (one stack per
        run of members whose tiles are views of one array on both sides), then summed in the members'
        order, each add the step's own ``P_k + out`` (one fp32 add of the same two values). NaNs become
        the one NaN at the end: NaN is sticky under +, so the final NaNs are the steps' NaNs."""
        out = self._tensor(run, chain.out)
        self._wrote_tensor(run, chain.out)
        read_a, read_b = self._device_reader(chain.a, len(run)), self._device_reader(chain.b, len(run))
        nan, initial, ncores = vector_ops.DEFAULT_NAN, chain.initial, len(run)
        before = out if ncores > 1 else out[None]
        members, mn = chain.members, (chain.a.shape[0], chain.b.shape[1])

        def matmul_chain(memory: Any, dma_addresses: dict) -> None:
            a, b = read_a(), read_b()
            if len(a) == 1 and len(b) == 1:
                products = np.matmul(a[0][1], b[0][1])  # (cores or 1, members, M, N)
            else:  # (the same GEMMs, one batch per run of members that are views of one array each)
                products = np.empty((max(a[0][1].shape[0], b[0][1].shape[0]), members, *mn), np.float32)
                for j, k, a_tiles, b_tiles in segments(a, b, members):
                    np.matmul(a_tiles, b_tiles, out=products[:, j:k])
            total = products[:, 0]
            if initial:
                total = np.add(total, before)  # the first step's P_0 + out
            for k in range(1, products.shape[1]):
                np.add(products[:, k], total, out=total)
            if np.isnan(total.min()):
                total = np.where(np.isnan(total), nan, total)
            out[...] = total if ncores > 1 else total[0]

        return matmul_chain

    def _device_reader(self, tile: DeviceTile, ncores: int) -> DeviceTileReader:
        def count(n: int) -> None:
            self.decoded_elements += n

        reader = DeviceTileReader(tile, ncores, self._regions, self._device_tiles, count)
        self.device_readers.append(reader)
        return reader

    def _reduce(self, run, ins: Reduce) -> Step:
        read_inp, out = self._reader(run, ins.inp), self._tensor(run, ins.out)
        self._wrote_tensor(run, ins.out)
        axis = ins.axis
        reduce, combine = vector_ops.REDUCE[ins.op]

        def reduce_step(memory: Any, dma_addresses: dict) -> None:
            x = read_inp()
            if x.dtype == np.bool_:
                x = x.astype(np.int64)
            result = reduce(x, axis=axis, keepdims=True)
            if ins.accumulate:
                result = combine(vector_ops.decode(out, ins.out.dtype), result)
            out[...] = vector_ops.encode(result, ins.out.dtype)

        return reduce_step


def _computes_in_fp32(ins: Elementwise) -> bool:
    """True when ``promote`` would bring every input to fp32 and the result is a float: every tensor
    input is float32 or DLFloat16 (read as fp32), and the op is neither ``where`` (its condition keeps
    its type) nor a comparison. (``cast`` is not promoted: its fp32 input is computed on as it is.)"""
    op = ins.op
    if op == "where" or op in vector_ops.BOOL_RESULT_OPS:
        return False
    tensors = [x for x in ins.inputs if isinstance(x, SpTensor)]
    return bool(tensors) and all(x.dtype in vector_ops.FLOAT_DTYPES for x in tensors)


def _same_bits(tile: np.ndarray, candidates: list[tuple], slots: list) -> tuple[int, np.ndarray] | None:
    """The first candidate (see ``FastPlan._same_bits_candidates``) already decoded this run whose bits
    are ``tile``'s: (its index, its decoded values), or None."""
    for k, (slot, j, bits) in enumerate(candidates):
        values = slots[slot]
        if values is not None and equal_bits(tile, bits):
            return k, values if j is None else values[j]
    return None


def _byte_offset(view: np.ndarray, block: np.ndarray) -> int:
    """Where ``view`` starts in ``block``'s buffer, in bytes."""
    return view.__array_interface__["data"][0] - block.__array_interface__["data"][0]


def _constant(value: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: value


def _read(view: np.ndarray, dtype: str) -> np.ndarray:
    """``vector_ops.decode`` without its copy where the scratchpad already holds the computed type: the
    vector ops never write their inputs, and the result is computed whole before it is stored."""
    if dtype == "float32" or dtype == "bool":
        return view
    return vector_ops.decode(view, dtype)


def even_runs(cores: Sequence[int], offsets: Sequence[int] | None = None) -> list[list[int]]:
    """Split positions 0..n-1 into maximal runs whose cores (and ``offsets``, if given) step evenly, so
    that each run is one strided view. ``cores`` are increasing."""
    runs: list[list[int]] = []
    for j in range(len(cores)):
        cur = runs[-1] if runs else None
        if cur and _extends(cur, j, cores, offsets):
            cur.append(j)
        else:
            runs.append([j])
    return runs


def _extends(run: list[int], j: int, cores: Sequence[int], offsets: Sequence[int] | None) -> bool:
    last = run[-1]
    if len(run) == 1:
        return True
    first, second = run[0], run[1]
    if cores[j] - cores[last] != cores[second] - cores[first]:
        return False
    return offsets is None or offsets[j] - offsets[last] == offsets[second] - offsets[first]
