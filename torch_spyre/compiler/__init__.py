"""The Spyre compiler: Inductor's fused nodes and single eager ops lowered to Spyre programs.

See docs/compiler.md. This package is the only one that touches Inductor internals. Importing it is
cheap; the Inductor backend for device ``spyre`` is registered by :func:`backend.register` (called on
the first ``torch.compile`` through the device module's lazy hook, or explicitly).
"""
