"""The program generators: one subpackage per kind of kernel (pointwise/reduction, matmul, gather, attention)."""
