"""The tasks' names, as a client sends them and a worker registers them.

Apart from the Celery app (``app.py``) so that a client that sends nothing (a new machine
whose every graph and kernel is a hit) never imports Celery. On the 2-core CI machine kombu and
Celery were most of importing ``compileq.features``, 0.51-0.59 s against 0.11-0.14 s without,
and that import runs inside a new machine's first compile (docs/BENCHMARKS.md, twenty-ninth
session). Rejected: importing the app lazily through the package's ``__getattr__``, which the
submodule ``tasks.app`` shadows as soon as it is imported."""

COMPILE_TRITON = "compileq.compile_triton"
COMPILE_FX = "compileq.compile_fx"
TUNE_TRITON = "compileq.tune_triton"
COMPILE_CPP = "compileq.compile_cpp"
