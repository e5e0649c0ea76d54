"""The Spyre compiler: Inductor's fused nodes and single eager ops lowered to Spyre programs.

See docs/compiler.md. Importing it is cheap. ``torch_spyre.register()`` installs the compiler's hooks
into the device (``hooks.py``: the eager program runner, and the answer to Inductor's lookup of
``torch.spyre.Scheduling``); the Inductor backend for device ``spyre`` is registered by
:func:`backend.register`, reached through those hooks on the first ``torch.compile`` or eager program (or
called explicitly). Inductor's private APIs are reached only through ``torch_spyre/_torch/inductor.py``.
"""
