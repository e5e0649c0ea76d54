"""The scratchpad race check: a ring transfer against the receiver's other uses of its bytes, ordered by
happens-before alone, so the verdict is the same whatever order the simulator runs the cores in."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.programs import DeviceTensor, encode, operand_layout
from torch_spyre.card import Card, load_config
from torch_spyre.card.execute import ExecutionError, resolve_addresses
from torch_spyre.card.execute.driver import Execution
from torch_spyre.card.execute.state import scratchpads
from torch_spyre.card.validate import validate
from torch_spyre.program import Barrier, Elementwise, Program, RingRecv, RingSend, Signal, SpTensor, Wait

DL = "dlfloat16"
X = DeviceTensor("x", (8, 64))
Y = DeviceTensor("y", (16, 64), access="out")
LOW = SpTensor(0, DL, (8, 64))  # scratchpad bytes [0, 1024)
HIGH = SpTensor(1024, DL, (8, 64))  # [1024, 2048)


@pytest.fixture(scope="module")
def card() -> Card:
    return Card(0, load_config(environ={}))


def run_in_order(card, cores, order):
    """Validate and run ``cores`` with the simulator stepping the cores in ``order``; y as a tensor."""
    prog = Program("t", [X.operand(), Y.operand()], cores)
    validate(prog, card.config)
    allocs = {op.name: card.memory.allocate(op.nbytes) for op in prog.operands}
    try:
        x = torch.arange(8 * 64, dtype=torch.float32).reshape(8, 64) / 64
        card.memory.write(allocs["x"].address, operand_layout(X.operand()).pack(encode(x, DL)))
        addresses = resolve_addresses(prog, {n: a.address for n, a in allocs.items()})
        with scratchpads(card).lock:
            ex = Execution(card, prog, addresses)
            assert sorted(ex.active) == sorted(order)
            ex.active = list(order)
            ex.run()
        raw = card.memory.read(allocs["y"].address, operand_layout(Y.operand()).nbytes)
        return raw
    finally:
        for a in allocs.values():
            card.memory.free(a)


def two_senders(ordered: bool):
    """Core 0 sends 2048 bytes into core 1's [0, 2048); core 1 stores their upper half, then receives
    core 2's 1024 bytes into [0, 1024) and stores them. Core 2's transfer may land before core 0's
    (whose lower half then overwrites it) unless core 1 tells core 2 it has received core 0's."""
    return {
        0: [X.load(0, 0, 8, 0, 64), X.load(1024, 0, 8, 0, 64), RingSend(1, 0, 0, 2048, tag=2)],
        1: [RingRecv(0, tag=2), *([Signal(2, tag=5)] if ordered else []), Y.store(1024, 0, 8, 0, 64),
            RingRecv(2, tag=3), Y.store(0, 8, 8, 0, 64)],
        2: [X.load(0, 0, 8, 0, 64), Elementwise("exp", LOW, (LOW,)), *([Wait(1, tag=5)] if ordered else []),
            RingSend(1, 0, 0, 1024, tag=3)],
    }


ORDERS = list(itertools.permutations(range(3)))


@pytest.mark.parametrize("order", ORDERS)
def test_two_transfers_into_overlapping_bytes_race_in_every_core_order(card, order):
    # Before this check, the default order (0, 1, 2) passed: core 1 never touched [0, 1024) itself.
    # Core 2's send runs while core 0's transfer is still in flight in some orders (reported at once), after
    # core 1 received it in others (reported after the run): the same race, described the same way.
    with pytest.raises(ExecutionError, match=(
            r"core [02], instruction 2 \(ring_send.*scratchpad race on core 1: this ring_send writes its bytes "
            r"\[0, (1024|2048)\) .*core [02]'s ring_send \(instruction 2\) into bytes \[0, (2048|1024)\).*"
            r"may land in either order.*have core 1 signal (core 2|the second sender) after")):
        run_in_order(card, two_senders(ordered=False), order)


@pytest.mark.parametrize("order", ORDERS)
def test_two_transfers_ordered_by_a_signal_pass_in_every_core_order(card, order):
    got = run_in_order(card, two_senders(ordered=True), order)
    want = run_in_order(card, two_senders(ordered=True), (0, 1, 2))
    assert (got == want).all()


def early_signal(ordered: bool):
    """Core 1 tells core 0 its buffer [0, 1024) is free, then (unordered) still reads it; core 0 sends
    into it after the wait. Ordered: core 1 reads first, then signals."""
    use = Elementwise("exp", HIGH, (LOW,))
    body = [use, Signal(0, tag=5)] if ordered else [Signal(0, tag=5), use]
    return {
        0: [X.load(0, 0, 8, 0, 64), Wait(1, tag=5), RingSend(1, 0, 0, 1024, tag=2)],
        1: [X.load(0, 0, 8, 0, 64), *body, RingRecv(0, tag=2), Y.store(0, 0, 8, 0, 64),
            Y.store(1024, 8, 8, 0, 64)],
    }


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_use_between_the_signal_and_the_receive_races_in_every_core_order(card, order):
    with pytest.raises(ExecutionError, match=(
            r"core 0, instruction 2 \(ring_send.*scratchpad race on core 1: .* races with core 1's instruction 2 "
            r"\(exp .*\), which uses bytes \[0, 1024\).*neither happens before this send nor comes after the "
            r"ring_recv \(instruction 3\)")):
        run_in_order(card, early_signal(ordered=False), order)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_use_before_the_signal_passes_in_every_core_order(card, order):
    run_in_order(card, early_signal(ordered=True), order)


def brute_force_races(ex) -> set[tuple[int, int, int]]:
    """An independent oracle: happens-before between instructions built from the matching itself (k-th
    send to k-th receive per source, destination and tag; k-th signal to k-th wait; k-th barrier instance),
    closed by a fixed point, then every (transfer, earlier use of its bytes on the receiver) pair checked.
    Returns (sender, send index, receiver's use index) for each race."""
    prog = ex.program
    cores = sorted(ex.active)
    col = {c: k for k, c in enumerate(cores)}
    sends, signals, arrivals, seen = {}, {}, {}, {}
    for c in cores:
        for pc, ins in enumerate(prog.cores[c]):
            if isinstance(ins, (RingSend, Signal)):
                sends.setdefault((type(ins), c, ins.dst_core, ins.tag), []).append(pc)
    preds: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for c in cores:
        for pc, ins in enumerate(prog.cores[c]):
            if isinstance(ins, (RingRecv, Wait)):
                key = (RingSend if isinstance(ins, RingRecv) else Signal, ins.src_core, c, ins.tag)
                k = seen[key] = seen.get(key, -1) + 1
                preds.setdefault((c, pc), []).append((ins.src_core, sends[key][k]))
            if isinstance(ins, Barrier):
                key = ("barrier", c, ins.tag)
                k = seen[key] = seen.get(key, -1) + 1
                arrivals.setdefault((ins.tag, k), []).append((c, pc))
    for group in arrivals.values():
        for c, pc in group:
            preds.setdefault((c, pc), []).extend((c2, pc2 - 1) for c2, pc2 in group if c2 != c and pc2 > 0)
    # last[c][pc][col[c2]]: the last instruction of core c2 that happens before (or is) (c, pc)
    last = {c: [[-1] * len(cores) for _ in prog.cores[c]] for c in cores}
    changed = True
    while changed:
        changed = False
        for c in cores:
            for pc in range(len(prog.cores[c])):
                row = [pc if k == col[c] else -1 for k in range(len(cores))]
                sources = ([last[c][pc - 1]] if pc else []) + [last[c2][p2] for c2, p2 in preds.get((c, pc), [])]
                for other in sources:
                    row = [max(a, b) for a, b in zip(row, other)]
                if row != last[c][pc]:
                    last[c][pc] = row
                    changed = True
    out = set()
    for t in ex.received:
        for pc, lo, hi, _ in ex.cores[t.dst_core].uses:
            if pc < t.recv_index and lo < t.hi and hi > t.lo and last[t.src_core][t.src_index][col[t.dst_core]] < pc:
                out.add((t.src_core, t.src_index, pc))
    return out


@pytest.mark.parametrize("name,cores,order,races", [
    ("two senders", two_senders(False), (0, 1, 2), {(2, 2, 0)}),  # the window check's verdict, independently
    ("two senders, ordered", two_senders(True), (0, 1, 2), set()),
    ("early signal", early_signal(False), (1, 0), {(0, 2, 2)}),
    ("use before signal", early_signal(True), (1, 0), set()),
])
def test_the_window_check_agrees_with_a_brute_force_happens_before(card, monkeypatch, name, cores, order, races):
    from torch_spyre.card.execute.scratchpad_races import ScratchpadRaceCheck

    executions = []
    real = ScratchpadRaceCheck._check_scratchpad_races

    def keep(self):
        executions.append(self)
        real(self)

    monkeypatch.setattr(ScratchpadRaceCheck, "_check_scratchpad_races", keep)
    if races:
        with pytest.raises(ExecutionError, match="scratchpad race"):
            run_in_order(card, cores, order)
    else:
        run_in_order(card, cores, order)
    assert brute_force_races(executions[0]) == races


@pytest.mark.parametrize("name", ["all_to_all", "matmul_ksplit", "minilm_attention", "softmax_scratchpad"])
def test_hand_written_programs_have_no_race_by_brute_force_either(card, monkeypatch, name):
    from benchmarks.programs import ALL_BUILDERS, run_on_card
    from torch_spyre.card.execute.scratchpad_races import ScratchpadRaceCheck

    executions = []
    real = ScratchpadRaceCheck._check_scratchpad_races
    monkeypatch.setattr(ScratchpadRaceCheck, "_check_scratchpad_races", lambda self: (executions.append(self), real(self)))
    built = ALL_BUILDERS[name]()
    run_on_card(card, built.program, built.make_inputs(0))
    assert brute_force_races(executions[0]) == set()
