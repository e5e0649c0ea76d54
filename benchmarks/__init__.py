"""Benchmark scripts and the hand-written programs that tests also run."""
