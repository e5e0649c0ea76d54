"""The numeric analysis of one chunk of a kernel (``access.py`` applied to the kernel's loads and
stores): for every access, the device elements and sticks it touches over the chunk; then the chunk cut
into *boxes* where every access is one strided view of its scratchpad sticks, every static mask and
index-only value is constant and every loop index used as data (``iindex``) is affine
(``KernelGen.partition``)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import access
from ...access import TensorView
from ...decisions import KernelDecisions
from ...kernel_ir import KernelSpec, LoweringError
from .dag import Dag
from .fold import card_op
from .tiling import node_vars
from .values import MAX_BOXES_PER_TILE, Value, compute_dtype, is_ref


# An ``iindex`` value's view of the core's iota spans at most twice its box's elements (or this many):
# a box whose index strides are sparser (a few elements of every 4096th row) is cut instead.
IOTA_MIN_SPAN = 4096


def iota_view(strides: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
    """How ``base + sum(i_d * strides_d)`` over ``shape`` reads the core's iota (``0, 1, 2, ...``): as
    ``g * iota[first + sum(i_d * strides_d / g)] + (base - g * first)``, with ``g`` the strides' gcd (0 when
    all are 0). Returns (g, first, strides / g)."""
    g = 0
    for st in strides:
        g = math.gcd(g, abs(st))
    if g == 0:
        return 0, 0, tuple(0 for _ in strides)
    unit = tuple(st // g for st in strides)
    first = -sum(min(0, st) * (n - 1) for st, n in zip(unit, shape))
    return g, first, unit


def _iota_span(strides: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """Iota elements the view of ``iota_view`` reaches."""
    _, _, unit = iota_view(strides, shape)
    return 1 + sum(abs(st) * (n - 1) for st, n in zip(unit, shape))


@dataclass
class AccessInTile:
    gid: int  # the load or store value
    buffer: str
    extent: str  # "full" or "outer"
    device: np.ndarray  # device element offsets over the domain (full or outer shape)
    valid: np.ndarray | None  # where the access is used (guards); None = everywhere
    sticks: access.StickSet | None = None
    alias: int | None = None  # a load served from a value of this kernel
    same_as: int | None = None  # a load of exactly the same elements as an earlier load: shares its sticks
    host: np.ndarray | None = None  # host element indices (relative to the view)


@dataclass
class Box:
    origin: tuple[int, ...]  # relative to the tile
    shape: tuple[int, ...]
    splits: dict[int, list[int]]  # mixed-radix factors per dim (innermost first)
    views: dict[int, tuple[int, tuple[int, ...]]]  # access (or iindex) gid -> (base position, strides) in refined dims
    statics: dict[int, Any]  # static value gid -> its (uniform) value in this box
    # Views emission derived from this box (``sym.py``), keyed by what they depend on besides the box.
    # Emission asks for the same few views of every box once per value: derived once, they cost a
    # lookup after that (boxes are never modified once partitioned).
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def refined(self) -> tuple[tuple[int, ...], list[list[int]]]:
        """The box's shape split in mixed radix (``access.refine_shape``): Python ints, as ``Sym.place``
        needs them."""
        found = self.memo.get("refined")
        if found is None:
            shape, axes = access.refine_shape(self.shape, self.splits)
            found = self.memo["refined"] = (tuple(int(n) for n in shape), axes)
        return found


@dataclass
class Chunk:
    """One pass over one reduction chunk of one x tile."""

    tile: int
    phase: int
    xo: tuple[int, ...]
    xs: tuple[int, ...]
    ro: tuple[int, ...]
    rs: tuple[int, ...]
    accesses: dict[int, AccessInTile] = field(default_factory=dict)
    full_boxes: list[Box] = field(default_factory=list)
    outer_boxes: list[Box] = field(default_factory=list)
    first_of_tile: bool = False
    last_of_tile: bool = False
    run_full: list[int] = field(default_factory=list)  # full value gids computed in this chunk
    run_outer: list[int] = field(default_factory=list)  # outer value gids computed after this chunk
    accessed: list[int] = field(default_factory=list)  # load/store gids to analyse (default: those run)
    index_base: dict[int, int] = field(default_factory=dict)  # iindex gid -> its index at the chunk's origin



class KernelGen:
    """What every pass over a kernel needs: its DAG, the statics, and the numeric analysis of a chunk's
    accesses into boxes."""

    def __init__(self, spec: KernelSpec, places: dict[str, TensorView], config: Any):
        self.spec = spec
        self.places = places
        self.config = config
        self.dag = Dag(spec)
        self.nx = len(spec.x_sizes)
        self.factors = sorted({p.lanes for p in places.values()})
        for b in spec.buffers:
            compute_dtype(b.dtype)
        self.decisions = KernelDecisions(spec.name, spec.kind, list(spec.source_ops), list(spec.source_lines))

    # --- statics --------------------------------------------------------------------------------
    def static_value(self, gid: int, env: dict[str, np.ndarray], cache: dict[int, Any]) -> Any:
        """Numeric value of an index-only value over a domain (numpy)."""
        if gid in cache:
            return cache[gid]
        v = self.dag.values[gid]
        if v.op == "const":
            out = v.args[0]
        elif v.op == "static":
            out = access.evaluate(v.attrs["index"], env)
        elif v.op == "indirect":
            out = np.asarray(self.static_value(v.args[0], env, cache)).astype(np.int64)
            if v.attrs.get("wrap_neg", True):
                out = np.where(out < 0, out + v.attrs["size"], out)
        elif v.op == "to_dtype":
            x = self.static_value(v.args[0], env, cache)
            out = np.asarray(x).astype(np.float64 if v.sp_dtype in ("float32", "dlfloat16") else
                                       np.bool_ if v.sp_dtype == "bool" else np.int64)
        else:
            args = [self.static_value(a, env, cache) if is_ref(a) else a for a in v.args]
            out = card_op(v.op, [np.asarray(a) for a in args])
            if out is None:
                raise LoweringError(f"cannot evaluate {v.op} on index values")
        cache[gid] = out
        return out

    def static_over(self, ch: "Chunk", gid: int, outer: bool) -> np.ndarray:
        """Static value ``gid`` over chunk ``ch``'s space (``outer``: its x dims only), in its node's variables."""
        env = self.node_env(self.dag.values[gid].node, ch.xo, ch.xs, ch.ro, ch.rs, outer)
        shape = tuple(ch.xs) if outer else tuple(ch.xs) + tuple(ch.rs)
        return np.broadcast_to(np.asarray(self.static_value(gid, env, {})), shape)

    def _static_consumers(self) -> list[int]:
        """Static values consumed by computed values (they must be uniform within each box)."""
        out = []
        for v in self.dag.values:
            if v.extent in ("full", "outer") and v.op not in ("load",):
                for a in self.dag.inputs(v):
                    if self.dag.values[a].extent == "static" and a not in out:
                        out.append(a)
            if v.op in ("load", "iindex"):
                for g in v.attrs.get("guards", []):
                    if g not in out:
                        out.append(g)
        return out

    def node_env(self, node: int, xo, xs, ro, rs, outer: bool) -> dict[str, np.ndarray]:
        """A node's loop variables over a tile, plus its indirect index symbols, which must be
        computable from the loop indices (an index read from memory is a gather: refused here)."""
        env = node_vars(self.spec, node, xo, xs, ro, rs, outer)
        cache: dict[int, Any] = {}
        for v in self.dag.values:
            if v.node != node or v.op != "indirect":
                continue
            src = self.dag.values[v.args[0]]
            if src.extent != "static" and not self._index_only(src.gid):
                raise LoweringError(
                    f"kernel {self.spec.name}: an index read from memory ({src.op}); data-dependent indexing runs "
                    "on the gather generator, whose lowerings take embedding, index_select, x[idx] with one index "
                    "tensor and torch.gather/take_along_dim on tensors of at least one dim with an index of the "
                    "same rank; this form did not reach it: rewrite it as one of those")
            env[v.attrs["symbol"]] = np.asarray(self.static_value(v.gid, env, cache))
        return env

    def _index_only(self, gid: int) -> bool:
        v = self.dag.values[gid]
        if v.op in ("const", "static"):
            return True
        if v.op == "load":
            return False
        return all(self._index_only(a) for a in self.dag.inputs(v))

    # --- analysing one chunk ---------------------------------------------------------------------
    def analyse(self, ch: Chunk, outer_only: bool = False, with_boxes: bool = True, host_only: bool = False) -> None:
        """The chunk's accesses (``ch.accesses``) and, ``with_boxes``, its boxes. ``host_only``: the host
        indices and aliases only, no device elements or sticks (what finding the aliases over the whole
        iteration space needs: the device offsets of every element of a big kernel cost seconds)."""
        spec, dag = self.spec, self.dag
        full_shape = tuple(ch.xs) + tuple(ch.rs)
        env_full: dict[int, dict[str, np.ndarray]] = {}
        env_outer: dict[int, dict[str, np.ndarray]] = {}

        def env(node: int, outer: bool) -> dict[str, np.ndarray]:
            table = env_outer if outer else env_full
            if node not in table:
                table[node] = self.node_env(node, ch.xo, ch.xs, ch.ro, ch.rs, outer)
            return table[node]

        static_cache: dict[tuple[int, bool], dict[int, Any]] = {}

        def static(gid: int, outer: bool) -> np.ndarray:
            node = dag.values[gid].node
            cache = static_cache.setdefault((node, outer), {})
            val = self.static_value(gid, env(node, outer), cache)
            shape = ch.xs if outer else full_shape
            return np.broadcast_to(np.asarray(val), shape)

        needed = set(ch.accessed) if ch.accessed else set(ch.run_full) | set(ch.run_outer)
        for gid in sorted(needed):
            v = dag.values[gid]
            if v.op not in ("load", "store") or gid in getattr(self, "aliases", {}):
                continue
            outer = v.extent == "outer"
            if v.op == "store" and dag.values[v.args[0]].extent == "outer":
                outer = True
            node = dag.values[gid].node
            e = env(node, outer or spec.nodes[node].placement == "outer")
            idx = access.evaluate(v.attrs["index"], e)
            shape = ch.xs if outer else full_shape
            idx = np.broadcast_to(idx, shape)
            valid = None
            for g in v.attrs.get("guards", []):
                m = static(g, outer) != 0
                valid = m if valid is None else (valid & m)
            internal = v.attrs["buffer"] in self.spec.internal
            if internal:  # a buffer that lives only in this kernel: host indices, for the alias check
                a = AccessInTile(gid, v.attrs["buffer"], "outer" if outer else "full", idx, valid, host=idx)
                if v.op == "load":
                    a.alias = self.aliases.get(gid) if hasattr(self, "aliases") else self._internal_alias(v, ch, idx, outer)
                    if a.alias is None:
                        raise LoweringError(f"kernel {spec.name}: {v.attrs['buffer']} is read before it is written")
                ch.accesses[gid] = a
                continue
            place = self.places[v.attrs["buffer"]]
            if valid is not None and not valid.any():
                ch.accesses[gid] = AccessInTile(gid, v.attrs["buffer"], "outer" if outer else "full",
                                                np.zeros(shape, np.int64), valid, access.StickSet(np.zeros(0, np.int64), np.zeros(shape, np.int64)))
                continue
            if host_only:
                a = ch.accesses[gid] = AccessInTile(gid, v.attrs["buffer"], "outer" if outer else "full", idx, valid, host=idx)
                if v.op == "load":
                    a.alias = self._internal_alias(v, ch, idx, outer)
                continue
            safe_idx = idx if valid is None else np.where(valid, idx, idx[valid].flat[0])
            dev = access.device_elements(place, safe_idx, f"{'load from' if v.op == 'load' else 'store to'} {v.attrs['buffer']}")
            a = AccessInTile(gid, v.attrs["buffer"], "outer" if outer else "full", dev, valid, host=idx)
            if hasattr(self, "aliases"):
                a.alias = self.aliases.get(gid)
            elif v.op == "load":
                a.alias = self._internal_alias(v, ch, idx, outer)
            if a.alias is None:
                a.sticks = self._stick_set(gid, outer, place, dev, valid)
            ch.accesses[gid] = a
        self._dedupe_loads(ch)
        if not with_boxes:
            return
        statics = self._static_consumers()
        full_static = {g: static(g, False) for g in statics if self._used_in(g, "full")}
        outer_static = {g: static(g, True) for g in statics if self._used_in(g, "outer")}

        def indices(run: list[int], extent: str) -> dict[int, np.ndarray]:
            """The loop indices each ``iindex`` value of the step reads, over the chunk."""
            out = {}
            for g in run:
                v = dag.values[g]
                if v.op == "iindex" and v.extent == extent:
                    outer = extent == "outer"
                    out[g] = np.broadcast_to(access.evaluate(v.attrs["index"], env(v.node, outer)),
                                             tuple(ch.xs) if outer else full_shape)
                    ch.index_base[g] = int(out[g].flat[0]) if out[g].size else 0
            return out

        if not outer_only:
            full_acc = [a for a in ch.accesses.values() if a.alias is None and a.same_as is None
                        and a.sticks is not None and dag.values[a.gid].extent == "full"]
            ch.full_boxes = self.partition(full_shape, full_acc, full_static, indices(ch.run_full, "full"))
        outer_acc = [a for a in ch.accesses.values()
                     if a.alias is None and a.same_as is None and a.sticks is not None and a.extent == "outer"]
        ch.outer_boxes = self.partition(tuple(ch.xs), outer_acc, outer_static, indices(ch.run_outer, "outer"))

    def _stick_set(self, gid: int, outer: bool, place: TensorView, dev: np.ndarray,
                   valid: np.ndarray | None) -> access.StickSet:
        """``access.stick_set``, or the translation of an earlier one of this access when its device
        elements moved by whole sticks under the same mask (another tile of a regular tensor). The last
        set of each lane phase is kept: tiles whose rows are lanes (a tensor sticked on rows) start at
        another lane each time and repeat every ``lanes`` tiles at most."""
        refs = self.__dict__.setdefault("_stick_refs", {})
        key = (gid, outer, int(dev.flat[0]) % place.lanes if dev.size else -1)
        ref = refs.get(key)
        if ref is not None and (valid is None if ref[1] is None else
                                valid is not None and valid.shape == ref[1].shape and np.array_equal(valid, ref[1])):
            found = access.translated(ref[2], ref[0], dev, place.lanes)
            if found is not None:
                return found
        sticks = access.stick_set(place, dev, valid)
        refs[key] = (dev, valid, sticks)
        return sticks

    def _dedupe_loads(self, ch: Chunk) -> None:
        """Loads of the same elements of the same buffer (Inductor repeats a load in every node that
        reads it) share one DMA and one scratchpad buffer."""
        seen: dict[tuple, int] = {}
        for gid in sorted(ch.accesses):
            a = ch.accesses[gid]
            if self.dag.values[gid].op != "load" or a.alias is not None or a.sticks is None:
                continue
            key = (a.buffer, a.extent, a.device.shape, a.device.tobytes(),
                   None if a.valid is None else a.valid.tobytes())
            if key in seen:
                a.same_as, a.sticks = seen[key], None
            else:
                seen[key] = gid

    def _used_in(self, gid: int, extent: str) -> bool:
        for v in self.dag.values:
            if gid in self.dag.inputs(v) or gid in v.attrs.get("guards", []):
                if v.extent == extent:
                    return True
        return False

    def _internal_alias(self, v: Value, ch: Chunk, host: np.ndarray, outer: bool) -> int | None:
        """A load of a buffer an earlier node of this kernel stores, at the same elements: the stored value."""
        dev = host
        for sgid in self.dag.stored.get(v.attrs["buffer"], []):
            if sgid > v.gid:
                continue
            s = self.dag.values[sgid]
            src = self.dag.values[s.args[0]]
            sa = ch.accesses.get(sgid)
            if sa is None:
                continue
            target = sa.host
            if src.extent == "outer" and not outer:
                target = np.broadcast_to(target.reshape(tuple(ch.xs) + (1,) * len(ch.rs)), dev.shape)
            if target.shape == dev.shape and np.array_equal(target, dev):
                return s.args[0]
            raise LoweringError(
                f"{v.attrs['buffer']} is stored and then read at other elements inside one fused kernel "
                f"({self.spec.name}); the Spyre compiler cannot serve that read yet"
            )
        return None

    # --- boxes -----------------------------------------------------------------------------------
    def partition(self, shape: tuple[int, ...], accs: list[AccessInTile], statics: dict[int, np.ndarray],
                  indices: dict[int, np.ndarray] | None = None) -> list[Box]:
        """The boxes of a tile. They depend only on the tile's scratchpad positions, masks, static values
        and the loop indices ``iindex`` values read (``indices``: those are affine within each box and
        their views go into ``Box.views``; the index arrays differ between tiles only by a constant,
        which ``_box`` subtracts), which are relative to the tile: tiles at different offsets of a
        regular tensor repeat them (a 25-row tile of a tensor sticked on rows repeats every 64 tiles), so
        equal inputs share one answer (boxes are never modified after this)."""
        if not all(shape):
            return []
        indices = {g: m - m.flat[0] for g, m in (indices or {}).items()}
        key = self._partition_key(shape, accs, statics, indices)
        cache = self.__dict__.setdefault("_partitions", {})
        if key not in cache:
            cache[key] = self._partition(shape, accs, statics, indices)
        return list(cache[key])

    def _partition_key(self, shape, accs: list[AccessInTile], statics: dict[int, np.ndarray],
                       indices: dict[int, np.ndarray]) -> tuple:
        h = hashlib.blake2b(digest_size=20)
        for a in accs:
            h.update(self._access_digest(a))
        for tag, arrays in (("s", statics), ("i", indices)):
            for g, m in arrays.items():
                m = np.asarray(m)
                h.update(f"{tag}{g}:{m.shape}:{m.dtype}".encode())
                h.update(np.ascontiguousarray(m).tobytes())
        return tuple(shape), h.digest()

    @staticmethod
    def _access_digest(a: AccessInTile) -> bytes:
        """A digest of an access's positions and mask, kept with its stick set (translations share it, and
        share the positions; a translation's mask is its first set's)."""
        key = ("digest", a.gid)
        found = a.sticks.memo.get(key)
        if found is None:
            h = hashlib.blake2b(digest_size=20)
            h.update(f"{a.gid}:{a.sticks.position.shape}:{a.sticks.position.dtype}".encode())
            h.update(np.ascontiguousarray(a.sticks.position).tobytes())
            if a.valid is not None:
                h.update(b"valid")
                h.update(np.ascontiguousarray(a.valid).tobytes())
            found = a.sticks.memo[key] = h.digest()
        return found

    def _partition(self, shape: tuple[int, ...], accs: list[AccessInTile], statics: dict[int, np.ndarray],
                   indices: dict[int, np.ndarray]) -> list[Box]:
        out: list[Box] = []
        stack = [(tuple(0 for _ in shape), tuple(shape))]
        while stack:
            org, shp = stack.pop()
            sl = tuple(slice(o, o + n) for o, n in zip(org, shp))
            cut = None
            for g, m in statics.items():
                cut = access.uniform_split(np.asarray(m)[sl])
                if cut:
                    break
            if cut is None:
                box = self._box(org, shp, sl, accs, statics, indices)
                if box is not None:
                    out.append(box)
                    if len(out) > MAX_BOXES_PER_TILE:
                        raise LoweringError(
                            f"kernel {self.spec.name}: an access or mask is too irregular (more than "
                            f"{MAX_BOXES_PER_TILE} strided views per tile); it needs a relayout kernel first")
                    continue
                cut = self._affine_cut(sl, accs, statics, indices)
            axis, pos = cut
            a = (org, shp[:axis] + (pos,) + shp[axis + 1:])
            b = (org[:axis] + (org[axis] + pos,) + org[axis + 1:], shp[:axis] + (shp[axis] - pos,) + shp[axis + 1:])
            stack.extend([b, a])
        out.sort(key=lambda b: b.origin)
        return out

    def _active(self, a: AccessInTile, sl) -> bool:
        return a.valid is None or bool(a.valid[sl].all())

    def _box(self, org, shp, sl, accs, statics, indices) -> Box | None:
        arrays = {a.gid: a.sticks.position[sl] for a in accs if self._active(a, sl)}
        for a in accs:
            if a.valid is not None and a.valid[sl].any() and not a.valid[sl].all():
                return None
        arrays.update((g, m[sl]) for g, m in indices.items())
        splits = access.choose_splits(list(arrays.values()))
        refined, axes = access.refine_shape(shp, splits)
        views = {}
        for g, arr in arrays.items():
            fit = access.affine_strides(arr.reshape(refined))
            if fit is None or g in indices and _iota_span(fit[1], refined) > max(2 * arr.size, IOTA_MIN_SPAN):
                return None
            views[g] = fit
        st = {g: np.asarray(m)[sl].flat[0].item() for g, m in statics.items()}
        box = Box(org, shp, splits, views, st)
        box.memo["refined"] = (tuple(int(n) for n in refined), axes)  # what Box.refined would compute
        return box

    def _affine_cut(self, sl, accs, statics, indices) -> tuple[int, int]:
        for a in accs:
            if a.valid is not None:
                cut = access.uniform_split(a.valid[sl])
                if cut:
                    return cut
        arrays = [a.sticks.position[sl] for a in accs if self._active(a, sl)] + [m[sl] for m in indices.values()]
        for arr in arrays:
            if access.affine_strides(arr) is None:
                cut = access.split_point(arr)
                if cut:
                    # Cut at the last multiple of the regular run, so the first part can be one view
                    # with a split dimension (e.g. 4 whole sticks of a 300-wide row, then 44).
                    axis, pos = cut
                    n = arr.shape[axis]
                    return axis, max(pos, (n // pos) * pos if n % pos else pos)
        shp = tuple(s.stop - s.start for s in sl)
        axis = max(range(len(shp)), key=lambda d: shp[d])
        return axis, shp[axis] // 2
