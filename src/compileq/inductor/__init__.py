"""Inductor's own caches, served from compileq's store: FX graphs, C++ objects (and their
builds on workers), Triton modules, autotuning timings, GPU-index-free keys, per-job profiles,
and the garbage-collector window around compiles.

Nothing here may import Celery at module level: ``compileq run``'s start-up hook imports
``profiles`` in every process, before torch."""
