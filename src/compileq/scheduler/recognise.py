"""Recognising Inductor's Triton job among everything it submits to its process pool."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

from compileq.tasks.jobs import TritonJob

#: Variables Inductor passes that only name this machine's cache directories; a worker uses its
#: own. Any other variable (TRITON_LIBDEVICE_PATH: a path to a file here) makes the job local.
_LOCATION_ENV = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"})


def recognise(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[TritonJob, dict[str, str]] | None:
    """``(job, extra_env)`` for ``_worker_compile_triton(partial(load, name, src), env, cfg)``.

    Anything else, or a Triton job compileq cannot reproduce elsewhere, returns None and runs
    in stock Inductor's pool exactly as without compileq.
    """
    from torch._inductor.codecache import _load_triton_kernel_from_source
    from torch._inductor.runtime.compile_tasks import _worker_compile_triton

    if fn is not _worker_compile_triton or kwargs or len(args) != 3:
        return None
    load, extra_env, extra_config = args
    if not (
        isinstance(load, functools.partial)
        and load.func is _load_triton_kernel_from_source
        and len(load.args) == 2
        and not load.keywords
        and all(isinstance(a, str) for a in load.args)
        and isinstance(extra_env, dict)
        and isinstance(extra_config, dict)
    ):
        return None
    if set(extra_env) - _LOCATION_ENV:
        return None
    try:
        # Round-trip so the key hashes exactly what the worker will see after JSON.
        config = json.loads(json.dumps(extra_config))
    except (TypeError, ValueError):
        return None
    job = TritonJob(load.args[0], load.args[1], config)
    if job.target is None:
        return None
    return job, dict(extra_env)


def inductor_extra_config() -> dict[str, Any]:
    """The ``extra_config`` Inductor (2.11 to 2.13) sends with every Triton job of this process.

    ``compileq warm`` builds with it so that warmed keys equal the keys a later
    ``torch.compile`` asks for.
    """
    from torch._inductor import config

    return {"use_static_triton_launcher": config.use_static_triton_launcher}


def relocate_to_this_machine(kernel: Any) -> None:
    """Point a ``CachingAutotuner`` built elsewhere at this machine's Inductor cache dir.

    A kernel built on a worker names the worker's files: its ``filename`` (the source the
    worker loaded) and the local autotune cache its ``save_cache_hook`` writes the winning
    config to (``<worker cache dir>/<xx>/<hash>.best_config``). Left so, this process would
    write its autotuning results under the worker's directory layout, on this machine: outside
    its own cache dir (a job that cannot create that path would fail its first run), where
    its next run never looks. Both are rewritten to the same two last parts under this
    process's ``cache_dir()``: the file names hash only the (index-free) source, so this is
    the path Inductor would have used here, and the key Inductor's Mega-Cache records for it.

    The remote autotune key is left as it is: it hashes the source file's name only, and the
    source was normalised to ``cuda:0`` (``tasks/device_index.py``), so every GPU index of every
    node reads and writes one entry per kernel.
    """
    # Inductor's ``cache_dir()`` also sets this variable and creates the directory; this runs
    # once per kernel, on the thread that settles builds, where a setenv can race a getenv in
    # native code on another thread. Inductor has set it before it submits any kernel.
    here = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if here is None:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        here = cache_dir()
    here = os.path.abspath(here)

    def moved(path: str) -> str:
        return os.path.join(here, *path.split(os.sep)[-2:])

    filename = getattr(kernel, "filename", None)
    if isinstance(filename, str) and os.sep in filename:
        kernel.filename = moved(filename)
    cache: Any = getattr(getattr(kernel, "save_cache_hook", None), "__self__", None)
    local = getattr(cache, "local_cache", None)
    if isinstance(local, tuple) and len(local) == 2 and isinstance(local[1], str):
        cache.local_cache = (local[0], moved(local[1]))
