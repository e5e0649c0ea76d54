"""The compiler's program generators, one subpackage each: ``matmul`` (the matmul family), and the
generators moved here alongside it. Each exports ``GENERATOR`` (its name in the wrapper's registry) and
``generate(kspec, places, config)`` (a kernel spec and its bound buffers -> a program)."""
