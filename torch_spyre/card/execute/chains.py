"""Matmul K loops as one step, and scratchpad writes nothing reads: planning for the fast executor.

A matmul kernel's K loop is a *chain* of MatMul instructions on one ``out`` tile (the first may overwrite
it, the rest accumulate), each reading an A and a B tile that DMA loads (and ring sends) brought from
device memory. The fast executor runs each as its own step; this module finds the chains so that one
step computes them all, reading the tiles straight from device memory, and finds the DMA loads and ring
sends whose scratchpad bytes then nothing reads (dropped: a program's final scratchpad contents are not
observable, and the checked executor proved that no byte is read before it is written).

*Provenance*, followed at planning over the steps in their order: a scratchpad stick a DMA load wrote
holds the device bytes it was loaded from (operand, byte offset), a ring send copies that to the
destination core's sticks, and any other write forgets it. Only operands the program never stores to
qualify, so the device bytes a tile came from still hold its bits when the chain reads them later (an
operand stored to through an overlapping binding is the caller's to exclude: :attr:`Fusion.operands`).

A chain: MatMul steps over the same cores and the same ``out`` (float32; A and B DLFloat16), the first
with ``accumulate`` either way, the rest accumulating, with no other step reading or writing ``out``'s
bytes on those cores in between, and every element of every A and B tile mapped to a device element by
provenance, as one strided view per tile (its dims split at stick boundaries where needed). Run at the
last member's place, it gives what the steps give, bit for bit (see ``fast``'s ``_chain``).

Dead writes: walking the steps backward with the scratchpad sticks some later step reads (per core),
a DMA load or ring send none of whose destination sticks are read before being rewritten is dropped.
Reads are counted on whole sticks they touch, rewrites only on sticks written whole: both err towards
keeping a step.
"""

from __future__ import annotations

import functools
import itertools
import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .. import vector_ops
from .dma import offset_grid
from ...program import (SP_DTYPES, STICK_BYTES, DmaGather, DmaLoad, DmaStore, Elementwise, Instruction, MatMul, Program,
                        Reduce, RingSend, SpTensor)

# A chain of one MatMul is left to the plain step: nothing to batch over k.
MIN_CHAIN = 2


@dataclass(frozen=True)
class DeviceTile:
    """Where a chain's A (or B) tiles lie in device memory: element (core j, member k, *index) of the
    split shape is the uint16 at byte ``bases[k] + j * core_stride + sum(index * strides)`` of operand
    ``operand`` (``core_stride`` 0: every core reads the same bytes). ``shape`` is the tile's own
    (rows, cols); ``split`` is it with dims cut at stick boundaries, which a reshape undoes."""

    operand: int
    shape: tuple[int, ...]
    split: tuple[int, ...]
    strides: tuple[int, ...]
    core_stride: int
    bases: tuple[int, ...]

    @property
    def k_stride(self) -> int | None:
        """The step between members' bases when it is even (one view over all members), else None."""
        b = self.bases
        if len(b) < 2:
            return 0
        step = b[1] - b[0]
        return step if all(y - x == step for x, y in zip(b, b[1:])) else None

    @functools.cached_property
    def dense_bytes(self) -> int | None:
        """The bytes one core's members span when they fill that span exactly (no gap, no overlap: then the
        span's bytes are the tiles' bits, whatever order the tiles walk them in), else None."""
        k_stride = self.k_stride
        if k_stride is None:
            return None
        dims = sorted((st, n) for st, n in zip((k_stride, *self.strides), (len(self.bases), *self.split)) if n > 1)
        extent = 2  # (uint16 elements)
        for stride, n in dims:
            if stride != extent:
                return None
            extent *= n
        return extent


@dataclass(frozen=True)
class Chain:
    """Matmuls that run as one step at the last member's place: on cores ``cores``, into ``out``."""

    cores: tuple[int, ...]
    out: SpTensor
    initial: bool  # the first member accumulates: out's bytes before the chain are its starting value
    a: DeviceTile
    b: DeviceTile
    members: int


@dataclass
class Fusion:
    """What the fast plan changes, by (group number, unit number) as ``FastPlan._units`` numbers them."""

    chains: dict[tuple[int, int], Chain] = field(default_factory=dict)  # at the last member's place
    fused: set[tuple[int, int]] = field(default_factory=set)  # the other members: no step of their own
    dead: set[tuple[int, int]] = field(default_factory=set)  # DMA loads and ring sends dropped
    operands: set[int] = field(default_factory=set)  # operands chains read from device memory


@dataclass
class _Unit:
    reads: list[tuple[int, int, int]] = field(default_factory=list)  # (core, first stick, end stick)
    kills: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (core, sticks written whole)
    writes: list[tuple[int, int, int]] = field(default_factory=list)  # (core, first stick, end stick)
    droppable: bool = False


@dataclass
class _Open:
    key: tuple
    members: list[tuple[int, int]]  # (group, unit)
    tiles: list[tuple[list, list]]  # per member: per core (A's map, B's map)
    initial: bool
    span: tuple[int, int]  # out's bytes


def plan_fusion(program: Program, cores: dict[int, list[Instruction]], units: Sequence[tuple[Sequence, ...]],
                num_cores: int, pad_bytes: int) -> Fusion:
    """Chains and dead writes of ``program`` whose steps are ``units`` (per group, in order: each unit a
    list of (core, index into ``cores[core]``), as ``FastPlan._units`` splits the groups)."""
    stored = {i.dst.operand for _, _, i in program.instructions() if isinstance(i, DmaStore)}
    index = {o.name: j for j, o in enumerate(program.operands)}
    qualifying = {index[o.name] for o in program.operands if o.name not in stored}
    prov = _Provenance(num_cores, pad_bytes, qualifying, index)
    # Outs some core computes two matmuls into: only these can chain (mapping tiles costs planning time).
    seen: set[tuple] = set()
    repeated = {i.out for c, instrs in program.cores.items() for i in instrs if isinstance(i, MatMul)
                and ((c, i.out) in seen or seen.add((c, i.out)))}
    fusion = Fusion()
    opened: dict[tuple, _Open] = {}
    info: dict[tuple[int, int], _Unit] = {}
    order: list[tuple[int, int]] = []

    def close(key: tuple) -> None:
        ch = opened.pop(key)
        if len(ch.members) < MIN_CHAIN:
            return
        a = _device_tile([[pair[0] for pair in member] for member in ch.tiles])
        b = _device_tile([[pair[1] for pair in member] for member in ch.tiles])
        if a is None or b is None:
            return
        last = ch.members[-1]
        out = key[1]
        fusion.chains[last] = Chain(key[0], out, ch.initial, a, b, len(ch.members))
        fusion.fused.update(ch.members[:-1])
        fusion.operands.update((a.operand, b.operand))
        for m in ch.members:  # the chain reads no A or B sticks; the last member reads out if it starts from it
            info[m].reads = []
        if ch.initial:
            lo, hi = out.byte_span()
            info[last].reads = [(c, lo // STICK_BYTES, -(-hi // STICK_BYTES)) for c in key[0]]

    for g, members_of in enumerate(units):
        for u, run in enumerate(members_of):
            ins = [cores[c][i] for c, i in run]
            unit = _effects(ins, run, prov.sticks)
            where = (g, u)
            info[where] = unit
            order.append(where)
            key = None
            if isinstance(ins[0], MatMul) and ins[0].out in repeated:
                key, tiles = _chain_member(ins[0], run, prov)
            run_cores = {c for c, _ in run} | {c for c, _, _ in unit.writes} | {c for c, _, _ in unit.reads}
            for k in [k for k, ch in opened.items() if k != key and _touches(unit, run_cores, k[0], ch.span)]:
                close(k)
            if key is not None:
                ch = opened.get(key)
                if ch is not None and not ins[0].accumulate:
                    close(key)
                    ch = None
                if tiles is None:
                    if ch is not None:
                        close(key)
                elif ch is None:
                    opened[key] = _Open(key, [where], [tiles], ins[0].accumulate, ins[0].out.byte_span())
                else:
                    ch.members.append(where)
                    ch.tiles.append(tiles)
            prov.apply(ins, run)
    for k in list(opened):
        close(k)
    _dead_writes(order, info, fusion, num_cores, pad_bytes)
    return fusion


def _touches(unit: _Unit, cores: set[int], chain_cores: tuple[int, ...], span: tuple[int, int]) -> bool:
    """Whether the unit reads or writes any of ``span``'s sticks on the chain's cores."""
    lo, hi = span[0] // STICK_BYTES, -(-span[1] // STICK_BYTES)
    mine = set(chain_cores)
    if not cores & mine:
        return False
    return any(c in mine and s < hi and lo < e for c, s, e in (*unit.reads, *unit.writes))


def _chain_member(ins: MatMul, run: Sequence[tuple[int, int]], prov: "_Provenance"):
    """(key, per core (A's device map, B's device map)) of a MatMul that could join a chain; tiles None
    when some element of A or B has no provenance. key None: this MatMul never chains."""
    if not (ins.out.dtype == "float32" and ins.a.dtype == "dlfloat16" and ins.b.dtype == "dlfloat16"
            and ins.out.numel and ins.a.numel and ins.b.numel):
        return None, None
    olo, ohi = ins.out.byte_span()
    if any(lo < ohi and olo < hi for lo, hi in (ins.a.byte_span(), ins.b.byte_span())):
        return None, None
    cores = [c for c, _ in run]
    key = (tuple(cores), ins.out)
    a = prov.device_maps(cores, ins.a)
    b = prov.device_maps(cores, ins.b) if a is not None else None
    return key, None if b is None else list(zip(a, b))


def _effects(ins: list[Instruction], run, sticks: int) -> _Unit:
    """The sticks a unit reads and writes on each core (reads and writes outward to whole sticks; kills
    only sticks written whole)."""
    unit = _Unit()

    def span(t: SpTensor) -> tuple[int, int]:
        lo, hi = t.byte_span()
        return lo // STICK_BYTES, -(-hi // STICK_BYTES)

    for (c, _), x in zip(run, ins):
        if isinstance(x, DmaLoad):
            lo, hi = x.pattern.sp_range(x.sp_offset)
            unit.writes.append((c, lo // STICK_BYTES, -(-hi // STICK_BYTES)))
            whole = _whole_sticks(x)
            if whole is not None:
                unit.kills.append((c, whole))
            unit.droppable = True
        elif isinstance(x, DmaStore):
            lo, hi = x.pattern.sp_range(x.sp_offset)
            unit.reads.append((c, lo // STICK_BYTES, -(-hi // STICK_BYTES)))
        elif isinstance(x, RingSend):
            unit.reads.append((c, x.src_offset // STICK_BYTES, -(-(x.src_offset + x.nbytes) // STICK_BYTES)))
            lo, hi = x.dst_offset, x.dst_offset + x.nbytes
            unit.writes.append((x.dst_core, lo // STICK_BYTES, -(-hi // STICK_BYTES)))
            if lo % STICK_BYTES == 0 and hi % STICK_BYTES == 0:
                unit.kills.append((x.dst_core, np.arange(lo // STICK_BYTES, hi // STICK_BYTES)))
            unit.droppable = True
        elif isinstance(x, DmaGather):
            unit.reads.append((c, *span(x.index)))
            lo, hi = x.sp_range()
            unit.writes.append((c, lo // STICK_BYTES, -(-hi // STICK_BYTES)))
        elif isinstance(x, (Elementwise, Reduce, MatMul)):
            ins_in = (x.inputs if isinstance(x, Elementwise) else (x.inp,) if isinstance(x, Reduce) else (x.a, x.b))
            for t in ins_in:
                if isinstance(t, SpTensor):
                    unit.reads.append((c, *span(t)))
            if getattr(x, "accumulate", False):
                unit.reads.append((c, *span(x.out)))
            unit.writes.append((c, *span(x.out)))
        else:  # an instruction this planning does not know: it reads and writes everything
            whole = (0, sticks)
            unit.reads.append((c, *whole))
            unit.writes.append((c, *whole))
    return unit


@functools.lru_cache(maxsize=4096)
def _whole_sticks(x: DmaLoad) -> np.ndarray | None:
    """The scratchpad sticks a DMA load writes, when each is a whole, aligned stick (else None; read-only).
    (Memoized: planning asks for each load twice, for its effects and for its provenance.)"""
    p = x.pattern
    if x.sp_offset % STICK_BYTES or any(s % STICK_BYTES for s in p.sp_strides):
        return None
    sticks = offset_grid(x.sp_offset, p.shape, p.sp_strides).reshape(-1) // STICK_BYTES
    sticks.flags.writeable = False
    return sticks


class _Provenance:
    """Per core and scratchpad stick: the operand (-1: none) and device byte offset it was loaded from."""

    def __init__(self, num_cores: int, pad_bytes: int, qualifying: set[int], index: dict[str, int]):
        self.sticks = pad_bytes // STICK_BYTES
        self.operand = np.full((num_cores, self.sticks), -1, dtype=np.int32)
        self.offset = np.zeros((num_cores, self.sticks), dtype=np.int64)
        self.qualifying = qualifying  # operands never stored to: their bytes do not change during a run
        self.index = index  # operand name -> index

    def forget(self, core: int, lo: int, hi: int) -> None:
        self.operand[core, lo // STICK_BYTES:-(-hi // STICK_BYTES)] = -1

    def apply(self, ins: list[Instruction], run) -> None:
        """The unit's writes, in order: what they leave in the sticks they write."""
        for (c, _), x in zip(run, ins):
            if isinstance(x, DmaLoad):
                p = x.pattern
                sticks = _whole_sticks(x)
                j = self.index.get(x.src.operand, -1)
                unique = sticks is not None and len(np.unique(sticks)) == sticks.size
                if unique and j in self.qualifying:
                    self.operand[c, sticks] = j
                    self.offset[c, sticks] = offset_grid(x.src.offset, p.shape, p.dram_strides).reshape(-1)
                elif p.sticks:
                    self.forget(c, *p.sp_range(x.sp_offset))
            elif isinstance(x, RingSend):
                lo, hi, src = x.dst_offset, x.dst_offset + x.nbytes, x.src_offset
                if lo % STICK_BYTES == 0 and hi % STICK_BYTES == 0 and src % STICK_BYTES == 0:
                    d, s, n = lo // STICK_BYTES, src // STICK_BYTES, x.nbytes // STICK_BYTES
                    self.operand[x.dst_core, d:d + n] = self.operand[c, s:s + n]
                    self.offset[x.dst_core, d:d + n] = self.offset[c, s:s + n]
                else:
                    self.forget(x.dst_core, lo, hi)
            elif isinstance(x, DmaGather):
                self.forget(c, *x.sp_range())
            elif isinstance(x, (Elementwise, Reduce, MatMul)):
                self.forget(c, *x.out.byte_span())
            elif not isinstance(x, DmaStore):
                self.operand[c] = -1

    def device_maps(self, cores: list[int], t: SpTensor) -> list[tuple[int, np.ndarray]] | None:
        """Per core: (operand, device byte offset of each of ``t``'s elements), or None when on some core
        an element has no provenance, they come from two operands, or the view leaves the scratchpad."""
        sticks = _tile_sticks(t.offset, t.dtype, t.shape, t.strides)
        if sticks is None or int(sticks[0][-1]) >= self.sticks:
            return None
        distinct, at, within = sticks
        rows = np.asarray(cores)[:, None]
        ops = self.operand[rows, distinct]
        j = int(ops[0, 0])
        if j < 0 or (ops != j).any():
            return None
        dev = self.offset[rows, distinct][:, at] + within
        return [(j, d) for d in dev]


@functools.lru_cache(maxsize=1024)
def _tile_sticks(offset: int, dtype: str, shape: tuple, strides: tuple) -> tuple | None:
    """A scratchpad view's sticks: (the distinct sticks, sorted; each element's index into them; each
    element's byte within its stick), or None for an empty view, one reaching below the scratchpad, or
    elements that could straddle sticks. Planning asks for the same views again and again."""
    isz = SP_DTYPES[dtype]
    addr = offset_grid(offset, shape, tuple(s * isz for s in strides))
    if addr.size == 0 or int(addr.min()) < 0 or offset % isz:
        return None
    distinct, at = np.unique(addr // STICK_BYTES, return_inverse=True)
    return distinct, at.reshape(addr.shape), addr % STICK_BYTES


def _factor(dev: np.ndarray, stick_elems: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(split shape, byte strides) under which ``dev`` (device byte offsets of a tile's elements) is
    affine: ``dev`` reshaped to the split shape is ``dev[0] + sum(i_d * strides_d)``. Each dim is tried
    whole, then cut into sticks."""
    options = [[(n,)] + ([(n // stick_elems, stick_elems)] if n % stick_elems == 0 and n > stick_elems else [])
               for n in dev.shape]
    for choice in itertools.product(*options):
        split = tuple(x for part in choice for x in part)
        r = dev.reshape(split)
        origin = int(r.flat[0])
        strides = []
        for d, n in enumerate(split):
            unit = tuple(1 if e == d else 0 for e in range(len(split)))
            strides.append(int(r[unit]) - origin if n > 1 else 0)
        if np.array_equal(r, offset_grid(origin, split, tuple(strides))):
            return split, tuple(strides)
    return None


def _device_tile(per_member: list[list[tuple[int, np.ndarray]]]) -> DeviceTile | None:
    """One DeviceTile for a chain's tiles (per member, per core: (operand, device map)), or None when they
    do not share one operand, split and strides, or the cores' bases do not step evenly."""
    operand = per_member[0][0][0]
    shape = per_member[0][0][1].shape
    first = _factor(per_member[0][0][1], STICK_BYTES // 2)
    if first is None or any(j != operand or d.shape != shape for tiles in per_member for j, d in tiles):
        return None
    split, strides = first
    dev = np.stack([np.stack([d for _, d in tiles]) for tiles in per_member])  # (members, cores, *shape)
    origins = dev.reshape(*dev.shape[:2], -1)[:, :, 0]
    if any(s % 2 for s in strides) or (origins[:, 0] % 2).any():
        return None
    steps = np.diff(origins, axis=1)
    core_stride = int(steps.flat[0]) if steps.size else 0
    if (steps != core_stride).any():
        return None
    tile = offset_grid(0, split, strides)
    if not np.array_equal(dev.reshape(*dev.shape[:2], *split), origins.reshape(*origins.shape, *[1] * len(split)) + tile):
        return None
    return DeviceTile(operand, shape, split, strides, core_stride, tuple(int(o) for o in origins[:, 0]))


def _dead_writes(order: list[tuple[int, int]], info: dict[tuple[int, int], _Unit], fusion: Fusion,
                 num_cores: int, pad_bytes: int) -> None:
    """Backward over the units: drop a DMA load or ring send none of whose written sticks is live."""
    live = np.zeros((num_cores, pad_bytes // STICK_BYTES), dtype=np.bool_)
    for where in reversed(order):
        unit = info[where]
        if where in fusion.fused:
            continue
        if unit.droppable and not any(live[c, lo:hi].any() for c, lo, hi in unit.writes):
            fusion.dead.add(where)
            continue
        for c, sticks in unit.kills:
            live[c, sticks] = False
        for c, lo, hi in unit.reads:
            live[c, lo:hi] = True


KEEP_BYTES = 512 << 20  # host bytes all readers together may keep across runs (:class:`_Keep`)
KEEP_BINDINGS = 1024  # bindings one reader remembers (the oldest is forgotten first)
SAMPLE_STEP = 61  # a span's sample: every 61st 8-byte word (a binding is kept once two samples agree)

# A chain operand's tiles as decoded: ``(j, tiles)`` pieces in member order, ``tiles`` (cores or 1, n, rows,
# cols) members ``j .. j+n-1``; a run of members holding earlier members' bits is a view of their values.
Pieces = tuple[tuple[int, np.ndarray], ...]


class _Keep:
    """Host bytes that readers keep across runs, against one budget (:data:`KEEP_BYTES`): the first
    comers keep, later ones decode at every run, nothing is evicted (an LRU over a working set larger than
    the budget would miss at every read and pay for keeping on top). A reader's bytes come back when it
    is garbage (its plan dropped with its program)."""

    lock = threading.Lock()
    used = 0

    @classmethod
    def take(cls, nbytes: int) -> bool:
        with cls.lock:
            if cls.used + nbytes > KEEP_BYTES:
                return False
            cls.used += nbytes
            return True

    @classmethod
    def give(cls, nbytes: int) -> None:
        with cls.lock:
            cls.used -= nbytes


@dataclass
class _Binding:
    """What a reader remembers of one binding of its operand: a sample of the span's bytes (seen, not
    kept), or the span's bytes and their pieces (kept), or neither (its bytes change from run to run)."""

    sample: np.ndarray | None = None
    words: np.ndarray | None = None
    pieces: Pieces | None = None
    values: np.ndarray | None = None  # the one array holding the pieces' values
    misses: int = 0  # runs running whose bytes differed from the run before

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.sample, self.words, self.values) if a is not None)


class DeviceTileReader:
    """A chain's tiles of one operand, decoded from device memory as :data:`Pieces` (cores 1 when every
    core reads the same bytes: np.matmul broadcasts it).

    Decoding is most of a chain's cost after its GEMMs, and much of it repeats:
    - within a run, chains on other cores read the very same A tiles (``cache``: one run's decoded tiles,
      by geometry; the operands do not change during a run);
    - within a chain, a K loop often meets the same bits again (fp32 matmuls at "highest" multiply each
      16-bit part of an operand in several passes). Which members hold an earlier member's bits is
      learned on the first run and checked at every later one (a comparison costs a fraction of a
      decode; once it fails the reader decodes every member and stops comparing); such members are not
      decoded again, nor copied: their piece is a view of the earlier members' values;
    - across runs, the tiles a program reads from a weight hold the same bits launch after launch. Where
      one core's tiles fill a span of device memory exactly (:attr:`DeviceTile.dense_bytes`), the reader
      remembers each binding (the operand's host buffer and offset): at its first run a sample of the
      span's bytes; at a run whose sample is the last one's, a copy of the span's bytes and their decoded
      pieces (kept); at later runs it compares the span with the copy (contiguous words: several times
      cheaper than decoding) and reuses the pieces when every byte is equal. The comparison is the whole
      proof: nothing is assumed about what may have written device memory since (the sample only
      decides what is worth keeping). A binding whose bytes differed at two runs running (an activation)
      is from then on decoded at every run, nothing kept; the bytes kept are bounded (:class:`_Keep`,
      :data:`KEEP_BINDINGS`).
    """

    def __init__(self, tile: DeviceTile, ncores: int, regions: list, cache: dict, count) -> None:
        self.tile, self.regions, self.cache, self.count = tile, regions, cache, count
        self.cores = 1 if tile.core_stride == 0 else ncores
        self.key = (tile, self.cores)
        self.shape = (self.cores, len(tile.bases), *tile.shape)
        self.repeats: tuple[int, ...] | None = None  # per member: the earlier member with its bits, or -1
        self.runs: list[tuple[int, int, int]] = []  # ``repeats`` as runs of consecutive members (``_runs``)
        self.bindings: dict[tuple[int, int], _Binding] = {}  # by (id of the host buffer, byte offset)
        self.kept_bytes = 0

    def __del__(self) -> None:
        if self.kept_bytes:
            _Keep.give(self.kept_bytes)

    def __call__(self) -> Pieces:
        pieces = self.cache.get(self.key)
        if pieces is None:
            pieces = self.cache[self.key] = self._pieces()
        return pieces

    def _pieces(self) -> Pieces:
        span = self._span()
        if span is None:
            return self._decode(self._raw())[0]
        buffer, base = self.regions[self.tile.operand]
        where = (id(buffer), base)
        old = self.bindings.get(where)
        if old is not None:
            if old.words is not None and equal_bits(span, old.words):
                old.misses = 0
                return old.pieces
            if old.words is None and old.sample is None:  # its bytes change from run to run, or no room
                return self._decode(self._raw())[0]
            self._drop(where)
        pieces, values = self._decode(self._raw())
        sample = _sample(span)
        if old is None:
            new = _Binding(sample=sample)
        elif old.sample is not None and equal_bits(sample, old.sample):
            values.flags.writeable = False  # (shared with later runs: chain steps only read it)
            new = _Binding(words=np.array(span), pieces=pieces, values=values)
        else:
            new = _Binding(sample=sample, misses=old.misses + 1)
            if new.misses >= 2:
                new = _Binding(misses=new.misses)
        self._put(where, new)
        return pieces

    def _put(self, where: tuple[int, int], binding: _Binding) -> None:
        """Remember ``binding`` (as one with nothing kept if the budget has no room for it)."""
        if len(self.bindings) >= KEEP_BINDINGS:
            self._drop(next(iter(self.bindings)))
        if not _Keep.take(binding.nbytes):
            binding = _Binding(misses=binding.misses)
        self.kept_bytes += binding.nbytes
        self.bindings[where] = binding

    def _drop(self, where: tuple[int, int]) -> None:
        nbytes = self.bindings.pop(where).nbytes
        self.kept_bytes -= nbytes
        _Keep.give(nbytes)

    def _span(self) -> np.ndarray | None:
        """Each core's tiles' span of device memory as 8-byte words, (cores, words), when dense."""
        t = self.tile
        nbytes = t.dense_bytes
        if nbytes is None or nbytes % 8:
            return None
        buffer, base = self.regions[t.operand]
        return np.ndarray((self.cores, nbytes // 8), np.uint64, buffer=buffer, offset=base + t.bases[0],
                          strides=(t.core_stride, 8))

    def _raw(self) -> np.ndarray:
        t = self.tile
        buffer, base = self.regions[t.operand]
        k_stride = t.k_stride
        if k_stride is not None:  # one view over every member
            return np.ndarray((self.cores, len(t.bases), *t.split), np.uint16, buffer=buffer, offset=base + t.bases[0],
                              strides=(t.core_stride, k_stride, *t.strides))
        return np.stack([np.ndarray((self.cores, *t.split), np.uint16, buffer=buffer, offset=base + b,
                                    strides=(t.core_stride, *t.strides)) for b in t.bases], axis=1)

    def _decode(self, raw: np.ndarray) -> tuple[Pieces, np.ndarray]:
        """The pieces, and the one array holding all their values."""
        words = _words(raw)  # (the comparisons on 8-byte words where the tiles allow: 4x fewer elements)
        repeats = self.repeats
        if repeats is None:
            repeats = self.repeats = _repeats(words)
            self.runs = _runs(repeats)
        elif repeats and not all(equal_bits(words[:, j:j + n], words[:, i:i + n]) for j, i, n in self.runs if i >= 0):
            repeats = self.repeats = ()
        if not repeats:
            values = vector_ops.decode(raw, "dlfloat16")
            self.count(values.size)
            return ((0, values.reshape(self.shape)),), values
        # Only the members holding no earlier member's bits are decoded, member-major (each member's values
        # one contiguous block, as np.matmul is handed a member's tile either way), in member order, so that
        # a run of repeated members is a run of consecutive decoded members: one view.
        decoded = [j for j, i in enumerate(repeats) if i < 0]
        slot = {j: s for s, j in enumerate(decoded)}
        values = np.empty((len(decoded), raw.shape[0], *raw.shape[2:]), np.float32)
        for j in decoded:  # (member by member: a block's strided read decodes 3x slower)
            vector_ops.decode(raw[:, j], "dlfloat16", out=values[slot[j]])
        self.count(values.size)
        tiles = values.reshape(len(decoded), self.cores, *self.tile.shape).swapaxes(0, 1)
        pieces = []
        for j, i, n in self.runs:
            first = slot[j if i < 0 else i]
            pieces.append((j, tiles[:, first:first + n]))
        return tuple(pieces), values


def _sample(span: np.ndarray) -> np.ndarray:
    return np.array(span[:, ::SAMPLE_STEP])


def segments(a: Pieces, b: Pieces, members: int):
    """``(j, k, a_tiles, b_tiles)``: members ``j .. k-1`` of two operands' pieces, cut where either's
    pieces are, so that each pair is one view of each."""
    cuts = sorted({j for j, _ in a}.union(j for j, _ in b).union((members,)))
    ia = ib = 0
    for j, k in zip(cuts, cuts[1:]):
        while ia + 1 < len(a) and a[ia + 1][0] <= j:
            ia += 1
        while ib + 1 < len(b) and b[ib + 1][0] <= j:
            ib += 1
        (ja, ta), (jb, tb) = a[ia], b[ib]
        yield j, k, ta[:, j - ja:k - ja], tb[:, j - jb:k - jb]


def _runs(repeats: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """``repeats`` (see :func:`_repeats`) as runs ``(j, i, n)``: members ``j .. j+n-1`` repeat members
    ``i .. i+n-1`` (``i`` -1: they are decoded)."""
    runs: list[list[int]] = []
    for j, i in enumerate(repeats):
        if runs:
            rj, ri, rn = runs[-1]
            if (ri < 0 and i < 0) or (ri >= 0 and i == ri + rn):
                runs[-1][2] += 1
                continue
        runs.append([j, i, 1])
    return [(j, i, n) for j, i, n in runs]


def _words(raw: np.ndarray) -> np.ndarray:
    """``raw`` (uint16) viewed as 8-byte words along its last dim where that dim is contiguous and a whole
    number of words (equal words are equal elements), else ``raw``."""
    if raw.ndim and raw.strides[-1] == 2 and raw.shape[-1] % 4 == 0:
        return raw.view(np.uint64)
    return raw


def _repeats(raw: np.ndarray) -> tuple[int, ...]:
    """Per member of ``raw`` (axis 1): the first earlier member holding the same bits, or -1; () when none
    repeats."""
    firsts: list[int] = []
    distinct: list[int] = []
    for j in range(raw.shape[1]):
        same = next((i for i in distinct if equal_bits(raw[:, j], raw[:, i])), -1)
        firsts.append(same)
        if same < 0:
            distinct.append(j)
    return tuple(firsts) if len(distinct) < len(firsts) else ()


def equal_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two tiles of one shape hold the same bits (their first elements first: most differ there)."""
    return a.item(0) == b.item(0) and bool((a == b).all())
