"""The gather spec and its normalisation: embedding, index_select and (expanded-index) torch.gather
brought to one form, "positions of an index pick rows along a dim of the source", with a clear error
for what cannot run. torch.gather along the stick dim is routed to the element gather (``element.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torch_spyre.compiler.access import CodegenError, TensorView, walks_layout_dims

GATHER_KINDS = ("embedding", "index_select", "gather")
INDEX_DTYPES = ("int64", "int32")


@dataclass(frozen=True)
class GatherSpec:
    """One gather with static shapes.

    - ``embedding``: out[*idx, :] = source[idx, :]; source [V, D], out idx.shape + [D] (dim must be 0).
    - ``index_select``: out = source.index_select(dim, index), index 1-d (or 0-d).
    - ``gather``: out = torch.gather(source, dim, index): along the last (stick) dim element by element;
      along another dim only when index is constant along every other dim (stride 0, i.e. an expanded
      index), which makes it an index_select of a narrowed source; anything else is refused with an
      explanation.

    ``chunk`` forces the indices gathered per DmaGather step (None: as many as fit, balanced over cores)."""

    kind: str
    source: TensorView
    index: TensorView
    out: TensorView
    dim: int = 0
    name: str = "gather"
    chunk: int | None = None
    source_ops: tuple[str, ...] = ()

    @staticmethod
    def embedding(num_embeddings: int, dim: int, index_shape: tuple[int, ...], dtype: Any = torch.float16,
                  index_dtype: Any = torch.int64, **kw: Any) -> "GatherSpec":
        """An embedding lookup over fresh buffers weight, indices and out in the default layout."""
        return GatherSpec("embedding", TensorView.contiguous("weight", (num_embeddings, dim), dtype),
                          TensorView.contiguous("indices", index_shape, index_dtype),
                          TensorView.contiguous("out", (*index_shape, dim), dtype), 0,
                          source_ops=("aten.embedding.default",), **kw)

    @staticmethod
    def index_select(source_shape: tuple[int, ...], dim: int, n: int, dtype: Any = torch.float16,
                     index_dtype: Any = torch.int64, **kw: Any) -> "GatherSpec":
        out_shape = list(source_shape)
        out_shape[dim % len(source_shape)] = n
        return GatherSpec("index_select", TensorView.contiguous("source", source_shape, dtype),
                          TensorView.contiguous("indices", (n,), index_dtype),
                          TensorView.contiguous("out", tuple(out_shape), dtype), dim,
                          source_ops=("aten.index_select.default",), **kw)


@dataclass(frozen=True)
class _Plan:
    """What a gather is after normalisation: positions of ``index`` (row-major) pick rows along ``dim``
    of ``source``; position coordinates ``coord_map`` [(out dim, index dim)] place them in ``out``."""

    source: TensorView
    index: TensorView
    out: TensorView
    dim: int
    coord_map: tuple[tuple[int, int], ...]
    num_rows: int


def _normalise(spec: GatherSpec) -> _Plan:
    """Check the spec and bring the three kinds to one form, with a clear error for what cannot run."""
    if spec.kind not in GATHER_KINDS:
        raise CodegenError(f"unknown gather kind {spec.kind!r}; known: {', '.join(GATHER_KINDS)}")
    src, idx, out = spec.source, spec.index, spec.out
    if idx.dtype not in INDEX_DTYPES:
        raise CodegenError(f"{spec.kind} index %{idx.name} must be int64 or int32, got {idx.dtype}")
    if src.dtype != out.dtype:
        raise CodegenError(f"{spec.kind}: source %{src.name} is {src.dtype} but out %{out.name} is {out.dtype}")
    if src.dtype not in ("dlfloat16", "float32", "int64", "int32", "bool"):
        raise CodegenError(f"{spec.kind}: unsupported data dtype {src.dtype}")
    r = len(src.shape)
    if r < 1:
        raise CodegenError(f"{spec.kind}: source %{src.name} is 0-d")
    dim = spec.dim % r
    if not idx.shape:  # a 0-d index is one position
        idx = TensorView(idx.name, idx.layout, (1,), (1,), idx.storage_offset)
    if spec.kind == "embedding":
        if r != 2 or dim != 0:
            raise CodegenError(f"embedding weight %{src.name} must be 2-d [num_embeddings, dim], got {list(src.shape)}")
        want = (*spec.index.shape, src.shape[1])
        # Index dim d is out dim d (a 0-d index: its one position has no coordinate in out).
        coord_map = tuple((d, d) for d in range(len(spec.index.shape)))
    elif spec.kind == "index_select":
        if len(idx.shape) != 1:
            raise CodegenError(f"index_select index %{idx.name} must be 1-d, got shape {list(spec.index.shape)}")
        want = tuple(idx.shape[0] if d == dim else s for d, s in enumerate(src.shape))
        coord_map = ((dim, 0),)
    else:
        src, idx, want, coord_map = _gather_as_select(spec, dim)
    if out.shape != tuple(want):
        raise CodegenError(f"{spec.kind}: out %{out.name} has shape {list(out.shape)}, expected {list(want)}")
    if dim == r - 1:
        raise CodegenError(
            f"{spec.kind} along dim {dim} of %{src.name}: that is the stick dim of its layout, so each index picks "
            "single elements inside 128-byte sticks, which DMA cannot do; relayout the source so that another "
            "dim is sticked (e.g. transpose so the gathered dim is not last), or run it on the vector unit")
    for role, t in (("source", src), ("index", idx), ("out", out)):
        t.check_last_dim_sticked(f"{spec.kind} {role}")
    # The index is read in chunks of consecutive positions, as lanes of its sticks: a view that merges
    # dims of its allocation (a [2, 12] index seen as [24]) jumps to another row's sticks mid-chunk.
    # (A source view like that is refused where its rows are found, with the relayout it needs.)
    if not walks_layout_dims(idx.layout, idx.shape, idx.strides):
        raise CodegenError(f"{spec.kind} index %{idx.name}: the view {list(idx.shape)} (strides {list(idx.strides)}) "
                           f"merges or splits dims of its allocation {list(idx.layout.host_shape)}, which a gather "
                           "cannot read one stride per dim; copy it to its own layout first")
    return _Plan(src, idx, out, dim, coord_map, src.shape[dim])


def _gather_as_select(spec: GatherSpec, dim: int) -> tuple[TensorView, TensorView, tuple[int, ...], tuple]:
    """torch.gather with an index constant along every dim but ``dim`` is an index_select of the source
    narrowed to the index's sizes. Anything else picks different elements in each row."""
    src, idx = spec.source, spec.index
    if len(idx.shape) != len(src.shape):
        raise CodegenError(f"gather index %{idx.name} must have the source's rank {len(src.shape)}, got {len(idx.shape)}")
    varying = [d for d in range(len(idx.shape)) if d != dim and idx.shape[d] > 1 and idx.strides[d] != 0]
    if varying:
        raise CodegenError(
            f"gather along dim {dim} with an index that varies along dim(s) {varying} picks a different element "
            "per row: a DmaGather moves whole rows of sticks and cannot. Only an index expanded over the other "
            "dims (index_select) maps to DmaGather; otherwise lower torch.gather to a relayout of the source "
            "sticked on the gathered dim plus a vector-unit select, or run it on the host")
    if any(idx.shape[d] > src.shape[d] for d in range(len(idx.shape)) if d != dim):
        raise CodegenError(f"gather index shape {list(idx.shape)} exceeds source {list(src.shape)} off dim {dim}")
    narrowed = TensorView(src.name, src.layout, tuple(src.shape[dim] if d == dim else idx.shape[d]
                                                       for d in range(len(src.shape))), src.strides, src.storage_offset)
    positions = TensorView(idx.name, idx.layout, tuple(s if d == dim else 1 for d, s in enumerate(idx.shape)),
                           idx.strides, idx.storage_offset)
    return narrowed, positions, idx.shape, ((dim, dim),)


def _select_as_gather(spec: GatherSpec) -> GatherSpec:
    """index_select along the last dim is a gather whose index is the same for every row (stride 0)."""
    src, idx = spec.source, spec.index
    if len(idx.shape) > 1:
        raise CodegenError(f"index_select index %{idx.name} must be 1-d, got shape {list(idx.shape)}")
    n, stride = (idx.shape[0], idx.strides[0]) if idx.shape else (1, 1)
    expanded = TensorView(idx.name, idx.layout, (*src.shape[:-1], n), (0,) * (len(src.shape) - 1) + (stride,),
                          idx.storage_offset)
    return GatherSpec("gather", src, expanded, spec.out, -1, spec.name, spec.chunk,
                      spec.source_ops or ("aten.index_select.default",))


def _is_element_gather(spec: GatherSpec) -> bool:
    return spec.kind == "gather" and len(spec.source.shape) >= 1 and spec.dim % len(spec.source.shape) == len(spec.source.shape) - 1
