"""``spyre coverage``: which Hugging Face architectures run on the card, how accurately and how fast.

- ``catalog.py``: every ``model_type`` of the installed transformers, its family and modality, built
  offline from a shrunken config with random weights and synthesised inputs;
- ``check.py``: one model eager and compiled on spyre against the CPU (one record);
- ``classify.py``: a failure's class (unsupported op, numerics, compile error, ...) from its exception;
- ``runners.py``: where the checks run: local worker processes or Ray tasks (no scheduler of our own);
- ``sweep.py``: the sweep: resume, progress, Ctrl-C, the output files;
- ``report.py``: the markdown summary and the HTML report with plots.
"""
