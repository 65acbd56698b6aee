"""Recognising Inductor's Triton job among everything it submits to its process pool."""

from __future__ import annotations

import functools
import json
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
