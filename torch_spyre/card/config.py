"""The simulated card's hardware figures, each with its provenance.

Every number the card model uses lives here. Defaults come from ../shared/spyre-card.md (IBM docs, papers,
community measurements); where sources disagree or are silent the figure is a parameter and its
``source`` says which default was chosen and why.

Overrides, lowest to highest precedence:
1. a YAML or JSON file named by ``TORCH_SPYRE_CONFIG`` (keys are field names);
2. one environment variable per field, ``TORCH_SPYRE_<FIELD NAME IN CAPITALS>`` (e.g.
   ``TORCH_SPYRE_CLOCK_HZ=1.0e9``, ``TORCH_SPYRE_NUM_CARDS=2``).
Invalid values raise :class:`ConfigError`, naming the field, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import SpyreError

Confidence = Literal["official", "paper", "community", "derived", "assumed"]

ENV_PREFIX = "TORCH_SPYRE_"
CONFIG_FILE_ENV = "TORCH_SPYRE_CONFIG"
# Variables of this prefix that are not card figures (read elsewhere in torch_spyre).
OTHER_ENV_VARS = frozenset({CONFIG_FILE_ENV, "TORCH_SPYRE_DLFLOAT16", "TORCH_SPYRE_DEBUG", "TORCH_SPYRE_DEBUG_DIR",
                            "TORCH_SPYRE_EAGER", "TORCH_SPYRE_EAGER_CACHE_SIZE", "TORCH_SPYRE_WEIGHT_PARTS_CACHE",
                            "TORCH_SPYRE_WEIGHT_PARTS_CACHE_BYTES",
                            "TORCH_SPYRE_SHAPE_CACHE_SIZE",
                            "TORCH_SPYRE_VLLM",  # serving/plugin.py: vLLM runs on spyre
                            "TORCH_SPYRE_CHECK", "TORCH_SPYRE_DISABLE", "TORCH_SPYRE_TIMING_ONLY"})

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class ConfigError(SpyreError, ValueError):
    """An invalid card configuration value."""


def _figure(default: Any, source: str, confidence: Confidence, unit: str = "", **constraints: Any) -> Any:
    return Field(
        default,
        description=source,
        json_schema_extra={"confidence": confidence, "unit": unit},
        **constraints,
    )


class CardConfig(BaseModel):
    """Hardware figures of one Spyre card (all cards in a system share one configuration)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    # --- system ---------------------------------------------------------------------------------
    num_cards: int = _figure(1, "cards in the system; IBM: up to 8 per system", "official", "cards", ge=1, le=8)

    # --- chip -----------------------------------------------------------------------------------
    num_cores: int = _figure(32, "32 AI cores on one chip", "official", "cores", ge=1, le=256)
    corelets_per_core: int = _figure(2, "2 corelets per core", "official", "corelets", ge=1, le=8)
    corelets_in_use: int = _figure(
        2, "both corelets of every core, sharing its scratchpad (a published LLM-sized fp16 GEMM on a real card "
        "exceeds the one-corelet peak of 36 TFLOPS, see docs/calibration.md; IBM's torch-spyre drives two with "
        "SENCORELETS=2); set 1 to model a stack that drives one corelet per core",
        "official", "corelets", ge=1, le=8,
    )
    pe_rows: int = _figure(8, "each corelet has a 2-D 8x8 PE array", "official", "PEs", ge=1)
    pe_cols: int = _figure(8, "each corelet has a 2-D 8x8 PE array", "official", "PEs", ge=1)
    pe_simd_fp16: int = _figure(
        8, "8-way fp16 SIMD per PE (512 fp16 MAC/cycle per corelet)", "community", "MAC/cycle/PE", ge=1
    )
    mac_latency_cycles: int = _figure(4, "fp16 MAC latency, hidden by interleaving", "community", "cycles", ge=1)
    clock_hz: float = _figure(
        1.1e9, "no IBM figure; 1.1 GHz is implied by a community-quoted 72.1 TFLOPS fp16 peak",
        "derived", "Hz", gt=0, le=10e9,
    )
    vector_fp16_per_cycle: int = _figure(
        64, "vector unit throughput per corelet: one 128-byte fp16 stick per cycle (no public figure)",
        "assumed", "elements/cycle", ge=1,
    )
    vector_transcendental_cycles: int = _figure(
        4, "extra cycles per stick for exp/tanh/rsqrt/erf on the vector unit (no public figure)",
        "assumed", "cycles/stick", ge=1,
    )

    # --- scratchpad -----------------------------------------------------------------------------
    scratchpad_bytes: int = _figure(2 * MiB, "2 MB scratchpad (LX) per core, no caches", "official", "bytes", ge=4 * KiB)
    scratchpad_plannable_bytes: int = _figure(
        1_625_216, "about 1.52-1.55 MB of the 2 MB is plannable by a compiler (1.55 MiB, in whole sticks)",
        "community", "bytes", ge=128,
    )
    stick_bytes: int = _figure(128, "the 128-byte stick: unit of DRAM, ring and scratchpad transfers", "official", "bytes")

    # --- ring -----------------------------------------------------------------------------------
    ring_bytes_per_cycle: int = _figure(
        128, "bidirectional ring, 128 bytes per cycle in each direction", "official", "bytes/cycle", ge=1
    )
    ring_efficiency: float = _figure(
        0.625, "measured about 88 GB/s core-to-core against 140.8 GB/s (128 B x 1.1 GHz)", "community", "", gt=0, le=1
    )
    ring_hop_latency_cycles: int = _figure(
        4, "latency of one ring hop (no public figure)", "assumed", "cycles", ge=0
    )
    reduction_ring_bytes_per_cycle: int = _figure(
        32, "separate 32 B/cycle ring for partial-sum reduction across cores", "community", "bytes/cycle", ge=1
    )

    memory_ring_stop: int = _figure(
        0, "ring stop the memory interface shares (the memory interface is a node on the ring; which "
        "stop is not published). DRAM traffic of core c crosses the shortest-direction links between "
        "this stop and c", "assumed", "ring stop", ge=0,
    )

    # --- DMA engine (one per core) --------------------------------------------------------------
    dma_bytes_per_cycle: int = _figure(
        128, "one DMA engine per core moving one 128-byte stick per cycle, the width of the core's ring "
        "stop (no public figure). The softmax pair (32.51 vs 23.67 us for 8 vs 2 MiB of traffic) would "
        "imply about 712 GB/s for one core, above the LPDDR5 peak: see docs/calibration.md",
        "assumed", "bytes/cycle", ge=1,
    )
    dram_run_overhead_bytes: int = _figure(
        128, "DRAM time lost at each discontinuity of a DMA pattern (a new row/bank burst), as an "
        "equivalent number of bytes: an isolated stick gets half the efficiency of a long burst "
        "(no public figure)", "assumed", "bytes/run", ge=0,
    )

    # --- device memory (LPDDR5) -----------------------------------------------------------------
    dram_capacity_bytes: int = _figure(
        128 * GiB, "up to 128 GB LPDDR5 per card (about 112 GB usable after ECC per one community note)",
        "official", "bytes", ge=1 * MiB,
    )
    dram_peak_bandwidth: float = _figure(
        204.8e9, "6400 MT/s x 256 bit, as used by IBM-derived planners", "community", "bytes/s", gt=0
    )
    dram_read_efficiency: float = _figure(
        0.86, "measured about 176 GB/s read-only (86 % of peak)", "community", "", gt=0, le=1
    )
    dram_write_efficiency: float = _figure(
        0.713, "measured about 146 GB/s write-only", "community", "", gt=0, le=1
    )
    dram_mixed_efficiency: float = _figure(
        0.52, "measured about 100-111 GB/s mixed read+write (106 GB/s taken)", "community", "", gt=0, le=1
    )
    dram_latency_s: float = _figure(
        150e-9, "LPDDR5 access latency for the first stick of a transfer (typical LPDDR5 figure)",
        "assumed", "s", ge=0,
    )
    core_address_span_bytes: int = _figure(
        256 * MiB, "a core can address at most about 256 MiB of device memory in one kernel",
        "official", "bytes", ge=1 * MiB,
    )

    # --- host link ------------------------------------------------------------------------------
    pcie_raw_bandwidth: float = _figure(64e9, "PCIe Gen5 x16, about 64 GB/s per direction raw", "derived", "bytes/s", gt=0)
    pcie_effective_bandwidth: float = _figure(
        55e9, "PCIe Gen5 x16 effective 50-60 GB/s per direction (midpoint)", "derived", "bytes/s", gt=0
    )
    pcie_latency_s: float = _figure(
        2e-6, "fixed cost of one host<->device DMA transfer (no public figure)", "assumed", "s", ge=0
    )

    # --- card-to-card link (tensor parallel collectives) -----------------------------------------
    p2p_bandwidth: float = _figure(
        54e9, "card-to-card PCIe Gen5 x16 peer-to-peer, per direction. No Spyre figure is published; PCIe Gen5 "
        "x16 accelerators measured 53-56 GB/s peer to peer on one root complex or switch (54.3 GB/s average, "
        "github.com/lukealonso/p2pmark; 53-56 GB/s same-NUMA in CUDA p2pBandwidthLatencyTest posts)",
        "community", "bytes/s", gt=0,
    )
    p2p_latency_s: float = _figure(
        4.1e-6, "fixed cost of one card-to-card transfer: 4.1 us best-pair peer-to-peer latency measured between "
        "PCIe Gen5 x16 accelerators (p2pmark); no Spyre figure", "community", "s", ge=0,
    )

    # --- kernels --------------------------------------------------------------------------------
    kernel_fixed_cost_s: float = _figure(
        20e-6, "about 20 us fixed cost for a tiny kernel on the device", "community", "s", ge=0
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> "CardConfig":
        if self.corelets_in_use > self.corelets_per_core:
            raise ValueError(
                f"corelets_in_use ({self.corelets_in_use}) cannot exceed corelets_per_core ({self.corelets_per_core})"
            )
        if self.scratchpad_plannable_bytes > self.scratchpad_bytes:
            raise ValueError(
                f"scratchpad_plannable_bytes ({self.scratchpad_plannable_bytes}) cannot exceed "
                f"scratchpad_bytes ({self.scratchpad_bytes})"
            )
        for name in ("scratchpad_bytes", "scratchpad_plannable_bytes", "dram_capacity_bytes"):
            if getattr(self, name) % self.stick_bytes:
                raise ValueError(f"{name} must be a whole number of {self.stick_bytes}-byte sticks")
        if self.memory_ring_stop >= self.num_cores:
            raise ValueError(
                f"memory_ring_stop ({self.memory_ring_stop}) must be a ring stop of a core (< num_cores {self.num_cores})"
            )
        if self.stick_bytes != 128:
            raise ValueError("stick_bytes is fixed at 128 by the hardware (sticks of 64 fp16 values)")
        return self

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "CardConfig":
        """A copy with ``update`` applied. Derived figures (cached properties) are dropped, not copied: a
        copy with another ``corelets_in_use`` must not keep the original's peak."""
        copied = super().model_copy(update=update, deep=deep)
        for name, attr in type(self).__dict__.items():
            if isinstance(attr, cached_property):
                copied.__dict__.pop(name, None)
        return copied

    # --- derived peaks --------------------------------------------------------------------------
    @cached_property
    def fp16_macs_per_cycle_per_core(self) -> int:
        return self.corelets_in_use * self.pe_rows * self.pe_cols * self.pe_simd_fp16

    @cached_property
    def peak_fp16_flops(self) -> float:
        """Peak fp16 flop/s of the card for the corelets in use (2 flop per multiply-add)."""
        return 2.0 * self.num_cores * self.fp16_macs_per_cycle_per_core * self.clock_hz

    @cached_property
    def chip_peak_fp16_flops(self) -> float:
        """Peak fp16 flop/s if every corelet were driven."""
        return 2.0 * self.num_cores * self.corelets_per_core * self.pe_rows * self.pe_cols * self.pe_simd_fp16 * self.clock_hz

    @cached_property
    def dram_read_bandwidth(self) -> float:
        return self.dram_peak_bandwidth * self.dram_read_efficiency

    @cached_property
    def dram_write_bandwidth(self) -> float:
        return self.dram_peak_bandwidth * self.dram_write_efficiency

    @cached_property
    def ring_link_bandwidth(self) -> float:
        """Achievable bytes/s on one ring link in one direction."""
        return self.ring_bytes_per_cycle * self.clock_hz * self.ring_efficiency

    @cached_property
    def reduction_ring_link_bandwidth(self) -> float:
        """Achievable bytes/s on one link of the reduction ring in one direction."""
        return self.reduction_ring_bytes_per_cycle * self.clock_hz * self.ring_efficiency

    @cached_property
    def dma_engine_bandwidth(self) -> float:
        """Bytes/s one core's DMA engine moves on each of its channels (read, write)."""
        return self.dma_bytes_per_cycle * self.clock_hz

    def cycles(self, seconds: float) -> float:
        return seconds * self.clock_hz

    def seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    # --- provenance -----------------------------------------------------------------------------
    @classmethod
    def provenance(cls) -> list[dict[str, Any]]:
        """One row per figure: name, default, unit, confidence and source."""
        rows = []
        for name, field in cls.model_fields.items():
            extra = field.json_schema_extra or {}
            rows.append(
                {
                    "name": name,
                    "default": field.default,
                    "unit": extra.get("unit", ""),
                    "confidence": extra.get("confidence", ""),
                    "source": field.description or "",
                }
            )
        return rows


def _read_config_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{CONFIG_FILE_ENV}={path!r}: no such file")
    text = p.read_text()
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - any parse failure becomes one clear error
        raise ConfigError(f"{CONFIG_FILE_ENV}={path!r} could not be parsed: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{CONFIG_FILE_ENV}={path!r} must hold a mapping of field names to values")
    return data


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in CardConfig.model_fields:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            out[name] = environ[key]
    _warn_unknown_env(environ)
    return out


def _warn_unknown_env(environ: dict[str, str]) -> None:
    """A misspelt variable would otherwise be ignored without a word."""
    known = {ENV_PREFIX + n.upper() for n in CardConfig.model_fields} | OTHER_ENV_VARS
    for key in sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.warn(f"{key} is not a torch_spyre setting and is ignored{hint}", stacklevel=3)


def _format_errors(err: ValidationError, sources: dict[str, str]) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "configuration"
        where = sources.get(field, "")
        value = e.get("input")
        allowed = ""
        if field in CardConfig.model_fields:
            f = CardConfig.model_fields[field]
            unit = (f.json_schema_extra or {}).get("unit", "")
            allowed = f" ({f.description}; unit: {unit or 'none'})"
        lines.append(f"  {field}{where}: {e['msg']}, got {value!r}{allowed}")
    return "invalid Spyre card configuration:\n" + "\n".join(lines)


def load_config(environ: dict[str, str] | None = None, **overrides: Any) -> CardConfig:
    """Build the configuration from defaults, the config file, environment variables and ``overrides``."""
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if environ.get(CONFIG_FILE_ENV):
        for k, v in _read_config_file(environ[CONFIG_FILE_ENV]).items():
            values[k] = v
            sources[k] = f" (from {environ[CONFIG_FILE_ENV]})"
    for k, v in _env_overrides(environ).items():
        values[k] = v
        sources[k] = f" (from ${ENV_PREFIX}{k.upper()})"
    values.update(overrides)
    unknown = sorted(set(values) - set(CardConfig.model_fields))
    if unknown:
        raise ConfigError(
            f"unknown Spyre card configuration field(s): {', '.join(unknown)}; "
            f"known fields: {', '.join(CardConfig.model_fields)}"
        )
    try:
        return CardConfig(**values)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, sources)) from None
