"""The ``spyre`` command.

    spyre info            the card configuration (every figure with unit, confidence, source) and derived peaks
    spyre info --json     the same as JSON
    spyre run             embed sentences with all-MiniLM-L6-v2 on the simulated card (compiled; --eager),
                          print the similarities and a per-kernel latency report in simulated device time
    spyre estimate        prefill/decode latency, tokens/s and memory of a Hugging Face decoder on the card,
                          from its config alone (--config CONFIG.json or --model NAME; timing-only mode)
    spyre serve DIR       vLLM's OpenAI-compatible server on the card (--host, --port, vLLM's options pass through)

Exit codes: 0 success, 1 the job failed (the message says why), 2 invalid configuration or usage.
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


_PIPE_WIDTH = 160  # columns of `spyre run`'s tables when stdout is not a terminal


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _read_sentences(path: str) -> tuple[str, ...]:
    """One sentence per non-empty line of ``path`` ("-" reads standard input)."""
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _run_options(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The job's options from the arguments; usage errors exit 2 through ``parser.error``."""
    from pathlib import Path

    from .jobs.embed import DEFAULT_SENTENCES, EmbedOptions

    sentences = tuple(args.sentences or ())
    if args.file is not None:
        try:
            from_file = _read_sentences(args.file)
        except OSError as e:
            parser.error(f"cannot read sentences from {args.file}: {e.strerror}")
        if not from_file:
            parser.error(f"no sentences in {args.file} (expected one per line)")
        sentences += from_file
    try:
        return EmbedOptions(sentences=sentences or DEFAULT_SENTENCES, mode="eager" if args.eager else "compiled",
                            dtype=args.dtype, batch_size=args.batch_size, seq_len=args.seq_len,
                            profile_dir=Path(args.profile) if args.profile else None)
    except ValueError as e:
        parser.error(str(e))


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .jobs.embed import JobError, run

    options = _run_options(args, args.parser)
    try:
        run(options, _report_console(), Console(stderr=True))
    except JobError as e:
        print(f"spyre run: {e}", file=sys.stderr)
        return 1
    return 0


def _report_console():
    """Standard output for reports. Kernel names are long: when it is not a terminal (a pipe, a file, a
    test), do not fold them into a narrow column."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=_PIPE_WIDTH)


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    from .jobs.embed import DEFAULT_SEQ_LEN, DTYPES

    run = sub.add_parser("run", help="embed sentences with MiniLM on the simulated card",
                         description="Embed sentences with all-MiniLM-L6-v2 on the simulated Spyre card; print "
                                     "their cosine similarities and a per-kernel latency report in simulated "
                                     "device time.")
    run.add_argument("--sentences", nargs="+", metavar="TEXT", help="sentences to embed (default: built-in examples)")
    run.add_argument("--file", metavar="PATH", help="read sentences from PATH, one per line ('-' for stdin)")
    run.add_argument("--eager", action="store_true",
                     help="run eagerly on spyre (each op through the device) instead of compiling for the card")
    run.add_argument("--dtype", choices=sorted(DTYPES), default="fp16", help="model dtype on the card (default fp16)")
    run.add_argument("--batch-size", type=_positive_int, default=None,
                     help="sentences per forward call (default: all in one batch)")
    run.add_argument("--seq-len", type=_positive_int, default=DEFAULT_SEQ_LEN,
                     help=f"tokens per sentence, padded or truncated (default {DEFAULT_SEQ_LEN})")
    run.add_argument("--profile", metavar="DIR", help="write DIR/trace.json (Perfetto) and DIR/timeline.png")
    run.set_defaults(func=_run, parser=run)


def _estimate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .errors import SpyreError
    from .jobs.embed import JobError
    from .jobs.estimate import EstimateInputError, EstimateOptions, print_report, read_config, run, to_json

    try:
        config, name = read_config(args.config, args.model)
        options = EstimateOptions(config, name, batch=args.batch, prompt=args.prompt, new_tokens=args.new_tokens)
        if args.json:
            result = run(options)
            print(to_json(result))
            return 0
        with Console(stderr=True).status("estimating") as status:
            result = run(options, status)
        print_report(result, _report_console())
    except EstimateInputError as e:
        print(f"spyre estimate: {e}", file=sys.stderr)
        return 2
    except (JobError, SpyreError) as e:
        print(f"spyre estimate: {e}", file=sys.stderr)
        return 1
    return 0


def _add_estimate_parser(sub: argparse._SubParsersAction) -> None:
    from .jobs.estimate import shipped_models

    est = sub.add_parser("estimate", help="estimate a Hugging Face decoder's latency and memory on the card",
                         description="Compile a Hugging Face decoder from its config (no weights) for the simulated "
                                     "card in timing-only mode; print prefill and decode latency, tokens per second, "
                                     "the per-kernel table, weights and KV-cache memory and the largest batch that "
                                     "fits. Times are simulated device time.")
    source = est.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="CONFIG.json", help="a Hugging Face config.json")
    source.add_argument("--model", choices=shipped_models(), help="a shipped config")
    est.add_argument("--batch", type=_positive_int, default=1, help="sequences per call (default 1)")
    est.add_argument("--prompt", type=_positive_int, default=512,
                     help="prompt tokens: the prefill's length and the decode step's KV length (default 512)")
    est.add_argument("--new-tokens", type=_positive_int, default=128,
                     help="generated tokens, for the end-to-end figure (default 128)")
    est.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    est.set_defaults(func=_estimate, parser=est)


def _serve(args: argparse.Namespace) -> int:
    from .serving.serve import ServeUsageError, exec_server, server_command, server_env

    try:
        command = server_command(args.model_dir, args.host, args.port, args.vllm_args)
    except ServeUsageError as e:
        print(f"spyre serve: {e}", file=sys.stderr)
        return 2
    exec_server(command, server_env())
    return 1  # not reached: exec replaced this process


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve a model with vLLM's OpenAI-compatible server on the simulated card",
                           description="Run vLLM's OpenAI-compatible server (completions, chat, /health, "
                                       "/metrics) with the model and its paged KV cache on the simulated card. "
                                       "Options spyre serve does not know are passed to vLLM's server "
                                       "(e.g. --max-model-len 512 --max-num-seqs 4). docs/serving.md",
                           usage="spyre serve MODEL_DIR [--host HOST] [--port PORT] [vLLM server options]")
    serve.add_argument("model_dir", metavar="MODEL_DIR", help="a Hugging Face model directory (config.json, "
                                                               "weights, tokenizer)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    serve.set_defaults(func=_serve, parser=serve, passes_through=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spyre", description="torch-spyre: IBM Spyre on a simulated card")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="print the card configuration and derived peaks")
    info.add_argument("--json", action="store_true", help="print JSON instead of tables")
    info.set_defaults(func=_info)
    _add_run_parser(sub)
    _add_estimate_parser(sub)
    _add_serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passes_through", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.vllm_args = extra
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
