"""What a worker's graph codegen was given, and where its time went: written on request.

Each graph's log line (``workers/fx.py``) names Inductor's longest timed phases. That says
which phase is long, not what inside it, and not why two processes sent two graphs where one
was expected. Two settings, off by default, write more, one file per graph under its key:

- ``codegen_profile_dir``: a cProfile of the codegen (``KEY.pstats``). On an H200 worker it
  found a ResNet backward's 10 s to be Inductor's own Python: fusion and kernel code
  generation, mostly in sympy (docs/BENCHMARKS.md, nineteenth session). The profiler slows
  the codegen it measures about 2.5x, so timings are read from runs without it.
- ``codegen_dump_dir``: what Inductor was handed (``KEY.txt``): the job's header, Inductor's
  arguments, each example input's layout and the graph's code. Two DDP ranks' graphs that
  differed only by a padded matmul were found with ``diff`` of two such files.

Rejected: Inductor's own debug trace (``TORCH_COMPILE_DEBUG``), set per process: it writes
every pass's graphs and IR of every compile into a directory of its own, where the key that
names a graph to compileq (and to the client that sent it) is nowhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compileq._log import log
from compileq.hooks.ledger import Patches
from compileq.tasks.fx_jobs import FxJob


@contextlib.contextmanager
def profiled(directory: str | None, key: str) -> Iterator[None]:
    """With ``codegen_profile_dir`` set: this codegen under cProfile, written to
    ``DIR/KEY.pstats`` (the key's hash part). Its log line's phases name Inductor's timed
    phases only; the profile names what runs inside them (per kernel, per pass)."""
    if not directory:
        yield
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        path = Path(directory) / f"{key.rsplit(':', 1)[-1][:32]}.pstats"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            profile.dump_stats(path)
        except OSError as e:  # a diagnostic: never the codegen's failure
            log.warning("compileq worker: could not write %s: %s", path, e)


#: Inductor's in-process codegen, wrapped for one job to write what it was given (``dumped``).
_CODEGEN_DUMP = Patches("fx-codegen-dump")


def described(value: Any) -> str:
    """An example input as a key would see it: a tensor's dtype, device, sizes and strides."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {value.device} {tuple(value.shape)} {tuple(value.stride())}"
    return f"{type(value).__name__} {value!r}"


@contextlib.contextmanager
def dumped(directory: str | None, key: str, job: FxJob) -> Iterator[None]:
    """With ``codegen_dump_dir`` set: what this codegen was given, readable, in
    ``DIR/KEY.txt`` (the job's header, Inductor's arguments, each example input's layout and
    the graph's code): two keys where one was expected are told apart with ``diff``."""
    if not directory:
        yield
        return
    from torch._inductor.compile_fx import _InProcessFxCompile

    lines = [
        f"key {key}",
        f"graph_key {job.graph_key}",
        f"target {job.target}",
        f"toolchain {job.toolchain}",
        f"env {job.env}",
        f"state {job.state.to_json()}",
    ]

    original = _InProcessFxCompile.codegen_and_compile

    def codegen_and_compile(
        self: Any, gm: Any, example_inputs: Any, inputs_to_check: Any, graph_kwargs: Any
    ) -> Any:
        lines.append(f"inputs_to_check {list(inputs_to_check)}")
        lines.extend(f"graph_kwargs {k} {v!r}" for k, v in sorted(graph_kwargs.items()))
        lines.extend(f"input {i} {described(x)}" for i, x in enumerate(example_inputs))
        lines.append(gm.code)
        return original(self, gm, example_inputs, inputs_to_check, graph_kwargs)

    try:
        with _CODEGEN_DUMP.swapped(_InProcessFxCompile, "codegen_and_compile", codegen_and_compile):
            yield
    finally:
        path = Path(directory) / f"{key.rsplit(':', 1)[-1][:32]}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
        except OSError as e:  # a diagnostic: never the codegen's failure
            log.warning("compileq worker: could not write %s: %s", path, e)
