"""The compiler's optimizations by name, each of which can be switched off.

Every optimization the compiler makes on top of a plain correct program has a name here, so that its effect is
measured rather than remembered (``benchmarks/seed.py`` times each one off and on) and so that a user who
suspects one can turn it off:

- in code: ``with torch_spyre.compiler.optimizations.disabled("matmul_tiling"): ...``;
- in the environment: ``TORCH_SPYRE_DISABLE=matmul_tiling,ring_sharing``.

A generator asks :func:`enabled` when it decides. The set of disabled optimizations is part of the compiler's
cache key (:func:`fingerprint`), so a program compiled with one off is never served with it on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator

ENV = "TORCH_SPYRE_DISABLE"

#: name -> what switching it off does. Add a name here before asking ``enabled`` for it.
KNOWN: dict[str, str] = {
    "matmul_tiling": "matmul takes the first valid tiling and layout instead of searching for the fastest",
    "scratchpad_planning": "kernels keep operands in device memory instead of planning scratchpad residency",
    "ring_sharing": "every core loads its own matmul operands instead of sharing tiles over the ring",
    "matmul_epilogue": "bias, activation and residual after a matmul run as separate pointwise kernels",
    "attention_heads_interleaved": "attention writes a contiguous [B, H, L, D] output, so merging its heads back "
                                   "into [B, L, H*D] is a copy kernel, instead of writing the heads interleaved",
    "index_views": "an index by aranges over whole dims (x[arange(B)[:, None], arange(S)]) runs as a gather "
                   "kernel and the kernels computing its indices instead of as a view of x",
    "matmul_layer_norm": "a LayerNorm after a matmul's epilogue runs as a reduction kernel of its own instead "
                         "of on the matmul's accumulator (whole rows per core) before its one rounding",
    "matmul_group": "matmuls reading the same input (attention's Q, K and V projections) run as a kernel each "
                    "instead of one kernel writing their outputs side by side",
    "mlp_layer_norm": "the residual and LayerNorm after a fused MLP run as a reduction kernel of their own instead "
                      "of on the MLP kernel's fp32 sums (the finisher keeps whole rows) before its one rounding",
    "embedding_group": "embedding lookups with index tensors of one shape (BERT's words, token types and "
                       "positions) run as a gather kernel each instead of one kernel running their gathers in turn",
    "fused_mlp": "an MLP block (up (+gate) -> activation -> down) runs as separate matmul and pointwise kernels, "
                 "its intermediate written to device memory and read back",
    "onchip_relayout": "an in-place relayout goes through device memory (a scratch allocation and a copy back) "
                       "instead of through the scratchpads with stick blocks exchanged over the ring",
    "matmul_leftover_split": "N sticks that do not divide equally over a matmul's cores go as uneven pieces (the "
                             "first cores one stick more) instead of each leftover stick split by K over several "
                             "cores, every core then doing the same work",
    "transposed_product": "a matmul read transposed by a kernel that wants it in the other stick layout "
                          "(attention's K from (w @ x.t()).t()) is followed by a transposing copy kernel instead "
                          "of being computed as b.t() @ a.t() in that layout",
    "row_views": "a view of whole rows of its allocation (x[i], an encode's batch rows stacked) is placed where "
                 "it lies, so an eager op compiles and a kernel generates again for every row offset, instead of "
                 "once with the view placed at offset 0 and bound where its rows start (compiler/row_views.py)",
}

#: optimizations the issue tracker plans but the compiler does not make yet. Switching one off would do nothing,
#: so it is refused with a message saying so (a name moves to KNOWN when its optimization is built).
NOT_BUILT: dict[str, str] = {}

_local = threading.local()


class UnknownOptimizationError(ValueError):
    pass


def _check(names: tuple[str, ...] | list[str], where: str) -> frozenset[str]:
    planned = sorted(set(names) & NOT_BUILT.keys())
    if planned:
        raise UnknownOptimizationError(
            f"optimization {', '.join(map(repr, planned))} in {where} is not built yet, so there is nothing to "
            f"switch off; switchable ones: {', '.join(sorted(KNOWN))}")
    unknown = sorted(set(names) - KNOWN.keys())
    if unknown:
        raise UnknownOptimizationError(
            f"unknown optimization {', '.join(map(repr, unknown))} in {where}; known ones: {', '.join(sorted(KNOWN))}")
    return frozenset(names)


def _from_env() -> frozenset[str]:
    return _parse_env(os.environ.get(ENV, ""))


@functools.lru_cache(maxsize=16)
def _parse_env(raw: str) -> frozenset[str]:
    """The names in the variable's value (memoized: every kernel launch reads the switches)."""
    return _check([n.strip() for n in raw.split(",") if n.strip()], f"${ENV}")


def disabled_set() -> frozenset[str]:
    """The optimizations switched off here and now: the environment's and every enclosing :func:`disabled`."""
    return _from_env() | getattr(_local, "disabled", frozenset())


def enabled(name: str) -> bool:
    _check((name,), "enabled()")
    return name not in disabled_set()


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Switch the named optimizations off inside the block (this thread only)."""
    extra = _check(names, "disabled()")
    before = getattr(_local, "disabled", frozenset())
    _local.disabled = before | extra
    try:
        yield
    finally:
        _local.disabled = before


def fingerprint() -> str:
    """The disabled set as it enters the compiler's cache key."""
    local = getattr(_local, "disabled", None)
    if not local:  # (every eager op and launch asks: the environment's alone, memoized per value)
        return _env_fingerprint(os.environ.get(ENV, ""))
    return _joined(disabled_set())


@functools.lru_cache(maxsize=16)
def _env_fingerprint(raw: str) -> str:
    return _joined(_parse_env(raw))


@functools.lru_cache(maxsize=64)
def _joined(names: frozenset[str]) -> str:
    return ",".join(sorted(names))
