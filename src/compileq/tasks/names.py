"""The tasks' names, as a client sends them and a worker registers them.

Apart from the Celery app (``app.py``) so that a client that sends nothing (a new machine
whose every graph and kernel is a hit) never imports Celery: 0.28 s of kombu and Celery inside
its first compile on the 2-core CI machine (docs/BENCHMARKS.md, twenty-ninth session)."""

COMPILE_TRITON = "compileq.compile_triton"
COMPILE_FX = "compileq.compile_fx"
TUNE_TRITON = "compileq.tune_triton"
COMPILE_CPP = "compileq.compile_cpp"
