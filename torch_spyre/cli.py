"""The ``spyre`` command.

    spyre info            the card configuration (every figure with unit, confidence, source) and derived peaks
    spyre info --json     the same as JSON
    spyre run             embed sentences with all-MiniLM-L6-v2 on the simulated card (compiled; --eager),
                          print the similarities and a per-kernel latency report in simulated device time
    spyre estimate        prefill/decode latency, tokens/s and memory of a Hugging Face decoder on the card,
                          from its config alone (--config CONFIG.json or --model NAME; timing-only mode)
    spyre serve DIR       vLLM's OpenAI-compatible server on the card (--host, --port, vLLM's options pass through)
    spyre coverage        every transformers architecture, shrunken with random weights, eager and compiled on
                          the card against the CPU (--models, --workers N, --ray ADDRESS|local, --out DIR)

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
        options = EstimateOptions(config, name, batch=args.batch, prompt=args.prompt, new_tokens=args.new_tokens,
                                  cards=args.cards)
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
    est.add_argument("--cards", type=int, default=1,
                     help="split the model over N cards (tensor parallel, as vLLM splits it): latency includes the "
                          "card-to-card all-reduces, memory is per card (default 1; at most the system's num_cards)")
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


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _coverage(args: argparse.Namespace) -> int:
    import signal
    from pathlib import Path

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .coverage import report, runners, sweep

    adapters = None if args.adapters is None else ([] if args.adapters == "none" else _names(args.adapters))
    opts = sweep.SweepOptions(out=Path(args.out), models=_names(args.models) if args.models else None,
                              families=_names(args.family) if args.family else None,
                              modalities=_names(args.modality) if args.modality else None,
                              workers=args.workers, ray=args.ray, timeout=args.timeout, dtype=args.dtype,
                              adapters=adapters, command="spyre coverage " + " ".join(args.argv),
                              merge=[Path(f) for f in _names(args.merge)] if args.merge else [],
                              report_only=args.report_only)
    console = Console(stderr=True)
    # Ctrl-C and a plain kill both stop the sweep keeping finished models (a shell starts background jobs
    # with SIGINT ignored: take it back).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if opts.ray and opts.ray != "local":
        try:
            runners.check_reachable(opts.ray)
        except runners.RayUnreachable as e:
            print(f"spyre coverage: {e}", file=sys.stderr)
            return 1
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        def progress(total, done):
            task = bar.add_task("coverage", total=total, completed=done)

            def advance(record):
                bar.update(task, advance=1, description=f"{record['model_type']}: {record['status']}")
            return advance

        try:
            result = sweep.run(opts, progress=progress, log=lambda m: bar.console.print(m))
        except (runners.RayUnreachable, ValueError) as e:
            print(f"spyre coverage: {e}", file=sys.stderr)
            return 1
    p_e, n_e = report.rate(result.records, "eager")
    p_c, n_c = report.rate(result.records, "compiled")
    console.print(f"eager {p_e}/{n_e} pass, compiled {p_c}/{n_c} pass "
                  f"({len(result.records) - len(report.counted(result.records))} not buildable); "
                  f"{opts.out}/coverage.json, coverage.md, coverage.html")
    failed = [r["model_type"] for r in report.counted(result.records) if r.get("status") != "pass"]
    if args.require_pass and failed and not result.interrupted:
        console.print(f"spyre coverage: --require-pass: {len(failed)} model types failed: {', '.join(sorted(failed))}")
        return 1
    if result.interrupted:
        console.print(f"interrupted: {result.ran} model types finished this run are saved; run the same command "
                      "again to resume")
        return 130
    return 0


def _add_coverage_parser(sub: argparse._SubParsersAction) -> None:
    cov = sub.add_parser("coverage", help="run transformers architectures on the card against the CPU",
                         description="Build every model_type of the installed transformers from a shrunken config "
                                     "(random weights, nothing downloaded), run it eagerly and compiled on the "
                                     "simulated card and compare with the CPU (cosine >= 0.999 passes). Writes "
                                     "DIR/coverage.json, coverage.md and coverage.html; resumable.")
    cov.add_argument("--out", required=True, metavar="DIR", help="output directory (an existing one is resumed)")
    cov.add_argument("--models", metavar="TYPE,...", help="model types to run (default: all)")
    cov.add_argument("--family", metavar="F,...", help="keep only these families: encoder, decoder, encoder-decoder")
    cov.add_argument("--modality", metavar="M,...", help="keep only these modalities: text, vision, audio, multimodal")
    cov.add_argument("--workers", type=_positive_int, default=1,
                     help="models run at once (local processes, or the CPUs of a --ray local cluster; default 1)")
    cov.add_argument("--ray", metavar="ADDRESS|local", help="run one Ray task per model on this cluster "
                     "(HOST:PORT) or on a local loopback cluster started for the sweep ('local')")
    cov.add_argument("--timeout", type=float, default=600.0, help="seconds per model (default 600)")
    cov.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                     help="the dtype of the model on the card (the CPU reference is float32)")
    cov.add_argument("--adapters", metavar="none|NAME,...",
                     help="adapters to apply ('none' for none; default: the default set)")
    cov.add_argument("--merge", metavar="FILE,...", help="coverage.json files of other sweeps whose records "
                     "replace those in DIR/coverage.json (in order) before the sweep runs what is missing")
    cov.add_argument("--report-only", action="store_true",
                     help="run no model: rewrite DIR/coverage.md (below its generated-results marker, if it has "
                          "one) and coverage.html from DIR/coverage.json")
    cov.add_argument("--require-pass", action="store_true",
                     help="exit 1 when a buildable model fails (CI's smoke sweep)")
    cov.set_defaults(func=_coverage)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spyre", description="torch-spyre: IBM Spyre on a simulated card")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="print the card configuration and derived peaks")
    info.add_argument("--json", action="store_true", help="print JSON instead of tables")
    info.set_defaults(func=_info)
    _add_run_parser(sub)
    _add_estimate_parser(sub)
    _add_serve_parser(sub)
    _add_coverage_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passes_through", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.vllm_args = extra
    args.argv = argv[1:] if argv[:1] == ["coverage"] else argv
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
