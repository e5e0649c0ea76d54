"""The whole-op program generators, one subpackage each (matmul, pointwise, gather, attention), and the
helpers they share (stick runs and DMA tiles, scratchpad emitters)."""
