"""Shrink a transformers config to a tiny, self-consistent one (hidden 64, 2 layers, 4 heads, vocab 256, ...).

Shrinking the size fields alone breaks the configs whose other fields are derived from them: an explicit
``head_dim`` or ``rotary_dim`` sized for the full model, multi-head latent attention's ranks and rope dims,
expert groups larger than the shrunken expert count, per-layer lists (``layer_types`` and its kin) cut to
the first two entries (which may drop the only attention layer, or a layer type the model looks up).
``consistent`` fixes those up per family of fields, so the shrunken model still runs on the CPU.
"""

from __future__ import annotations

from typing import Any

HIDDEN = 64
HEADS = 4
LAYERS = 2
MAX_LAYERS = 4  # more layers only to keep every distinct layer type

# Size fields and their shrunken values (set only where the config has the field with a larger int).
SIZES: dict[str, Any] = {
    **dict.fromkeys(["hidden_size", "d_model", "n_embd", "embed_dim", "dim", "word_embed_proj_dim",
                     "embedding_size", "projection_dim", "text_embed_dim", "vision_embed_dim",
                     "hidden_dim", "emb_dim"], HIDDEN),  # emb_dim: XLM/FlauBERT (was 2048, 100 M weights)
    **dict.fromkeys(["intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
                     "moe_intermediate_size", "shared_expert_intermediate_size",
                     "dim_ff", "d_inner", "shared_intermediate_size", "mamba_d_ssm",
                     "moe_shared_expert_intermediate_size"],
                    2 * HIDDEN),  # CPM-Ant's dim_ff, Funnel's d_inner, the Mamba-2 hybrids' fields
    **dict.fromkeys(["num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers",
                     "decoder_layers", "num_decoder_layers", "num_encoder_layers"], LAYERS),
    **dict.fromkeys(["num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads"], HEADS),
    **dict.fromkeys(["num_key_value_heads", "n_kv_heads", "num_kv_heads"], 2),
    **dict.fromkeys(["head_dim", "dim_head", "d_head"], HIDDEN // HEADS),  # CPM-Ant, Funnel
    **dict.fromkeys(["vocab_size", "n_vocab", "vocab_size_per_layer_input", "src_vocab_size", "tgt_vocab_size"],
                    256),  # Gemma3n: a per-layer table too; FSMT: one vocab per language
    "hidden_size_per_layer_input": HIDDEN // HEADS,
    **dict.fromkeys(["num_experts", "num_local_experts", "n_routed_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "top_k"], 2),
    **dict.fromkeys(["max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length"], 128),
}
TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                   "cls_token_id", "mask_token_id", "unk_token_id")
_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads")
_KV_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _first(d: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        if _int(d.get(k)):
            return k, d[k]
    return None, None


def sizes(values: dict[str, Any]) -> dict[str, Any]:
    """The size fields of ``values`` (a config's ``to_dict()``) shrunk, special token ids kept in the vocab."""
    out = {k: v for k, v in SIZES.items() if _int(values.get(k)) and values[k] > v}
    if values.get("vocab_size", 0) is None:  # a default that needs a tokenizer (ESM): give it one
        out["vocab_size"] = SIZES["vocab_size"]
        if "pad_token_id" in values and values["pad_token_id"] is None:
            out["pad_token_id"] = 1
    vocab = min((out[k] for k in ("vocab_size", "src_vocab_size", "tgt_vocab_size") if k in out), default=None)
    if vocab is not None:
        for key in TOKEN_ID_FIELDS:
            v = values.get(key)
            if _int(v) and v >= vocab:
                out[key] = min(vocab - 1, 2)
    return out


def mrope(values: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """Multimodal rotary sections (Qwen-VL, GLM-4V kin: the rotary frequencies split into time, height and width
    parts, ``mrope_section``) that add up to the shrunken head's rotary half. The modeling code's defaults
    ([16, 24, 24] for Qwen2-VL's 128-wide heads) are not in the config, so a config of a model that reads them
    gets them explicitly; the same 1 : 1.5 : 1.5 split, [2, 3, 3] for 16-wide heads."""
    rope = out.get("rope_parameters", values.get("rope_parameters"))  # ``consistent`` may have set it
    _, heads = _first({**values, **out}, _HEAD_KEYS)
    _, hidden = _first({**values, **out}, _HIDDEN_KEYS)
    head_dim = out.get("head_dim") or (hidden // heads if heads and hidden else None)
    if not isinstance(rope, dict) or not rope or not _int(head_dim) or rope.get("rope_type") == "axial":
        return {}  # no rope, or a vision tower's 2-D (axial) one

    def sections(params: dict) -> dict:
        half = int(head_dim * (params.get("partial_rotary_factor") or 1.0)) // 2
        side = 3 * half // 8
        return {**params, "mrope_section": [half - 2 * side, side, side]}

    if all(isinstance(v, dict) for v in rope.values()):  # one rope per layer type (Cohere Compass)
        return {"rope_parameters": {t: sections(p) for t, p in rope.items()}}
    return {"rope_parameters": sections(rope)}


MEDIA_TOKEN_FIELDS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index",
                      "audio_token_id", "audio_token_index")


def media_tokens(values: dict[str, Any]) -> dict[str, Any]:
    """The placeholder token ids of a vision- or audio-language config moved into the shrunken vocab: its top
    ids, one per distinct id (LLaVA's image token is 32000, past a 256-token vocab; the embedding of the
    token ids, placeholders included, runs before the image features replace them)."""
    vocab = SIZES["vocab_size"]
    ids = sorted({values[k] for k in MEDIA_TOKEN_FIELDS if _int(values.get(k)) and values[k] >= vocab})
    new = {old: vocab - 1 - i for i, old in enumerate(ids)}
    return {k: new[values[k]] for k in MEDIA_TOKEN_FIELDS if _int(values.get(k)) and values[k] in new}


def consistent(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Fix up ``out`` (the shrunk fields of ``values``) so the derived fields agree with the new sizes."""
    _heads(values, out)
    _latent_attention(values, out)
    _experts(values, out)
    _layers(values, out)
    _blocks(values, out)
    _mamba2(values, out)


MAMBA_CHUNK = 4  # two chunks of the 8 tokens: the inter-chunk recurrence runs too


def _mamba2(values: dict, out: dict) -> None:
    """Mamba-2 mixers (Bamba, Falcon-H1, GraniteMoeHybrid): 128 heads of a 256-wide state in chunks of 256
    tokens, for 8 tokens padded to one chunk, made them the slowest models of the sweep (timeouts, eager
    too). 4 heads whose head dim fills the mixer's width, a 16-wide state and chunks of 4 tokens."""
    if _int(values.get("mamba_num_heads")) and _int(values.get("mamba_head_dim")):
        _nemotron_h_mamba(values, out)
        return
    if not _int(values.get("mamba_n_heads")):
        return
    hidden = next((out[k] for k in _HIDDEN_KEYS if k in out), None) or values.get("hidden_size")
    width = out.get("mamba_d_ssm", values.get("mamba_d_ssm"))
    if not _int(width):
        width = (values.get("mamba_expand") or 2) * hidden
    heads = min(values["mamba_n_heads"], HEADS)
    out.update(mamba_n_heads=heads, mamba_d_head=width // heads)
    if _int(values.get("mamba_d_state")) and values["mamba_d_state"] > 16:
        out["mamba_d_state"] = 16
    if _int(values.get("mamba_chunk_size")) and values["mamba_chunk_size"] > MAMBA_CHUNK:
        out["mamba_chunk_size"] = MAMBA_CHUNK


def _nemotron_h_mamba(values: dict, out: dict) -> None:
    """Nemotron-H's names for the Mamba-2 mixer: 128 heads x 64 wide (8192, for a 64-wide shrunken model), an
    8-group 128-wide state: its worker ran out of the machine's 23 GB and was killed. 4 heads filling
    ``expand`` x the hidden size, 2 groups, a 16-wide state, chunks of 4 tokens."""
    hidden = next((out[k] for k in _HIDDEN_KEYS if k in out), None) or values.get("hidden_size")
    heads = min(values["mamba_num_heads"], HEADS)
    out.update(mamba_num_heads=heads, mamba_head_dim=(values.get("expand") or 2) * hidden // heads)
    if _int(values.get("n_groups")) and values["n_groups"] > 2:
        out["n_groups"] = 2  # divides the 4 heads
    if _int(values.get("ssm_state_size")) and values["ssm_state_size"] > 16:
        out["ssm_state_size"] = 16
    if _int(values.get("chunk_size")) and values["chunk_size"] > MAMBA_CHUNK:
        out["chunk_size"] = MAMBA_CHUNK


def _blocks(values: dict, out: dict) -> None:
    """Funnel's layers are ``block_sizes`` (default 3 blocks of 4 = 12 layers): one layer per block, the
    pooling between blocks kept."""
    blocks = values.get("block_sizes")
    if isinstance(blocks, list) and blocks and all(_int(b) for b in blocks) and max(blocks) > 1:
        out["block_sizes"] = [1] * len(blocks)


def _heads(values: dict, out: dict) -> None:
    hk, heads = _first(values, _HEAD_KEYS)
    _, hidden = _first(values, _HIDDEN_KEYS)
    if hk is None:
        return
    new_heads = out.get(hk, heads)
    for kv in _KV_KEYS:  # multi-head attention stays multi-head (some configs insist: ESMC)
        if _int(values.get(kv)) and values[kv] == heads:
            out[kv] = new_heads
        elif kv in values and values[kv] is None:  # Nemotron's config leaves it None and its attention divides by it
            out[kv] = new_heads
    if not _int(hidden):
        return
    new_hidden = next((out[k] for k in _HIDDEN_KEYS if k in out), hidden)
    old_head_dim = values["head_dim"] if _int(values.get("head_dim")) else hidden // heads
    new_head_dim = new_hidden // new_heads
    if _int(values.get("head_dim")):
        out["head_dim"] = new_head_dim
    rot = values.get("rotary_dim")
    if _int(rot) and old_head_dim:  # partial rotary sized for the full head: keep the same fraction
        out["rotary_dim"] = max(2, min(new_head_dim, round(rot * new_head_dim / old_head_dim / 2) * 2))


def _latent_attention(values: dict, out: dict) -> None:
    """Multi-head latent attention (DeepSeek V2/V3 and kin): small ranks, rope and nope dims that add up."""
    head_dim = out.get("head_dim", HIDDEN // HEADS)
    for key in ("q_lora_rank", "o_lora_rank"):  # DeepSeek-V4 has low-rank q and o without kv_lora_rank
        if _int(values.get(key)) and values[key] > 2 * head_dim:
            out[key] = 2 * head_dim
    if _int(values.get("index_head_dim")) and not _int(values.get("kv_lora_rank")):  # its indexer (8192 x 1024)
        out["index_head_dim"] = head_dim
        out["index_n_heads"] = min(values.get("index_n_heads") or HEADS, HEADS)
    if not _int(values.get("kv_lora_rank")):
        return
    out.update(kv_lora_rank=2 * head_dim, qk_rope_head_dim=head_dim // 2, qk_nope_head_dim=head_dim // 2,
               v_head_dim=head_dim)
    if _int(values.get("q_lora_rank")):
        out["q_lora_rank"] = 2 * head_dim
    if "head_dim" in values:
        out["head_dim"] = head_dim // 2  # these configs set head_dim to the rope dim
    if _int(values.get("index_head_dim")):  # DeepSeek sparse attention's indexer
        out["index_head_dim"] = head_dim
        out["index_n_heads"] = min(values.get("index_n_heads") or HEADS, HEADS)


def _experts(values: dict, out: dict) -> None:
    ek = next((k for k in _EXPERT_KEYS if k in values), None)
    if ek is not None and values[ek] is None and "num_experts_per_tok" in values \
            and values["num_experts_per_tok"] is None and _int(values.get("moe_intermediate_size")):
        out[ek], out["num_experts_per_tok"] = SIZES[ek], SIZES["num_experts_per_tok"]  # Dots1: MoE without a count
        if "n_shared_experts" in values and values["n_shared_experts"] is None:
            out["n_shared_experts"] = 1
    elif _int(values.get(ek)) and "num_experts_per_tok" in values and values["num_experts_per_tok"] is None:
        out["num_experts_per_tok"] = SIZES["num_experts_per_tok"]  # DeepSeek V2: experts but no top-k
    if _int(values.get("n_group")) and values["n_group"] > 1:  # groups of the 4 shrunken experts
        out["n_group"], out["topk_group"] = 2, 1
    if _int(values.get("first_k_dense_replace")) and values["first_k_dense_replace"] > 1:
        out["first_k_dense_replace"] = 1  # one dense layer, one MoE layer


def _layers(values: dict, out: dict) -> None:
    lk, n = _first(values, _LAYER_KEYS)
    if lk is None or lk not in out:
        return
    types = values.get("layer_types")
    keep = list(range(out[lk]))
    if isinstance(types, list) and len(types) == n:
        # one layer of each distinct type (first occurrences), topped up to LAYERS in order
        firsts = sorted({t: types.index(t) for t in types if isinstance(t, str)}.values())[:MAX_LAYERS]
        keep = sorted(set(firsts) | set(range(n)[: max(0, LAYERS - len(firsts))]))
        while len(keep) < LAYERS:
            keep.append(next(i for i in range(n) if i not in keep))
            keep.sort()
        out[lk] = len(keep)
        picked = [types[i] for i in keep]
        if all(t == "linear_attention" for t in picked):  # a hybrid needs an attention layer to run
            picked[-1] = "full_attention"
        out["layer_types"] = picked
    for key, v in values.items():  # other per-layer lists follow the same layers
        if key != "layer_types" and isinstance(v, list) and len(v) == n and n > out[lk]:
            out[key] = [v[i] for i in keep]
    if "attn_layer_indices" in values and not values.get("attn_layer_indices"):
        out["attn_layer_indices"] = [out[lk] - 1]  # Bamba's default has no attention layer
    elif isinstance(values.get("attn_layer_indices"), list):
        out["attn_layer_indices"] = [out[lk] - 1]
    if isinstance(values.get("attention_types"), list) and values["attention_types"]:
        kinds = values["attention_types"][0][0]  # GPT-Neo: [[["global", "local"], repeats]]
        out["attention_types"] = [[kinds, max(1, out[lk] // len(kinds))]]
        out[lk] = max(1, out[lk] // len(kinds)) * len(kinds)
    if _int(values.get("num_kv_shared_layers")) and values["num_kv_shared_layers"] >= out[lk]:
        out["num_kv_shared_layers"] = 0
    rope = values.get("rope_parameters")
    layer_types = out.get("layer_types", types)
    if rope == {} and isinstance(layer_types, list):  # per-layer-type rope with no entries (Cohere Compass)
        out["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": 10000.0} for t in set(layer_types)}


IMAGE = 64  # pixels a side
AUDIO_POSITIONS = 32  # Whisper-like encoders: 64 feature frames (the default 1500 positions are 3000 frames)


def media(values: dict[str, Any]) -> dict[str, Any]:
    """Vision and audio size fields: ``image_size`` about ``IMAGE`` (a multiple of ``patch_size``), per-stage
    lists of hierarchical vision models (Swin, ConvNeXt, Hiera: ``depths`` one block per stage, ``hidden_sizes``
    16 doubling per stage, ``num_heads`` scaled down so they divide the shrunken widths), and the audio
    encoder's source positions."""
    out: dict[str, Any] = {}
    size, patch = values.get("image_size"), values.get("patch_size")
    patch = patch[0] if isinstance(patch, (list, tuple)) and patch and _int(patch[0]) else patch
    side = size[0] if isinstance(size, (list, tuple)) and size and _int(size[0]) else size
    if _int(side) and side > IMAGE:
        new = patch * max(2, IMAGE // patch) if _int(patch) and patch > 0 else IMAGE
        if new < side:
            out["image_size"] = [new] * len(size) if isinstance(size, (list, tuple)) else new
    depths = values.get("depths")
    if _list_of_ints(depths) and max(depths) > 1:
        out["depths"] = [1] * len(depths)
    widths = values.get("hidden_sizes")
    if _list_of_ints(widths) and widths[0] > 16:
        out["hidden_sizes"] = [16 * 2 ** i for i in range(len(widths))]
    window, side = values.get("window_size"), out.get("image_size", values.get("image_size"))
    if _int(window) and window > 1 and _int(side) and _int(patch) and _list_of_ints(depths):
        # Swin kin: a window that tiles the token grid at every stage (the grid halves per stage)
        out["window_size"] = max(1, (side // patch) >> (len(depths) - 1))
    if _int(values.get("num_mel_bins")) and _int(values.get("max_length")) and values["max_length"] > 128:
        out["max_length"] = 128  # AST: 128 spectrogram frames, not 1024
    heads = values.get("num_heads")
    if _list_of_ints(heads) and heads[0] > 1 and all(h % heads[0] == 0 for h in heads):
        out["num_heads"] = [h // heads[0] for h in heads]  # Swin: [3, 6, 12, 24] -> [1, 2, 4, 8]
    if _int(values.get("max_source_positions")) and values["max_source_positions"] > AUDIO_POSITIONS:
        out["max_source_positions"] = AUDIO_POSITIONS
    return out


def _list_of_ints(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_int(x) for x in v)
