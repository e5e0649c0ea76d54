"""The Spyre compiler: Inductor's fused nodes and single eager ops lowered to Spyre programs.

See docs/compiler.md. This package is the only one that touches Inductor internals.
"""
