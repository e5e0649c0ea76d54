"""The ``spyre`` PrivateUse1 device: tensors, layouts, copies, eager ops, memory stats, serialization.

This package is the only one touching PyTorch's device machinery (see docs/device.md). Importing it
imports nothing heavy; :func:`registration.register` makes the device available.
"""
