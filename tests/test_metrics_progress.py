"""A worker's Prometheus endpoint after real builds, and the client's progress line and summary."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import redis

from compileq import keys
from compileq.config import Settings
from compileq.tasks.app import COMPILE_TRITON, client_app
from tests.conftest import (
    FIXTURES,
    Env,
    Worker,
    compileq_cmd,
    manifest_rows,
    warm_json,
)

GPT = FIXTURES / "gpt_head.jsonl"


def scrape(port: int) -> dict[str, float]:
    """``{'name{labels}': value}`` of every sample the endpoint exposes."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def sample(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if metric == name and all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


def test_a_worker_exposes_build_counts_and_latencies_from_its_pool_processes(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    port = worker.metrics_port
    assert port is not None
    n = len(manifest_rows(GPT))
    (queue,) = [  # its kernel queue (it also serves an FX queue)
        k.decode()[len(keys.WORKERS) :]
        for k in clean_cache.scan_iter(keys.WORKERS + keys.QUEUE_PREFIX + "*")
    ]
    labels = {"kind": "triton", "queue": queue}
    built = {**labels, "outcome": "built"}
    # The session's worker has served other tests: compare against what it showed before.
    before = scrape(port)
    assert warm_json(env, GPT, tmp_path)["remote"] == n
    # An entry already present (a duplicate delivery) and a malformed message.
    sender = client_app(settings)
    present = next(clean_cache.scan_iter(match=keys.artifact("triton", "") + "*")).decode()
    sender.send_task(COMPILE_TRITON, args=[present], queue=queue)
    sender.send_task(COMPILE_TRITON, args=["not-a-key"], queue=queue)

    def delta(name: str, **wanted: str) -> float:
        return sample(after, name, **wanted) - sample(before, name, **wanted)

    deadline = time.monotonic() + 60
    while True:
        after = scrape(port)
        if delta("compileq_worker_tasks_total", **labels, outcome="rejected") >= 1 and delta(
            "compileq_worker_tasks_total", **labels, outcome="cached"
        ):
            break
        assert time.monotonic() < deadline, after
        time.sleep(0.3)
    # Counted in the pool's child processes, summed by the parent's endpoint.
    assert delta("compileq_worker_tasks_total", **built) == n
    assert delta("compileq_worker_task_seconds_count", **built) == n
    assert delta("compileq_worker_task_seconds_sum", **built) > 0
    assert delta("compileq_worker_task_seconds_bucket", **built, le="+Inf") == n
    assert delta("compileq_worker_tasks_total", **labels, outcome="cached") == 1
    assert delta("compileq_worker_tasks_total", outcome="failed") == 0


def warm_argv() -> list[str]:
    return compileq_cmd("warm", str(GPT))


def client_env(env: Env, tmp: Path) -> dict[str, str]:
    tag = str(time.monotonic_ns())
    return env.vars(
        TRITON_CACHE_DIR=str(tmp / f"triton-{tag}"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor-{tag}"),
    )


SUMMARY = re.compile(r"compileq compileq: (\d+) kernels \((\d+) hits, (\d+) remote, (\d+) local\)")


def test_off_a_terminal_the_client_draws_nothing_and_logs_one_summary(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    n = len(manifest_rows(GPT))
    proc = subprocess.run(
        warm_argv(),
        env=client_env(env, tmp_path),
        capture_output=True,  # stderr is a pipe: no terminal
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr
    summaries = SUMMARY.findall(proc.stderr)
    assert summaries == [(str(n), "0", str(n), "0")]


def test_on_a_terminal_the_client_shows_one_live_line_then_the_summary(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    n = len(manifest_rows(GPT))
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        warm_argv(),
        env=client_env(env, tmp_path),
        stdout=subprocess.PIPE,
        stderr=secondary,
        text=True,
    )
    os.close(secondary)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(primary, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stdout, _ = proc.communicate(timeout=300)
    reader.join(timeout=10)
    os.close(primary)
    terminal = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, terminal[-3000:]
    # Redrawn in place (carriage return, clear line), never a scrolling list of lines.
    live = re.findall(r"\r\x1b\[Kcompileq: (\d+)/(\d+) kernels", terminal)
    assert live and all(0 <= int(done) <= int(of) == n for done, of in live)
    assert "\r\x1b[K" in terminal.split("compileq compileq:")[0]  # cleared before the summary
    assert SUMMARY.findall(terminal) == [(str(n), "0", str(n), "0")]
    assert f"{n} kernels: 0 hits, {n} built remotely" in stdout
