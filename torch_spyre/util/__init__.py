"""Small helpers with no torch_spyre dependencies, at the bottom of the layers (docs/architecture.md)."""
