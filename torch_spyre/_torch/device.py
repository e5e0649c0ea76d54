"""The device's side of the seam: torch's private APIs for a PrivateUse1 device written in Python.

What the device needs from torch internals, under names that say what each does for us:

- :func:`register_python_device`, :func:`privateuse1_backend_name`: make PrivateUse1 a named device with a
  device module (``torch.<name>``), Python device hooks (always available) and a device guard;
- :func:`redispatch_to_cpu`: run an op's CPU kernel on device tensors (metadata-only ops, ``set_``);
- :func:`call_composite_implicit`: an op's CompositeImplicitAutograd kernel (its decomposition);
- :func:`torch_dispatch_disabled`: whether this thread runs with torch dispatch off (``no_dispatch()``);
- :func:`op_schema`, :data:`OpOverload`: an ATen op's schema, the type of an op overload;
- :func:`storage_key`: a number identifying a storage's ``StorageImpl`` while it lives;
- :func:`current_accelerator_type`: the device type of ``torch.accelerator``'s current accelerator.

The patches of torch's global state the device makes (docs/architecture.md, "Patches of torch's global
state"), each idempotent:

- :func:`set_composite_python_kernel`: a Python kernel for an op's CompositeImplicitAutograd key
  (``aten::scaled_dot_product_attention``, so traced SDPA on spyre becomes ``spyre::flash_attention``);
- :func:`route_accelerator_functions`: ``torch.accelerator`` functions call the device module when the
  current accelerator is ours;
- :func:`print_as_float32`: tensor printing converts tensors of our device to float32, not float64.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import torch
import torch._C
import torch._ops
import torch._tensor_str
from torch.utils import backend_registration

# Every private torch symbol this module uses ("module:attribute.path"); tests/test_torch_seam.py
# imports each one.
PRIVATE_SYMBOLS = [
    "torch._C._acc:PrivateUse1Hooks",
    "torch._C._acc:DeviceGuard",
    "torch._C._autograd:DeviceType.PrivateUse1",
    "torch._C:DispatchKey.CPU",
    "torch._C:DispatchKey.CompositeImplicitAutograd",
    "torch._C:DispatchKey.Python",
    "torch._C:_dispatch_tls_local_exclude_set",
    "torch._C:DispatchKeySet",
    "torch._C:_get_privateuse1_backend_name",
    "torch._C:_accelerator_getAccelerator",
    "torch.utils.backend_registration:_setup_privateuseone_for_python_backend",
    "torch._ops:OpOverload.redispatch",
    "torch._ops:OpOverload.py_impl",
    "torch:ops.aten.add.Tensor._op_dk",
    "torch:ops.aten.add.Tensor.py_kernels",
    "torch:ops.aten.add.Tensor._schema",
    "torch:UntypedStorage._cdata",
    "torch._tensor_str:tensor_totype",
    "torch._decomp:decomposition_table",
    "torch._refs:native_layer_norm",
    "torch.autograd:_unsafe_preserve_version_counter",
    "torch:Tensor._version",
    "torch._inductor.decomposition:decompositions",
    "torch._inductor.decomposition:decomp_native_layer_norm",
]

OpOverload = torch._ops.OpOverload  # the type of ``torch.ops.aten.add.Tensor`` (for annotations)

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_COMPOSITE_IMPLICIT = torch._C.DispatchKey.CompositeImplicitAutograd


# --- the device -----------------------------------------------------------------------------------
class _AlwaysAvailable(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _PrivateUse1Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def privateuse1_backend_name() -> str:
    """The current name of PrivateUse1 (``"privateuseone"`` until a backend renames it)."""
    return torch._C._get_privateuse1_backend_name()


def register_python_device(name: str, device_module: Any) -> None:
    """Rename PrivateUse1 to ``name``, install ``device_module`` as ``torch.<name>``, generate the
    ``Tensor.<name>()`` / ``Module.<name>()`` methods, and install Python device hooks (the device is
    always available) and a device guard (without them ``backward()`` fails an assertion)."""
    backend_registration._setup_privateuseone_for_python_backend(
        name, backend_module=device_module, hook=_AlwaysAvailable(), device_guard=_PrivateUse1Guard())


# --- the dispatcher -------------------------------------------------------------------------------
def redispatch_to_cpu(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``op``'s CPU kernel on these arguments, whatever their device (for ops that only edit metadata)."""
    return op.redispatch(_CPU_KEYS, *args, **kwargs)


def call_composite_implicit(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``op``'s CompositeImplicitAutograd kernel: torch's own decomposition of the op."""
    return op._op_dk(_COMPOSITE_IMPLICIT, *args, **kwargs)


def torch_dispatch_disabled() -> bool:
    """Whether this thread runs with torch dispatch disabled (``torch.utils._mode_utils.no_dispatch()``:
    the Python dispatch key excluded). Torch's tracers do so to compute on real tensors (fake tensors'
    constant propagation and fallback kernels, Inductor's constant inlining); nothing traced with fake
    tensors can run there (making a fake tensor then fails an assertion)."""
    return _is_excluded(_PYTHON_KEY)  # (one call: every eager op asks)


_is_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_PYTHON_KEY = torch._C.DispatchKey.Python


def set_composite_python_kernel(op: Any, fn: Callable[..., Any]) -> None:
    """Patch: ``fn`` as ``op``'s Python kernel for CompositeImplicitAutograd (the Python dispatcher, on
    while tracing, calls it instead of the C++ decomposition). Idempotent: an existing one is kept."""
    if _COMPOSITE_IMPLICIT not in op.py_kernels:
        op.py_impl(_COMPOSITE_IMPLICIT)(fn)


def wrap_decompositions(ops: list[Any], wrap: Callable[[Any, Callable[..., Any]], Callable[..., Any]]) -> None:
    """Patch: each op's Python decomposition in torch's table (which fake tensors run while tracing, and
    Inductor's decomposition table copies at its import) becomes ``wrap(op, decomposition)``. The layer
    norm's fake kernel and Inductor's decomposition call ``torch._refs.native_layer_norm`` by name, so that
    function is wrapped too (and Inductor's reference to it, if Inductor is already loaded). Idempotent."""
    import sys

    import torch._decomp
    import torch._refs

    def wrapped(op: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(fn, "_spyre_wrapped", False):
            return fn
        new = functools.wraps(fn)(wrap(op, fn))
        new._spyre_wrapped = True
        return new

    inductor = sys.modules.get("torch._inductor.decomposition")
    tables = [torch._decomp.decomposition_table] + ([inductor.decompositions] if inductor else [])
    for op in ops:
        for table in tables:
            if op in table and op is not torch.ops.aten.native_layer_norm.default:
                table[op] = wrapped(op, table[op])
        if op is torch.ops.aten.native_layer_norm.default:
            ref = torch._refs.native_layer_norm = wrapped(op, torch._refs.native_layer_norm)
            torch._decomp.decomposition_table[op] = ref
            if inductor is not None:
                inductor.decomp_native_layer_norm = ref


def version_of(t: torch.Tensor) -> int:
    """``t``'s autograd version counter (bumped by every in-place write to it or to a view of its storage)."""
    return t._version


def unversioned_writes(tensors: tuple) -> Any:
    """Context manager: writes to ``tensors`` inside it leave their autograd version counters as they
    were, as the CPU's batch norm kernels write the running statistics (their schemas do not declare
    the write, so autograd may have saved those tensors for the backward)."""
    return torch.autograd._unsafe_preserve_version_counter(tuple(tensors))


def op_schema(op: Any) -> Any:
    """An op overload's schema (``FunctionSchema``: arguments, returns, alias info)."""
    return op._schema


def storage_key(storage: torch.UntypedStorage) -> int:
    """The address of a storage's ``StorageImpl``: the same for every Python object of one storage."""
    return storage._cdata


# --- torch.accelerator ----------------------------------------------------------------------------
def current_accelerator_type() -> str | None:
    """The device type of the current accelerator (``torch.accelerator``), without initializing it."""
    acc = torch._C._accelerator_getAccelerator()
    return None if acc is None else acc.type


def _routed(original: Callable, target: Callable[[], Callable], active: Callable[[], bool]) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if active():
            return target()(*args, **kwargs)
        return original(*args, **kwargs)

    wrapper.__spyre_original__ = original  # type: ignore[attr-defined]
    return wrapper


def route_accelerator_functions(device_module: Callable[[], Any], memory: Mapping[str, str],
                                device: Mapping[str, str], device_index: Callable[[Any], Any],
                                active: Callable[[], bool]) -> None:
    """Patch: the ``torch.accelerator`` functions named in ``memory`` (``torch.accelerator.memory``) and
    ``device`` call the device module's function of the mapped name while ``active()`` (our device is
    the current accelerator), and the original otherwise. ``device_index(i)`` replaces
    ``torch.accelerator.device_index`` likewise. Each wrapper keeps the original as ``__spyre_original__``."""
    import torch.accelerator as acc
    import torch.accelerator.memory as acc_memory

    for attr, name in memory.items():
        original = getattr(acc_memory, attr)
        wrapped = _routed(original, lambda name=name: getattr(device_module(), name), active)
        setattr(acc_memory, attr, wrapped)
        if getattr(acc, attr, None) is original:
            setattr(acc, attr, wrapped)
    for attr, name in device.items():
        if hasattr(acc, attr):
            setattr(acc, attr, _routed(getattr(acc, attr), lambda name=name: getattr(device_module(), name), active))
    original_ctx = acc.device_index

    def device_index_ctx(index: Any, /):
        return device_index(index) if active() else original_ctx(index)

    acc.device_index = device_index_ctx


# --- printing -------------------------------------------------------------------------------------
def print_as_float32(device_type: str) -> None:
    """Patch: printing a tensor of ``device_type`` converts its values to float32 on the device, not
    float64 (as torch does for MPS and MAIA, which have no float64 either)."""
    ts = torch._tensor_str
    original = ts.tensor_totype
    if getattr(original, "__spyre_original__", None) is not None:
        return

    @functools.wraps(original)
    def tensor_totype(t):
        if t.device.type == device_type:
            return t.to(dtype=torch.float)
        return original(t)

    tensor_totype.__spyre_original__ = original  # type: ignore[attr-defined]
    ts.tensor_totype = tensor_totype


def call_after_module_to(hook: Callable[[torch.nn.Module], None]) -> None:
    """Patch: ``torch.nn.Module.to`` calls ``hook(module)`` after every move (one hook, installed once).

    Public API, but a process-wide change of torch, so it lives here: the adapters use it to adapt a
    transformers model that reaches spyre inside a container (a SentenceTransformer's ``nn.Sequential``)."""
    original = torch.nn.Module.to
    if getattr(original, "__spyre_original__", None) is not None:
        return

    @functools.wraps(original)
    def to(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if isinstance(out, torch.nn.Module):
            hook(out)
        return out

    to.__spyre_original__ = original  # type: ignore[attr-defined]
    torch.nn.Module.to = to
