"""Every ``model_type`` of the installed transformers, built offline from a shrunken config.

A model is built from its config class's defaults with the size fields shrunk (hidden 64, 2 layers,
4 heads, vocab 256, ...; every sub-config too; ``shrink.py`` keeps the derived fields consistent), random weights and synthesised inputs of the kind its
``main_input_name`` asks for (token ids, pixel values, audio samples or features). Nothing is downloaded.

A model type that cannot be built this way (no model class, a config whose defaults need a checkpoint,
inputs we cannot synthesise, a CPU forward that fails) is :class:`NotBuildable`: reported, not counted.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from . import shrink

SEQ_LEN = 8
BATCH = 2


class NotBuildable(Exception):
    """The model type cannot be built offline from a shrunken config (not counted in pass rates)."""


@dataclass
class Built:
    model_type: str
    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    family: str  # encoder | decoder | encoder-decoder | other
    modality: str  # text | vision | audio | multimodal | other
    output: str = "last_hidden_state"  # what is compared: "logits" or "last_hidden_state"
    class_name: str = ""
    config_changes: dict[str, Any] = field(default_factory=dict)
    batch_norms_calibrated: int = 0  # batch norms whose running statistics ``calibrate_batch_norms`` set


def _mappings():
    from transformers.models.auto import modeling_auto as ma

    return ma


def model_types() -> list[str]:
    """Every model type of the installed transformers that has a model class, sorted."""
    ma = _mappings()
    return sorted(ma.MODEL_MAPPING_NAMES)


_AUDIO = ("MODEL_FOR_CTC_MAPPING_NAMES", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
          "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES",
          "MODEL_FOR_AUDIO_FRAME_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES",
          "MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES")
_MULTIMODAL = ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_VISUAL_QUESTION_ANSWERING_MAPPING_NAMES",
               "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES", "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
               "MODEL_FOR_DOCUMENT_QUESTION_ANSWERING_MAPPING_NAMES", "MODEL_FOR_ZERO_SHOT_OBJECT_DETECTION_MAPPING_NAMES")
_VISION = ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_IMAGE_MAPPING_NAMES",
           "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
           "MODEL_FOR_BACKBONE_MAPPING_NAMES", "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES",
           "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES", "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES",
           "MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES", "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES")
_TEXT = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
         "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
         "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
         "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES")


def _in(model_type: str, names: tuple[str, ...]) -> bool:
    ma = _mappings()
    return any(model_type in getattr(ma, n, {}) for n in names)


def classify(model_type: str) -> tuple[str, str]:
    """``(family, modality)`` of a model type, from the auto mappings that list it."""
    ma = _mappings()
    if _in(model_type, _AUDIO):
        modality = "audio"
    elif _in(model_type, _MULTIMODAL):
        modality = "multimodal"
    elif _in(model_type, _VISION):
        modality = "vision"
    elif _in(model_type, _TEXT):
        modality = "text"
    else:
        modality = "other"
    if model_type in ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES or model_type in ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        family = "encoder-decoder"
    elif model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        family = "encoder"  # Bert and its kin also have a causal-LM head; masked LM makes them encoders
    elif model_type in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        family = "decoder"
    elif modality == "text":
        family = "encoder"
    elif modality in ("vision", "audio"):
        family = "encoder"
    else:
        family = "other"
    return family, modality


def _shrunk_kwargs(cfg, diff_subconfigs: bool = False, media: bool = True, mrope: bool = False) -> dict[str, Any]:
    """Constructor overrides that shrink ``cfg`` (a config instance with its defaults), sub-configs included.
    ``diff_subconfigs``: a sub-config is passed without the generic fields every config has (for the sub-config classes
    that refuse the generic fields of a full ``to_dict()``, e.g. DBRX's). ``media``: the image and audio fields
    too (``shrink.media``)."""
    from transformers import PretrainedConfig

    values = cfg.to_dict()
    out = shrink.sizes(values)
    shrink.consistent(values, out)
    out.update(shrink.media_tokens(values))
    if mrope:
        out.update(shrink.mrope(values, out))
    if media:
        out.update(shrink.media(values))
    for key in list(values):
        sub = getattr(cfg, key, None)
        if isinstance(sub, PretrainedConfig):
            base = sub.to_dict()
            if diff_subconfigs:
                generic = PretrainedConfig().to_dict()
                base = {k: v for k, v in base.items() if k not in generic or k == "model_type"}
            out[key] = {**base, **_shrunk_kwargs(sub, diff_subconfigs, media, mrope)}
    return out


def _mae_noise(model, cfg, inputs: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """ViT-MAE keeps the patches of lowest ``noise`` (else ``torch.rand`` on the model's device): one fixed
    permutation per sample, spaced 1/patches apart so no two values tie, not even rounded to fp16."""
    size, patch = cfg.image_size, cfg.patch_size
    size = size if isinstance(size, (list, tuple)) else (size, size)
    patch = patch if isinstance(patch, (list, tuple)) else (patch, patch)
    patches = (size[0] // patch[0]) * (size[1] // patch[1])
    batch = inputs["pixel_values"].shape[0]
    return {"noise": torch.stack([torch.randperm(patches, generator=gen) for _ in range(batch)]).float() / patches}


# Per-family extras: config overrides applied after shrinking (``config``) and extra inputs (``inputs``:
# ``f(model, cfg, inputs, generator)``, the same tensors on the CPU and on the card) for what the generic
# synthesis gets wrong. Mostly randomness a forward draws itself: the card's generator and the CPU's draw
# different numbers, so it is given as an input or switched off. ``build`` refuses a model whose two CPU
# forwards still differ (``NotBuildable``), so one missing here is not reported as the card's numerics.
EXTRAS: dict[str, dict[str, Any]] = {
    "vit_mae": {"inputs": _mae_noise},
    # VITS samples its prior latents and (stochastic duration predictor) durations with randn: scale 0 keeps
    # the means, so the output length (the durations) and the waveform are the model's deterministic part
    "vits": {"config": {"noise_scale": 0.0, "noise_scale_duration": 0.0}},
    # BLIP-2 kin place the query tokens' outputs at their image token, which has no default id
    **dict.fromkeys(["blip-2", "instructblip", "instructblipvideo"], {"config": {"image_token_index": 255}}),
}


def shrunk_config(model_type: str, media: bool = True):
    """The config of ``model_type`` with its size fields shrunk; NotBuildable when it cannot be made."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise NotBuildable(f"unknown model_type {model_type!r} (not in this transformers' CONFIG_MAPPING)")
    cls = CONFIG_MAPPING[model_type]
    try:
        default = cls()
    except Exception as e:  # noqa: BLE001 - any failure to make the config means "cannot shrink"
        raise NotBuildable(f"config cannot be shrunk: {type(e).__name__}: {_first_line(e)}") from None
    error = None
    for diff in (False, True):
        try:
            kwargs = {**_shrunk_kwargs(default, diff_subconfigs=diff, media=media, mrope=_reads_mrope(cls)),
                      **EXTRAS.get(model_type, {}).get("config", {})}
            return cls(**kwargs), kwargs
        except Exception as e:  # noqa: BLE001
            from .check import ModelTimeout

            if isinstance(e, ModelTimeout):  # the model's time ran out: not a reason to try the other form
                raise
            error = error or e
    raise NotBuildable(f"config cannot be shrunk: {type(error).__name__}: {_first_line(error)}") from None


def _reads_mrope(config_cls) -> bool:
    """Whether the model type's modeling code splits its rotary embedding in ``mrope_section``s (its defaults
    are in that code, sized for the full head: ``shrink.mrope``)."""
    import importlib.util

    spec = importlib.util.find_spec(config_cls.__module__.replace(".configuration_", ".modeling_"))
    if spec is None or not spec.origin:
        return False
    with open(spec.origin, encoding="utf-8") as f:
        return "mrope_section" in f.read()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _model_class(model_type: str, family: str):
    ma = _mappings()
    import transformers

    order = {"decoder": ["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"],
             "encoder-decoder": ["MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"]}.get(family, [])
    for mapping in order + ["MODEL_MAPPING_NAMES"]:
        name = getattr(ma, mapping).get(model_type)
        if isinstance(name, (tuple, list)):
            name = name[0]
        if name and hasattr(transformers, name):
            return getattr(transformers, name), mapping != "MODEL_MAPPING_NAMES"
    raise NotBuildable(f"no model class for {model_type!r} in this transformers")


def _inputs(model, cfg, family: str) -> list[dict[str, torch.Tensor]]:
    """Candidate inputs for ``model``, the most likely first (``build`` keeps the first whose CPU forward
    works). Token ids for text; pixel values sized from the vision config; raw audio samples or filterbank
    features for audio, in the layouts and lengths the speech models ask for."""
    gen = torch.Generator().manual_seed(0)
    name = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    if name == "input_ids":
        vocab = getattr(cfg.get_text_config(), "vocab_size", None) or 256
        low = min(4, vocab - 1)
        ids = torch.randint(low, vocab, (BATCH, SEQ_LEN), generator=gen)
        out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if family == "encoder-decoder":
            out["decoder_input_ids"] = ids[:, : SEQ_LEN // 2].clone()
        if "bbox" in params:
            out["bbox"] = _boxes(cfg, gen)
        if "pixel_values" in params and (getattr(cfg, "vision_config", None) is not None or hasattr(cfg, "image_size")):
            with_image = {**out, "pixel_values": _pixels(cfg, gen, batch=BATCH)}  # dual encoders (CLIP kin)
            image_text = _image_and_text(model, cfg, out, gen)  # vision-language models
            return [c for c in (image_text, with_image, out) if c is not None]
        return [out]
    if name == "pixel_values":
        image = {"pixel_values": _pixels(cfg, gen)}
        if "input_ids" not in params:
            return [image]
        # image-conditioned text (BLIP-2, InstructBLIP, Kosmos-2): a caption of SEQ_LEN tokens too
        vocab = getattr(cfg.get_text_config(), "vocab_size", None) or 256
        ids = torch.randint(min(4, vocab - 1), vocab, (1, SEQ_LEN), generator=gen)
        text = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if "qformer_input_ids" in params:
            qvocab = getattr(getattr(cfg, "qformer_config", None), "vocab_size", None) or 256
            text.update(qformer_input_ids=ids % qvocab, qformer_attention_mask=torch.ones_like(ids))
        candidates = [{**image, **text}, image]
        with_tokens = _image_and_text(model, cfg, text, gen, batch=1)
        return [with_tokens | {k: v for k, v in text.items() if k.startswith("qformer")}] + candidates \
            if with_tokens else candidates
    if name in ("input_values", "input_features"):
        return [_audio(name, shape, cfg, family) for shape in _audio_shapes(name, cfg)]
    raise NotBuildable(f"cannot synthesise the input {name!r} (only token ids, pixel values and audio are)")


def _image_token(cfg) -> int | None:
    return next((v for v in (getattr(cfg, k, None) for k in ("image_token_id", "image_token_index"))
                 if isinstance(v, int) and not isinstance(v, bool)), None)


def _image_and_text(model, cfg, text: dict[str, torch.Tensor], gen: torch.Generator,
                    batch: int = BATCH) -> dict[str, torch.Tensor] | None:
    """A vision-language model's inputs: one image per sample and, before the ``SEQ_LEN`` text tokens, as many
    image placeholder tokens as ``get_image_features`` returns features per image (the model checks that they
    match). None when the model has no placeholder token or its image features need more inputs than we
    synthesise (Qwen-VL's grid sizes): then its candidates without image tokens are tried."""
    token, features = _image_token(cfg), getattr(model, "get_image_features", None)
    hidden = getattr(cfg.get_text_config(), "hidden_size", None)
    if token is None or features is None or not hidden:
        return None
    pixels = _pixels(cfg, gen, batch=batch)
    h, w = pixels.shape[-2:]
    params = inspect.signature(features).parameters
    for image in ({"pixel_values": pixels},  # [batch, channels, h, w]
                  {"pixel_values": pixels, "image_sizes": torch.tensor([[h, w]] * batch)},  # LLaVA-NeXT, Mistral 3
                  {"pixel_values": pixels.unsqueeze(1)},  # [batch, images, channels, h, w]: Idefics 2/3, SmolVLM
                  _patch_grid(cfg, gen, batch)):  # flattened patches and their grid: Qwen-VL, GLM-4V kin
        if not set(image) - {"pixel_values"} <= set(params):
            continue
        try:
            with torch.no_grad():
                out = features(**image, **{k: v for k, v in text.items() if k.startswith("qformer") and k in params})
            break
        except Exception:  # noqa: BLE001 - try the next layout
            continue
    else:
        return None  # not this kind of model: the other candidates are tried
    out = getattr(out, "pooler_output", out)
    tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
    total = sum(t.numel() for t in tensors)
    if not tensors or total % (hidden * batch):
        return None
    per_image = getattr(cfg, "num_query_tokens", None) or total // (hidden * batch)  # BLIP-2: its queries
    if "image_grid_thw" in image:  # the processor's rule: a placeholder per merge window of the grid
        vc = getattr(cfg, "vision_config", None) or cfg
        per_image = int(image["image_grid_thw"][0].prod()) // (getattr(vc, "spatial_merge_size", None) or 1) ** 2
    ids = text["input_ids"].masked_fill(text["input_ids"] == token, 1 if token != 1 else 2)
    ids = torch.cat([torch.full((batch, per_image), token, dtype=ids.dtype), ids], dim=1)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **image}
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:  # 1 marks an image token (GLM-4.6V)
        out["mm_token_type_ids"] = (ids == token).int()
    return out


def _patch_grid(cfg, gen: torch.Generator, batch: int) -> dict[str, torch.Tensor]:
    """Images as Qwen-VL's processor leaves them: each image a grid of 1 x side x side patches (``side`` two
    merge windows), every patch flattened to ``channels * temporal_patch * patch^2`` values, and the grids."""
    vc = getattr(cfg, "vision_config", None) or cfg
    patch = vc.patch_size if isinstance(getattr(vc, "patch_size", None), int) else 14
    merge = getattr(vc, "spatial_merge_size", None) or 1
    channels = getattr(vc, "in_channels", None) or getattr(vc, "num_channels", None) or 3
    side = 2 * merge
    values = channels * (getattr(vc, "temporal_patch_size", None) or 1) * patch * patch
    return {"pixel_values": torch.randn(batch * side * side, values, generator=gen),
            "image_grid_thw": torch.tensor([[1, side, side]] * batch)}


def _pixels(cfg, gen: torch.Generator, batch: int = 1) -> torch.Tensor:
    """Random pixel values of the vision config's ``num_channels`` x ``image_size`` (shrunk by ``_shrunk_kwargs``)."""
    vc = getattr(cfg, "vision_config", None) or cfg
    size = getattr(vc, "image_size", 64)
    h, w = (size[0], size[-1]) if isinstance(size, (list, tuple)) else (size, size)
    channels = getattr(vc, "num_channels", None) or 3
    return torch.randn(batch, channels, h, w, generator=gen)


AUDIO_SAMPLES = 1600  # 0.1 s at 16 kHz: 4 or 5 frames after a wav2vec2-style feature encoder
AUDIO_FRAMES = 64


def _audio_shapes(name: str, cfg) -> list[tuple[int, ...]]:
    """Shapes to try for an audio input: raw samples ``[1, samples]``; filterbank features ``[1, bins, frames]``
    (Whisper) or ``[1, frames, bins]`` (Speech2Text, AST, conformers). Whisper-like encoders need exactly
    ``2 * max_source_positions`` frames (shrunk to 32 positions); AST its ``max_length`` frames."""
    bins = next((getattr(cfg, k) for k in ("num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels")
                 if isinstance(getattr(cfg, k, None), int)), 80)
    frames = [AUDIO_FRAMES]
    for key, factor in (("max_source_positions", 2), ("max_length", 1)):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and factor * v not in frames and factor * v <= 4096:
            frames.insert(0, factor * v)
    if name == "input_values":
        return [(1, AUDIO_SAMPLES), *[(1, f, bins) for f in frames]]
    return [shape for f in frames for shape in ((1, bins, f), (1, f, bins))]


def _audio(name: str, shape: tuple[int, ...], cfg, family: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {name: torch.randn(*shape, generator=gen)}
    if family == "encoder-decoder":
        vocab = getattr(cfg.get_text_config(), "vocab_size", None) or 256
        out["decoder_input_ids"] = torch.randint(min(4, vocab - 1), vocab, (1, 2), generator=gen)
    return out


def _boxes(cfg, gen: torch.Generator) -> torch.Tensor:
    """Token bounding boxes for document models: BROS's normalised ``dim_bbox`` coordinates, else LayoutLM's
    (x0, y0, x1, y1) on its 0..1000 grid."""
    dim = getattr(cfg, "dim_bbox", None)
    if isinstance(dim, int):
        return torch.rand(BATCH, SEQ_LEN, dim, generator=gen)
    corner = torch.randint(0, 500, (BATCH, SEQ_LEN, 2), generator=gen)
    return torch.cat([corner, corner + torch.randint(1, 500, (BATCH, SEQ_LEN, 2), generator=gen)], dim=-1)


def build(model_type: str, seed: int = 0) -> Built:
    """The shrunken model in eval mode (fp32, CPU) with inputs whose CPU forward works. A model that cannot be
    built with its image and audio fields shrunk too (BiT's group norms need the full stage widths) is tried
    with them at their defaults; the first error is reported when neither builds."""
    try:
        return _build(model_type, seed, media=True)
    except NotBuildable as first:
        if shrunk_config(model_type, media=False)[1] == shrunk_config(model_type, media=True)[1]:
            raise  # nothing to shrink less
        try:
            return _build(model_type, seed, media=False)
        except NotBuildable:
            raise first from None


def _build(model_type: str, seed: int, media: bool) -> Built:
    family, modality = classify(model_type)
    cfg, changes = shrunk_config(model_type, media)
    cls, with_head = _model_class(model_type, family)
    torch.manual_seed(seed)
    try:
        model = cls(cfg).eval()
    except Exception as e:  # noqa: BLE001
        raise NotBuildable(f"model cannot be built: {type(e).__name__}: {_first_line(e)}") from None
    output = "logits" if with_head else "last_hidden_state"
    first_error = None
    extras = EXTRAS.get(model_type, {}).get("inputs")
    for inputs in _inputs(model, cfg, family):
        if extras:
            inputs = {**inputs, **extras(model, cfg, inputs, torch.Generator().manual_seed(seed))}
        built = Built(model_type, model, inputs, family, modality, output, cls.__name__, changes)
        try:
            built.batch_norms_calibrated = calibrate_batch_norms(model, calibration_inputs(inputs))
            first = reference(built)
        except Exception as e:  # noqa: BLE001 - try the next candidate; report the first (most likely) error
            from .check import ModelTimeout

            if isinstance(e, ModelTimeout):
                raise
            first_error = first_error or e
            continue
        _deterministic(built, first)
        return built
    raise NotBuildable(f"CPU forward fails: {type(first_error).__name__}: {_first_line(first_error)}") from None


def _deterministic(built: Built, first: torch.Tensor) -> None:
    """NotBuildable when a second CPU forward differs from the first: the forward draws random numbers (not
    fixed by ``EXTRAS``), and the card's would differ from the CPU's whatever its numerics."""
    second = reference(built)
    if first.shape != second.shape or not torch.allclose(first, second, rtol=1e-5, atol=1e-6, equal_nan=True):
        what = (f"shapes {tuple(first.shape)} and {tuple(second.shape)}" if first.shape != second.shape
                else f"max abs difference {float((first - second).abs().max()):.4g}")
        raise NotBuildable(f"the CPU forward is random: two runs differ ({what}); the card's could not be compared")


CALIBRATION_SEED = 1
CALIBRATION_BATCH = 8  # samples per input sample: a norm after global pooling sees one value per sample


def calibration_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inputs like ``inputs`` but not them, ``CALIBRATION_BATCH`` times the batch: each floating tensor redrawn
    (another seed) with its mean and std; token ids and masks repeated."""
    gen = torch.Generator().manual_seed(CALIBRATION_SEED)
    out = {}
    for k, v in inputs.items():
        shape = (v.shape[0] * CALIBRATION_BATCH, *v.shape[1:]) if v.dim() else v.shape
        if v.is_floating_point() and v.numel() > 1:
            out[k] = torch.randn(shape, generator=gen, dtype=v.dtype) * v.std() + v.mean()
        else:
            out[k] = v.repeat(CALIBRATION_BATCH, *[1] * (v.dim() - 1)) if v.dim() else v
    return out


def _is_batch_norm(m: torch.nn.Module) -> bool:
    # by name: transformers' FrozenBatchNorm2d (DETR kin) and D-FINE's are not torch's BatchNorm classes
    return "BatchNorm" in type(m).__name__ and isinstance(getattr(m, "running_var", None), torch.Tensor) \
        and isinstance(getattr(m, "running_mean", None), torch.Tensor)


def calibrate_batch_norms(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> int:
    """Set every batch norm's running mean and variance to its input's statistics in one eval-mode forward
    of ``inputs`` (each norm is set just before it runs, so the norms after it see normalised inputs);
    the number of norms set.

    A fresh model's batch norms have mean 0, variance 1 for inputs of any scale: with transformers' weight
    init (std 0.02, sized for fine-tuning a checkpoint) a shrunken convnet's activations then shrink ~10x per
    conv, and MobileNet's, MobileViT's, LeViT's and HGNetV2's outputs were 1e-10 .. exactly 0 on the CPU,
    nothing to compare the card's with. A trained net's statistics match its activations; so do these."""
    norms = [m for m in model.modules() if _is_batch_norm(m)]
    if not norms:
        return 0
    seen: set[int] = set()

    def _set(module, args):
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[1] != module.running_var.numel():
            return
        dims = [d for d in range(x.dim()) if d != 1]
        module.running_mean.copy_(x.mean(dims))
        module.running_var.copy_(x.var(dims, unbiased=False))
        seen.add(id(module))

    handles = [m.register_forward_pre_hook(_set) for m in norms]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
    return len(seen)


def compared(built: Built, out: Any) -> torch.Tensor:
    """The tensor a run is judged by: the logits or the last hidden state (else the first tensor output)."""
    if isinstance(out, dict):  # transformers' ModelOutput is a dict too
        value = out.get(built.output)
    else:
        value = getattr(out, built.output, None) if not isinstance(out, (tuple, list)) else None
    if value is None and isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        value = out["logits"]  # a base model that ends in its language model's head
    if value is None and isinstance(out, dict) and isinstance(out.get("language_model_outputs"), dict):
        inner = out["language_model_outputs"]  # BLIP-2 kin: the language model's own output
        value = next((inner.get(k) for k in (built.output, "last_hidden_state", "logits")
                      if isinstance(inner.get(k), torch.Tensor)), None)
    if value is None and isinstance(getattr(out, "feature_maps", None), (tuple, list)) and out.feature_maps:
        value = out.feature_maps[-1]  # a backbone: its deepest feature map
    if value is None and hasattr(out, "to_tuple"):
        value = next((v for v in out.to_tuple() if isinstance(v, torch.Tensor)), None)
    if value is None and isinstance(out, (tuple, list)):
        value = next((v for v in out if isinstance(v, torch.Tensor)), None)
    if value is None and isinstance(out, torch.Tensor):
        value = out
    if not isinstance(value, torch.Tensor):
        raise NotBuildable(f"the model returned no tensor to compare ({type(out).__name__})")
    return value


def reference(built: Built) -> torch.Tensor:
    with torch.no_grad():
        return compared(built, built.model(**built.inputs)).float()
