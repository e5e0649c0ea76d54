"""The sweep's markdown summary and HTML report (plots by matplotlib, embedded as PNG), from the records."""

from __future__ import annotations

import base64
import html
import io
from collections import Counter, defaultdict
from pathlib import Path

MODES = ("eager", "compiled")


NOT_COUNTED = ("not_buildable", "degenerate_reference")


def counted(records: list[dict]) -> list[dict]:
    """Records that count in pass rates: every model that could be built on the CPU and whose output is not
    all zeros there (a degenerate reference: nothing to compare the card's with)."""
    return [r for r in records if r.get("status") not in NOT_COUNTED]


def mode_status(record: dict, mode: str) -> str:
    """"pass" / "fail" / "degenerate" / "-" (not run) of one mode; a model-level failure (timeout, crash) fails every mode."""
    if mode in record:
        return record[mode]["status"]
    return "fail" if record.get("failure") else "-"


def failure_of(record: dict, mode: str) -> dict | None:
    if mode in record:
        return record[mode].get("failure")
    return record.get("failure")


def rate(records: list[dict], mode: str) -> tuple[int, int]:
    ran = [r for r in counted(records) if mode_status(r, mode) in ("pass", "fail")]  # not "degenerate"
    return sum(mode_status(r, mode) == "pass" for r in ran), len(ran)


def _pct(p: int, n: int) -> str:
    return f"{p}/{n} ({100 * p / n:.1f}%)" if n else "0/0"


def groups(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in counted(records):
        out[(r.get("modality", "other"), r.get("family", "other"))].append(r)
    return dict(sorted(out.items()))


def failure_classes(records: list[dict], mode: str) -> Counter:
    return Counter(f["class"] for r in counted(records) if (f := failure_of(r, mode)))


def missing_ops(records: list[dict]) -> Counter:
    """Ops by the number of model types that ran them on the host or failed on them (compiled, else eager)."""
    ops: Counter = Counter()
    for r in counted(records):
        names = set()
        for mode in MODES:
            if mode in r:
                names |= set(r[mode].get("host_ops", {})) | set(r[mode].get("compile_fallbacks", {}))
                f = r[mode].get("failure")
                if f and f.get("op"):
                    names.add(f["op"])
        ops.update(names)
    return ops


def _most_common(counts: Counter, n: int) -> list[tuple[str, int]]:
    """The ``n`` most common, ties by name: the same report from the same records in every process (a
    Counter's ties follow set order, which string hashing randomises per process)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _fmt(x, digits=6) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# The targets: (what, mode, which records, required pass rate).
TARGETS = (("compiled, encoder-only text", "compiled", ("text", "encoder"), 0.95),
           ("compiled, decoder-only text", "compiled", ("text", "decoder"), 0.90),
           ("eager, every buildable architecture", "eager", None, 0.97))
MARKER = "<!-- spyre coverage: everything below this line is generated from coverage.json -->"


def by_modality(records: list[dict]) -> dict[str, list[dict]]:
    """Counted records per reported modality: text split by family (encoder, decoder, encoder-decoder), then
    vision, audio, multimodal, other."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in counted(records):
        m = r.get("modality", "other")
        out[r.get("family", "other") if m == "text" else m].append(r)
    order = ("encoder", "decoder", "encoder-decoder", "vision", "audio", "multimodal", "other")
    return {k: out[k] for k in order if k in out}


def targets(records: list[dict]) -> list[tuple[str, int, int, float, bool]]:
    """``(target, passed, counted, required, met)`` for each of ``TARGETS``, measured on ``records``."""
    rows = []
    for what, mode, key, need in TARGETS:
        rs = [r for r in counted(records) if key is None or (r.get("modality"), r.get("family")) == key]
        p, n = rate(rs, mode)
        rows.append((what, p, n, need, bool(n) and p / n >= need))
    return rows


def markdown(records: list[dict], command: str = "", universe: dict[str, int] | None = None) -> str:
    """The summary; ``universe``: model types of the installed transformers per modality (to say how much of
    it the records cover)."""
    total, built = len(records), len(counted(records))
    lines = ["# Model coverage on the simulated Spyre card", ""]
    if command:
        lines += ["Regenerate with:", "", "```bash", command, "```", ""]
    nb = [r for r in records if r.get("status") == "not_buildable"]
    degenerate = [r for r in records if r.get("status") == "degenerate_reference"]
    lines += [f"{total} model types swept; {built} could be built offline from a shrunken config (random weights) "
              f"and count; {len(nb)} could not and {len(degenerate)} had an all-zero output on the CPU (nothing to "
              f"compare; both listed at the end, not counted). A mode passes when the cosine of its logits or "
              f"last hidden state with the CPU's (fp32) is >= 0.999.", ""]
    if universe:
        swept = Counter(r.get("modality", "other") for r in records)
        lines += ["| modality | model types swept | in this transformers |", "|---|---|---|"]
        lines += [f"| {m} | {swept.get(m, 0)} | {n} |" for m, n in sorted(universe.items())]
        lines.append("")
    lines += ["## Pass rates per modality", "", "| modality | models | eager pass | compiled pass |", "|---|---|---|---|"]
    for name, rs in by_modality(records).items():
        label = f"text {name}" if name in ("encoder", "decoder", "encoder-decoder") else name
        lines.append(f"| {label} | {len(rs)} | {_pct(*rate(rs, 'eager'))} | {_pct(*rate(rs, 'compiled'))} |")
    lines.append(f"| **all** | {built} | {_pct(*rate(records, 'eager'))} | {_pct(*rate(records, 'compiled'))} |")
    lines += ["", "## Targets", "", "| target | required | measured | met |", "|---|---|---|---|"]
    for what, p, n, need, met in targets(records):
        lines.append(f"| {what} | >= {100 * need:.0f}% | {_pct(p, n)} | {'yes' if met else 'no'} |")
    lines += ["", "## Pass rates per modality and family", "",
              "| modality | family | models | eager pass | compiled pass |", "|---|---|---|---|---|"]
    for (modality, family), rs in groups(records).items():
        lines.append(f"| {modality} | {family} | {len(rs)} | {_pct(*rate(rs, 'eager'))} | {_pct(*rate(rs, 'compiled'))} |")
    lines.append(f"| **all** | | {built} | {_pct(*rate(records, 'eager'))} | {_pct(*rate(records, 'compiled'))} |")
    lines += ["", "## Failure classes", "", "| class | eager | compiled |", "|---|---|---|"]
    fe, fc = failure_classes(records, "eager"), failure_classes(records, "compiled")
    for cls in sorted(set(fe) | set(fc)):
        lines.append(f"| {cls} | {fe.get(cls, 0)} | {fc.get(cls, 0)} |")
    ops = missing_ops(records)
    if ops:
        lines += ["", "## Ops run on the host or missing (model types using each)", "",
                  "| op | model types |", "|---|---|"]
        lines += [f"| `{op}` | {n} |" for op, n in _most_common(ops, 25)]
    lines += ["", "## Per model", "",
              "| model_type | modality | family | eager | compiled | cosine (compiled) | simulated ms (compiled) "
              "| host ops | adapters | failure |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(counted(records), key=lambda r: r["model_type"]):
        comp = r.get("compiled", {})
        f = failure_of(r, "compiled") or failure_of(r, "eager")
        host = sorted(set(comp.get("host_ops", {})) | set(r.get("eager", {}).get("host_ops", {})))
        why = f"{f['class']}: {f['detail']}" if f else ""
        lines.append(f"| {r['model_type']} | {r.get('modality')} | {r.get('family')} | {mode_status(r, 'eager')} "
                     f"| {mode_status(r, 'compiled')} | {_fmt(comp.get('cosine'))} | {_fmt(comp.get('latency_ms'), 3)} "
                     f"| {', '.join(host)} | {', '.join(r.get('adapters', []))} | {_cell(why)} |")
    if degenerate:
        lines += ["", "## Degenerate reference (not counted)", "", "| model_type | reason |", "|---|---|"]
        lines += [f"| {r['model_type']} | {_cell(r.get('reason', ''))} |"
                  for r in sorted(degenerate, key=lambda r: r["model_type"])]
    if nb:
        lines += ["", "## Not buildable (not counted)", "", "| model_type | reason |", "|---|---|"]
        lines += [f"| {r['model_type']} | {_cell(r.get('reason', ''))} |" for r in sorted(nb, key=lambda r: r["model_type"])]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:200]


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def plots(records: list[dict]) -> list[tuple[str, str]]:
    """(title, base64 PNG): pass rate per family and modality, latency distribution, most common missing ops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    g = groups(records)
    if g:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(g) + 1.2))
        labels = [f"{m} / {f} ({len(rs)})" for (m, f), rs in g.items()]
        for k, mode in enumerate(MODES):
            vals = [100 * p / n if n else 0 for p, n in (rate(rs, mode) for rs in g.values())]
            ax.barh([i + 0.4 * k for i in range(len(g))], vals, height=0.4, label=mode)
        ax.set_yticks([i + 0.2 for i in range(len(g))], labels)
        ax.set_xlabel("pass rate (%)")
        ax.set_xlim(0, 100)
        ax.legend()
        out.append(("Pass rate per modality and family", _png(fig)))
        plt.close(fig)
    lat = [r["compiled"]["latency_ms"] for r in counted(records)
           if r.get("compiled", {}).get("latency_ms") is not None]
    if lat:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.hist(lat, bins=min(30, max(5, len(lat) // 2)))
        ax.set_xlabel("simulated device time of one compiled forward (ms)")
        ax.set_ylabel("model types")
        out.append(("Latency distribution (compiled, simulated)", _png(fig)))
        plt.close(fig)
    ops = _most_common(missing_ops(records), 15)
    if ops:
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(ops) + 1))
        ax.barh([o for o, _ in ops][::-1], [n for _, n in ops][::-1])
        ax.set_xlabel("model types")
        out.append(("Most common ops run on the host or missing", _png(fig)))
        plt.close(fig)
    return out


def html_report(records: list[dict], command: str = "", universe: dict[str, int] | None = None) -> str:
    """The HTML report: the plots, then the markdown summary's tables as preformatted text."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Spyre model coverage</title></head><body>",
             "<h1>Model coverage on the simulated Spyre card</h1>"]
    for title, png in plots(records):
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Summary</h2><pre>" + html.escape(markdown(records, command, universe)) + "</pre></body></html>")
    return "\n".join(parts)


def splice(existing: str, generated: str) -> str:
    """``existing`` up to and including ``MARKER``, then ``generated`` one heading level down (a hand-written
    document that ends in the generated results); ``generated`` alone when there is no marker."""
    if MARKER not in existing:
        return generated
    head = existing[: existing.index(MARKER) + len(MARKER)]
    lines, fenced = [], False
    for line in generated.splitlines():
        fenced ^= line.startswith("```")
        lines.append("#" + line if line.startswith("#") and not fenced else line)  # not a shell comment
    return head + "\n\n" + "\n".join(lines) + "\n"


def write(out: Path, records: list[dict], command: str = "", universe: dict[str, int] | None = None) -> None:
    """``out/coverage.md`` (spliced below ``MARKER`` when the file has it) and ``out/coverage.html``."""
    md = out / "coverage.md"
    generated = markdown(records, command, universe)
    md.write_text(splice(md.read_text() if md.exists() else "", generated))
    (out / "coverage.html").write_text(html_report(records, command, universe))
