"""``x[..., idx, ...] = v`` (``index_put`` / ``index_put_`` with one 1-d integer index, no accumulate) as
programs: how a static KV cache's ``index_copy_(2, cache_position, key_states)`` runs compiled.

The card has no scatter: its DMA moves rows to data-dependent places only when *reading* (``DmaGather``),
and the pointwise generator computes addresses from loop indices alone. A row scatter is the gather of its
inverse: with ``L`` rows along ``dim`` and ``S`` indices,

    inv[l]  = max { i : idx[i] == l }   (-1 when no index hits row l)   -- a [L, S] compare and a max
    new     = where(inv >= 0, index_select(v, dim, max(inv, 0)), x)      -- a row gather and a select

and ``index_put_`` copies ``new`` into ``x``. Every op is one the card compiles (pointwise, reduction, the
gather generator). The cost is a rewrite of all of ``x`` rather than of the ``S`` rows written: a decode
step of a static cache rewrites the whole cache of each layer (a true in-place scatter needs a DMA write
to data-dependent addresses, which the card model does not have). Of duplicate indices the last wins,
as torch's serial CPU kernel does. Negative indices count from the end; an index out of range raises at
launch (the indices are read through a gather, which checks them). Empty indices, other forms (several index
tensors, bool masks, ``accumulate=True``) keep Inductor's lowering and with it the fallback kernel
(``fallback.py``).
"""

from __future__ import annotations

import torch

from .._torch import inductor as torch_inductor


def _single_row_index(indices) -> tuple[int, object] | None:
    live = [(d, t) for d, t in enumerate(indices) if t is not None]
    if len(live) != 1:
        return None
    d, idx = live[0]
    dtype = idx.get_dtype()
    if dtype == torch.bool or dtype.is_floating_point or len(idx.get_size()) != 1:
        return None
    return d, idx


def rows_put(x, dim: int, idx, values):
    """``x`` with rows ``idx`` along ``dim`` replaced by ``values`` (broadcast to x's shape with ``len(idx)``
    rows at ``dim``), as IR the card compiles; ``x`` is not changed."""
    from .lowerings import _from_the_end, _lower_index_select, _own_contiguous_copy

    aten, prims = torch.ops.aten, torch.ops.prims
    low = torch_inductor.lowering_for
    view, where = low(aten.view.default), low(aten.where.self)
    size = list(x.get_size())
    rank, rows, n = len(size), size[dim], idx.get_numel()
    device = x.get_device()
    idx = _from_the_end(idx, rows)
    iota = low(prims.iota.default)
    row = iota(rows, start=0, step=1, dtype=torch.int64, device=device, requires_grad=False)
    # row[idx] is idx itself, read through a gather: the gather checks its indices at every launch, so an
    # index out of range raises IndexError as on the CPU instead of matching no row and dropping the write.
    idx = _lower_index_select(row, 0, idx)
    pos = iota(n, start=0, step=1, dtype=torch.int64, device=device, requires_grad=False)
    hits = low(aten.eq.Tensor)(view(row, [rows, 1]), view(idx, [1, n]))  # [L, S]
    inv = low(aten.amax.default)(where(hits, view(pos, [1, n]), -1), [1])  # [L]: the last index writing row l
    written = low(aten.ge.Scalar)(inv, 0)
    src = low(aten.expand.default)(values, [*size[:dim], n, *size[dim + 1:]])
    if src.get_dtype() != x.get_dtype():
        src = torch_inductor.to_dtype(src, x.get_dtype())
    # The gather moves whole rows of sticks: the source gets a buffer of its own, whose rows start sticks
    # (new K/V states are views of the projection's [B, S, H*D] output, H rows sharing one stick row).
    src = _own_contiguous_copy(src)
    picked = _lower_index_select(src, dim, low(aten.clamp_min.default)(inv, 0))
    keep = [1] * rank
    keep[dim] = rows
    return where(view(written, keep), picked, x)


def lower_index_put(original, in_place: bool):
    """The lowering of ``index_put_`` (``in_place``) or ``index_put`` on spyre: the single-row-index form
    through :func:`rows_put`, every other form through ``original`` (Inductor's)."""

    from .lowerings import _static_equals

    def lower(x, indices, values, accumulate=False):
        found = None if accumulate else _single_row_index(indices)
        if found is None or not len(x.get_size()) or _static_equals(found[1].get_numel(), 0):
            return original(x, indices, values, accumulate)
        new = rows_put(x, found[0], found[1], values)
        if in_place:
            return torch_inductor.lowering_for(torch.ops.aten.copy_.default)(x, new)
        return new

    return lower
