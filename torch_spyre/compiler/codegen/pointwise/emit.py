"""Instruction emission: a core's steps become DMA loads (double-buffered, one group ahead), one vector
instruction per box for every materialized value (op-major, so intermediate buffers live only while
needed), and stores through staging sticks (read-modify-write of sticks a step writes only partly).
Loop indices used as data are views of the core's index iota. Reductions and the reduction-position
iota are in ``reduce.py``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ....program import STICK_BYTES, Addr, DmaLoad, DmaStore, Elementwise, Scalar
from ....card.layout import sorted_unique
from ...kernel_ir import LoweringError
from .analysis import AccessInTile, Box, Chunk, iota_view
from .fold import fold_scalar
from .schedule import Step
from .sym import Sym, SymInstr, dense, fit_input
from .values import Value, acc_dtype, is_ref, itemsize


class Emitter:
    """The emission half of :class:`~.generator.PointwiseGenerator` (a mixin over its analysis state)."""

    def _emit_core(self, steps: list[Step]) -> list[SymInstr]:
        """Loads of the next DMA group are issued before the current step computes (two buffers per
        input, alternating): never more than one group ahead, so a buffer is reloaded only after the
        step that read it."""
        out: list[SymInstr] = []
        self._pos = 0
        self._tile = None
        self._iota_base: int | None = None  # first reduction position the core's iota holds
        self._index_iota = 0  # how many consecutive integers the core's index iota holds
        owners = [s for s in steps if s.load_from is s and s.loads]  # type: ignore[attr-defined]
        index = {id(o): i for i, o in enumerate(owners)}
        loaded: set[int] = set()
        current = -1
        for s in steps:
            if s.chunk.tile != self._tile:
                self._tile, self._pos = s.chunk.tile, 0
            owner = s.load_from  # type: ignore[attr-defined]
            if id(owner) in index:
                current = index[id(owner)]
                if current not in loaded:
                    self._emit_loads(owner, out)
                    loaded.add(current)
            nxt = current + 1
            if nxt < len(owners) and nxt not in loaded:
                self._emit_loads(owners[nxt], out)
                loaded.add(nxt)
            self._emit_step(s, out)
        return out

    def _add(self, sink: list[SymInstr], cls: type, **args: Any) -> None:
        sink.append(SymInstr(cls, args, self._pos))
        self._pos += 1

    def _emit_loads(self, owner: Step, out: list[SymInstr]) -> None:
        for g in owner.loads:
            a = owner.chunk.accesses[g]
            self._dma_sticks(out, DmaLoad, a, f"ld{g}.{owner.parity}")

    def _dma_sticks(self, out: list[SymInstr], cls: type, a: AccessInTile, sp_buf: str) -> None:
        """DMAs between the sticks access ``a`` touches and scratchpad buffer ``sp_buf`` (the sticks one
        after the other, in device order): ``DmaLoad`` into it or ``DmaStore`` out of it."""
        where = "src" if cls is DmaLoad else "dst"
        for first, rank, pat in a.sticks.patterns():
            self._add(out, cls, **{where: Addr(a.buffer, first * STICK_BYTES)},
                      sp_offset=Sym(sp_buf, rank * STICK_BYTES, "uint8", (1,), (1,)), pattern=pat)

    def _emit_step(self, s: Step, out: list[SymInstr]) -> None:
        ch = s.chunk
        bxs = ch.full_boxes if s.kind == "full" else ch.outer_boxes
        self._views: dict[tuple[int, int], Sym | Scalar] = {}  # (gid, id(box)) -> view, this step's
        stores = [g for g in s.values if self.dag.values[g].op == "store"
                  and self.dag.values[g].attrs["buffer"] not in self.spec.internal]
        for g in stores:
            self._prepare_store(g, ch, out)
        if any(self.dag.values[g].op == "rindex" for g in s.values):
            self._ensure_iota(ch, out)
        for g in s.values:
            v = self.dag.values[g]
            if v.op == "reduction":
                self._emit_reduction(v, s, bxs, out)
            elif v.op == "store":
                if g in self.direct.values() or v.attrs["buffer"] in self.spec.internal:
                    continue  # its value was computed into the staging sticks
                for bi, b in enumerate(bxs):
                    self._emit_store_box(v, s, b, bi, out)
            elif g in self.elided:
                continue
            elif self._materialized(v):
                for bi, b in enumerate(bxs):
                    self._emit_value_box(v, s, b, bi, out)
        for g in stores:
            self._dma_sticks(out, DmaStore, ch.accesses[g], f"st{g}")

    def _direct_stores(self) -> tuple[dict[int, int], set[int]]:
        """Values whose only use is a store are computed straight into the store's staging sticks (the
        vector unit rounds on write, which is what the cast before a store does): value gid -> store
        gid, and the casts made unnecessary that way."""
        users: dict[int, int] = {}
        for v in self.dag.values:
            for a in set(self.dag.inputs(v)) | set(v.attrs.get("guards", [])):
                users[a] = users.get(a, 0) + 1
        for g, src in self.aliases.items():
            users[src] = users.get(src, 0) + 1
        direct, elided = {}, set()
        for st in (v for v in self.dag.values if v.op == "store" and v.attrs["buffer"] not in self.spec.internal):
            v = self.dag.values[st.args[0]]
            if users.get(v.gid) != 1 or v.op == "reduction" or not self._materialized(v) or v.guards:
                continue
            if v.op == "to_dtype":
                u = self.dag.values[v.args[0]]
                if (users.get(u.gid) == 1 and self._materialized(u) and u.op != "reduction" and not u.guards
                        and u.sp_dtype == "float32" and v.sp_dtype in ("dlfloat16", "float32")
                        and self.places[st.attrs["buffer"]].layout.device_dtype == v.sp_dtype):
                    direct[u.gid] = st.gid
                    elided.add(v.gid)
                    continue
            direct[v.gid] = st.gid
        return direct, elided

    def _materialized(self, v: Value) -> bool:
        if v.extent in ("static", "scalar"):
            return False
        if v.op in ("load", "const", "static", "store", "rindex") or v.gid in self.aliases:
            return False
        if v.op == "to_dtype" and self._cast_alias(v):
            return False
        if v.op == "where" and self.dag.values[v.args[0]].extent in ("static", "scalar"):
            return False
        return True

    # ``_cast_alias`` and ``_sp_dtype_of`` are pure functions of the DAG and the aliases, which are fixed
    # once ``generate`` has found them: asked per view of every box, they are answered once per value
    # (``_value_memo``, reset by ``generate``).
    def _memoised(self, kind: str, v: Value, find):
        memo = self.__dict__.setdefault("_value_memo", {})
        found = memo.get((kind, v.gid))
        if found is None:
            found = memo[(kind, v.gid)] = find(v)
        return found

    def _cast_alias(self, v: Value) -> bool:
        return self._memoised("cast_alias", v, self._find_cast_alias)

    def _find_cast_alias(self, v: Value) -> bool:
        src = self.dag.values[v.args[0]]
        if src.extent in ("scalar", "static"):
            return True
        s_dt = self._sp_dtype_of(src)
        return s_dt == v.sp_dtype or (s_dt == "dlfloat16" and v.sp_dtype == "float32")

    def _sp_dtype_of(self, v: Value) -> str:
        return self._memoised("sp_dtype", v, self._find_sp_dtype)

    def _find_sp_dtype(self, v: Value) -> str:
        if v.op == "load":
            if v.gid in self.aliases:
                return self._sp_dtype_of(self.dag.values[self.aliases[v.gid]])
            return self.places[v.attrs["buffer"]].layout.device_dtype
        if v.op == "reduction":
            return acc_dtype(v)
        if v.op == "to_dtype" and self._cast_alias(v):
            return self._sp_dtype_of(self.dag.values[v.args[0]])
        if v.op == "where" and self.dag.values[v.args[0]].extent in ("static", "scalar"):
            return v.sp_dtype
        return v.sp_dtype

    # --- views of values inside a box ------------------------------------------------------------------
    def view(self, gid: int, s: Step, box: Box) -> Sym | Scalar:
        """The view of value ``gid`` in ``box`` of step ``s``. A step asks for each value's view once per
        consumer: it is derived once per step and box (``_emit_step`` resets ``_views``)."""
        key = (gid, id(box))
        found = self._views.get(key)
        if found is None:
            found = self._views[key] = self._view(gid, s, box)
        return found

    def _view(self, gid: int, s: Step, box: Box) -> Sym | Scalar:
        v = self.dag.values[gid]
        ch = s.chunk
        full = s.kind == "full"
        if v.extent == "scalar" and v.op == "const":
            return Scalar(v.args[0])
        if v.op == "rindex":
            return self._iota_view(s, box)
        if v.extent == "static":
            val = box.statics.get(gid)
            if val is None:
                raise LoweringError(f"kernel {self.spec.name}: an index value is used as data "
                                    f"({v.op} {v.attrs.get('index', '')}); not supported by the Spyre compiler yet")
            return Scalar(val)
        if v.extent == "scalar":
            ins = [self.view(a, s, box) if is_ref(a) else Scalar(a) for a in v.args]
            return Scalar(fold_scalar(v, ins))
        if gid in self.aliases:
            return self.view(self.aliases[gid], s, box)
        if self._guarded_off(v, box):
            return Scalar(0.0)  # never read: every consumer here selects the other branch
        if v.op == "load":
            owner = s.load_from  # type: ignore[attr-defined]
            a = owner.chunk.accesses[gid]
            if a.same_as is not None:
                gid, a = a.same_as, owner.chunk.accesses[a.same_as]
            if gid not in box.views:
                raise LoweringError(f"kernel {self.spec.name}: load {gid} has no view in this box")
            base, strides = box.views[gid]
            place = self.places[a.buffer]
            shape, _ = box.refined
            return Sym(f"ld{gid}.{owner.parity}", base * place.itemsize, place.layout.device_dtype, shape, strides)
        if v.op == "to_dtype" and self._cast_alias(v):
            inner = self.view(v.args[0], s, box)
            return inner
        if v.op == "where" and self.dag.values[v.args[0]].extent in ("static", "scalar"):
            cond = self.view(v.args[0], s, box)
            pick = v.args[1] if cond.value else v.args[2]
            return self.view(pick, s, box) if is_ref(pick) else Scalar(pick)
        # a materialized value: its dense buffer
        dt = self._sp_dtype_of(v)
        nx = len(ch.xs)
        if v.extent == "outer":
            if full:
                return dense(f"v{gid}", dt, tuple(ch.xs) + (1,) * len(ch.rs), box, range(nx, nx + len(ch.rs)))
            return dense(f"v{gid}", dt, tuple(ch.xs), box)
        return dense(f"v{gid}", dt, tuple(ch.xs) + tuple(ch.rs), box)


    def _guarded_off(self, v: Value, box: Box) -> bool:
        if not v.guards:
            return False
        key = ("off", v.gid)  # a pure function of the value's guards and the box's statics
        found = box.memo.get(key)
        if found is None:
            found = box.memo[key] = any(not box.statics.get(g, True) for g in v.guards)
        return found

    def _emit_value_box(self, v: Value, s: Step, box: Box, bi: int, out: list[SymInstr]) -> None:
        if self._guarded_off(v, box):
            return  # the value does not exist here (a masked branch that is not taken)
        dst = self._staging_view(self.direct[v.gid], s, box) if v.gid in self.direct else self.view(v.gid, s, box)
        if v.op == "iindex":
            self._emit_index_box(v, s, box, dst, out)
            return
        ins = [self.view(a, s, box) if is_ref(a) else Scalar(a) for a in v.args]
        op = v.op
        if op == "to_dtype":
            op = "cast"
        if all(isinstance(x, Scalar) for x in ins):
            folded = fold_scalar(v, ins)
            self._add(out, Elementwise, op="copy", out=dst, inputs=(Scalar(folded),))
            return
        self._add(out, Elementwise, op=op, out=dst, inputs=tuple(fit_input(x, dst) for x in ins))


    # --- index values used as data (``Dag._lift_index_data``) -----------------------------------------
    def _emit_index_box(self, v: Value, s: Step, box: Box, dst: Sym, out: list[SymInstr]) -> None:
        """An index affine over the box (``base + sum(i_d * strides_d)``, fitted by ``KernelGen._box``) as one
        instruction over a view of the core's iota: ``iota_view * g + offset`` (``analysis.iota_view``). The
        iota is int64, so the index is exact at any size and rounds once into a float value's dtype, as
        torch's cast of an int64 ``arange`` does."""
        rel, strides = box.views[v.gid]
        base = int(rel) + s.chunk.index_base[v.gid]
        shape, _ = box.refined
        g, first, unit = iota_view(strides, shape)
        if g == 0:
            self._add(out, Elementwise, op="copy", out=dst, inputs=(Scalar(base),))
            return
        self._ensure_index_iota(first + 1 + sum(max(0, st) * (n - 1) for st, n in zip(unit, shape)), out)
        view = Sym("xiota", first * itemsize("int64"), "int64", shape, unit)
        if g == 1:
            self._add(out, Elementwise, op="add", out=dst, inputs=(view, Scalar(base - first)))
        else:
            self._add(out, Elementwise, op="fma", out=dst, inputs=(view, Scalar(g), Scalar(base - g * first)))

    def _ensure_index_iota(self, n: int, out: list[SymInstr]) -> None:
        """Make the core's index iota hold 0 .. n-1: started once per core and extended by doubling
        (``[0, k) + k``: log2(n) instructions for n element-ops), never shifted."""
        if self._index_iota < n:
            self._index_iota = self._fill_iota("xiota", "int64", self._index_iota, n, out)

    def _fill_iota(self, name: str, dtype: str, have: int, n: int, out: list[SymInstr]) -> int:
        """Extend scratchpad buffer ``name`` from holding 0 .. have-1 (have < n) to holding 0 .. n-1 by
        doubling (0, then ``[0, k) + k`` for k = 1, 2, 4, ...: log2(n) instructions for n element-ops);
        returns n. Shared by the index iota and the reduction-position iota (``reduce.py``)."""
        run = lambda at, m: Sym(name, at * itemsize(dtype), dtype, (m,), (1,))  # noqa: E731
        k = have
        if k == 0:
            self._add(out, Elementwise, op="copy", out=run(0, 1), inputs=(Scalar(0),))
            k = 1
        while k < n:
            m = min(k, n - k)
            self._add(out, Elementwise, op="add", out=run(k, m), inputs=(run(0, m), Scalar(k)))
            k += m
        return k

    # --- stores --------------------------------------------------------------------------------------
    def _prepare_store(self, g: int, ch: Chunk, out: list[SymInstr]) -> None:
        """Stage sticks the step writes only partly (padding included): load them first."""
        a = ch.accesses[g]
        lanes = self.places[a.buffer].lanes
        covered = a.sticks.memo.get("covered")
        if covered is None:  # positions are shared by translations (access.translated)
            covered = a.sticks.memo["covered"] = sorted_unique(a.sticks.position).size
        if covered < a.sticks.sticks.size * lanes:
            self._dma_sticks(out, DmaLoad, a, f"st{g}")

    def _staging_view(self, store_gid: int, s: Step, box: Box) -> Sym:
        key = ("staging", store_gid)  # the store's buffer is the same in every step: a function of the box
        found = box.memo.get(key)
        if found is None:
            place = self.places[s.chunk.accesses[store_gid].buffer]
            base, strides = box.views[store_gid]
            shape, _ = box.refined
            found = box.memo[key] = Sym(f"st{store_gid}", base * place.itemsize, place.layout.device_dtype, shape, strides)
        return found

    def _emit_store_box(self, v: Value, s: Step, box: Box, bi: int, out: list[SymInstr]) -> None:
        dst = self._staging_view(v.gid, s, box)
        src = self.view(v.args[0], s, box)
        if isinstance(src, Scalar):
            self._add(out, Elementwise, op="copy", out=dst, inputs=(src,))
            return
        op = "copy" if src.dtype == dst.dtype else "cast"
        self._add(out, Elementwise, op=op, out=dst, inputs=(fit_input(src, dst),))
