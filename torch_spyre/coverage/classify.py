"""A failure's class from its exception: what a model developer needs to know first.

- ``unsupported_op``: the card or the compiler has no way to run an op (the op is named);
- ``compile_error``: torch.compile (Dynamo, Inductor or our backend) failed (its first line);
- ``runtime_error``: the run on spyre raised (its first line);
- ``numerics``: the run finished but its output is not close enough to the CPU's (set by ``check.py``);
- ``timeout`` / ``crash``: the model's time ran out or its worker process died (set by the runners).
"""

from __future__ import annotations

import re

_OP = re.compile(r"\baten(?:::|\.)([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)")
_UNSUPPORTED_WORDS = ("no lowering", "not supported", "unsupported", "not implemented", "notimplemented",
                      "could not run", "no kernel")


def first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def failure(e: BaseException, compiling: bool) -> dict:
    """``{"class", "detail", "op"}`` for an exception raised running a model (``compiling``: under torch.compile)."""
    chain = list(_chain(e))
    if any(type(x).__name__ == "ModelTimeout" for x in chain) or "ModelTimeout:" in str(e):
        return {"class": "timeout", "detail": first_line(e), "op": None}  # raised inside Dynamo, which wraps it
    text = "\n".join(str(x) for x in chain)
    op = None
    for x in chain:
        if type(x).__name__ in ("UnsupportedOpError", "UnsupportedDtypeError", "NotImplementedError", "NoDataError") \
                or any(w in str(x).lower() for w in _UNSUPPORTED_WORDS):
            m = _OP.search(str(x))
            if m:
                op = m.group(1)
                break
    if op is None:
        m = _OP.search(text) if any(w in text.lower() for w in _UNSUPPORTED_WORDS) else None
        op = m.group(1) if m else None
    if op is not None:
        return {"class": "unsupported_op", "detail": first_line(e), "op": op}
    modules = " ".join(type(x).__module__ for x in chain)
    if compiling and ("torch._dynamo" in modules or "torch._inductor" in modules or "torch_spyre.compiler" in modules):
        return {"class": "compile_error", "detail": first_line(e), "op": None}
    return {"class": "compile_error" if compiling and "torch._" in modules else "runtime_error",
            "detail": first_line(e), "op": None}
