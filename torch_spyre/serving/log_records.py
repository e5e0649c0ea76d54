"""vLLM's log records keep the text of an exception's traceback, not the traceback itself.

A traceback holds its frames, and each frame its caller (``f_back``), with their locals. vLLM's
``LLM.__init__`` warms up the chat renderer and logs a failure of it with ``exc_info=True`` (always, under
``skip_tokenizer_init=True``: no tokenizer to render with). A handler that keeps records, such as pytest's log
capture, a ``logging.handlers.MemoryHandler`` or a notebook's, then keeps ``LLM.__init__``'s frame, hence
``self``: the whole engine, its weights and its KV cache stay on the card after ``del llm; gc.collect()``
(about 17 MB for the tests' tiny models). Measured and explained in docs/serving.md, "Card memory".

The record factory installed here renders the traceback of a ``vllm.*`` record to ``exc_text`` when the
record is made, as ``logging.Formatter`` would have at the first ``format``, and drops ``exc_info``: every
formatter prints the same text, and no frame outlives the ``except`` block that logged it. Handlers that
want the exception object of a vLLM record get its text only. Other loggers' records are left alone.
"""

from __future__ import annotations

import logging
import threading

_lock = threading.Lock()
_formatter = logging.Formatter()


def _detached(factory):
    def make_record(name, *args, **kwargs):
        record = factory(name, *args, **kwargs)
        exc_info = record.exc_info
        if exc_info and exc_info[2] is not None and (name == "vllm" or name.startswith("vllm.")):
            record.exc_text = record.exc_text or _formatter.formatException(exc_info)
            record.exc_info = None
        return record

    make_record.detaches_tracebacks = True
    return make_record


def install() -> None:
    """Make every later ``vllm.*`` log record keep its traceback as text (idempotent)."""
    with _lock:
        current = logging.getLogRecordFactory()
        if not getattr(current, "detaches_tracebacks", False):
            logging.setLogRecordFactory(_detached(current))
