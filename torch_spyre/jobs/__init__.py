"""Jobs: complete workloads run on the simulated card (``spyre run``).

- :mod:`torch_spyre.jobs.embed`: sentence embeddings with all-MiniLM-L6-v2, compiled for the card (or
  eager), with the similarity matrix and a per-kernel latency report in simulated device time.
"""
