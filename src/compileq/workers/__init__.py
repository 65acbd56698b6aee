"""Worker side: processes pinned to GPUs (or cross-compiling on CPUs) that build kernels."""
