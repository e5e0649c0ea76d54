"""TEMPORARY stand-ins for card/execute.py, card/validate.py and card/timing.py until they land.

Installed into sys.modules only when the real module cannot be imported. Small on purpose: they
handle the instructions the runtime tests use (contiguous-or-strided DMA, elementwise add/mul/copy
on float32) and time each instruction for one cycle-ish microsecond, which is all the launch and
profiler tests need (they compare against whatever ProgramTiming says, never against constants).
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass, field

import numpy as np

from torch_spyre.program import DmaLoad, DmaStore, Elementwise, ProgramError


def _validate(program, config):
    names = {o.name for o in program.operands}
    for core, i, ins in program.instructions():
        addr = getattr(ins, "src", None) if isinstance(ins, DmaLoad) else getattr(ins, "dst", None)
        if addr is not None and addr.operand not in names:
            raise ProgramError(f"unknown operand {addr.operand!r}", core, i, ins)


@dataclass
class _Interval:
    core: int
    index: int
    engine: str
    start: float
    end: float


@dataclass
class _Timing:
    total: float
    busy: dict
    utilization: dict
    intervals: list
    bytes: dict
    flops: float
    roofline_bound: float
    roofline_fraction: float
    bottleneck: str
    extra: dict = field(default_factory=dict)

    def summary(self):
        return f"stand-in timing: {self.total * 1e6:.3f} us, {self.bottleneck}-bound"


def _time_program(program, config):
    intervals, busy, dram, flops = [], {}, 0, 0
    for core, ins in program.cores.items():
        t = 0.0
        busy[core] = {}
        for i, x in enumerate(ins):
            d = 1e-6 if x.ENGINE != "dma" else 2e-6
            intervals.append(_Interval(core, i, x.ENGINE, t, t + d))
            busy[core][x.ENGINE] = busy[core].get(x.ENGINE, 0.0) + d
            t += d
            if x.ENGINE == "dma":
                dram += x.pattern.nbytes
            if isinstance(x, Elementwise):
                flops += x.out.numel
    total = max([iv.end for iv in intervals] + [0.0]) + 20e-6
    util = {c: {e: b / total for e, b in es.items()} for c, es in busy.items()}
    bound = dram / config.dram_read_bandwidth
    return _Timing(total, busy, util, intervals, {"dram": dram}, flops, bound, bound / total, "dram")


@dataclass
class _Stats:
    instructions: int


def _execute(card, program, dma_addresses):
    sps = {c: np.zeros(card.config.scratchpad_bytes, np.uint8) for c in program.cores}
    n = 0
    for core, i, ins in program.instructions():
        sp = sps[core]
        if isinstance(ins, (DmaLoad, DmaStore)):
            base = int(dma_addresses[core][i])
            p = ins.pattern
            for idx in np.ndindex(*p.shape):
                d = base + sum(a * s for a, s in zip(idx, p.dram_strides))
                o = ins.sp_offset + sum(a * s for a, s in zip(idx, p.sp_strides))
                if isinstance(ins, DmaLoad):
                    sp[o:o + 128] = card.memory.read(d, 128)
                else:
                    card.memory.write(d, sp[o:o + 128])
        elif isinstance(ins, Elementwise):
            view = lambda t: np.frombuffer(sp, np.float32, t.numel, t.offset)  # noqa: E731
            args = [view(a) for a in ins.inputs]
            out = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "copy": lambda a: a}[ins.op](*args)
            sp[ins.out.offset:ins.out.offset + 4 * ins.out.numel] = out.astype(np.float32).view(np.uint8)
        n += 1
    return _Stats(n)


def install() -> list[str]:
    """Put a stand-in in sys.modules for each card module that does not exist yet; returns their names."""
    import torch_spyre.card as card_pkg

    installed = []
    for mod, attr, fn in (("execute", "execute", _execute), ("validate", "validate", _validate),
                          ("timing", "time_program", _time_program)):
        name = f"torch_spyre.card.{mod}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            m = types.ModuleType(name)
            setattr(m, attr, fn)
            sys.modules[name] = m
            setattr(card_pkg, mod, m)
            installed.append(name)
    return installed
