"""What the compiler plugs into the device, installed by ``torch_spyre.register()`` (cheap: importing this
module imports neither Inductor nor the rest of the compiler).

- the device's program runner (``device/program_runner.py``): eager ops on spyre tensors run as cached
  single-op programs (``eager.py``; ``TORCH_SPYRE_EAGER=host`` makes it decline every op);
- the ``attention_heads_interleaved`` switch, asked when attention lays its output out (``device/sdpa.py``);
- the names Inductor looks up on the device module on the first compile for a PrivateUse1 device
  (``torch.spyre.Scheduling``, ``PythonWrapperCodegen``, ``CppWrapperCodegen``): answering registers the
  compiler with Inductor (``backend.register``), so the first ``torch.compile`` needs no explicit setup.
"""

from __future__ import annotations

from typing import Any

from ..device.program_runner import ProgramRunner, Ran, set_program_runner

# Inductor's lazy PrivateUse1 lookup (``init_backend_registration``) reads these on the device module.
INDUCTOR_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen")


class EagerProgramRunner(ProgramRunner):
    """The compiler's program runner: one op as a single-op program (``eager.run``), or a decline that
    says why once per op (``eager.warn_host``)."""

    def run(self, op: Any, info: Any, args: tuple, kwargs: dict, card: int) -> Ran | None:
        from . import eager

        if eager.mode() != "compile":
            return None
        if eager.compiling():
            return None
        blocked = eager.cannot_compile_now()
        if blocked:  # torch computing on real tensors inside a tracer: this call on the host, nothing cached
            eager.warn_host(info.name, blocked)  # (a quiet reason: recorded in host_reasons(), no warning)
            return None
        if eager.active():  # an op inside an eager program's graph: on the host, and the program is not used
            eager.note_nested_host(info.name)
            return None
        try:
            result, host_reason = eager.run(op, info, args, kwargs, card)
        except eager.HostOp as e:
            reason = e.reason
        else:
            reason = ""
        if reason:  # (warned outside the except: a warning raised as an error does not chain HostOp)
            eager.warn_host(info.name, reason)
            return None
        if host_reason:  # its graph computed on the host: those nested ops are already counted as host
            eager.warn_host(info.name, host_reason)
            return Ran(result, as_program=False)
        return Ran(result)

    def probing(self) -> bool:
        from . import eager

        return eager.compiling()


RUNNER = EagerProgramRunner()


def inductor_attr(name: str) -> Any:
    """``torch.spyre.<name>`` for Inductor's lookup: registers the backend (``backend.inductor_attr``)."""
    from . import backend

    return backend.inductor_attr(name)


def install() -> None:
    """Plug the compiler into the device (idempotent)."""
    from .. import spyre_module

    from ..device import sdpa
    from . import optimizations

    set_program_runner(RUNNER)
    spyre_module.provide(INDUCTOR_NAMES, inductor_attr)
    sdpa.set_interleave_policy(lambda: optimizations.enabled("attention_heads_interleaved"))
