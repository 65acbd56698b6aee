"""What clients and workers both build with: below ``scheduler`` and ``workers``.

A client's local fallback builds a Triton job with the very function a worker runs
(``triton``), and a worker's FX codegen, which runs compileq's client inside the worker, times
GPU ops under the same per-GPU lock as the worker's own timing jobs (``gpu_lock``). Each side
imports them from here, so neither imports the other. Modules here import only the wire
(``tasks``), the store (``cache``) and the base modules.

Rejected alternative: leaving them in ``workers/`` and letting the client import from there,
which would make every client-side module a possible importer of worker-process code (Celery
signal handlers, the pool's start-up) and hide which of it the client really runs.
"""
