"""The compiler's program generators, one subpackage per kind of kernel: ``pointwise`` (pointwise and
reduction kernels), ``matmul`` (the matmul family), ``gather`` (embedding, index_select, gather) and
``attention`` (flash attention). Each exports ``GENERATOR`` (its name in the wrapper's registry) and
``generate(kspec, places, config)`` (a kernel spec and its bound buffers -> a program)."""
