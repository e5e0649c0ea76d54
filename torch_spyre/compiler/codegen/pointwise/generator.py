"""The pointwise generator's driver: aliases (loads served from values of this kernel), the division of
the outer space over the cores, the tile search (shrink until the scratchpad plan fits), the schedule of
each tile, emission, the scratchpad plan and the decisions recorded in the program."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from ....card import costs
from ....card.layout import sorted_unique
from ....program import TRANSCENDENTAL_OPS, Operand, Program, dram_spans, row_major_strides
from ... import access, optimizations
from ...access import TensorView
from ...core_count import cores_for, dma_cycles
from ...decisions import BufferDecision
from ...placement import cores_near_memory
from ...kernel_ir import KernelSpec, LoweringError
from ...scratchpad import ScratchpadOverflowError, SpBuffer, plan
from .analysis import Chunk, KernelGen
from .emit import Emitter
from .reduce import Reducer
from .schedule import Scheduler, Step
from .sym import SymInstr
from .tiling import boxes, core_boxes, shrink, shrink_outer, split_counts
from .values import AddressSpanError, itemsize


# Kernels whose first core's box has fewer elements (x times reduction chunk) build every tile attempt.
_PROOF_MIN_ELEMENTS = 1 << 18


class PointwiseGenerator(Emitter, Reducer, KernelGen):
    """Builds the program of one pointwise/reduction kernel."""

    # Divide over every available core instead of the core count's (see :func:`generate`).
    spread = False

    def generate(self) -> Program:
        spec = self.spec
        if any(n == 0 for n in spec.x_sizes + spec.r_sizes):
            raise LoweringError(f"kernel {spec.name} has an empty iteration space; the wrapper skips it")
        self.aliases = self._find_aliases()
        self.dag.set_aliases(self.aliases)
        self._value_memo: dict[tuple[str, int], Any] = {}  # emit.py's per-value answers, for these aliases
        self.direct, self.elided = self._direct_stores()
        cboxes = self._divide()
        tried = []
        tx = list(cboxes[0][1])
        tr = list(self.spec.r_sizes)
        lanes = max(self.factors) if self.factors else 64
        while True:
            tried.append({"tile": list(tx), "rchunk": list(tr)})
            proof = self._overflow_proof(cboxes, tuple(tx), tuple(tr))
            try:
                if proof is not None:
                    raise proof
                cores, base, sp_plan, persistent = self._build(cboxes, tuple(tx), tuple(tr))
                break
            except ScratchpadOverflowError as err:
                last = err
                at_least = "at least " if err is proof else ""
                tried[-1]["result"] = f"needs {at_least}{err.needed} B > {err.capacity} B"
            if not shrink(tx, lanes) and not shrink(tr, lanes):
                err = ScratchpadOverflowError(last.needed, last.capacity, last.live, last.step)
                err.add_note(f"kernel {spec.name}: even the smallest tile (x {tx}, reduction chunk {tr}) does "
                             f"not fit the {last.capacity} plannable scratchpad bytes "
                             "(config.scratchpad_plannable_bytes)")
                raise err from None
        program = Program(spec.name, self._operands(), {c: [si.place(base) for si in ins] for c, ins in cores.items()})
        self._check_span(program)
        self._record(cboxes, tx, tr, persistent, sp_plan, tried, program)
        program.metadata["decisions"] = self.decisions.to_dict()
        program.metadata["source_ops"] = list(spec.source_ops)
        return program

    # --- the tile search's shortcut -------------------------------------------------------------------
    def _overflow_proof(self, cboxes, tx, tr) -> ScratchpadOverflowError | None:
        """An overflow the full build of tile ``tx`` (and reduction chunk ``tr``) is certain to hit, found
        from the first tiles of the first core alone, or None (then the build decides). Every load and
        store buffer is live for the whole program and at least as large as the sticks any part of a tile
        touches, so their sizes over the first tiles (huge tiles: a leading part of them) add up to a lower
        bound of the plan's peak (``scratchpad._max_live_bytes``): above the capacity, the build would
        overflow. A big tensor's first attempts (a tile the size of the core's box) are refused this way
        at the cost of a few stick counts instead of generating the whole program each time. Small
        kernels skip it (their build is cheap)."""
        xo, xs = cboxes[0]
        rn = math.prod(tr) if tr else 1
        if math.prod(xs) * rn < _PROOF_MIN_ELEMENTS:
            return None
        cap = self.config.scratchpad_plannable_bytes
        persistent = self._persistent(tr)
        sched = Scheduler(self.dag, self.aliases, persistent)
        steps: list[Step] = []
        for t, (txo, txs) in enumerate(boxes(xo, xs, tx)[:2]):  # two tiles: both load parities
            part = list(txs)
            while math.prod(part) * rn > cap and shrink_outer(part):
                pass
            steps.extend(self._tile_steps(sched, t, txo, tuple(part), tr, persistent, with_boxes=False))
            self._assign_loads(steps, persistent)
            sizes: dict[str, int] = {}
            for s in steps:
                named = [(f"ld{g}.{s.parity}", g) for g in (s.loads if s.load_from is s else [])]
                named += [(f"st{g}", g) for g in s.values if self.dag.values[g].op == "store"
                          and self.dag.values[g].attrs["buffer"] not in self.spec.internal]
                for name, g in named:
                    a = s.chunk.accesses[g]
                    if a.sticks is not None:
                        sizes[name] = max(sizes.get(name, 0), a.sticks.nbytes)
            need = sum(sizes.values())
            if need > cap:
                return ScratchpadOverflowError(need, cap, [SpBuffer(n, b) for n, b in sorted(sizes.items())], -1)
        return None

    # --- aliases (loads served from values of this kernel) ----------------------------------------
    def _find_aliases(self) -> dict[int, int]:
        if not any(self.dag.stored.get(v.attrs.get("buffer")) for v in self.dag.values if v.op == "load"):
            return {}
        spec = self.spec
        xs = tuple(spec.x_sizes)
        ch = Chunk(0, 0, tuple(0 for _ in xs), xs, tuple(0 for _ in spec.r_sizes), tuple(spec.r_sizes))
        ch.accessed = [v.gid for v in self.dag.values if v.op in ("load", "store")]
        self.analyse(ch, outer_only=True, with_boxes=False, host_only=True)
        aliases = {g: a.alias for g, a in ch.accesses.items() if a.alias is not None}
        self._merge_equal_loads(ch, aliases)
        return aliases

    def _merge_equal_loads(self, ch: Chunk, aliases: dict[int, int]) -> None:
        """With the whole iteration space analysed (``ch``), loads of the same elements in different
        nodes (a softmax reads x in its max, sum and normalising nodes) and loads served from scratchpad
        become one value each, and the ops above them merge too (``Dag.merge``)."""
        canon: dict[int, int] = dict(aliases)
        seen: dict[tuple, int] = {}
        for gid in sorted(ch.accesses):
            a = ch.accesses[gid]
            if self.dag.values[gid].op != "load" or gid in aliases or a.host is None:
                continue
            key = (a.buffer, a.extent, a.host.shape, a.host.tobytes(), None if a.valid is None else a.valid.tobytes())
            if key not in seen:
                seen[key] = gid
                continue
            guards = self._equal_guards(ch, seen[key], gid)
            if guards is not None:
                canon[gid] = seen[key]
                canon.update(guards)
        self.dag.merge(canon)

    def _equal_guards(self, ch: Chunk, keep: int, drop: int) -> dict[int, int] | None:
        """Load ``drop``'s guards as ``keep``'s (``{drop's guard: keep's}``), or None when they cannot be shown
        equal. A guard is a static mask, and ``where(mask, a, b)`` drops ``mask`` from ``a``'s guards by
        identity (``Dag._guards``): the masked load of a cat read by a reduction node (``r0 < 8``) and by a
        pointwise node over the same elements (``x3 < 8``) has one mask per node, so merging the loads
        without merging the masks left the pointwise node's values under a mask its ``where`` never drops,
        and with the other branch's they were never computed (gpt_oss's attention sinks: the whole
        ``logits - max`` was zeros). Each pair must be equal over the whole space in every extent
        the dropped one is used in."""
        kept, dropped = (self.dag.values[g].attrs.get("guards", []) for g in (keep, drop))
        if len(kept) != len(dropped):
            return None
        same: dict[int, int] = {}
        for k, d in zip(kept, dropped):
            if k == d:
                continue
            for outer in (False, True):
                if outer and not (self._used_in(d, "outer") or self._used_in(k, "outer")):
                    continue
                try:
                    equal = np.array_equal(self.static_over(ch, k, outer), self.static_over(ch, d, outer))
                except (LoweringError, ValueError):  # not defined in that extent (access.AccessError)
                    equal = False
                if not equal:
                    return None
            same[d] = k
        return same

    # --- work division ----------------------------------------------------------------------------
    def _divide(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Core boxes over x such that every output stick has one owner (checked numerically), on as
        many cores as the work is worth (``core_count``)."""
        sizes = list(self.spec.x_sizes)
        self.core_count = cores_for(self._work_cycles(), self.config)
        unit = max(self.factors) if self.factors else 64
        # The rule's count first; if no division of it gives every output stick one owner, the powers of
        # two below it (they cut flattened rows at row boundaries more often: 6144 elements of 96-wide
        # rows split into 20 parts share sticks, into 16 they do not), then one box.
        rule = self.core_count.available if self.spread else self.core_count.cores
        for cores in [rule] + [c for c in (16, 8, 4, 2) if c < rule]:
            for u in (1, unit):
                cboxes = core_boxes(sizes, split_counts(sizes, cores, u), u)
                if len(cboxes) <= 1 or self._owners_disjoint(cboxes):
                    self.division = {"unit": u}
                    return cboxes
        u = sizes[-1] if sizes else 1
        cboxes = core_boxes(sizes, split_counts(sizes, rule, u), u)
        if len(cboxes) <= 1 or self._owners_disjoint(cboxes):
            self.division = {"unit": u}
            return cboxes
        self.division = {"unit": "single core"}
        return core_boxes(sizes, [1] * len(sizes), 1)

    def _work_cycles(self) -> float:
        """The kernel's work for ``core_count``, from its DAG without analysing any access: DMA cycles
        to read each input and write each output once (the elements the iteration space reaches, with
        the layout's stick padding), plus one vector pass per computed value over its extent."""
        spec = self.spec
        x = math.prod(spec.x_sizes)
        full = x * math.prod(spec.r_sizes)
        elements = {"full": full, "outer": x}
        used = self._used_values()
        moved = 0.0
        for buf, _op in {(self.dag.values[g].attrs["buffer"], self.dag.values[g].op) for g in used
                         if self.dag.values[g].op in ("load", "store") and g not in self.aliases}:
            if buf in spec.internal:
                continue
            layout = self.places[buf].layout
            reached = min(math.prod(spec.buffer(buf).size), full)
            moved += layout.nbytes * min(1.0, reached / layout.numel)
        vector = 0
        for g in used:
            v = self.dag.values[g]
            if v.op in ("load", "store", "const", "static", "indirect") or v.extent not in elements:
                continue
            n = full if v.op == "reduction" else elements[v.extent]
            vector += costs.vector_cycles(self.config, n, itemsize(v.sp_dtype), v.op in TRANSCENDENTAL_OPS)
        return dma_cycles(self.config, moved) + vector

    def _used_values(self) -> set[int]:
        """Values the stores need (merged duplicates stay in the DAG unused)."""
        todo = [v.gid for v in self.dag.values if v.op == "store"]
        seen: set[int] = set()
        while todo:
            g = todo.pop()
            if g in seen:
                continue
            seen.add(g)
            v = self.dag.values[g]
            todo += self.dag.inputs(v) + [a for a in v.attrs.get("guards", [])]
            if g in self.aliases:
                todo.append(self.aliases[g])
        return seen

    def _owners_disjoint(self, cboxes) -> bool:
        for v in (v for v in self.dag.values if v.op == "store" and v.attrs["buffer"] not in self.spec.internal):
            whole = self._store_sticks(v)
            lo, hi = self._store_stick_range(v)
            # One mark per stick owned so far: a box's sticks already marked belong to an earlier box. A
            # division that shares a stick usually does so between its first boxes, and stops there.
            owned = np.zeros(hi - lo + 1, dtype=bool) if hi - lo < 4 * whole.size else None
            sticks = []
            for xo, xs in cboxes:
                box = sorted_unique(whole[tuple(slice(o, o + n) for o, n in zip(xo, xs))])
                if owned is None:
                    sticks.append(box)
                    continue
                if owned[box - lo].any():
                    return False
                owned[box - lo] = True
            if owned is None:
                allst = np.concatenate(sticks)
                if sorted_unique(allst).size != allst.size:
                    return False
        return True

    def _store_stick_range(self, v) -> tuple[int, int]:
        cache = self.__dict__.setdefault("_store_stick_ranges", {})
        if v.gid not in cache:
            whole = self._store_sticks(v)
            cache[v.gid] = (int(whole.min()), int(whole.max())) if whole.size else (0, -1)
        return cache[v.gid]

    _STICKS_CHUNK = 1 << 22  # elements evaluated at once by _store_sticks (bounds its temporaries)

    def _store_sticks(self, v) -> np.ndarray:
        """The device stick each element of store ``v`` writes, over the whole iteration space (x dims,
        then r dims unless the store is outer), computed once per kernel: every division the search tries
        slices it instead of evaluating the index again (a 12800 x 4096 weight's relayout tried five)."""
        cache = self.__dict__.setdefault("_store_sticks_cache", {})
        if v.gid in cache:
            return cache[v.gid]
        outer = self.dag.values[v.args[0]].extent == "outer" or self.spec.nodes[v.node].placement == "outer"
        place = self.places[v.attrs["buffer"]]
        xs, rs = tuple(self.spec.x_sizes), tuple(self.spec.r_sizes)
        shape = xs if outer else xs + rs
        out = np.empty(shape, dtype=np.int64)
        inner = math.prod(shape[1:])
        rows = max(1, self._STICKS_CHUNK // max(inner, 1))  # chunks of the first x dim
        ro = tuple(0 for _ in rs)
        for r0 in range(0, xs[0], rows):
            n = min(rows, xs[0] - r0)
            e = self.node_env(v.node, (r0,) + (0,) * (len(xs) - 1), (n,) + xs[1:], ro, rs, outer)
            dev = access.device_elements(place, access.evaluate(v.attrs["index"], e), f"store to {v.attrs['buffer']}")
            out[r0:r0 + n] = np.broadcast_to(dev // place.lanes, (n,) + shape[1:])
        cache[v.gid] = out
        return out

    # --- building -----------------------------------------------------------------------------------
    def _persistent(self, tr) -> bool:
        """Whether the reduction's rows stay in scratchpad between its passes: when the whole reduction fits
        one chunk, unless the ``scratchpad_planning`` optimization is switched off (then every pass loads
        its rows from device memory again, as a chunked reduction does)."""
        return tuple(tr) == tuple(self.spec.r_sizes) and optimizations.enabled("scratchpad_planning")

    def _build(self, cboxes, tx, tr):
        persistent = self._persistent(tr)
        # the iota (argmax/argmin positions) covers one reduction chunk
        self._iota_span = 1 + sum((t - 1) * st for t, st in zip(tr, row_major_strides(self.spec.r_sizes)))
        sched = Scheduler(self.dag, self.aliases, persistent)
        cores: dict[int, list[SymInstr]] = {}
        for core, (xo, xs) in zip(cores_near_memory(len(cboxes), self.config), cboxes):
            steps: list[Step] = []
            for t, (txo, txs) in enumerate(boxes(xo, xs, tx)):
                steps.extend(self._tile_steps(sched, t, txo, txs, tr, persistent))
            self._assign_loads(steps, persistent)
            cores[core] = self._emit_core(steps)
        base, sp_plan = self._place(cores)
        return cores, base, sp_plan, persistent

    def _tile_steps(self, sched: Scheduler, t, txo, txs, tr, persistent: bool, with_boxes: bool = True) -> list[Step]:
        spec, dag = self.spec, self.dag
        steps: list[Step] = []
        done: set[int] = set()
        rzero = tuple(0 for _ in spec.r_sizes)
        rchunks = boxes(rzero, tuple(spec.r_sizes), tuple(tr)) if spec.r_sizes else [((), ())]
        pre = sched.closure(sched.outer_roots(-1), "outer", done)
        if pre:
            ch = Chunk(t, -1, txo, txs, rzero, tuple(spec.r_sizes))
            ch.run_outer = pre
            steps.append(Step("outer", -1, ch, pre))
            done |= set(pre)
        for p in range(dag.n_phases):
            roots = sched.full_roots(p)
            keep = done if persistent else {g for g in done if dag.values[g].extent != "full"}
            run = sched.closure(roots, "full", keep)
            if run:
                for ro, rs in rchunks:
                    ch = Chunk(t, p, txo, txs, ro, rs)
                    ch.run_full = run
                    steps.append(Step("full", p, ch, run))
                done |= set(run)
            post = sched.closure(sched.outer_roots(p), "outer", done - self._views_only(done))
            if post:
                ch = Chunk(t, p, txo, txs, rzero, tuple(spec.r_sizes))
                ch.run_outer = post
                steps.append(Step("outer", p, ch, post))
                done |= set(post)
        tile_accesses = sorted({g for s in steps for g in s.values if dag.values[g].op in ("load", "store")})
        for s in steps:
            if persistent and s.kind == "full":
                s.chunk.accessed = [g for g in tile_accesses if dag.values[g].extent == "full"
                                    or dag.values[g].op == "store" and dag.values[dag.values[g].args[0]].extent == "full"]
            self.analyse(s.chunk, outer_only=s.kind == "outer", with_boxes=with_boxes)
        return steps

    def _views_only(self, done: set[int]) -> set[int]:
        """Outer values among ``done`` that compute nothing: loads, and casts that are only views of them
        (``_cast_alias``: a 16-bit load read as fp32). An outer step after a reduction reads them again
        through its own boxes (a box has views only of its step's accesses), so its closure takes them
        back. Without this, a 16-bit (C,) vector cast before the first pass (e.g. the saved mean in a batch
        norm backward) had no view in the epilogue's boxes: "load ... has no view in this box"."""
        out: set[int] = set()
        for g in sorted(done):
            v = self.dag.values[g]
            if v.extent != "outer":
                continue
            if v.op == "load" and g not in self.aliases:
                out.add(g)
            elif v.op == "to_dtype" and v.args[0] in out and self._cast_alias(v):
                out.add(g)
        return out

    def _assign_loads(self, steps: list[Step], persistent: bool) -> None:
        """Which step's DMA group loads each access, and its buffer parity (double buffering)."""
        parity = 0
        owners: dict[tuple[int, str], Step] = {}
        for s in steps:
            loads = [g for g, a in s.chunk.accesses.items()
                     if self.dag.values[g].op == "load" and a.alias is None and a.sticks is not None]
            key = (s.chunk.tile, s.kind) if persistent else (id(s), s.kind)
            owner = owners.get(key)
            if owner is None:
                owner = owners[key] = s
                s.parity = parity
                s.loads = []
                if loads:
                    parity ^= 1
            s.load_from = owner  # type: ignore[attr-defined]
            s.parity = owner.parity
            for g in loads:
                if g not in owner.loads:
                    owner.loads.append(g)


    # --- the scratchpad plan ------------------------------------------------------------------------
    def _place(self, cores: dict[int, list[SymInstr]]):
        """Scratchpad offsets for every symbolic buffer: one liveness plan shared by all cores."""
        size: dict[str, int] = {}
        first: dict[str, int] = {}  # the earliest and latest tile step each buffer is used at
        last: dict[str, int] = {}
        for ins in cores.values():
            for si in ins:
                step = si.tile_step
                for sym in si.syms():
                    # a mask pattern (uint8) is as long as the pattern; uint8 data (a byte tensor) as its sticks
                    pattern = si.args.get("pattern") if sym.dtype == "uint8" else None
                    end = sym.rel + pattern.nbytes if pattern is not None else sym.end()
                    buf = sym.buf
                    if buf in size:
                        if end > size[buf]:
                            size[buf] = end
                        if step < first[buf]:
                            first[buf] = step
                        elif step > last[buf]:
                            last[buf] = step
                    else:
                        size[buf], first[buf], last[buf] = max(0, end), step, step
        bufs = []
        for name, n in sorted(size.items()):
            lo, hi = first[name], last[name]
            if name.startswith(("ld", "st")) or name in ("iota", "xiota") or (
                    name.startswith("v") and self.dag.values[int(name[1:])].op == "reduction"):
                lo, hi = -1, 1 << 30  # loads are double-buffered across tiles; accumulators span the tile
            elif self.dag.values[int(name[1:].split(".")[0])].extent == "outer" if name.startswith("v") else False:
                lo, hi = -1, 1 << 30
            bufs.append(SpBuffer(name, max(n, 1), lo, hi))
        sp_plan = plan(bufs, self.config.scratchpad_plannable_bytes)
        return {b.name: b.offset for b in sp_plan.buffers}, sp_plan

    # --- operands, checks, decisions --------------------------------------------------------------
    def _operands(self) -> list[Operand]:
        ops = []
        for b in self.spec.buffers:
            role = b.role
            if role == "inout" and all(v.gid in self.aliases for v in self.dag.values
                                       if v.op == "load" and v.attrs["buffer"] == b.name):
                role = "output"  # its reads in this kernel come from scratchpad
            access_kind = {"input": "in", "output": "out", "inout": "inout"}[role]
            ops.append(replace(self.places[b.name], name=b.name).operand(access_kind))
        return ops

    def _check_span(self, program: Program) -> None:
        limit = self.config.core_address_span_bytes
        for core, ins in program.cores.items():
            spans = dram_spans(ins)
            total = sum(hi - lo for lo, hi in spans.values())
            if total > limit:
                raise AddressSpanError(
                    f"kernel {self.spec.name}: core {core} would address {total} bytes of device memory "
                    f"({', '.join(f'{k}: {hi - lo} B' for k, (lo, hi) in spans.items())}), more than the "
                    f"{limit} bytes one core can reach in a kernel (config.core_address_span_bytes). "
                    "Split the tensor (smaller batch or sequence chunks) so each core's share fits."
                )

    def _record(self, cboxes, tx, tr, persistent, sp_plan, tried, program: Program) -> None:
        d = self.decisions
        for b in self.spec.buffers:
            d.buffers.append(BufferDecision(b.name, b.role, self.places[b.name].layout.describe()))
        d.work_division = {"cores": len(cboxes), "x": list(self.spec.x_sizes), "core_box": list(cboxes[0][1]) if cboxes else [],
                           **self.division}
        d.core_count = self.core_count.to_dict()
        n_instr = sum(len(v) for v in program.cores.values())
        d.tiling = {"tile": list(tx), "r_chunk": list(tr), "persistent_reduction": persistent,
                    "phases": self.dag.n_phases, "instructions": n_instr}
        d.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                        "buffers": {b.name: [b.offset, b.nbytes] for b in sp_plan.buffers}}
        d.overlap = {"double_buffered": sorted({b.name.split(".")[0] for b in sp_plan.buffers if b.name.startswith("ld")})}
        d.alternatives = tried[:-1]
        if self.aliases:
            d.notes.append(f"{len(self.aliases)} load(s) served from values computed in this kernel")
        if self.dag.n_phases > 1 and tuple(tr) == tuple(self.spec.r_sizes) and not persistent:
            d.notes.append("scratchpad_planning is switched off: every pass loads its rows from device memory "
                           "again instead of keeping them in scratchpad")



def generate(spec: KernelSpec, places: dict[str, TensorView], config: Any) -> Program:
    """The program of a pointwise/reduction kernel for tensors placed as ``places``. A kernel it cannot
    generate raises LoweringError naming the ATen ops and the user's source line it came from."""
    try:
        program = PointwiseGenerator(spec, places, config).generate()
        count = program.metadata["decisions"]["core_count"]
        if count["cores"] < count["available"] and not count["forced"]:
            program = _faster_of(program, _spread(spec, places, config), config)
        return program
    except LoweringError as e:
        raise type(e)(f"{e}{_provenance(spec)}") from None


def _spread(spec: KernelSpec, places: dict[str, TensorView], config: Any) -> Program | None:
    """The kernel divided over every available core, if that generates."""
    gen = PointwiseGenerator(spec, places, config)
    gen.spread = True
    try:
        return gen.generate()
    except (LoweringError, ScratchpadOverflowError):
        return None


def _faster_of(rule: Program, spread: Program | None, config: Any) -> Program:
    """The core count's program unless the card's timing model finds the one on every core faster: the
    count bounds what spreading can save (one DRAM latency), but the boxes it allows can still split the
    sticks worse (``benchmarks/small_kernels.py --wide``)."""
    from ....card.timing import time_program  # the card's own clock, used only to settle this choice

    if spread is None:
        return rule
    t_rule, t_spread = time_program(rule, config).total_s, time_program(spread, config).total_s
    kept = spread if t_spread < t_rule else rule
    kept.metadata["decisions"].setdefault("notes", []).append(
        f"simulated: {t_rule * 1e6:.3f} us on the core count's {len(rule.cores)} cores, {t_spread * 1e6:.3f} us "
        f"on {len(spread.cores)}: {len(kept.cores)} kept")
    return kept


def _provenance(spec: KernelSpec) -> str:
    ops = ", ".join(spec.source_ops) or "unknown ops"
    at = f" at {spec.source_lines[0]}" if spec.source_lines else ""
    return f" (kernel from {ops}{at})"
