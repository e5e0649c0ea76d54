"""The event loop: starts instructions when their predecessors finish, moves transfers at their shared
rates, and records when each instruction started and ended."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from typing import Any

from ...program import ProgramError
from ..config import CardConfig
from .graph import Graph
from .sharing import Sharing

_EPS_BYTES = 1e-6  # a flow with fewer bytes left than this has finished (float round-off)


class Simulation:
    def __init__(self, graph: Graph, config: CardConfig):
        self.g = graph
        self.sharing = Sharing(config)
        n = len(graph.nodes)
        # Each flow's signature, interned once (the sharing solver works on signature ids).
        self.sig_id = [-1 if node.flow is None else self.sharing.intern(node.flow.signature()) for node in graph.nodes]
        self.duration = [node.duration for node in graph.nodes]
        self.kind = ["flow" if node.flow is not None else "end" for node in graph.nodes]
        self.flow_bytes = [0.0 if node.flow is None else node.flow.nbytes for node in graph.nodes]
        self.start = [math.nan] * n
        self.end = [math.nan] * n
        self.pending = [len(node.preds) for node in graph.nodes]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for nid, node in enumerate(graph.nodes):
            for p in node.preds:
                self.succs[p].append(nid)
        self.timers: list[tuple[float, int, str, int]] = []  # time, seq, kind, node
        self.seq = 0
        self.flows: dict[int, list[float]] = {}  # node -> [bytes left, rate]
        self.flows_changed = False
        self.occupancy: dict[Any, float] = {}  # resource -> fraction of its capacity in use now
        self.busy: dict[Any, float] = defaultdict(float)  # resource -> seconds of full use so far
        self.now = 0.0

    def run(self) -> None:
        ready = [nid for nid, p in enumerate(self.pending) if p == 0]
        self._start_all(ready)
        while self.timers or self.flows:
            if self.flows_changed:
                self._share()
            t_next = self._next_event()
            self._advance(t_next)
            self._fire_timers()
            self._finish_flows()
        self._check_all_ran()

    # --- events -------------------------------------------------------------------------------
    def _start_all(self, nids: list[int]) -> None:
        now, start, duration, kind, timers = self.now, self.start, self.duration, self.kind, self.timers
        for nid in nids:
            start[nid] = now
            heapq.heappush(timers, (now + duration[nid], self.seq, kind[nid], nid))
            self.seq += 1

    def _next_event(self) -> float:
        t = self.timers[0][0] if self.timers else math.inf
        for left, rate in self.flows.values():
            if rate > 0:
                t = min(t, self.now + left / rate)
        if math.isinf(t):
            raise ProgramError("timing model stalled: flows with no bandwidth")  # a bug, not a program error
        return t

    def _advance(self, t: float) -> None:
        dt = t - self.now
        for f in self.flows.values():
            f[0] -= f[1] * dt
        for r, fraction in self.occupancy.items():
            self.busy[r] += fraction * dt
        self.now = t

    def _fire_timers(self) -> None:
        tol = self.now * 1e-12 + 1e-18
        while self.timers and self.timers[0][0] <= self.now + tol:
            _t, _s, kind, nid = heapq.heappop(self.timers)
            if kind == "flow" and self.flow_bytes[nid] > 0:  # "flow" timers are only pushed for nodes with a flow
                self.flows[nid] = [self.flow_bytes[nid], 0.0]
                self.flows_changed = True
            else:
                self._finish(nid)

    def _finish_flows(self) -> None:
        done = [nid for nid, (left, rate) in self.flows.items() if left <= _EPS_BYTES + rate * self.now * 1e-12]
        for nid in done:
            del self.flows[nid]
            self.flows_changed = True
            self._finish(nid)

    def _finish(self, nid: int) -> None:
        self.end[nid] = self.now
        pending = self.pending
        ready = []
        for s in self.succs[nid]:
            pending[s] -= 1
            if pending[s] == 0:
                ready.append(s)
        if ready:
            self._start_all(ready)

    def _share(self) -> None:
        sig_id = self.sig_id
        classes: dict[int, int] = {}  # in the order the flows started: the order the solver sums loads in
        for nid in self.flows:
            sid = sig_id[nid]
            classes[sid] = classes.get(sid, 0) + 1
        rates, self.occupancy = self.sharing.rates(classes)
        for nid, f in self.flows.items():
            f[1] = rates[sig_id[nid]]
        self.flows_changed = False

    def _check_all_ran(self) -> None:
        for nid, node in enumerate(self.g.nodes):
            if math.isnan(self.end[nid]):
                raise ProgramError("deadlock: this instruction never becomes ready (circular waits across cores)",
                                   node.core, node.index, node.instr)

