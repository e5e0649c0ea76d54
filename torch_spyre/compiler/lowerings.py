"""Lowerings that keep whole ops on the card instead of Inductor's extern ATen calls or indirect indexing.

- the matmul family (``mm``, ``bmm``, ``addmm``, ``baddbmm``) -> generator "matmul" (fp32 operands as 16-bit
  parts for the PE arrays at ``torch.get_float32_matmul_precision()``, ``fp32_matmul.py``; views that
  merge dims of their buffer are copied first);
- ``embedding``, ``index_select``, ``index`` (one index tensor, or several on adjacent dims), ``gather`` -> generator "gather";
- ``cumsum`` -> a log-step scan of pointwise kernels;
- ``index_put(_)`` with one 1-d index (a static KV cache's ``index_copy_``) -> the gather of its inverse
  (``index_put.py``);
- ``spyre::flash_attention`` (traced SDPA on spyre, ``device/sdpa.py``) -> generator "attention", writing its
  heads interleaved ([B, L, H*Dv] underneath) where it can, as the meta kernel lays the result out;
- ``spyre::matmul_epilogue`` (a matmul with its bias, activation and residual, ``epilogue.py``, and a
  LayerNorm after them, ``epilogue_norm.py``) -> generator "matmul" with the epilogue in the kernel;
- ``spyre::matmul_group`` (matmuls reading one input, ``matmul_group.py``) -> generator "matmul_group";
- ``spyre::fused_mlp`` (up (+gate) -> activation -> down, ``fused_mlp.py``) -> generator "mlp", or the
  unfused kernels when no tiling of the fused kernel fits the scratchpad;
- ``copy_`` into a graph input written only by that copy (an eager op's write-only ``out=``, e.g. the
  ``addmm.out`` an eager ``nn.Linear`` reaches) from a whole-op kernel's result of the same strides -> that
  kernel writes the input directly (no copy kernel after it); any other ``copy_`` is Inductor's.

:func:`register_lowerings` puts them in Inductor's global lowerings table (through the seam,
``torch_spyre/_torch/inductor.py``); each one hands tensors of other devices to Inductor's own lowering.
Whole ops become :class:`SpyreExternKernel` nodes, whose ``codegen`` defines a whole-op kernel spec
(``kernel_ir.extern_kernel_spec``) in the wrapper.
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch import inductor as torch_inductor
from ..device import sdpa
from .access import walks_dims

DEVICE = "spyre"

MATMUL_KINDS = {"mm": 2, "bmm": 2, "addmm": 3, "baddbmm": 3}


def _make_extern_node():
    from . import kernel_ir

    class SpyreExternKernel(torch_inductor.ExternKernelOutBase):
        """One whole-op spyre kernel: ``inputs`` in the order of ``roles``, the output is role ``out``."""

        def __init__(self, layout, inputs, generator: str, roles: list[str], params: dict[str, Any], label: str):
            super().__init__(layout, inputs, python_kernel_name=f"spyre_{label}")
            self.spyre_generator, self.spyre_roles, self.spyre_params, self.spyre_label = generator, roles, params, label

        def codegen(self, wrapper) -> None:
            refs = {r: x.codegen_reference() for r, x in zip(self.spyre_roles, self.inputs)}
            target = torch_inductor.written_into(self)  # an out= it writes straight into (_lower_copy_)
            refs["out"] = target.get_name() if target is not None else self.get_name()
            spec = kernel_ir.extern_kernel_spec(
                wrapper.next_spyre_kernel_name_for(self.spyre_label), self.spyre_generator,
                {r: x for r, x in zip(self.spyre_roles, self.inputs)} | {"out": self},
                self.spyre_params, self.get_origins(),
            )
            wrapper.define_spyre_kernel(spec)
            wrapper.call_spyre_kernel(spec, refs)

    return SpyreExternKernel


def _spyre_lowering(original, lower_fn, name: str):
    """``lower_fn`` for tensors on spyre, Inductor's own lowering for every other device."""

    def lower(*args, **kwargs):
        tensors = [a for a in args if torch_inductor.is_ir_node(a)]
        device = tensors[0].get_device() if tensors else None
        if device is None or device.type != DEVICE:
            return original(*args, **kwargs)
        return lower_fn(*args, **kwargs)

    lower.__name__ = f"spyre_{name}_lowering"
    return lower


def _extern(generator: str, label: str, roles: list[str], inputs, size, dtype, params, stride=None):
    """One whole-op kernel writing a fresh buffer of ``size`` (row-major, or ``stride`` when given)."""
    if stride is None:
        stride = [1] * len(size)
        for d in range(len(size) - 2, -1, -1):
            stride[d] = stride[d + 1] * size[d + 1]
    layout = torch_inductor.fixed_layout(inputs[-1].get_device(), dtype, list(size), stride)
    return torch_inductor.tensor_box(_make_extern_node.cls(layout, inputs, generator, roles, params, label))


def _lower_matmul(kind: str):
    from . import fp32_matmul

    def lower(*args, **kwargs):
        n_in = MATMUL_KINDS[kind]
        if kind in ("mm", "bmm") and _static_equals(args[1].get_size()[-1], 1):
            return _matrix_vector(args[0], args[1])
        out_dtype = args[n_in - 1].get_dtype()
        beta = kwargs.get("beta", args[n_in] if len(args) > n_in else 1)
        alpha = kwargs.get("alpha", args[n_in + 1] if len(args) > n_in + 1 else 1)
        roles = (["bias"] if n_in == 3 else []) + ["a", "b"]
        node = torch_inductor.current_fx_node()
        note = node.meta.get("spyre_note") if node is not None else None  # (transposed_product.py)
        if out_dtype != torch.float32:
            inputs = [_matmul_operand(torch_inductor.realize_input(a)) for a in args[:n_in]]
            return _matmul_extern(kind, roles, inputs, alpha, beta, out_dtype, {"note": note} if note else {})
        # fp32: the PE arrays multiply 16-bit parts of the operands (fp32_matmul.py): one pass, or six
        # for fp32-accurate results, as one matmul over the parts concatenated along K.
        passes = fp32_matmul.passes()
        a, b = fp32_matmul.k_concatenated(*args[n_in - 2:n_in], passes)
        inputs = [_matmul_operand(torch_inductor.realize_input(x)) for x in (*args[:n_in - 2], a, b)]
        return _matmul_extern(kind, roles, inputs, alpha, beta, out_dtype, _fp32_note(passes))

    return lower


def _matmul_extern(kind: str, roles: list[str], inputs: list, alpha, beta, out_dtype, params: dict,
                   label: str | None = None):
    a, b = inputs[-2], inputs[-1]
    size = [*a.get_size()[:-1], b.get_size()[-1]]
    params = {"kind": kind, "alpha": float(alpha), "beta": float(beta)} | params
    return _extern("matmul", label or kind, roles, inputs, size, out_dtype, params)


def _fp32_note(passes) -> dict:
    """Why an fp32 matmul's K is several times the op's (recorded in its decisions)."""
    from . import fp32_matmul

    return {"note": f"fp32 operands as DLFloat16 parts for the PE arrays, {len(passes)} pass(es) concatenated "
                    f"along K (float32_matmul_precision={fp32_matmul.precision()!r}); fp32 accumulation and output"}


def _lower_fp32_b_parts(b):
    """``spyre::fp32_b_parts`` (``weight_parts.py``) -> the pointwise kernel(s) writing fp32 ``b``'s 16-bit
    parts stacked along K, as an fp32 matmul's own split writes them."""
    from . import fp32_matmul

    passes = fp32_matmul.passes()
    if len(passes) == 1:  # the one part, as the graph's output
        return torch_inductor.to_dtype(b, torch.float16)
    return fp32_matmul.b_concatenated(b, passes)


def _lower_fp32_mm_b_parts(a, b_parts, bias, beta, alpha):
    """``spyre::fp32_mm_b_parts`` (``weight_parts.py``) -> the fp32 ``addmm``/``mm`` lowering with B's parts
    given: only A is split here; the matmul kernel is the one ``addmm``/``mm`` gets."""
    from . import fp32_matmul

    passes = fp32_matmul.passes()
    a2 = fp32_matmul.a_concatenated(a, passes)
    kind = "addmm" if bias is not None else "mm"
    roles = (["bias"] if bias is not None else []) + ["a", "b"]
    inputs = [_matmul_operand(torch_inductor.realize_input(x)) for x in ([bias] if bias is not None else []) + [a2, b_parts]]
    return _matmul_extern(kind, roles, inputs, alpha, beta, torch.float32, _fp32_note(passes))


def _lower_matmul_epilogue(a, b, bias, residual, activation, alpha, beta, norm_weight=None, norm_bias=None,
                           norm_eps=None, note: str | None = None):
    """``spyre::matmul_epilogue`` (``epilogue.py``'s rewrite of a matmul and the bias, activation and
    residual after it) -> one matmul kernel that applies them to the fp32 accumulator before its one
    rounding, and a LayerNorm over N after them when ``norm_eps`` is given (``epilogue_norm.py``; 16-bit
    only). fp32 operands are multiplied as 16-bit parts concatenated along K (``fp32_matmul.py``), so the
    epilogue stays in the kernel at every precision."""
    from . import fp32_matmul

    batched = len(a.get_size()) == 3
    kind = ("baddbmm" if batched else "addmm") if bias is not None else ("bmm" if batched else "mm")
    steps = ([] if bias is None else ["bias"]) + ([activation] if activation else []) + \
        ([] if residual is None else ["residual"])
    norm = {"norm_weight": norm_weight, "norm_bias": norm_bias} if norm_eps is not None else {}
    if norm_eps is not None:
        if a.get_dtype() == torch.float32:
            raise ValueError("spyre::matmul_epilogue with a LayerNorm is for 16-bit operands (epilogue_norm.py only "
                             "rewrites those)")
        steps.append("layer_norm")
    label = "_".join([kind, *(s for s in steps if s != "bias")])  # e.g. addmm_gelu, bmm_relu_residual
    params = {"epilogue": {"steps": steps, "activation": activation, "optimization": "matmul_epilogue"}}
    if norm_eps is not None:
        params["norm"] = {"eps": float(norm_eps), "optimization": "matmul_layer_norm"}
    if note:  # why a fusion (the fused MLP, the LayerNorm) did not take this matmul (recorded in its decisions)
        params["unfused_mlp"] = note
    out_dtype = a.get_dtype()
    addends = [x for x in (bias, residual) if x is not None] + [x for x in norm.values() if x is not None]
    roles = (["bias"] if bias is not None else []) + (["residual"] if residual is not None else []) + \
        [r for r, x in norm.items() if x is not None] + ["a", "b"]
    if out_dtype == torch.float32:  # the PE arrays multiply 16-bit parts, concatenated along K
        passes = fp32_matmul.passes()
        a, b = fp32_matmul.k_concatenated(a, b, passes)
        params |= _fp32_note(passes)
    inputs = [_matmul_operand(torch_inductor.realize_input(x)) for x in (*addends, a, b)]
    params["activation"] = activation
    return _matmul_extern(kind, roles, inputs, alpha, beta, out_dtype, params, label)


def _lower_matmul_group(a, b, bias):
    """``spyre::matmul_group`` (``matmul_group.py``'s rewrite of matmuls reading one input) -> one kernel of
    the "matmul_group" generator (``codegen/matmul/group.py``) writing the members' outputs side by side."""
    a = _matmul_operand(torch_inductor.realize_input(a))
    inputs, roles, members, offset = [a], ["a"], [], 0
    for i, (w, c) in enumerate(zip(b, bias)):
        inputs.append(_matmul_operand(torch_inductor.realize_input(w)))
        roles.append(f"b{i}")
        if c is not None:
            inputs.append(_matmul_operand(torch_inductor.realize_input(c)))
            roles.append(f"bias{i}")
        n = int(w.get_size()[-1])
        members.append({"b": f"b{i}", "bias": f"bias{i}" if c is not None else None, "offset": offset})
        offset += n
    kind = "addmm" if all(c is not None for c in bias) else "mm"
    size = [*a.get_size()[:-1], offset]
    params = {"kind": "matmul_group", "members": members, "optimization": "matmul_group"}
    node = torch_inductor.current_fx_node()
    if node is not None and node.meta.get("spyre_notes"):  # its members' (matmul_group.py)
        params["notes"] = list(node.meta["spyre_notes"])
    return _extern("matmul_group", f"{kind}_x{len(members)}", roles, inputs, size, a.get_dtype(), params)


def _lower_fused_mlp(x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation, residual=None, norm_weight=None,
                     norm_bias=None, norm_eps=None, note=None):
    """``spyre::fused_mlp`` (``fused_mlp.py``'s rewrite of an MLP block) -> one kernel of the "mlp" generator
    (``codegen/mlp``) when some tiling of it fits the scratchpad (checked on the static shapes with the
    layouts the graph's layout plan gives its operands), else the unfused kernels: the up (and gate) matmul
    with the activation in its epilogue, the gate product, the down matmul; each records why. With
    ``norm_eps`` (``mlp_norm.py``) the kernel adds ``residual`` and normalizes over H; unfused, the down
    matmul's epilogue does (``epilogue_norm.py``'s kernel)."""
    from ..device import cards
    from .codegen import mlp

    x = _matmul_operand(torch_inductor.realize_input(x))
    operands = {"x": x, "w_up": w_up, "w_gate": w_gate, "w_down": w_down, "b_up": b_up, "b_gate": b_gate,
                "b_down": b_down}
    if norm_eps is not None:
        operands |= {"residual": residual, "norm_weight": norm_weight, "norm_bias": norm_bias}
    roles = [r for r, v in operands.items() if v is not None]
    inputs = [x] + [_matmul_operand(torch_inductor.realize_input(operands[r])) for r in roles[1:]]
    size = [*x.get_size()[:-1], w_down.get_size()[-1]]
    reason = _mlp_fit(roles, inputs, size, x.get_dtype(), activation, cards.config(), mlp, norm_eps)
    if reason is None:
        label = f"mlp_{activation}" + ("_gated" if w_gate is not None else "") + \
            ("_residual_layer_norm" if norm_eps is not None else "")
        params = {"activation": activation, "kind": "fused_mlp"}
        if norm_eps is not None:
            params["norm_eps"] = float(norm_eps)
        if note:  # why the LayerNorm after it was not folded (mlp_norm.py)
            params["norm_note"] = note
        return _extern("mlp", label, roles, inputs, size, x.get_dtype(), params)
    note = f"fused_mlp not used: {reason}"
    if w_gate is None:
        h = _lower_matmul_epilogue(x, w_up, b_up, None, activation, 1.0, 1.0, note=note)
    else:
        g = _lower_matmul_epilogue(x, w_gate, b_gate, None, activation, 1.0, 1.0, note=note)
        u = _lower_matmul_epilogue(x, w_up, b_up, None, None, 1.0, 1.0, note=note)
        h = torch_inductor.lowering_for(torch.ops.aten.mul.Tensor)(g, u)
    if norm_eps is not None:
        return _lower_matmul_epilogue(h, w_down, b_down, residual, None, 1.0, 1.0, norm_weight, norm_bias, norm_eps,
                                      note=note)
    return _lower_matmul_epilogue(h, w_down, b_down, None, None, 1.0, 1.0, note=note)


def _mlp_fit(roles, inputs, size, dtype, activation, config, mlp, norm_eps=None) -> str | None:
    """None when the fused kernel fits, else why not (shapes must be static to know). The weights are taken
    in the layout that needs the most scratchpad (sticked on K: staged and transposed in the kernel), since
    the layouts they will have at run time are not known here."""
    from .access import TensorView, device_dtype_of
    from ..card.layout import StickLayout

    views = {}
    for role, node, shape in [*zip(roles, inputs, [i.get_size() for i in inputs]), ("out", None, size)]:
        if not all(isinstance(d, int) or (hasattr(d, "is_number") and d.is_number) for d in shape):
            return f"the {role} shape {list(shape)} is symbolic; the fit is checked on static shapes"
        shape = tuple(int(d) for d in shape)
        layout = StickLayout(shape, -1, device_dtype_of(dtype))
        if role.startswith("w_"):  # the worst case: nn.Linear's own layout (sticked on K), transposed in kernel
            layout = StickLayout(shape[::-1], -1, device_dtype_of(dtype))
            views[role] = TensorView(role, layout, shape, (1, shape[0]))
        else:
            views[role] = TensorView(role, layout, shape)
    spec = mlp.MlpSpec(views["x"], views["w_up"], views["w_down"], views["out"], views.get("w_gate"),
                       views.get("b_up"), views.get("b_gate"), views.get("b_down"), activation,
                       residual=views.get("residual"), norm_weight=views.get("norm_weight"),
                       norm_bias=views.get("norm_bias"), norm_eps=norm_eps)
    return mlp.fit(spec, config)


def _activation_ir(name: str, x):
    """An activation of IR node ``x`` with Inductor's pointwise lowerings (the formulas torch's own
    decompositions use)."""
    aten = torch.ops.aten
    mul, add = torch_inductor.lowering_for(aten.mul.Tensor), torch_inductor.lowering_for(aten.add.Tensor)
    if name == "relu":
        return torch_inductor.lowering_for(aten.relu.default)(x)
    if name == "silu":
        return mul(x, torch_inductor.lowering_for(aten.sigmoid.default)(x))
    if name == "gelu":
        inner = torch_inductor.lowering_for(aten.erf.default)(mul(x, 0.7071067811865476))
    elif name == "gelu_tanh":
        cube = mul(mul(x, x), x)
        inner = torch_inductor.lowering_for(aten.tanh.default)(mul(add(x, mul(cube, 0.044715)), 0.7978845608028654))
    else:
        raise ValueError(f"unknown matmul epilogue activation {name!r}")
    return mul(mul(x, 0.5), add(inner, 1.0))


def _static_equals(n, value: int) -> bool:
    """True when the size ``n`` is the static number ``value`` (False for a symbolic size)."""
    try:
        return int(n) == value
    except (TypeError, ValueError):
        return False


def _matrix_vector(a, b):
    """``a @ b`` with N == 1 (a matrix-vector product, e.g. transformers' batched_mm MoE experts
    ``bmm(weight, x.unsqueeze(-1))``) as a multiply and a sum over K on the vector unit: the output's last
    dim has one element, so it cannot be the stick dim the matmul generator writes (it failed code
    generation with "out must be sticked on N"). Computed in fp32, as the card's accumulation is."""
    rank = len(a.get_size())
    bt = torch_inductor.permute(b, list(range(rank - 2)) + [rank - 1, rank - 2])  # [..., 1, K]
    aten = torch.ops.aten
    prod = torch_inductor.lowering_for(aten.mul.Tensor)(a, bt)  # [..., M, K]
    if prod.get_dtype() != torch.float32:
        prod = torch_inductor.to_dtype(prod, torch.float32)
    out = torch_inductor.lowering_for(aten.sum.dim_IntList)(prod, [rank - 1], True)  # [..., M, 1]
    return torch_inductor.to_dtype(out, a.get_dtype()) if a.get_dtype() != torch.float32 else out


def _lower_embedding(weight, indices, *args, **kwargs):
    if _unit_rows(weight) == 1:  # a [V, 1] table: an element gather of its [V] storage (see _unit_rows)
        view = torch_inductor.lowering_for(torch.ops.aten.view.default)
        flat = view(indices, [indices.get_numel()])
        picked = _lower_index_select(view(weight, [weight.get_size()[0]]), 0, flat, note=_UNIT_ROWS_NOTE)
        return view(picked, [*indices.get_size(), 1])
    w, i = _gather_operand(weight, starts_rows=True), _gather_operand(indices)
    size = [*i.get_size(), w.get_size()[1]]
    params = {"kind": "embedding", "dim": 0}
    node = torch_inductor.current_fx_node()
    if node is not None and node.meta.get("spyre_note"):  # why it was not grouped (embedding_group.py)
        params["note"] = node.meta["spyre_note"]
    return _extern("gather", "embedding", ["source", "index"], [w, i], size, w.get_dtype(), params)


def _lower_embedding_group(weights, indices):
    """``spyre::embedding_group`` (``embedding_group.py``'s rewrite of sibling lookups) -> one kernel of the
    "gather" generator running the members' row gathers in turn, each writing its slice [k] of the
    stacked [n, *index shape, D] output."""
    inputs, roles, members = [], [], []
    for k, (weight, index) in enumerate(zip(weights, indices)):
        inputs += [_gather_operand(weight, starts_rows=True), _gather_operand(index)]
        roles += [f"source{k}", f"index{k}"]
        members.append({"source": f"source{k}", "index": f"index{k}"})
    size = [len(members), *inputs[1].get_size(), inputs[0].get_size()[1]]
    return _extern("gather", f"embedding_x{len(members)}", roles, inputs, size, inputs[0].get_dtype(),
                   {"kind": "embedding_group", "members": members, "optimization": "embedding_group"})


def _lower_index_select(x, dim, index, note: str | None = None):
    rank = len(x.get_size())
    if rank >= 1 and dim % rank == rank - 1:
        return _element_index_select(x, index, note)
    unit = min(_unit_rows(x), rank - 1 - dim % rank)
    if unit:  # rows of size-1 dims: the same select of the source without them (see _unit_rows)
        view = torch_inductor.lowering_for(torch.ops.aten.view.default)
        size = list(x.get_size())
        picked = _lower_index_select(view(x, size[:rank - unit]), dim % rank, index, note=_UNIT_ROWS_NOTE)
        size[dim % rank] = index.get_numel()
        return view(picked, size)
    src, idx = _gather_operand(x, starts_rows=True), _gather_operand(index)
    dim = dim % max(len(src.get_size()), 1)
    size = list(src.get_size())
    size[dim] = idx.get_numel()
    return _extern("gather", "index_select", ["source", "index"], [src, idx], size, src.get_dtype(),
                   {"kind": "index_select", "dim": int(dim), **({"note": note} if note else {})})


def _element_index_select(x, index, note: str | None = None):
    """``index_select`` along the last dim, which the stick layout sticks: each index picks one element
    inside a 128-byte stick, which a row gather (whole sticks by DMA) cannot do. It is ``torch.gather``
    along that dim with the index expanded over the other dims: the gather generator's element path."""
    aten = torch.ops.aten
    rank, n = len(x.get_size()), index.get_numel()
    shaped = torch_inductor.lowering_for(aten.view.default)(index, [1] * (rank - 1) + [n])
    expanded = torch_inductor.lowering_for(aten.expand.default)(shaped, [*x.get_size()[:-1], n])
    return _lower_gather(torch_inductor.lowering_for(aten.gather.default))(x, rank - 1, expanded, note=note)


def _lower_index(original):
    """``x[idx]`` (``aten.index.Tensor`` with one index tensor): an index_select along its dim for a
    1-d index, an embedding row gather for a 2-d source indexed on dim 0, an index_select of the
    flattened index (viewed back) for other integer indices (``torch.take``); negative indices count from
    the end. Integer index tensors on adjacent dims (``x[i, j]``) index the merged dims. Other forms keep
    Inductor's lowering (indirect indexing, which the pointwise generator refuses with a clear error)."""

    def lower(x, indices):
        live = [(d, t) for d, t in enumerate(indices) if t is not None]
        if len(live) == 1 and not _is_bool(live[0][1]):
            d, idx = live[0]
            if torch_inductor.lowering_origin() != "aten.index_select.default":
                # Inductor decomposes index_select into x[idx]; index_select takes no negative indices (torch
                # raises), so its gathers skip the wrap kernel (20 us of fixed cost per gather).
                idx = _from_the_end(idx, x.get_size()[d])
            if len(idx.get_size()) == 1:
                return _lower_index_select(x, d, idx)
            if d == 0 and len(x.get_size()) == 2:
                return _lower_embedding(x, idx)
            if len(idx.get_size()) > 1 and not _is_bool(idx):  # an index_select of the flattened index
                view = torch_inductor.lowering_for(torch.ops.aten.view.default)
                picked = _lower_index_select(x, d, view(idx, [idx.get_numel()]))
                size = list(x.get_size())
                return view(picked, [*size[:d], *idx.get_size(), *size[d + 1:]])
        merged = _index_of_merged_dims(x, live)
        if merged is not None:
            return lower(*merged)
        return original(x, indices)

    return lower


def _from_the_end(index, size):
    """``x[idx]`` counts negative indices from the end (index_select and embedding do not; the gather
    generator stops on them): Falcon's ``x[..., -2]``-style reads failed on the card as out of range."""
    aten = torch.ops.aten
    where, lt = torch_inductor.lowering_for(aten.where.self), torch_inductor.lowering_for(aten.lt.Scalar)
    return where(lt(index, 0), torch_inductor.lowering_for(aten.add.Tensor)(index, size), index)


def _index_of_merged_dims(x, live):
    """``x[i, j]`` with integer index tensors on adjacent dims d..d+k-1 (CLIP's pooling
    ``h[arange(B), ids.argmax(-1)]``) is ``x`` with those dims merged, indexed by the one linear index
    ``i * size(d+1) + j`` (broadcast): the one-index forms above then keep it on the gather generator.
    Negative indices count from the end, as in torch. None for other forms."""
    dims = [d for d, _ in live]
    if len(live) < 2 or dims != list(range(dims[0], dims[0] + len(dims))) or any(_is_bool(t) for _, t in live) \
            or any(t.get_dtype().is_floating_point for _, t in live):
        return None
    size = list(x.get_size())
    d0, k = dims[0], len(dims)
    aten = torch.ops.aten
    add, mul = torch_inductor.lowering_for(aten.add.Tensor), torch_inductor.lowering_for(aten.mul.Tensor)
    linear = None
    for (d, t) in live:
        wrapped = _from_the_end(t, size[d])
        linear = wrapped if linear is None else add(mul(linear, size[d]), wrapped)
    flat = 1
    for n in size[d0:d0 + k]:
        flat = flat * n
    view = torch_inductor.lowering_for(aten.view.default)
    merged = view(x, [*size[:d0], flat, *size[d0 + k:]])
    return merged, [None] * d0 + [linear]


def _is_bool(x) -> bool:
    return x.get_dtype() == torch.bool


def _lower_gather(original):
    """``torch.gather(x, dim, index)`` -> the gather generator: along the last (stick) dim element by
    element; along another dim as a row gather when the index is constant along every other dim (an
    expanded index), else on the source and index moved so that ``dim`` is last (copy kernels) and the
    result moved back (a view). 0-d sources and empty indices keep Inductor's lowering."""

    def lower(x, dim, index, sparse_grad=False, note: str | None = None):
        rank = len(x.get_size())
        if rank == 0 or len(index.get_size()) != rank or index.get_numel() == 0:
            return original(x, dim, index, sparse_grad)
        dim = dim % rank
        idx = torch_inductor.realize_input(index)
        if dim != rank - 1 and not _varies_only_along(idx, dim):
            perm = [d for d in range(rank) if d != dim] + [dim]
            moved = lower(torch_inductor.permute(x, perm), rank - 1, torch_inductor.permute(index, perm), note=note)
            return torch_inductor.permute(moved, [perm.index(d) for d in range(rank)])
        unit = min(_unit_rows(x), rank - 1 - dim)
        if unit and all(torch_inductor.current_graph().sizevars.statically_known_equals(n, 1)
                        for n in idx.get_size()[rank - unit:]):  # see _unit_rows
            view = torch_inductor.lowering_for(torch.ops.aten.view.default)
            kept = rank - unit
            # An expanded index (stride 0) is no view's base: made contiguous first (a small copy kernel).
            idx = torch_inductor.require_contiguous(idx)
            picked = lower(view(x, list(x.get_size())[:kept]), dim, view(idx, list(idx.get_size())[:kept]),
                           note=_UNIT_ROWS_NOTE)
            return view(picked, list(idx.get_size()))
        if dim == rank - 1 and _index_rows_packed_apart(idx):
            # out[..., :1] of the gather by the index repeated twice: index and out rows then own their sticks.
            aten = torch.ops.aten
            twice = torch_inductor.lowering_for(aten.expand.default)(index, [*idx.get_size()[:-1], 2])
            note = ("index rows of one element lie apart in their storage (its size-1 last dim dropped): "
                    "gathered by the index repeated twice, out[..., :1] kept")
            return torch_inductor.lowering_for(aten.slice.Tensor)(lower(x, dim, twice, note=note), rank - 1, 0, 1)
        src = _gather_operand(x, starts_rows=dim != rank - 1)
        # A row gather reads the index along ``dim`` only (it is constant along the others): as it is.
        idx = _gather_operand(idx) if dim == rank - 1 else idx
        return _extern("gather", "gather", ["source", "index"], [src, idx], list(idx.get_size()),
                       src.get_dtype(), {"kind": "gather", "dim": int(dim), **({"note": note} if note else {})})

    return lower


def _index_rows_packed_apart(index) -> bool:
    """A gather index whose last dim is 1 over two or more leading dims of size > 1 (zaya's router,
    ``torch.gather(x [B, S, E], -1, idx [B, S, 1])``): its storage drops the size-1 dim
    (``device.tensor.layout_for``), so rows are single elements packed into sticks of the next dim, one
    stick per outer row ([B, S] sticked on S): neither rows owning sticks nor one back-to-back run, the
    two forms the element gather reads (nor can its out be stored so). With one leading dim they are one
    run ([N, 1] stored as [N]), which it reads as it is."""
    sv = torch_inductor.current_graph().sizevars
    size = list(index.get_size())
    return (len(size) >= 3 and sv.statically_known_equals(size[-1], 1)
            and sum(not sv.statically_known_leq(n, 1) for n in size[:-1]) >= 2)


def _varies_only_along(index, dim: int) -> bool:
    """The index is constant (stride 0) along every dim but ``dim`` of size > 1: an expanded index."""
    try:
        return all(int(n) <= 1 or int(st) == 0 for d, (n, st) in enumerate(zip(index.get_size(), index.get_stride()))
                   if d != dim)
    except (TypeError, AttributeError, NotImplementedError):
        return False


_UNIT_ROWS_NOTE = ("the source's rows end in size-1 dims, which its storage drops (rows of single elements packed "
                   "into sticks): gathered without them")


def _unit_rows(x) -> int:
    """How many trailing dims of a row gather's source are (provably) of size 1, unless all are. A storage
    drops its size-1 dims (``device.tensor.layout_for``: a [V, 1] table is stored as [V], sticked on V), so
    such rows are single elements packed 64 to a stick, never whole sticks of their own: Swin's relative
    position bias table with one head, ``table[index]`` of a [169, 1] table, failed code generation ("rows
    start at different lanes of their sticks"). Without those dims the gather is the same one over fewer
    dims, down to the element gather along the stick dim; no copy of the source is needed."""
    sv = torch_inductor.current_graph().sizevars
    size = list(x.get_size())
    unit = 0
    while unit < len(size) - 1 and sv.statically_known_equals(size[len(size) - 1 - unit], 1):
        unit += 1
    return unit


def _gather_operand(x, starts_rows: bool = False):
    """What the gather generator reads in place (its index, and its source: a row gather moves the source's
    rows as fixed sets of sticks, which a view merging dims of its buffer or starting inside a row is not): a view whose last dim is unit-stride and walks one dim
    of its buffer (sticks of one row evenly spaced). Anything else gets a copy in its own layout.
    ``starts_rows``: gathered rows must also start at the first lane of a stick (a row gather moves whole
    sticks), so a view starting inside its buffer's last dim is copied too."""

    x = torch_inductor.realize_input(x)
    if torch_inductor.has_flexible_layout(x):
        # Frozen contiguous (no copy): left flexible, Inductor gives the buffer the stride order of what
        # its kernel reads, so XLNet's ``input_ids.transpose(0, 1).contiguous()`` reached the embedding
        # as the transposed view ("its last dim (stride 8) does not run along the stick dim").
        return torch_inductor.require_contiguous(x)
    # Checked as Inductor's size variables prove them for every value of the symbols, not with int(): a
    # serving graph's KV cache has symbolic sizes, and int() failing on them copied the whole cache (4 MB a
    # layer) every decode step. What cannot be proved gets the copy (correct, only slower).
    sv = torch_inductor.current_graph().sizevars
    try:
        size, stride = x.get_size(), x.get_stride()
        if torch_inductor.is_reinterpret_view(x) and not _walks_buffer_dims(x):
            return _own_contiguous_copy(x)
        if size and not (sv.statically_known_leq(size[-1], 1) or sv.statically_known_equals(stride[-1], 1)):
            return _own_contiguous_copy(x)
        if starts_rows and torch_inductor.is_reinterpret_view(x):
            inner = x.data.get_layout().size[-1]
            offset = x.get_layout().offset
            if not (sv.statically_known_equals(offset, 0) or sv.statically_known_multiple_of(offset, inner)):
                return _own_contiguous_copy(x)
    except (TypeError, AttributeError, NotImplementedError):  # unusual layouts: a copy is always readable
        return _own_contiguous_copy(x)
    return x


def _own_contiguous_copy(x):
    """``x`` copied to its own contiguous buffer. The copy must be frozen contiguous: Inductor would otherwise
    give a copy kernel the stride order of what it reads (the transposed order we are copying away from).
    A view that is contiguous on the host but merges dims of its buffer (topk's [16, 2] indices seen as
    [32]) is returned as it is by ``require_contiguous``: it gets a plain copy."""
    copied = torch_inductor.require_contiguous(x)
    return torch_inductor.copy_input(x) if copied is x else copied


def _lower_cumsum(original):
    """``cumsum`` as a log-step (Hillis-Steele) scan: ceil(log_r(n)) pointwise kernels, step k adding to
    each element the r - 1 elements j * r^k (0 < j < r) before it along the dim (shifted, masked reads:
    the pointwise generator reads them as misaligned views, each mask cuts one box). Floats accumulate in
    fp32, integers in int64 (torch's result dtype for them). Each step is a full pass: right for the
    short scans models use (positions from an attention mask, a few thousand elements)."""

    ops = torch_inductor.loop_ops()

    def lower(x, axis=None, dtype=None):
        size = list(x.get_size())
        if not size or axis is None:
            return original(x, axis, dtype=dtype)
        if dtype is None:
            dtype = torch.int64 if not x.get_dtype().is_floating_point else x.get_dtype()
        dim = axis % len(size)
        acc = torch.float32 if dtype.is_floating_point else torch.int64
        y = torch_inductor.to_dtype(x, acc)
        step, radix = 1, _scan_radix(int(x.get_numel()))
        while step < int(size[dim]):
            y = _scan_step(y, dim, step, radix, ops)
            step *= radix
        return torch_inductor.to_dtype(y, dtype)

    return lower


def _scan_radix(numel: int) -> int:
    """Elements summed per scan step. Each step is a kernel (~20 µs fixed cost) reading ``radix``
    shifted views: 8 for small scans (fewer kernels: [8, 4096] in 4 kernels, 128 µs against 165 µs with
    4), 4 past 256k elements, where the reads dominate ([256, 4096] fp32: 913 µs against 969 µs with 8)."""
    return 8 if numel <= 1 << 18 else 4


def _scan_step(y, dim: int, step: int, radix: int, ops):
    """One scan step: out[..., i, ...] = sum over j < radix of y[i - j*step] (0 before the start),
    realized (the next step reads it shifted)."""
    load = y.make_loader()
    dtype = y.get_dtype()

    def earlier(index, j):
        shifted = list(index)
        shifted[dim] = index[dim] - j * step
        exists = ops.ge(ops.index_expr(index[dim], torch.int64), ops.constant(j * step, torch.int64))
        return ops.masked(exists, lambda: load(shifted), 0)

    def fn(index):
        total = load(index)
        for j in range(1, radix):
            total = ops.add(total, earlier(index, j))
        return total

    out = torch_inductor.pointwise(y.get_device(), dtype, fn, list(y.get_size()))
    out.realize()
    return out


def _matmul_operand(x):
    """A view that merges or splits dims of its buffer (e.g. [B, S, K] seen as [B*S, K]) is not one
    stride per dim in the stick layout's device order: give the matmul a copy in its own layout (a
    pointwise kernel). Permutes and slices stay views; the matmul generator reads them as they are."""

    if torch_inductor.is_reinterpret_view(x) and not _walks_buffer_dims(x):
        return torch_inductor.copy_input(x)
    return x


def _walks_buffer_dims(view) -> bool:
    """``access.walks_dims`` of an Inductor view over its buffer, with sizes and strides compared as
    Inductor's size variables prove them for every value of the symbols (what cannot be proved counts as
    false: a copy is correct, only slower)."""
    sv = torch_inductor.current_graph().sizevars
    try:
        base = view.data.get_layout()
        return walks_dims(list(zip(base.size, base.stride)), view.get_size(), view.get_stride(),
                          is_one=lambda n: sv.statically_known_leq(n, 1), equal=sv.statically_known_equals,
                          leq=sv.statically_known_leq, broadcast_ok=False)
    except (TypeError, AttributeError):  # unusual layouts: copy to be safe
        return False


def _lower_flash_attention(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """``spyre::flash_attention`` (traced SDPA on spyre, see ``device/sdpa.py``) -> one kernel of the
    "attention" generator (``codegen/attention/``) reading q/k/v/mask as they lie (views included),
    writing a fresh contiguous [B, Hq, Lq, Dv]."""

    q, k, v = (_attention_operand(x) for x in (query, key, value))
    inputs, roles = [q, k, v], ["query", "key", "value"]
    if attn_mask is not None:
        inputs.append(_attention_operand(attn_mask, rows=True))
        roles.append("attn_mask")
    B, Hq, Lq, _ = q.get_size()
    Dv = v.get_size()[-1]
    size = [B, Hq, Lq, Dv]
    params = {"is_causal": bool(is_causal), "scale": None if scale is None else float(scale),
              "enable_gqa": bool(enable_gqa), "attn_mask": "attn_mask" if attn_mask is not None else None,
              "kind": "attention"}
    # As the meta kernel laid it out (device/sdpa.py): heads interleaved ([B, Lq, Hq, Dv] underneath) when
    # the generator can store that, so merging the heads back afterwards is a view, not a copy kernel.
    views = [_static_view(x) for x in (q, k, v)]
    if None in views or not sdpa.heads_interleaved_out(views, q.get_dtype().itemsize):
        return _extern("attention", "sdpa", roles, inputs, size, q.get_dtype(), params)
    # The kernel writes a [B, Lq, Hq * Dv] buffer (allocated, and sticked, as one row of Hq * Dv per token:
    # heads of Dv < 64 share sticks, which the generator stores from tiles holding all of a stick's heads)
    # and the op's result is its [B, Hq, Lq, Dv] view.
    params["out_heads"] = int(Hq)
    merged = _extern("attention", "sdpa", roles, inputs, [B, Lq, Hq * Dv], q.get_dtype(), params)
    split = torch_inductor.lowering_for(torch.ops.aten.view.default)(merged, [B, Lq, Hq, Dv])
    return torch_inductor.permute(split, [0, 2, 1, 3])


def _static_view(x) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """(sizes, strides, storage offset) of an IR view as ints, None when any is symbolic."""
    try:
        return (tuple(int(n) for n in x.get_size()), tuple(int(n) for n in x.get_stride()),
                int(x.get_layout().offset))
    except (TypeError, ValueError, AttributeError, NotImplementedError):
        return None


def _attention_operand(x, rows: bool = False):
    """The generator reads rows along the stick dim (the last dim, unit stride): a view whose last dim
    has another stride (e.g. K given as a transpose of K^T) gets a copy in its own layout first.
    ``rows`` (the mask): a view splitting dims of its buffer is copied too (broadcast dims stay views):
    Swin's bias with one head is a [1, 1, L, L] view of the gather's [L * L] output, whose rows of L
    elements share sticks ("%attn_mask: rows start at different lanes of their sticks")."""

    sv = torch_inductor.current_graph().sizevars
    x = torch_inductor.realize_input(x)
    try:
        size, stride = x.get_size(), x.get_stride()
        if rows and torch_inductor.is_reinterpret_view(x):
            base = x.data.get_layout()
            if not walks_dims(list(zip(base.size, base.stride)), size, stride,
                              is_one=lambda n: sv.statically_known_leq(n, 1), equal=sv.statically_known_equals,
                              leq=sv.statically_known_leq):
                return _own_contiguous_copy(x)
        # Symbolic: only a last dim proved unit-stride (or of size 1) is read in place.
        if not (sv.statically_known_leq(size[-1], 1) or sv.statically_known_equals(stride[-1], 1)):
            return torch_inductor.require_contiguous(x)
    except (TypeError, AttributeError, NotImplementedError):
        return torch_inductor.require_contiguous(x)
    return x


def _register_sdpa_lowering() -> None:
    op = getattr(getattr(torch.ops, "spyre", None), "flash_attention", None)
    if op is None:  # the device did not define it (torch_spyre.device.sdpa)
        return
    torch_inductor.register_lowering(op.default, _lower_flash_attention)


def _lower_copy_(original):
    """``copy_(dst, src)`` where ``dst`` is a graph input written only by this copy (an eager op's write-only
    ``out=``, e.g. ``addmm.out``) and ``src`` a whole-op kernel's result read by nothing else, of the same
    dtype, size and strides: the kernel writes straight into ``dst`` instead of a buffer that a copy kernel
    then copies (one launch and one round trip through device memory fewer). Otherwise Inductor's copy."""

    def lower(dst, src, non_blocking=False):
        if _writes_straight_into(dst, src):
            torch_inductor.write_into(src.data.data, dst.data)
            return dst
        return original(dst, src, non_blocking)

    return lower


def _writes_straight_into(dst, src) -> bool:
    node = torch_inductor.current_fx_node()
    if node is None or len(node.args) < 2 or not all(hasattr(a, "users") for a in node.args[:2]):
        return False
    dst_fx, src_fx = node.args[:2]
    if dst_fx.op != "placeholder" or set(dst_fx.users) != {node} or set(src_fx.users) != {node}:
        return False  # the input is read too (its old value), or the result is used elsewhere
    if not (torch_inductor.is_tensor_box(dst) and torch_inductor.is_tensor_box(src)):
        return False
    dst_box, src_box = dst.data, src.data
    if not (getattr(dst_box, "is_input_buffer", lambda: False)() and hasattr(src_box, "data")):
        return False
    kernel = src_box.data
    if not isinstance(kernel, _make_extern_node.cls) or torch_inductor.written_into(kernel) is not None:
        return False
    if not _static_layout_equal(kernel.get_layout(), dst_box.data.get_layout()):
        return False
    return dst.get_device().type == DEVICE


def _static_layout_equal(a, b) -> bool:
    """Same dtype, static size, strides and offset."""
    try:
        return (a.dtype == b.dtype and [int(x) for x in a.size] == [int(x) for x in b.size]
                and [int(x) for x in a.stride] == [int(x) for x in b.stride] and int(a.offset) == int(b.offset))
    except TypeError:  # symbolic: not compared
        return False


def register_lowerings() -> None:
    """Patch Inductor's lowerings table for the ops above (each keeps Inductor's lowering for other devices)."""

    _make_extern_node.cls = _make_extern_node()
    aten = torch.ops.aten
    table = {getattr(aten, k).default: (_lower_matmul(k), k) for k in MATMUL_KINDS}
    table[aten.embedding.default] = (_lower_embedding, "embedding")
    table[aten.index_select.default] = (_lower_index_select, "index_select")
    lowering_for = torch_inductor.lowering_for
    table[aten.index.Tensor] = (_lower_index(lowering_for(aten.index.Tensor)), "index")
    table[aten.gather.default] = (_lower_gather(lowering_for(aten.gather.default)), "gather")
    table[aten.cumsum.default] = (_lower_cumsum(lowering_for(aten.cumsum.default)), "cumsum")
    from .index_put import lower_index_put

    table[aten.index_put_.default] = (lower_index_put(lowering_for(aten.index_put_.default), True), "index_put_")
    table[aten.index_put.default] = (lower_index_put(lowering_for(aten.index_put.default), False), "index_put")
    for op, (fn, name) in table.items():
        original = lowering_for(op)
        if original is None or getattr(original, "__name__", "").startswith("spyre_"):
            continue
        torch_inductor.register_lowering(op, _spyre_lowering(original, fn, name))
    copy_original = lowering_for(aten.copy_.default)
    if not getattr(copy_original, "__name__", "").startswith("spyre_"):
        torch_inductor.register_lowering(aten.copy_.default, _spyre_lowering(copy_original, _lower_copy_(copy_original),
                                                                              "copy_"))
    _register_sdpa_lowering()
    from . import embedding_group, epilogue, fused_mlp, matmul_group, weight_parts

    torch_inductor.register_lowering(epilogue.op(), _lower_matmul_epilogue)
    torch_inductor.register_lowering(fused_mlp.op(), _lower_fused_mlp)
    torch_inductor.register_lowering(embedding_group.op(), _lower_embedding_group)
    torch_inductor.register_lowering(matmul_group.op(), _lower_matmul_group)
    torch_inductor.register_lowering(weight_parts.parts_op(), _lower_fp32_b_parts)
    torch_inductor.register_lowering(weight_parts.matmul_op(), _lower_fp32_mm_b_parts)
