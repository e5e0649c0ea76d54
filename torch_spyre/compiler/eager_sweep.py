"""The sweep behind docs/eager-ops.md: common eager ops on spyre, which ATen ops ran as programs.

``python -m torch_spyre.compiler.eager_sweep > docs/eager-ops.md`` regenerates the document
(about two minutes; ``--cases`` prints only the common-op cases);
``tests/compiler/test_eager.py`` checks the document against the code (a sample always, the whole
sweep in the slow tier). Each case runs once in compile mode on fresh caches; the ATen ops it reached
are read from ``fallback_stats()`` (``.compiled`` and ``.host``) and the host reasons from
``eager.host_reasons()``.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

# name -> (function of spyre tensors, CPU inputs). Inputs are small fp32 (fp16 where the op is
# usually run in half precision) so the sweep stays quick; shapes do not change which ops lower.


def _x(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


def _idx(n, hi):
    return torch.arange(n) % hi


CASES: dict[str, tuple[Callable, tuple]] = {
    # pointwise
    "add": (lambda a, b: a + b, (_x(8, 64), _x(8, 64))),
    "add_scalar": (lambda a: a + 2.5, (_x(8, 64),)),
    "sub": (lambda a, b: a - b, (_x(8, 64), _x(8, 64))),
    "mul": (lambda a, b: a * b, (_x(8, 64), _x(64))),
    "div": (lambda a, b: a / b, (_x(8, 64), _x(8, 64).abs() + 1)),
    "neg": (lambda a: -a, (_x(8, 64),)),
    "abs": (torch.abs, (_x(8, 64),)),
    "exp": (torch.exp, (_x(8, 64),)),
    "log": (lambda a: torch.log(a.abs() + 1), (_x(8, 64),)),
    "sqrt": (lambda a: torch.sqrt(a.abs()), (_x(8, 64),)),
    "rsqrt": (lambda a: torch.rsqrt(a.abs() + 1), (_x(8, 64),)),
    "pow": (lambda a: a ** 2, (_x(8, 64),)),
    "tanh": (torch.tanh, (_x(8, 64),)),
    "sigmoid": (torch.sigmoid, (_x(8, 64),)),
    "relu": (torch.relu, (_x(8, 64),)),
    "gelu": (F.gelu, (_x(8, 64),)),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), (_x(8, 64),)),
    "silu": (F.silu, (_x(8, 64),)),
    "clamp": (lambda a: a.clamp(-0.5, 0.5), (_x(8, 64),)),
    "maximum": (torch.maximum, (_x(8, 64), _x(8, 64))),
    "where": (lambda c, a, b: torch.where(c > 0, a, b), (_x(8, 64), _x(8, 64), _x(8, 64))),
    "eq": (lambda a, b: a == b, (_x(8, 64), _x(8, 64))),
    "gt": (lambda a: a > 0, (_x(8, 64),)),
    "masked_fill": (lambda a: a.masked_fill(a > 0, 0.0), (_x(8, 64),)),
    "to_fp16": (lambda a: a.to(torch.float16), (_x(8, 64),)),
    "sin": (torch.sin, (_x(8, 64),)),
    "cos": (torch.cos, (_x(8, 64),)),
    "floor": (torch.floor, (_x(8, 64),)),
    "sign": (torch.sign, (_x(8, 64),)),
    "erf": (torch.erf, (_x(8, 64),)),
    # reductions and normalizations
    "sum": (lambda a: a.sum(-1), (_x(8, 64),)),
    "sum_all": (lambda a: a.sum(), (_x(8, 64),)),
    "mean": (lambda a: a.mean(0), (_x(8, 64),)),
    "amax": (lambda a: a.amax(-1), (_x(8, 64),)),
    "max_dim": (lambda a: a.max(-1)[0], (_x(8, 64),)),
    "var": (lambda a: a.var(-1), (_x(8, 64),)),
    "softmax": (lambda a: a.softmax(-1), (_x(8, 64),)),
    "log_softmax": (lambda a: a.log_softmax(-1), (_x(8, 64),)),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (64,), w, b), (_x(8, 64), _x(64), _x(64))),
    "rms_norm": (lambda a, w: F.rms_norm(a, (64,), w), (_x(8, 64), _x(64))),
    "argmax": (lambda a: a.argmax(-1), (_x(8, 64),)),
    "cumsum": (lambda a: a.cumsum(-1), (_x(8, 64),)),
    "logsumexp": (lambda a: a.logsumexp(-1), (_x(8, 64),)),
    "topk": (lambda a: a.topk(3, -1)[0], (_x(8, 64),)),
    "sort": (lambda a: a.sort(-1)[0], (_x(8, 64),)),
    # matmul family (fp16: the PE arrays multiply 16-bit floats)
    "mm": (torch.mm, (_x(16, 64, dtype=torch.float16), _x(64, 64, dtype=torch.float16))),
    "matmul_3d": (torch.matmul, (_x(2, 16, 64, dtype=torch.float16), _x(64, 64, dtype=torch.float16))),
    "bmm": (torch.bmm, (_x(2, 16, 64, dtype=torch.float16), _x(2, 64, 64, dtype=torch.float16))),
    "addmm": (torch.addmm, (_x(64, dtype=torch.float16), _x(16, 64, dtype=torch.float16),
                            _x(64, 64, dtype=torch.float16))),
    "linear": (F.linear, (_x(16, 64, dtype=torch.float16), _x(64, 64, dtype=torch.float16),
                          _x(64, dtype=torch.float16))),
    "mm_fp32": (torch.mm, (_x(16, 64), _x(64, 64))),
    "sdpa": (F.scaled_dot_product_attention, (_x(1, 2, 16, 64, dtype=torch.float16),
                                              _x(1, 2, 16, 64, dtype=torch.float16),
                                              _x(1, 2, 16, 64, dtype=torch.float16))),
    # indexing and data movement
    "embedding": (F.embedding, (_idx(12, 32), _x(32, 64))),
    "index_select": (lambda a, i: a.index_select(0, i), (_x(32, 64), _idx(5, 32))),
    "gather": (lambda a, i: a.gather(1, i), (_x(8, 64), _idx(16, 64).reshape(8, 2))),
    "cat": (lambda a, b: torch.cat([a, b], 0), (_x(8, 64), _x(8, 64))),
    "stack": (lambda a, b: torch.stack([a, b]), (_x(8, 64), _x(8, 64))),
    "transpose_contiguous": (lambda a: a.t().contiguous(), (_x(64, 64),)),
    "pad": (lambda a: F.pad(a, (1, 2)), (_x(8, 64),)),
    "tril": (lambda a: a.tril(), (_x(64, 64),)),
    "flip": (lambda a: a.flip(-1), (_x(8, 64),)),
    "repeat": (lambda a: a.repeat(2, 1), (_x(8, 64),)),
    "index_put": (lambda a, i: a.index_put((i,), torch.zeros((), device=a.device)),
                  (_x(32, 64), _idx(5, 32))),
    "nonzero": (lambda a: (a > 0).nonzero(), (_x(8, 64),)),
    # random and factories
    "dropout": (lambda a: F.dropout(a, 0.5, training=True), (_x(8, 64),)),
    "rand_like": (torch.rand_like, (_x(8, 64),)),
    "arange": (lambda a: torch.arange(8, device=a.device), (_x(8, 64),)),
    "item": (lambda a: a.sum().item(), (_x(8, 64),)),
}


def run_case(name: str) -> dict[str, dict[str, str]]:
    """One case on fresh caches: ``{"program": {op: ""}, "host": {op: reason}}``."""
    from torch_spyre.compiler import eager
    from torch_spyre.device import fallback

    fn, inputs = CASES[name]
    previous = os.environ.get("TORCH_SPYRE_EAGER")
    os.environ["TORCH_SPYRE_EAGER"] = "compile"
    try:
        eager.reset_warnings()
        fallback.reset_fallback_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*[x.to("spyre") for x in inputs])
        stats = fallback.fallback_stats()
        reasons = eager.host_reasons()
    finally:
        if previous is None:
            os.environ.pop("TORCH_SPYRE_EAGER", None)
        else:
            os.environ["TORCH_SPYRE_EAGER"] = previous
    return {"program": {op: "" for op in stats.compiled},
            "host": {op: reasons.get(op, "") for op in stats.host}}


def sweep(names=None) -> dict[str, dict[str, dict[str, str]]]:
    return {name: run_case(name) for name in (names or CASES)}


HEADER = """# Eager ops: programs or host

Generated by `python -m torch_spyre.compiler.eager_sweep > docs/eager-ops.md` (do not edit by hand;
`tests/compiler/test_eager.py` checks this file against the code). With `TORCH_SPYRE_EAGER=compile`
each eager ATen op on spyre tensors runs as a cached single-op program (docs/compiler.md, "Eager
mode"); the ops below on the host run there, warn once and are counted in `fallback_stats().host`.
Each case runs the user-level call on small inputs (fp32; fp16 for the matmul family) and lists the ATen
ops it reached (composite ops decompose before they reach the device).
"""


def render(results: dict[str, dict[str, dict[str, str]]]) -> str:
    lines = [HEADER, "## Cases", "", "| case | ATen ops run as programs | ATen ops on the host (why) |",
             "|---|---|---|"]
    for name, r in results.items():
        prog = ", ".join(f"`{op}`" for op in sorted(r["program"])) or "-"
        host = ", ".join(f"`{op}` ({why})" for op, why in sorted(r["host"].items())) or "-"
        lines.append(f"| {name} | {prog} | {host} |")
    programs = sorted({op for r in results.values() for op in r["program"]})
    hosts = sorted({op for r in results.values() for op in r["host"]} - set(programs))
    lines += ["", "## ATen ops that ran as programs", "", ", ".join(f"`{op}`" for op in programs), "",
              "## ATen ops that ran on the host", "", ", ".join(f"`{op}`" for op in hosts), ""]
    return "\n".join(lines)


def parse(text: str) -> dict[str, dict[str, list[str]]]:
    """The case table of a rendered document: case -> {"program": [ops], "host": [ops]}."""
    import re

    out = {}
    for line in text.splitlines():
        m = re.match(r"^\| (\w+) \| (.*) \| (.*) \|$", line)
        if not m or m.group(1) == "case":
            continue
        out[m.group(1)] = {"program": re.findall(r"`([^`]+)`", m.group(2)),
                           "host": re.findall(r"`([^`]+)`", m.group(3))}
    return out


# ---------------------------------------------------------------------------------------------
# OpInfo sweep: the first float32 sample of every op in PyTorch's OpInfo database
# ---------------------------------------------------------------------------------------------
def _to(x, device):
    from .._torch.testing import tree_map

    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)


def _close(dev, ref) -> bool:
    from .._torch.testing import tree_leaves

    d, r = tree_leaves(dev), tree_leaves(ref)
    for a, b in zip(d, r):
        if isinstance(b, torch.Tensor) and b.is_floating_point():
            a = a.cpu() if isinstance(a, torch.Tensor) else a
            if not torch.allclose(a.float(), b.float(), atol=3e-2, rtol=2e-2, equal_nan=True):
                return False
    return True


UNINITIALIZED = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}


def opinfo_case(opinfo) -> dict[str, object]:
    """One OpInfo's first float32 sample in compile mode: the ATen ops it reached and whether the
    result matches the CPU at DLFloat16 tolerances (``error`` when spyre raised)."""
    from torch_spyre.compiler import eager
    from torch_spyre.device import fallback

    torch.manual_seed(0)  # OpInfo samples draw from the global generator
    sample = next(iter(opinfo.sample_inputs("cpu", torch.float32)))
    args = (sample.input, *sample.args)
    ref = opinfo(*args, **sample.kwargs)
    eager.reset_warnings()
    fallback.reset_fallback_stats()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = opinfo(*_to(args, "spyre"), **_to(sample.kwargs, "spyre"))
        close = None if opinfo.name in UNINITIALIZED else _close(out, ref)
    except Exception as e:  # noqa: BLE001 - recorded
        return {"program": {}, "host": {}, "error": type(e).__name__}
    stats, reasons = fallback.fallback_stats(), eager.host_reasons()
    return {"program": dict(stats.compiled), "host": {op: reasons.get(op, "") for op in stats.host},
            "close": close}


def opinfo_sweep(log=None) -> dict[str, dict[str, object]]:
    from .._torch.testing import cheap_sample_tracking, opinfo_database

    with cheap_sample_tracking():
        return _opinfo_sweep(opinfo_database(), log)


def _opinfo_sweep(op_db: list, log) -> dict[str, dict[str, object]]:
    os.environ["TORCH_SPYRE_EAGER"] = "compile"
    out = {}
    for opinfo in op_db:
        name = f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name
        if torch.float32 not in opinfo.dtypes or name in out:
            continue
        try:
            out[name] = opinfo_case(opinfo)
        except Exception:  # noqa: BLE001 - no sample / the CPU refuses: not a spyre question
            continue
        if log:
            log(name, out[name])
    return out


def render_opinfo(results: dict[str, dict[str, object]]) -> str:
    program, host = {}, {}
    for name, r in results.items():
        for op in r["program"]:
            program.setdefault(op, []).append(name)
        for op, why in r["host"].items():
            host.setdefault(op, (why, []))[1].append(name)
    mismatched = sorted(n for n, r in results.items() if r.get("close") is False)
    errors = sorted(n for n, r in results.items() if "error" in r)
    lines = ["## OpInfo sweep", "",
             f"The first float32 sample of each of {len(results)} OpInfo entries, in compile mode. "
             f"{len(program)} ATen ops ran as programs, {len(set(host) - set(program))} only on the host.",
             "", "| ATen op | ran as a program | on the host (why, first reason seen) |", "|---|---|---|"]
    for op in sorted(set(program) | set(host)):
        why = host[op][0] if op in host else ""
        why = why.replace("|", "/") if op in host else "-"
        lines.append(f"| `{op}` | {'yes' if op in program else 'no'} | {why} |")
    lines += ["", "Results outside DLFloat16 tolerances (atol 3e-2, rtol 2e-2) against the CPU (`empty*`, "
              "uninitialized, are not compared; fp32 matmuls run at torch's default precision, \"highest\": "
              "fp32-accurate): "
              f"{', '.join(f'`{n}`' for n in mismatched) or 'none'}.", "",
              "Samples that raised on spyre (dtypes the card cannot hold, sparse layouts, CPU index arguments: "
              f"they raise in host mode too): {', '.join(f'`{n}`' for n in errors) or 'none'}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    from torch_spyre._torch.inductor import disable_fx_graph_cache  # (importing torch_spyre registered the device)

    disable_fx_graph_cache()
    cases = render(sweep())
    if "--cases" in sys.argv:
        print(cases, end="")
    else:
        log = (lambda n, r: print(n, r, file=sys.stderr, flush=True)) if "-v" in sys.argv else None
        print(cases + "\n" + render_opinfo(opinfo_sweep(log=log)), end="")
