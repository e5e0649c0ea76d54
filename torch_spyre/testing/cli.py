"""The ``spyre-tests`` command: upstream PyTorch tests on spyre through YAML suites (docs/test-suites.md).

    spyre-tests run [CONFIG...] [--tier smoke|full] [--junit FILE] [--results FILE] [--pytorch-src DIR] [--jobs N]
                    [--only FILE]
    spyre-tests ops-doc [RESULTS] [-o FILE]  docs/supported-ops.md from the records --results wrote
    spyre-tests inventory [-o FILE]          what the installed torch's tests and ops are (JSON)
    spyre-tests select --old OLD --new NEW   the tests to rerun after moving from one torch to another
    spyre-tests schema                       the JSON schema of suite files

Without CONFIG, ``run`` uses the suites shipped with torch-spyre. Exit codes: 0 success, 1 an unexpected
failure or unexpected pass (run), 2 invalid input (a suite, an inventory, the command line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .runner import RunOptions, env_ok, print_summary, run_suites, shipped_configs, write_junit
    from .suite import SuiteError

    problem = env_ok()
    if problem:
        print(f"spyre-tests: {problem}", file=sys.stderr)
        return 2
    configs = [Path(c) for c in args.configs] or shipped_configs()
    only = None
    if args.only:
        only = {line.strip() for line in Path(args.only).read_text().splitlines() if line.strip()}
    options = RunOptions(tier=args.tier, pytorch_src=args.pytorch_src, jobs=args.jobs, chunk_size=args.chunk_size,
                         max_retries=args.max_retries, test_timeout=args.test_timeout, only=only)
    if args.results:  # a file this run cannot add to is refused before the run, not after it
        import torch

        from .results import ResultsError, check_writable
        from .results import write as write_results

        try:
            check_writable(Path(args.results), torch.__version__)
        except ResultsError as e:
            print(f"spyre-tests: {e}", file=sys.stderr)
            return 2
    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]spyre-tests"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[last]}"), console=console, transient=False)

    def progress(total):
        task = bar.add_task("tests", total=total, last="")
        return lambda record: bar.update(task, advance=1, last=record["id"].rsplit(".", 1)[-1][:60])

    try:
        with bar:
            result = run_suites(configs, options, progress)
    except SuiteError as e:
        print(f"spyre-tests: {e}", file=sys.stderr)
        return 2
    print_summary(result, Console(width=160) if not sys.stdout.isatty() else Console())
    if args.junit:
        write_junit(result, Path(args.junit))
    if args.results:
        write_results(Path(args.results), result.outcomes, ["spyre-tests", *args.argv], torch.__version__,
                      result.scope)
    return result.exit_code


def _inventory(args: argparse.Namespace) -> int:
    from .inventory import build_inventory

    text = json.dumps(build_inventory(), indent=1, sort_keys=True)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    return 0


def _select(args: argparse.Namespace) -> int:
    from .inventory import InventoryError, load_inventory, select

    try:
        old, new = load_inventory(args.old), load_inventory(args.new)
    except InventoryError as e:
        print(f"spyre-tests: {e}", file=sys.stderr)
        return 2
    chosen = select(old, new)
    total = len(new["tests"])
    if args.json:
        print(json.dumps({"selected": sorted(chosen), "reasons": chosen.reasons, "total": total}, indent=1))
    else:
        for test_id in sorted(chosen):
            print(test_id)
    print(f"selected {len(chosen)} of {total} tests ({', '.join(f'{n} {k}' for k, n in chosen.counts().items())}); "
          f"torch {old['torch_version']} -> {new['torch_version']}", file=sys.stderr)
    return 0


def _ops_doc(args: argparse.Namespace) -> int:
    from .results import ResultsError, load, render

    try:
        text = render(load(Path(args.results)))
    except (ResultsError, OSError) as e:
        print(f"spyre-tests: {e}", file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from .suite import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spyre-tests", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run suites (default: the shipped ones)")
    run.add_argument("configs", nargs="*", help="suite YAML files")
    run.add_argument("--tier", choices=("smoke", "full"), help="only sources labelled with this tier")
    run.add_argument("--junit", help="write a JUnit XML report here")
    run.add_argument("--pytorch-src", type=Path, help="a PyTorch checkout for pytorch: sources (the installed tag)")
    run.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes at once")
    run.add_argument("--chunk-size", type=int, default=300, help="tests per worker process")
    run.add_argument("--max-retries", type=int, default=25, help="failing tests retried alone, at most")
    run.add_argument("--test-timeout", type=int, default=300, help="seconds one test may take")
    run.add_argument("--only", help="a file of test ids (one a line, e.g. from select): run only those")
    run.add_argument("--results", help="add this run's result records to this JSON file (spyre-tests ops-doc reads it)")
    run.set_defaults(fn=_run)
    doc = sub.add_parser("ops-doc", help="render docs/supported-ops.md from result records")
    doc.add_argument("results", nargs="?", default=str(_shipped_results()),
                     help="a results file written by run --results (default: the shipped full-tier records)")
    doc.add_argument("-o", "--output", help="file to write (default: standard output)")
    doc.set_defaults(fn=_ops_doc)
    inv = sub.add_parser("inventory", help="write the installed torch's test inventory (JSON)")
    inv.add_argument("-o", "--output", help="file to write (default: standard output)")
    inv.set_defaults(fn=_inventory)
    sel = sub.add_parser("select", help="tests to rerun after a torch upgrade")
    sel.add_argument("--old", required=True, help="inventory of the torch you move from")
    sel.add_argument("--new", required=True, help="inventory of the torch you move to")
    sel.add_argument("--json", action="store_true", help="print ids with the reason each was selected")
    sel.set_defaults(fn=_select)
    sch = sub.add_parser("schema", help="print the JSON schema of suite files")
    sch.set_defaults(fn=_schema)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as result records name their run
    return args.fn(args)


def _shipped_results() -> Path:
    from .results import SHIPPED_RESULTS

    return SHIPPED_RESULTS


if __name__ == "__main__":
    sys.exit(main())
