"""One model type, eager and compiled on spyre against the CPU: one coverage record.

The record (plain JSON values):

    {"model_type", "family", "modality", "class", "inputs": {name: shape} (the synthesised inputs),
     "status": "pass" | "fail" | "not_buildable" | "degenerate_reference",
     "reason" (not buildable, degenerate reference), "adapters": [...], "host_seconds",
     "batch_norms_calibrated" (when the model has batch norms: ``catalog.calibrate_batch_norms``),
     "eager" / "compiled": {"status": "pass" | "fail" | "degenerate", "cosine", "max_abs_error", "greedy_match",
                            "latency_ms" (simulated), "host_ops": {op: calls run on the host},
                            "compile_fallbacks": {op: calls}, "failure": {"class", "detail", "op"} | None}}

A mode passes when its output's cosine with the CPU's is >= ``COSINE_PASS``; ``greedy_match`` (decoders
and other logits) says whether the argmax token at every position equals the CPU's. The model passes when
every mode run passes. A mode whose CPU output is all zeros (and the card's too) is "degenerate": there is
nothing to compare, so it is neither a pass nor a numerics failure, and its model is not counted in pass
rates (``report.py`` lists it with the reason). ``latency_ms`` is the simulated device time of one call (the compiled mode's second
call: the first one compiles and relayouts the weights).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Any, Iterator

import torch

from . import catalog, classify

COSINE_PASS = 0.999
MODES = ("eager", "compiled")


class ModelTimeout(Exception):
    """The model's time budget ran out."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ModelTimeout in this (main) thread after ``seconds``; the runners kill what this cannot stop.
    Sticky: the alarm can land where its exception is swallowed (a broad ``except`` in model code trying
    alternatives, a finalizer, whose exceptions Python only prints), so once it has fired the block ends in
    ModelTimeout however it ends."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    message = f"the model took longer than {seconds:g} s"
    fired = []

    def _raise(signum, frame):
        fired.append(True)
        raise ModelTimeout(message)

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except ModelTimeout:
        raise
    except BaseException as e:
        if fired:
            raise ModelTimeout(message) from e
        raise
    else:
        if fired:
            raise ModelTimeout(message)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _to(inputs: dict[str, torch.Tensor], device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: (v.to(dtype) if v.is_floating_point() else v).to(device) for k, v in inputs.items()}


def _stats() -> tuple[dict, dict]:
    import torch_spyre.device.fallback as fb
    from torch_spyre.compiler import wrapper

    stats = fb.fallback_stats()
    host: dict[str, int] = {}
    for op, n in [*stats.host.items(), *wrapper.host_fallback_stats().items()]:
        host[_op_name(op)] = host.get(_op_name(op), 0) + n
    return host, {_op_name(op): n for op, n in stats.compile_fallbacks.items()}


def _op_name(name: str) -> str:
    """One spelling for an op counted by the device ("sort.stable") and by the wrapper ("torch.ops.aten.sort.stable")."""
    name = name.removeprefix("torch.ops.").removeprefix("aten.").removeprefix("aten::")
    return name.removesuffix(".default")


def _reset() -> None:
    import torch_spyre.device.fallback as fb
    from torch_spyre.compiler import wrapper

    fb.reset_fallback_stats()
    wrapper.reset_host_fallback_stats()


def _timed_call(fn, inputs) -> tuple[Any, float]:
    start, end = torch.spyre.Event(enable_timing=True), torch.spyre.Event(enable_timing=True)
    start.record()
    out = fn(**inputs)
    end.record()
    end.synchronize()
    return out, start.elapsed_time(end)


DEGENERATE_ATOL = 1e-6  # a zero reference: the card's output within this of zero is "degenerate", not wrong


def cosine(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The cosine of two finite tensors (float64), scale-free: ``cosine_similarity`` clamps the norms at 1e-8,
    which made two equal outputs of norm ~1e-10 score 0. 0 when ``got`` is all zeros and ``ref`` is not."""
    scale = ref.abs().max()
    g, r = (got / scale).flatten(), (ref / scale).flatten()  # ref's largest is 1: no under- or overflow
    norm = float(g.norm() * r.norm())
    return float(g @ r) / norm if norm > 0 else 0.0


def _judge(built: catalog.Built, ref: torch.Tensor, out: Any) -> dict:
    """The mode's verdict: "pass" / "fail" (``failure`` says why), or "degenerate" when the CPU's output is all
    zeros and the card's too (nothing to compare: neither a pass nor a numerics failure)."""
    got = catalog.compared(built, out).cpu().double()
    r = ref.double()
    if got.shape != r.shape:
        return {"status": "fail", "cosine": None, "max_abs_error": None, "greedy_match": None,
                "failure": {"class": "numerics", "detail": f"output shape {tuple(got.shape)} != CPU {tuple(r.shape)}",
                            "op": None}}
    if not bool(torch.isfinite(got).all()):
        return {"status": "fail", "cosine": None, "max_abs_error": None, "greedy_match": None,
                "failure": {"class": "numerics", "detail": "non-finite values in the output", "op": None}}
    err = float((got - r).abs().max()) if got.numel() else 0.0
    if not bool(r.any()):
        if err <= DEGENERATE_ATOL:
            return {"status": "degenerate", "cosine": None, "max_abs_error": err, "greedy_match": None,
                    "failure": None, "reason": f"the CPU's output is all zeros (the card's is within {err:.3g} of "
                                               f"zero): nothing to compare"}
        return {"status": "fail", "cosine": None, "max_abs_error": err, "greedy_match": None,
                "failure": {"class": "numerics", "op": None,
                            "detail": f"the CPU's output is all zeros, the card's is not (max abs error {err:.4g})"}}
    cos = cosine(got, r)
    greedy = bool(torch.equal(got.argmax(-1), r.argmax(-1))) if built.output == "logits" else None
    ok = cos >= COSINE_PASS
    detail = None if ok else {"class": "numerics", "op": None,
                              "detail": f"cosine {cos:.6f} < {COSINE_PASS}, max abs error {err:.4g}"}
    return {"status": "pass" if ok else "fail", "cosine": cos, "max_abs_error": err, "greedy_match": greedy,
            "failure": detail}


def _run_mode(built: catalog.Built, model, ref: torch.Tensor, mode: str, dtype: torch.dtype) -> dict:
    inputs = _to(built.inputs, "spyre", dtype)
    _reset()
    compiling = mode == "compiled"
    try:
        with torch.no_grad():
            if compiling:
                torch.compiler.reset()  # each model compiles from a clean slate
                fn = torch.compile(model)
                fn(**inputs)  # compiles, prepares the programs, relayouts the weights
                _reset()
            else:
                fn = model
            out, latency = _timed_call(fn, inputs)
            result = _judge(built, ref, out)
    except ModelTimeout:
        raise
    except catalog.NotBuildable as e:
        result = {"status": "fail", "failure": {"class": "runtime_error", "detail": str(e), "op": None}}
    except Exception as e:  # noqa: BLE001 - every failure is classified, none stops the sweep
        result = {"status": "fail", "failure": classify.failure(e, compiling)}
        latency = None
    host, compile_fallbacks = _stats()
    result.update(latency_ms=latency if result["status"] != "fail" or result.get("cosine") is not None else None,
                  host_ops=host, compile_fallbacks=compile_fallbacks)
    return result


def check_model(model_type: str, modes: tuple[str, ...] = MODES, dtype: str = "float32",
                adapters: list[str] | None = None, timeout: float | None = None) -> dict:
    """Build ``model_type`` and run it in ``modes`` on spyre against the CPU; one record (never raises
    for a model's failure). ``adapters``: None applies the default set when the model moves to spyre,
    ``[]`` none, a list of names exactly those."""
    from torch_spyre import adapters as _  # noqa: F401 - importing any part of torch_spyre registers the device

    t0 = time.perf_counter()
    family, modality = catalog.classify(model_type) if _known(model_type) else ("other", "other")
    record: dict[str, Any] = {"model_type": model_type, "family": family, "modality": modality}
    try:
        with time_limit(timeout):
            try:
                built = catalog.build(model_type)
            except catalog.NotBuildable as e:
                if _caused_by_timeout(e):  # the budget ran out while building: a timeout, not unbuildable
                    raise ModelTimeout(f"the model took longer than {timeout:g} s (while building it)") from e
                record.update(status="not_buildable", reason=str(e))
                return record
            record.update({"class": built.class_name,
                           "inputs": {k: list(v.shape) for k, v in built.inputs.items()}})
            if built.batch_norms_calibrated:
                record["batch_norms_calibrated"] = built.batch_norms_calibrated
            ref = catalog.reference(built)
            model = _on_spyre(built.model, dtype, adapters)
            record["adapters"] = list(getattr(model, "spyre_adapters", []))
            for mode in modes:
                record[mode] = _run_mode(built, model, ref, mode, getattr(torch, dtype))
    except ModelTimeout as e:
        record.setdefault("class", None)
        record["status"] = "fail"
        record["failure"] = {"class": "timeout", "detail": str(e), "op": None}
    else:
        record["status"] = model_status([record[m] for m in modes])
        if record["status"] == "degenerate_reference":
            record["reason"] = next(record[m]["reason"] for m in modes if record[m]["status"] == "degenerate")
    record["host_seconds"] = round(time.perf_counter() - t0, 2)
    return record


def model_status(results: list[dict]) -> str:
    """"fail" when a mode failed; else "degenerate_reference" when a mode had nothing to compare (not counted
    in pass rates, listed with its reason); else "pass"."""
    statuses = {r["status"] for r in results}
    if statuses - {"pass", "degenerate"}:
        return "fail"
    return "degenerate_reference" if "degenerate" in statuses else "pass"


def _caused_by_timeout(e: BaseException) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, ModelTimeout):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _known(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def _on_spyre(model: torch.nn.Module, dtype: str, adapters: list[str] | None) -> torch.nn.Module:
    """The model on spyre: adapted automatically as it moves (adapters None), or with exactly ``adapters``."""
    from torch_spyre import adapters as adapt_mod

    if adapters is not None:
        adapt_mod.adapt(model, adapters=adapters)
    return model.to(getattr(torch, dtype)).to("spyre")
