"""``spyre estimate``: how fast a Hugging Face decoder would run on the card, from its config alone.

    spyre estimate --model granite-3.3-8b                      # a shipped config (jobs/configs/*.json)
    spyre estimate --config config.json --batch 4 --prompt 1024 --new-tokens 128 --json

No weights are read or downloaded: the model is built from its config on the meta device, its parameters
are allocated on the card in timing-only mode (``runtime/timing_only.py``: memory is accounted, nothing is
stored), and the prefill and one decode step are compiled for the card and timed, not executed. Every
time reported is simulated device time from the card's timing model, the same a faithful run would give.

What is compiled: each module of the model on its own (regional compilation, torch's recipe for
models of repeated blocks): the embedding, the rotary embedding, the decoder layer (one graph, which every
layer reuses: the layers are identical), the final norm and the LM head; the few ops between them
(position ids, the multipliers of Granite) run as eager ops on the card. Every layer is launched, so the
times are those of the whole model as compiled, with nothing extrapolated; what regional compilation
gives up is fusion across module boundaries (a layer's last residual add with the next layer's norm).

Also reported: the prefill at ``batch x prompt`` tokens (the LM head on the last position only, as
generation does), one decode step at the prompt's KV length (HF's ``DynamicCache``, whose update
concatenates the new token's keys and values), tokens per second ``batch x 1000 / decode ms``, the
per-kernel table of both with each kernel's fraction of its op roofline (docs/calibration.md), the weights' device bytes
(measured on the card, stick padding included, tied embeddings once), the KV cache's device bytes per
token (the default stick layout of a ``[batch, kv_heads, tokens, head_dim]`` fp16 cache), and the largest
batch whose KV cache at the prompt's length fits the card's memory next to the weights.

``--cards N`` (``EstimateOptions.cards``) estimates one card's share of the model split over N cards as vLLM's
tensor parallelism splits it (``shard_config``), with the collectives of tensor parallelism charged on the
card-to-card link model (``device/collectives.py``) between the compiled regions; memory is then per card.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import SpyreError
from .embed import JobError

CONFIG_DIR = Path(__file__).parent / "configs"
# Architectures whose Hugging Face models the job has been checked on (their decoder layers repeat).
ARCHITECTURES = ("granite", "llama", "qwen2")
DTYPE = torch.float16  # stored as DLFloat16 on the card, as bf16 would be: the same simulated times
DTYPE_NAME = "fp16"


class EstimateInputError(JobError, ValueError):
    """The config cannot be read or built, or names an architecture the job does not know (exit code 2)."""


# ---------------------------------------------------------------------------------------------
# options and results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EstimateOptions:
    config: dict[str, Any]  # a Hugging Face config.json, as a dict
    name: str  # what to call the model in the report (file or shipped name)
    batch: int = 1
    prompt: int = 512
    new_tokens: int = 128
    cards: int = 1  # tensor-parallel degree: the model split over this many cards

    def __post_init__(self) -> None:
        for what in ("batch", "prompt", "new_tokens"):
            if getattr(self, what) < 1:
                raise ValueError(f"{what} must be at least 1, got {getattr(self, what)}")
        if self.cards < 1:
            raise EstimateInputError(f"--cards must be at least 1, got {self.cards}")


@dataclass
class KernelLine:
    """Every launch of one kernel shape in the full model (one row of the report's table)."""

    phase: str  # "prefill" or "decode"
    name: str  # the kernel's name without its graph index (spyre_mm_12 -> spyre_mm)
    kind: str
    calls: int  # in the full model
    us_each: float
    ms_total: float
    roofline_fraction: float | None
    bottleneck: str
    flops: float
    bytes: float


@dataclass
class EstimateResult:
    model: str
    architecture: str
    layers: int
    batch: int
    prompt: int
    new_tokens: int
    prefill_ms: float  # simulated latency of the prefill call (first launch's start to last one's end)
    decode_ms_per_token: float  # the same for one decode step
    tokens_per_s: float
    generate_ms: float  # prefill + new_tokens decode steps, each at the prompt's KV length
    weights_bytes: int  # on each card
    kv_bytes_per_token: int  # on each card: one token of one sequence, all layers, keys and values
    kv_bytes_at_prompt: int  # on each card: batch x prompt tokens
    max_batch_at_prompt: int
    capacity_bytes: int  # of each card
    compiled: str
    launches: dict[str, int]  # kernels and eager ops launched, per phase
    kernels: list[KernelLine] = field(default_factory=list)
    host_s: float = 0.0
    # Tensor parallel (``cards`` > 1): the collectives on the card-to-card link, included in the latencies.
    cards: int = 1
    weights_bytes_total: int = 0  # all cards
    prefill_collective_ms: float = 0.0
    decode_collective_ms: float = 0.0
    prefill_allreduce_ms_per_layer: float = 0.0  # a layer's two all-reduces of the hidden states
    decode_allreduce_ms_per_layer: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------------
def shipped_models() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def read_config(path: str | Path | None = None, model: str | None = None) -> tuple[dict[str, Any], str]:
    """The config dict and its display name, from a file or a shipped model name."""
    if (path is None) == (model is None):
        raise EstimateInputError("give either --config CONFIG.json or --model NAME")
    if model is not None:
        file = CONFIG_DIR / f"{model}.json"
        if not file.is_file():
            raise EstimateInputError(f"no shipped config named {model!r}; known: {', '.join(shipped_models())} "
                                     f"(or pass --config CONFIG.json)")
        name = model
    else:
        file, name = Path(path), Path(path).name
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise EstimateInputError(f"cannot read {file}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EstimateInputError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise EstimateInputError(f"{file} holds a JSON {type(data).__name__}, expected a Hugging Face config object")
    return data, name


def build_config(data: dict[str, Any], layers: int | None = None) -> Any:
    """The transformers config object (``num_hidden_layers`` replaced by ``layers`` when given)."""
    import transformers

    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise EstimateInputError("the config has no \"model_type\" (e.g. \"llama\"); is it a Hugging Face config.json?")
    if model_type not in ARCHITECTURES:
        raise EstimateInputError(f"unknown architecture {model_type!r}: spyre estimate knows "
                                 f"{', '.join(ARCHITECTURES)} decoders")
    fields = {k: v for k, v in data.items() if not k.startswith("_") and k not in ("model_type", "architectures")}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **fields)
    except Exception as e:  # noqa: BLE001 - any refusal of transformers: the config is not buildable
        raise EstimateInputError(f"cannot build a {model_type} config: {_one_line(e)}") from None
    needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
    bad = [k for k in needed if not isinstance(getattr(cfg, k, None), int) or getattr(cfg, k) < 1]
    if bad:
        raise EstimateInputError(f"the config's {', '.join(bad)} must be positive integers")
    if cfg.hidden_size % cfg.num_attention_heads:
        raise EstimateInputError(f"hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads "
                                 f"{cfg.num_attention_heads}")
    return cfg


def shard_config(data: dict[str, Any], cfg: Any, cards: int) -> dict[str, Any]:
    """The config of one card's share of the model split over ``cards`` cards (tensor parallel, Megatron-style
    as vLLM splits it): query heads, KV heads (replicated when there are fewer than cards), the MLP's
    intermediate size and the vocabulary (embedding and LM head) divided by ``cards``; the head size, the
    hidden size and the norms kept whole. Bad splits raise :class:`EstimateInputError`."""
    from ..device import cards as system

    available = system.config().num_cards
    if cards > available:
        raise EstimateInputError(f"--cards {cards}: the simulated system has {available} card(s) (num_cards); set "
                                 f"TORCH_SPYRE_NUM_CARDS={cards} (up to 8) or use fewer cards")
    if cards == 1:
        return data
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    if heads % cards:
        raise EstimateInputError(f"--cards {cards}: the {heads} attention heads do not split evenly over {cards} cards")
    if kv_heads % cards and cards % kv_heads:
        raise EstimateInputError(f"--cards {cards}: the {kv_heads} KV heads neither split evenly over {cards} cards "
                                 "nor replicate evenly onto them")
    if cfg.intermediate_size % cards:
        raise EstimateInputError(f"--cards {cards}: the MLP's intermediate size {cfg.intermediate_size} does not "
                                 f"split evenly over {cards} cards")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return {**data, "num_attention_heads": heads // cards, "num_key_value_heads": max(1, kv_heads // cards),
            "head_dim": head_dim, "intermediate_size": cfg.intermediate_size // cards,
            "vocab_size": -(-cfg.vocab_size // cards)}


def _one_line(e: BaseException) -> str:
    """The whole message on one line (transformers' validation errors put the reason on the second)."""
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else repr(e)


# ---------------------------------------------------------------------------------------------
# the model on the card, without data
# ---------------------------------------------------------------------------------------------
def build_model(cfg: Any) -> torch.nn.Module:
    """The causal LM of ``cfg`` with its parameters allocated on the card, holding no data (call inside
    ``timing_only()``)."""
    import transformers

    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPE).eval()
    except Exception as e:  # noqa: BLE001
        raise EstimateInputError(f"cannot build the {cfg.model_type} model from the config: "
                                 f"{type(e).__name__}: {_first_line(e)}") from None
    model.to_empty(device="spyre")
    # to_empty makes a new parameter per module: tie the LM head to the embedding again (one allocation).
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    return model


def _kv_cache(cfg: Any, batch: int, length: int) -> Any:
    """A DynamicCache holding ``length`` tokens per layer, on the card, without data."""
    from transformers import DynamicCache

    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    shape = (batch, kv_heads, length, head_dim)
    layers = [(torch.empty(shape, dtype=DTYPE, device="spyre"), torch.empty(shape, dtype=DTYPE, device="spyre"))
              for _ in range(cfg.num_hidden_layers)]
    return DynamicCache(ddp_cache_data=layers, config=cfg)


def kv_bytes_per_token(cfg: Any, layers: int, length: int) -> int:
    """Device bytes of one sequence's keys and values per token, all layers (the cache's stick layout)."""
    from ..card.layout import StickLayout

    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    one = StickLayout((1, kv_heads, length, head_dim), -1, "dlfloat16").nbytes  # keys of one layer
    return 2 * layers * one // length


def weights_bytes(model: torch.nn.Module) -> int:
    """Device bytes of the model's parameters, each allocation once (tied weights share one), measured
    after the first call (when relayouts have given the weights their final layouts)."""
    from ..device.storage import allocation_of

    allocs = {id(a): a.nbytes for p in model.parameters() if (a := allocation_of(p)) is not None}
    return sum(allocs.values())


# ---------------------------------------------------------------------------------------------
# the kernel table
# ---------------------------------------------------------------------------------------------
_INDEX = re.compile(r"_\d+$")


def _signature(rec: Any) -> tuple:
    d = rec.details
    return (rec.kind, _INDEX.sub("", rec.name), rec.duration, d.get("flops"), d.get("dram_bytes", d.get("bytes")))


def kernel_lines(phase: str, records: Sequence[Any]) -> tuple[float, list[KernelLine]]:
    """(simulated seconds the cores were busy, the launches grouped by kernel shape) of one phase."""
    work = [r for r in records if r.resource == "compute"]
    counts: Counter[tuple] = Counter(_signature(r) for r in work)
    first: dict[tuple, Any] = {}
    for r in work:
        first.setdefault(_signature(r), r)
    lines = []
    for sig, n in counts.items():
        r, d = first[sig], first[sig].details
        lines.append(KernelLine(phase, sig[1], r.kind, n, r.duration * 1e6, n * r.duration * 1e3,
                                d.get("roofline_fraction"), d.get("bottleneck", ""), float(d.get("flops") or 0),
                                float(d.get("dram_bytes", d.get("bytes")) or 0)))
    lines.sort(key=lambda line: -line.ms_total)
    return sum(r.duration for r in work), lines


def span(records: Sequence[Any]) -> float:
    """Simulated seconds from the first work's start to the last one's end (the phase's latency)."""
    return max(r.end for r in records) - min(r.start for r in records) if records else 0.0


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------
def _profiled(fn: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
    import torch_spyre.profiler

    with torch.no_grad(), torch_spyre.profiler.profile() as prof:
        out = fn(**kwargs)
    return out, prof.events()


def _compiled_call(fn: Any, what: str, **kwargs: Any) -> Any:
    try:
        with torch.no_grad():
            return fn(**kwargs)
    except SpyreError:
        raise
    except Exception as e:  # the compiler's errors, named for the user
        raise JobError(f"compiling the {what} failed: {type(e).__name__}: {_first_line(e)}") from e


class _LayerOfCache:
    """What one decoder layer sees of the model's KV cache: its own layer of it.

    HF's attention calls ``past_key_values.update(k, v, self.layer_idx)``; indexing the cache's list with
    the layer's index inside the compiled region makes Dynamo guard on that index, so every layer would
    compile its own graph (and past ``recompile_limit`` run eagerly). Handing each layer its own cache
    layer keeps one graph for all of them; the update is the same (``DynamicLayer.update``)."""

    def __init__(self, layer: Any):
        self.layer = layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int | None = None,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer.update(key_states, value_states, *args, **kwargs)


def _charge_collective(op: str, out: Any, cards: int, count: int = 1) -> None:
    """Queue ``count`` collectives ``op`` of ``out``'s device bytes among ``cards`` cards on this card (every card
    runs the same shard at the same time, so no card waits for another)."""
    from ..device import collectives

    for _ in range(count):
        collectives.charge(out.device.index or 0, op, collectives.device_bytes(out), cards)


class _CompiledLayer(torch.nn.Module):
    """Decoder layer ``index``, compiled, called with its own layer of the KV cache (``_LayerOfCache``). Split over
    ``cards`` cards, a layer ends its attention and its MLP with an all-reduce of the hidden states (the row-parallel
    output projections); both are charged after the layer: on one stream the sum is the same."""

    def __init__(self, layer: torch.nn.Module, index: int, cards: int = 1):
        super().__init__()
        self.layer, self.index, self.cards = layer, index, cards
        layer.compile(dynamic=False)

    def forward(self, *args: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        if past_key_values is not None:
            past_key_values = _LayerOfCache(past_key_values.layers[self.index])
        out = self.layer(*args, past_key_values=past_key_values, **kwargs)
        if self.cards > 1:
            _charge_collective("all_reduce", out[0] if isinstance(out, tuple) else out, self.cards, count=2)
        return out


class _ThenCollective(torch.nn.Module):
    """A compiled region followed by collective ``op`` on its output: the vocabulary-parallel embedding's
    all-reduce, the LM head's gather of the logits to the first card."""

    def __init__(self, module: torch.nn.Module, op: str, cards: int):
        super().__init__()
        self.module, self.op, self.cards = module, op, cards

    @property
    def weight(self) -> torch.Tensor:  # HF reads the embedding's and the LM head's weight
        return self.module.weight

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        _charge_collective(self.op, out, self.cards)
        return out


def compile_regions(model: torch.nn.Module, cards: int = 1) -> list[str]:
    """Compile each module of the model on its own (regional compilation); the names compiled. With ``cards`` > 1
    the model is one card's shard and the collectives of tensor parallelism are charged between regions."""
    inner = model.model
    regions = {"embedding": inner.embed_tokens, "rotary embedding": getattr(inner, "rotary_emb", None),
               "final norm": inner.norm, "LM head": model.lm_head}
    for i, layer in enumerate(inner.layers):
        inner.layers[i] = _CompiledLayer(layer, i, cards)
    for module in regions.values():
        if module is not None:
            module.compile(dynamic=False)
    if cards > 1:
        inner.embed_tokens = _ThenCollective(inner.embed_tokens, "all_reduce", cards)
        model.lm_head = _ThenCollective(model.lm_head, "gather", cards)
    return ["decoder layer (one graph for all layers)", *(k for k, v in regions.items() if v is not None)]


def run(options: EstimateOptions, status: Any = None) -> EstimateResult:
    """Build, compile and time the model of ``options.config`` in timing-only mode."""
    from ..card.layout import StickLayout
    from ..compiler import backend
    from ..device import cards, collectives, tensor
    from ..runtime.timing_only import timing_only

    t0 = time.perf_counter()
    full = build_config(options.config)
    N = options.cards
    shard = shard_config(options.config, full, N)  # checked for one card too: the system must have it
    cfg = build_config(shard) if N > 1 else full
    layers = cfg.num_hidden_layers
    backend.register()
    B, P = options.batch, options.prompt
    with timing_only(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*runs on the host.*")
        _say(status, f"building {options.name} ({layers} layers) on the card, without data")
        model = build_model(cfg)
        regions = compile_regions(model, N)
        ids = torch.empty((B, P), dtype=torch.int64, device="spyre")
        step = torch.empty((B, 1), dtype=torch.int64, device="spyre")
        prefill = dict(input_ids=ids, use_cache=True, logits_to_keep=1)
        _say(status, f"compiling the prefill ({B} x {P} tokens)")
        _compiled_call(model, "prefill", **prefill)
        _, prefill_records = _profiled(model, **prefill)
        # A fresh cache of P tokens for each call: the step appends to the cache it is given.
        decode = lambda: dict(input_ids=step, past_key_values=_kv_cache(cfg, B, P), use_cache=True)  # noqa: E731
        _say(status, f"compiling one decode step (KV length {P})")
        _compiled_call(model, "decode step", **decode())
        _, decode_records = _profiled(model, **decode())
        tensor.release_freed()
        weights = weights_bytes(model)
    _, pre_lines = kernel_lines("prefill", prefill_records)
    _, dec_lines = kernel_lines("decode", decode_records)
    prefill_ms, decode_ms = span(prefill_records) * 1e3, span(decode_records) * 1e3
    hidden_bytes = lambda tokens: StickLayout((tokens, cfg.hidden_size), -1, "dlfloat16").nbytes  # noqa: E731
    kv_token = kv_bytes_per_token(cfg, layers, P)
    capacity = cards.config().dram_capacity_bytes
    max_batch = max(0, (capacity - weights) // (kv_token * P))
    return EstimateResult(
        model=options.name, architecture=cfg.model_type, layers=layers, batch=B, prompt=P,
        new_tokens=options.new_tokens, prefill_ms=prefill_ms, decode_ms_per_token=decode_ms,
        tokens_per_s=B * 1e3 / decode_ms, generate_ms=prefill_ms + options.new_tokens * decode_ms,
        weights_bytes=int(weights), kv_bytes_per_token=int(kv_token), kv_bytes_at_prompt=int(kv_token * B * P),
        max_batch_at_prompt=int(max_batch), capacity_bytes=int(capacity),
        compiled="regional compilation, every layer launched: " + ", ".join(regions),
        launches={"prefill": len(prefill_records), "decode": len(decode_records)}, kernels=pre_lines + dec_lines,
        host_s=time.perf_counter() - t0, cards=N, weights_bytes_total=int(weights) * N,
        prefill_collective_ms=collective_seconds(prefill_records) * 1e3,
        decode_collective_ms=collective_seconds(decode_records) * 1e3,
        prefill_allreduce_ms_per_layer=2 * collectives.seconds("all_reduce", hidden_bytes(B * P), N) * 1e3,
        decode_allreduce_ms_per_layer=2 * collectives.seconds("all_reduce", hidden_bytes(B), N) * 1e3,
    )


def collective_seconds(records: Sequence[Any]) -> float:
    """Simulated seconds of card-to-card collectives among a phase's work."""
    return sum(r.duration for r in records if r.kind == "collective")


def _say(status: Any, text: str) -> None:
    if status is not None:
        status.update(f"[bold]{text}[/bold]")


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def print_report(result: EstimateResult, console: Any) -> None:
    from rich.table import Table

    r = result
    where = "the simulated Spyre card" if r.cards == 1 else f"{r.cards} simulated Spyre cards (tensor parallel)"
    console.print(f"[bold]{r.model}[/bold] ({r.architecture}, {r.layers} layers) on {where}, "
                  f"batch {r.batch}, prompt {r.prompt} tokens, fp16 (DLFloat16 on the card)")
    console.print(f"compiled in timing-only mode ({r.compiled})")
    summary = Table(title="Estimate (simulated device time)")
    summary.add_column("figure")
    summary.add_column("value", justify="right")
    rows = [
        ("prefill latency", f"{r.prefill_ms:.3f} ms"),
        (f"decode latency per token (KV length {r.prompt})", f"{r.decode_ms_per_token:.3f} ms/token"),
        ("tokens per second (batch x 1000 / decode ms)", f"{r.tokens_per_s:.1f}"),
        (f"prefill + {r.new_tokens} new tokens", f"{r.generate_ms:.1f} ms"),
        ("weights", f"{_gib(r.weights_bytes)} ({r.weights_bytes:,} bytes)"),
        ("KV cache per token (all layers)", f"{r.kv_bytes_per_token:,} bytes"),
        (f"KV cache at batch {r.batch} x {r.prompt} tokens", _gib(r.kv_bytes_at_prompt)),
        (f"largest batch whose KV cache fits ({_gib(r.capacity_bytes)} card)", f"{r.max_batch_at_prompt}"),
    ]
    if r.cards > 1:
        per_card = ("weights", "KV cache per token (all layers)", f"KV cache at batch {r.batch} x {r.prompt} tokens")
        rows = [(f"{name} per card" if name in per_card else name, value) for name, value in rows]
        rows[4:4] = [
            ("card-to-card collectives in the prefill (PCIe peer to peer)", f"{r.prefill_collective_ms:.3f} ms"),
            ("card-to-card collectives per decode token", f"{r.decode_collective_ms:.3f} ms"),
            ("all-reduces per layer: prefill / decode", f"{r.prefill_allreduce_ms_per_layer:.4f} / "
                                                        f"{r.decode_allreduce_ms_per_layer:.4f} ms"),
        ]
        rows.insert(8, (f"weights on all {r.cards} cards", _gib(r.weights_bytes_total)))
    for name, value in rows:
        summary.add_row(name, value)
    console.print(summary)
    for phase in ("prefill", "decode"):
        lines = [k for k in r.kernels if k.phase == phase]
        total = sum(k.ms_total for k in lines) or 1.0
        table = Table(title=f"{phase}: {r.launches[phase]} launches, by kernel")
        for col, justify in (("kernel", "left"), ("calls", "right"), ("MFLOP", "right"), ("DRAM MB", "right"),
                             ("us each", "right"), ("ms total", "right"), ("share", "right"),
                             ("of op roofline", "right"), ("bottleneck", "left")):
            table.add_column(col, justify=justify, overflow="fold")
        for k in lines:
            roof = f"{k.roofline_fraction:.1%}" if k.roofline_fraction is not None else "-"
            table.add_row(k.name, str(k.calls), f"{k.flops / 1e6:,.1f}", f"{k.bytes / 1e6:,.2f}", f"{k.us_each:.2f}",
                          f"{k.ms_total:.3f}", f"{k.ms_total / total:.1%}", roof, k.bottleneck)
        console.print(table)
    console.print(f"host time: {r.host_s:.1f} s")


def to_json(result: EstimateResult) -> str:
    return json.dumps(result.to_dict(), default=float)


__all__ = ["ARCHITECTURES", "EstimateInputError", "EstimateOptions", "EstimateResult", "build_config",
           "build_model", "compile_regions", "kernel_lines", "kv_bytes_per_token", "print_report", "read_config",
           "run", "shipped_models", "span", "to_json", "weights_bytes"]
