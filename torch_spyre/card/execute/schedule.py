"""A fixed order in which a proved program's instructions can run together: lockstep rounds.

In each round every core that is not blocked runs at most one data instruction (DMA, compute, ring send),
plus the sync instructions (signal, wait, ring receive, barrier) around it. A token produced in a round
(a signal, a ring transfer, a completed barrier) can be consumed only from the next round on. So whatever
one core does after synchronizing with another lands in a later round than everything the other did
before: two data instructions of one round are never ordered by the program. The program is proved free
of races (the checked executor's vector clocks), so the instructions of one round may run in any order,
and the alike ones of different cores at once: each round's data instructions are grouped by
:func:`instruction_key`, and a group runs as one array operation over its cores (see ``fast``).

The order depends only on the program (synchronization is static), so it is computed once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable

from ...program import (
    Barrier,
    DmaGather,
    DmaLoad,
    DmaStore,
    Instruction,
    Program,
    ProgramError,
    RingRecv,
    RingSend,
    Signal,
    Wait,
)

SYNC_TYPES = (Signal, Wait, RingRecv, Barrier)


@dataclass(frozen=True)
class Group:
    """Alike data instructions that several cores run in one round: ``members`` are (core, index)."""

    key: Hashable
    members: tuple[tuple[int, int], ...]


def instruction_key(ins: Instruction) -> Hashable:
    """What makes instructions of different cores alike: the instruction without its per-core parts
    (a DMA's device offset, a ring send's destination core). A gather reads its own indices: it is
    alike only with itself (each runs on its own)."""
    if isinstance(ins, DmaLoad):
        return (DmaLoad, ins.src.operand, ins.sp_offset, ins.pattern)
    if isinstance(ins, DmaStore):
        return (DmaStore, ins.dst.operand, ins.sp_offset, ins.pattern)
    if isinstance(ins, RingSend):
        return (RingSend, ins.src_offset, ins.dst_offset, ins.nbytes)
    if isinstance(ins, DmaGather):
        return (DmaGather, id(ins))
    return ins


def lockstep_rounds(program: Program, cores: dict[int, list[Instruction]] | None = None) -> list[list[Group]]:
    """The program's data instructions as rounds of groups (see the module docstring); ``cores``, if
    given, replaces the program's instruction lists (the fast executor's joined runs). Raises
    :class:`ProgramError` if the program cannot finish, which a proved program never does."""
    cores = {c: instrs for c, instrs in sorted((program.cores if cores is None else cores).items()) if instrs}
    active = tuple(cores)
    pc = dict.fromkeys(cores, 0)
    tokens: Counter = Counter()  # (kind, src, dst, tag) -> tokens consumable from this round on
    fresh: Counter = Counter()  # tokens produced in this round
    barrier_seen: dict[tuple[int, int], int] = Counter()  # (core, tag) -> barriers passed
    arrived: dict[tuple, set[int]] = {}  # (tag, group, count) -> cores that arrived
    complete: dict[tuple, int] = {}  # barrier instance -> round it became complete
    rounds: list[list[Group]] = []
    r = 0
    while any(pc[c] < len(cores[c]) for c in cores):
        groups: dict[Hashable, list[tuple[int, int]]] = {}
        progressed = False
        for c, instrs in cores.items():
            ran_data = False
            while pc[c] < len(instrs):
                ins = instrs[pc[c]]
                if isinstance(ins, SYNC_TYPES):
                    if not _sync_ready(ins, c, r, active, tokens, fresh, barrier_seen, arrived, complete):
                        break
                elif ran_data:
                    break  # one data instruction per core per round
                else:
                    groups.setdefault(instruction_key(ins), []).append((c, pc[c]))
                    if isinstance(ins, RingSend):
                        fresh[("ring", c, ins.dst_core, ins.tag)] += 1
                    ran_data = True
                pc[c] += 1
                progressed = True
        if not progressed:
            stuck = [c for c in cores if pc[c] < len(cores[c])]
            raise ProgramError(f"no order runs this program to the end: cores {stuck} stay blocked "
                               "(the checked executor names the deadlock)")
        tokens.update(fresh)
        fresh.clear()
        rounds.append([Group(k, tuple(m)) for k, m in groups.items()])
        r += 1
    return rounds


def _sync_ready(ins, core, r, active, tokens, fresh, barrier_seen, arrived, complete) -> bool:
    """Run sync instruction ``ins`` of ``core`` in round ``r`` if it can; False while it is blocked."""
    if isinstance(ins, Signal):
        fresh[("signal", core, ins.dst_core, ins.tag)] += 1
        return True
    if isinstance(ins, (Wait, RingRecv)):
        key = ("signal" if isinstance(ins, Wait) else "ring", ins.src_core, core, ins.tag)
        if tokens[key] <= 0:
            return False
        tokens[key] -= 1
        return True
    group = active if ins.cores is None else ins.cores
    instance = (ins.tag, group, barrier_seen[(core, ins.tag)])
    members = arrived.setdefault(instance, set())
    members.add(core)
    if len(members) == len(group) and instance not in complete:
        complete[instance] = r
    if complete.get(instance, r) >= r:  # complete only from the next round on
        return False
    barrier_seen[(core, ins.tag)] += 1
    return True
