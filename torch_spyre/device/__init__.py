"""The ``spyre`` PrivateUse1 device: tensors, layouts, copies, eager ops, memory stats, serialization.

See docs/device.md. This package imports nothing above it (not the compiler): eager ops reach a program
runner through ``program_runner.py``, which the compiler fills when torch_spyre registers. Torch's private
device machinery is reached only through ``torch_spyre/_torch/device.py``. Importing this package imports
nothing heavy; :func:`registration.register` makes the device available.
"""
