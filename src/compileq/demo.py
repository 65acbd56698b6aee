"""``compileq demo``: one training step under stock ``torch.compile`` and under compileq.

Without ``COMPILEQ_REDIS_URL`` it starts a private redis-server and a local worker (the
embedded default: GPU-pinned when this machine has a GPU, cross-compiling otherwise). It then
runs the training step of ``compileq.demo_step`` three times, each in a fresh process with
empty local Inductor/Triton caches: under stock ``torch.compile``, under ``compileq run`` on a
cold cache, and under ``compileq run`` again as a new machine. Each compileq phase is measured
by the difference of the cluster's counters before and after it, so the figures are the same
whether the cluster is private or shared.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compileq.cache.stats import snapshot
from compileq.cache.store import RedisStore
from compileq.config import child_env, get_settings
from compileq.connect import redis_client
from compileq.errors import DemoError
from compileq.local import control

STOCK, COLD, NEW = "stock torch.compile", "compileq, cold cache", "compileq, new machine"

#: Counter families whose hits, remote and local builds make up the table's columns. A key
#: missing from a snapshot (a counter another version does not have) counts as 0.
_FAMILIES = ("kernel", "fx", "aot", "cpp")

_TICK_S = 0.5


class _Progress:
    """One self-rewriting line on a terminal; nothing at all when stderr is a pipe or a file."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self._shown = ""

    def say(self, message: str) -> None:
        if self.live and message != self._shown:
            self._shown = message
            print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        self.say("")


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    return {
        k: int(v) - int(before.get(k) or 0)
        for k, v in after.items()
        if isinstance(v, int) and k != "bytes"
    }


def summarize(counters: dict[str, int]) -> dict[str, int]:
    """The table's three columns from one phase's counter deltas."""
    return {
        "hits": sum(counters.get(f"{f}_hits", 0) for f in _FAMILIES),
        "remote": sum(counters.get(f"{f}_remote_compiles", 0) for f in ("kernel", "fx", "cpp")),
        "local": sum(counters.get(f"{f}_local_compiles", 0) for f in _FAMILIES),
    }


def _run_phase(
    argv: list[str], env: dict[str, str], label: str, progress: _Progress
) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
        while proc.poll() is None:
            progress.say(
                f"{label}: compiling the training step... {time.perf_counter() - started:.0f}s"
            )
            time.sleep(_TICK_S)
        process_s = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    lines = stdout.strip().splitlines()
    if proc.returncode not in (0, 1) or not lines:
        raise DemoError(f"{label}: the training step exited {proc.returncode}\n{stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result, process_s


def run_demo(as_json: bool) -> int:
    progress = _Progress()
    try:
        result = _measure(progress)
    finally:
        progress.done()  # an error message must not land on the progress line
    print(json.dumps(result) if as_json else render(result))
    return 0 if all(p["matches_eager"] for p in result["phases"]) else 1


def _measure(progress: _Progress) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compileq-demo-")))
        configured = get_settings()
        if "redis_url" in configured.model_fields_set:  # COMPILEQ_REDIS_URL names a cluster
            settings = configured
            settings.secret_bytes()
            where = f"the cluster at {settings.redis_display}"
        else:
            progress.say("starting a local cluster (redis-server on a unix socket, a worker)...")
            # The local cluster `compileq run` starts with no settings (compileq/local/), in a
            # dir of the demo's own: a second demo's "cold" run must be cold, so neither the
            # user's local cluster nor Inductor's default dir (/tmp/torchinductor_<user>, which
            # the worker would use) may be shared. The cluster inherits these variables.
            os.environ.update(
                XDG_CACHE_HOME=str(workdir / "cache"),
                TORCHINDUCTOR_CACHE_DIR=str(workdir / "worker" / "inductor"),
                TRITON_CACHE_DIR=str(workdir / "worker" / "triton"),
            )
            settings = control.local_settings(configured, start=True)
            stack.callback(control.stop)
            where = "a local cluster of its own, as `compileq run` starts (embedded default)"
        store = RedisStore(redis_client(settings.redis_url, settings), settings)
        step = [sys.executable, "-m", "compileq.demo_step"]
        phases = [
            # Stock must not pick compileq up from a PYTHONPATH the demo itself was run with.
            (STOCK, step, {"COMPILEQ_ENABLED": "0"}),
            (COLD, [sys.executable, "-m", "compileq.cli", "run", "--", *step], {}),
            (NEW, [sys.executable, "-m", "compileq.cli", "run", "--", *step], {}),
        ]
        rows = []
        for number, (label, argv, extra) in enumerate(phases, 1):
            fresh = workdir / f"phase{number}"
            env = child_env(
                settings,
                TRITON_CACHE_DIR=str(fresh / "triton"),
                TORCHINDUCTOR_CACHE_DIR=str(fresh / "inductor"),
                **extra,
            )
            before = snapshot(store)
            step_result, process_s = _run_phase(
                argv, env, f"[{number}/{len(phases)}] {label}", progress
            )
            row: dict[str, Any] = {"phase": label, **step_result, "process_s": round(process_s, 2)}
            if label == STOCK:
                row.update(hits=None, remote=None, local=None, counters={})
            else:
                counters = _delta(before, snapshot(store))
                row.update(summarize(counters), counters=counters)
            rows.append(row)
        stock_s = rows[0]["first_step_s"]
        for row in rows:
            row["vs_stock"] = round(row["first_step_s"] / stock_s, 3) if stock_s else None
        return {"device": rows[0]["device"], "where": where, "phases": rows}


def render(result: dict[str, Any]) -> str:
    head = (
        f"{'phase':<24} {'first step s':>12} {'vs stock':>9} {'hits':>5} {'remote':>7} {'local':>6}"
    )
    lines = [
        f"compileq demo: one training step on {result['device']}, {result['where']}",
        "each phase is a fresh process with empty local Inductor/Triton caches",
        "",
        head,
        "-" * len(head),
    ]

    def cell(value: int | None, width: int) -> str:
        return f"{'-' if value is None else value:>{width}}"

    for r in result["phases"]:
        lines.append(
            f"{r['phase']:<24} {r['first_step_s']:>12.2f} {r['vs_stock']:>8.2f}x "
            f"{cell(r['hits'], 5)} {cell(r['remote'], 7)} {cell(r['local'], 6)}"
        )
    lines += [
        "",
        "'first step s': the compiled step's first call (compile + run, forward and backward),",
        "process start and imports excluded. hits/remote/local: FX-graph, AOTAutograd, Triton and",
        "C++ cache hits, builds on a worker, and builds in the training process (compileq counters).",
    ]
    if result["device"] == "cpu":
        lines += [
            "On a CPU, stock's first step also finds the CPU's vector ISAs (a compile per ISA);",
            "the workers found them when they started and share the answer: part of 'cold cache'",
            "is a running cluster's head start, as it would be in production.",
        ]
    if not all(r["matches_eager"] for r in result["phases"]):
        lines.append("WARNING: a compiled step did not match eager")
    return "\n".join(lines)
