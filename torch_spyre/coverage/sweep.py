"""The sweep: which models, resume, progress, Ctrl-C, and the files it writes.

``DIR/coverage.json`` is ``{"models": [record, ...], "options": {...}}`` (records as ``check.py`` makes
them), rewritten atomically after every finished model, so a sweep that is interrupted or killed keeps
everything finished so far and a second run with the same ``DIR`` only runs what is missing (resume).
``DIR/coverage.md`` and ``DIR/coverage.html`` are written from the JSON at the end (``report.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import catalog, report, runners

FAMILIES = ("encoder", "decoder", "encoder-decoder")


@dataclass
class SweepOptions:
    out: Path
    models: list[str] | None = None  # model types (None: every one of the installed transformers)
    families: list[str] | None = None  # keep only these families (text architectures: FAMILIES + modality)
    modalities: list[str] | None = None
    workers: int = 1
    ray: str | None = None  # a Ray address, or "local"
    timeout: float = 600.0  # per model, seconds of host time
    dtype: str = "float32"
    adapters: list[str] | None = None  # None: the default set; []: none
    modes: tuple[str, ...] = ("eager", "compiled")
    command: str = ""  # the command line, recorded in the report
    merge: list[Path] = field(default_factory=list)  # coverage.json files whose records replace ours first
    report_only: bool = False  # no models run: merge, then rewrite the reports from the records

    def check_options(self) -> dict:
        return {"timeout": self.timeout, "dtype": self.dtype, "adapters": self.adapters, "modes": list(self.modes)}


@dataclass
class SweepResult:
    records: list[dict] = field(default_factory=list)
    ran: int = 0
    skipped: int = 0
    interrupted: bool = False


def selected_types(opts: SweepOptions) -> list[str]:
    """The model types the sweep covers (unknown names are kept: they become "not buildable" records)."""
    types = list(opts.models) if opts.models else catalog.model_types()
    if opts.families or opts.modalities:
        keep = []
        for mt in types:
            try:
                family, modality = catalog.classify(mt)
            except Exception:  # noqa: BLE001
                family, modality = "other", "other"
            if (not opts.families or family in opts.families) and (not opts.modalities or modality in opts.modalities):
                keep.append(mt)
        types = keep
    return types


def load(path: Path) -> dict:
    """The JSON of an earlier run of this sweep ({"models": []} when there is none)."""
    if not path.exists():
        return {"models": []}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise ValueError(f"{path} is not a coverage file (expected {{\"models\": [...]}}); pass another --out")
    return data


def save(path: Path, records: list[dict], opts: SweepOptions, options: dict | None = None) -> None:
    """Write the records; ``options`` (an earlier file's) is kept when this run ran no model."""
    tmp = path.with_suffix(".json.tmp")
    data = {"models": sorted(records, key=lambda r: r["model_type"]),
            "options": options if options is not None else {**opts.check_options(), "command": opts.command}}
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)  # atomic: a kill mid-write never leaves a broken file


def universe() -> dict[str, int]:
    """Model types of the installed transformers per modality (what a full sweep would cover)."""
    counts: dict[str, int] = {}
    for mt in catalog.model_types():
        modality = catalog.classify(mt)[1]
        counts[modality] = counts.get(modality, 0) + 1
    return counts


def merged(earlier: dict, files: list[Path]) -> tuple[dict[str, dict], dict]:
    """The records of ``earlier`` with those of ``files`` replacing them by model type, in order; and the
    options to keep (``earlier``'s, with each merged file and the command that made it)."""
    records = {r["model_type"]: r for r in earlier["models"]}
    options = dict(earlier.get("options") or {})
    for f in files:
        data = load(Path(f))
        if not data["models"] and not Path(f).exists():
            raise ValueError(f"--merge {f}: no such file")
        records.update({r["model_type"]: r for r in data["models"]})
        options.setdefault("merged", []).append({"file": str(f), "command": (data.get("options") or {}).get("command", "")})
    return records, options


def report_command(opts: SweepOptions) -> str:
    return f"spyre coverage --report-only --out {opts.out}"


def run(opts: SweepOptions, progress: Callable | None = None, log: Callable[[str], None] = print) -> SweepResult:
    """Run the sweep into ``opts.out``; ``progress(total, done_before)`` returns an ``advance(record)``."""
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / "coverage.json"
    if opts.report_only and not path.exists() and not opts.merge:
        raise ValueError(f"--report-only: there is no {path} to report on (run the sweep first, or --merge FILE)")
    data = load(path)
    earlier, options = merged(data, opts.merge)
    if opts.report_only:
        records = list(earlier.values())
        if opts.merge:
            save(path, records, opts, options)
        _write_reports(opts, records, options)
        return SweepResult(records=records, skipped=len(records))
    types = selected_types(opts)
    todo = [mt for mt in types if mt not in earlier]
    result = SweepResult(records=list(earlier.values()), skipped=len(types) - len(todo))
    if result.skipped:
        log(f"resuming: {result.skipped} of {len(types)} model types already in {path}")
    advance = progress(len(types), result.skipped) if progress else (lambda record: None)
    if opts.ray:
        stream = runners.run_ray(todo, opts.check_options(), opts.ray, opts.workers, on_start=log)
    else:
        stream = runners.run_local(todo, opts.check_options(), opts.workers)
    try:
        for record in stream:
            result.records.append(record)
            result.ran += 1
            save(path, result.records, opts)
            advance(record)
    except KeyboardInterrupt:
        result.interrupted = True
        runners.kill_all()
    finally:
        close = getattr(stream, "close", None)
        if close:
            try:
                close()
            except KeyboardInterrupt:
                result.interrupted = True
        kept = None if result.ran else options  # a run that ran nothing keeps the file's own command
        save(path, result.records, opts, kept)
        _write_reports(opts, result.records, kept or {"command": opts.command})
    return result


def _write_reports(opts: SweepOptions, records: list[dict], options: dict) -> None:
    lines = [c for c in (options.get("command"), *(m["command"] for m in options.get("merged", []))) if c]
    command = "\n".join(["# the sweep (resumable: runs only the model types missing from coverage.json)",
                          *lines, "# this summary and coverage.html from coverage.json", report_command(opts)])
    report.write(opts.out, records, command, universe())
