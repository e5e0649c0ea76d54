"""The ``spyre`` command.

    spyre info            the card configuration (every figure with unit, confidence, source) and derived peaks
    spyre info --json     the same as JSON

Exit codes: 0 success, 2 invalid configuration or usage. More subcommands (``spyre run``) come with the
compiler.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def _derived(cfg) -> list[tuple[str, float, str, str]]:
    return [
        ("peak_fp16_flops", cfg.peak_fp16_flops, "flop/s",
         "2 x cores x corelets_in_use x pe_rows x pe_cols x pe_simd_fp16 x clock_hz"),
        ("chip_peak_fp16_flops", cfg.chip_peak_fp16_flops, "flop/s", "the same with every corelet driven"),
        ("dram_peak_bandwidth", cfg.dram_peak_bandwidth, "bytes/s", "LPDDR5 peak"),
        ("dram_read_bandwidth", cfg.dram_read_bandwidth, "bytes/s", "peak x dram_read_efficiency"),
        ("dram_write_bandwidth", cfg.dram_write_bandwidth, "bytes/s", "peak x dram_write_efficiency"),
        ("dram_mixed_bandwidth", cfg.dram_peak_bandwidth * cfg.dram_mixed_efficiency, "bytes/s",
         "peak x dram_mixed_efficiency (used by the eager-op roofline)"),
        ("ring_link_bandwidth", cfg.ring_link_bandwidth, "bytes/s", "ring_bytes_per_cycle x clock_hz x ring_efficiency"),
        ("pcie_effective_bandwidth", cfg.pcie_effective_bandwidth, "bytes/s", "host link, per direction"),
    ]


def _si(value: float, unit: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    short = {"bytes/s": "B/s"}.get(unit, unit)
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor and unit in ("flop/s", "bytes/s", "Hz"):
            return f"{value / factor:.2f} {prefix}{short}"
    if unit == "s" and value and abs(value) < 1e-3:
        return f"{value * 1e6:g} us"
    return f"{value:g} {unit}".strip() if isinstance(value, float) else f"{value:,} {unit}".strip()


def _info(args: argparse.Namespace) -> int:
    from .card.config import CardConfig, ConfigError, load_config

    try:
        cfg = load_config()
    except ConfigError as e:
        print(f"spyre: {e}", file=sys.stderr)
        return 2
    rows = {r["name"]: r for r in CardConfig.provenance()}
    if args.json:
        out = {
            "figures": [{**rows[n], "value": getattr(cfg, n)} for n in rows],
            "derived": [{"name": n, "value": v, "unit": u, "formula": f} for n, v, u, f in _derived(cfg)],
        }
        print(json.dumps(out, indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="Simulated Spyre card configuration")
    for col in ("figure", "value", "confidence", "source"):
        table.add_column(col, overflow="fold")
    for name, r in rows.items():
        value = getattr(cfg, name)
        mark = "" if value == r["default"] else " (overridden)"
        table.add_row(name, _si(value, r["unit"]) + mark, r["confidence"], r["source"])
    console.print(table)
    peaks = Table(title="Derived peaks")
    for col in ("figure", "value", "formula"):
        peaks.add_column(col, overflow="fold")
    for name, value, unit, formula in _derived(cfg):
        peaks.add_row(name, _si(value, unit), formula)
    console.print(peaks)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spyre", description="torch-spyre: IBM Spyre on a simulated card")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="print the card configuration and derived peaks")
    info.add_argument("--json", action="store_true", help="print JSON instead of tables")
    info.set_defaults(func=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
