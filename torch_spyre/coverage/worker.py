"""One model's check in a fresh process: ``python -m torch_spyre.coverage.worker MODEL_TYPE OPTIONS_JSON``.

Prints the record as one JSON line on stdout (the last line). A fresh process per model keeps every model's
state apart (Dynamo's caches, the fallback counters, the card's memory) and lets the caller kill a model
that hangs or crash without losing anything else (``runners.py``).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

MARK = "@@coverage-record@@ "


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    model_type, options = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    import transformers

    transformers.logging.set_verbosity_error()
    from .check import check_model

    record = check_model(model_type, **options)
    sys.stdout.write(MARK + json.dumps(record) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
