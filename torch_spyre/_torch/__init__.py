"""The seam to torch's private APIs: the only place torch_spyre touches them.

- :mod:`torch_spyre._torch.device`: PrivateUse1 hooks and guard, the dispatcher (dispatch keys, redispatch to
  the CPU kernel, Python kernels of an op), op schemas, storage internals, and the patches of torch's
  global state the device needs (SDPA's Python kernel, ``torch.accelerator``, tensor printing).
- :mod:`torch_spyre._torch.inductor`: Inductor and Dynamo (backend registration, the lowerings table, IR,
  the graph being compiled, shape symbols, FX graph cache, fake tensors); imports Inductor on first use.
- :mod:`torch_spyre._torch.testing`: PyTorch's OpInfo and ModuleInfo databases, device-generic test instantiation,
  op schemas and pytree helpers, for the eager sweep and the test suites (`testing/`).

Each module lists the private symbols it uses in ``PRIVATE_SYMBOLS``; tests/test_torch_seam.py imports
every one of them, so a torch upgrade that moves or removes one fails there first, one line per symbol.
Every other module of torch_spyre uses public torch APIs only (the same test scans the sources).
This package imports nothing of torch_spyre but ``errors`` (tests/test_architecture.py).
"""

MODULES = ("torch_spyre._torch.device", "torch_spyre._torch.inductor", "torch_spyre._torch.testing")
