"""The device's hook for eager ops that can run as programs: a *program runner*, set by a higher layer.

Every ATen op without a spyre kernel reaches the device's fallback (``fallback.py``). Before computing it
on the host, the fallback asks the program runner, if one is set, to run the op; the runner returns a
:class:`Ran` or declines (None), and the fallback then computes the op on the host. The device knows
nothing of how a runner runs an op: the compiler installs its runner (``compiler/hooks.py``, single-op
programs from ``compiler/eager.py``) when ``torch_spyre`` registers, so eager ops run as programs without
any ``torch.compile`` (``TORCH_SPYRE_EAGER=compile``, the default; ``host`` makes the runner decline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .op_call import OpInfo


class Ran:
    """An op the runner computed: its ``result`` (device tensors, aliases of the arguments where the
    schema says so). ``as_program``: it ran as a program (counted in ``fallback_stats().compiled``);
    False when its program computed on the host after all (those nested ops were counted as host ops).
    (A plain class: this module is imported at ``import torch``, and stays cheap.)"""

    __slots__ = ("result", "as_program")

    def __init__(self, result: Any, as_program: bool = True):
        self.result = result
        self.as_program = as_program


class ProgramRunner:
    """What the device asks of a program runner (subclass it, or provide the same two methods)."""

    def run(self, op: Any, info: "OpInfo", args: tuple, kwargs: dict, card: int) -> Ran | None:
        """Run the op on card ``card``, or decline (None: nothing was computed or written)."""
        return None

    def probing(self) -> bool:
        """True while host runs of ops are the runner's own probes (e.g. shape inference while it
        compiles): the fallback neither counts nor times them."""
        return False


_runner: ProgramRunner | None = None


def set_program_runner(runner: ProgramRunner | None) -> ProgramRunner | None:
    """Install ``runner`` (None: every op on the host); returns the previous one."""
    global _runner
    previous, _runner = _runner, runner
    return previous


def program_runner() -> ProgramRunner | None:
    return _runner
