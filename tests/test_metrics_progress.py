"""A worker's Prometheus endpoint after real builds, and the client's progress line and summary."""

from __future__ import annotations

import json
import os
import pty
import random
import re
import subprocess
import sys
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
    stats,
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


#: The summary: logged off a terminal (``compileq warm`` configures logging), printed on one.
SUMMARY = re.compile(r"compileq: (\d+) kernels \((\d+) hits, (\d+) remote, (\d+) local\)")


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
    assert "compileq compileq: " in proc.stderr  # the log's line, not a printed one


def on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on one pseudo-terminal: its exit code, and every
    byte it wrote there (the terminal's line ends, ``\r\n``, made ``\n``)."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdout=secondary, stderr=secondary)
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
    code = proc.wait(timeout=600)
    reader.join(timeout=10)
    os.close(primary)
    return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def visible_lines(terminal: str) -> list[str]:
    """What the terminal shows: each line as left after its last carriage return (every
    redraw and clear is ``\r\x1b[K``), the clear sequences left out."""
    return [line.rpartition("\r")[2].replace("\x1b[K", "") for line in terminal.split("\n")]


def test_on_a_terminal_the_client_shows_one_live_line_then_the_summary(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    n = len(manifest_rows(GPT))
    code, terminal = on_a_terminal(warm_argv(), client_env(env, tmp_path))
    assert code == 0, terminal[-3000:]
    # Redrawn in place (carriage return, clear line), never a scrolling list of lines.
    live = re.findall(r"\r\x1b\[Kcompileq: (\d+)/(\d+) kernels", terminal)
    assert live and all(0 <= int(done) <= int(of) == n for done, of in live)
    # Printed once, on a line of its own and ending with a newline; not logged as well.
    (summary,) = [line for line in visible_lines(terminal) if SUMMARY.match(line)]
    assert SUMMARY.findall(summary) == [(str(n), "0", str(n), "0")]
    assert "compileq compileq:" not in terminal
    # Then warm's report (stdout), on the next line: the summary ended with a newline.
    assert f"{summary}\n{n} kernels: 0 hits, {n} built remotely" in terminal


TRAIN = Path(__file__).parent / "clients" / "train_cpu.py"
#: One kind's counts in the progress line.
KIND = r"(\d+) {} \((\d+) hits, (\d+) remote, (\d+) local\)"


def counts(kind: str, line: str) -> tuple[int, int, int, int]:
    """``(done, hits, remote, local)`` of ``kind`` (a pattern: ``graphs``, C++ objects) in
    ``line``."""
    found = re.search(KIND.format(kind), line)
    assert found, f"no {kind} in {line!r}"
    done, hits, remote, local = (int(g) for g in found.groups())
    assert done == hits + remote + local
    return done, hits, remote, local


def train(
    env: Env, tmp: Path, name: str, width: int, **more: str
) -> subprocess.CompletedProcess[str]:
    """``compileq run -- python train_cpu.py WIDTH`` off a terminal, with empty local caches."""
    proc = subprocess.run(
        compileq_cmd("run", "--", sys.executable, str(TRAIN), str(width)),
        env=env.vars(
            TORCHINDUCTOR_CACHE_DIR=str(tmp / name / "inductor"),
            TRITON_CACHE_DIR=str(tmp / name / "triton"),
            TMPDIR=str(tmp),
            **more,
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_a_cpu_jobs_progress_names_its_graphs_and_cpp_objects_cold_and_on_a_new_machine(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    width = random.randrange(1001, 9000)  # a model no cache holds
    # Cold, on a terminal: the live line goes before the script prints, the summary comes last.
    code, terminal = on_a_terminal(
        compileq_cmd("run", "--", sys.executable, str(TRAIN), str(width)),
        env.vars(
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cold" / "inductor"),
            TRITON_CACHE_DIR=str(tmp_path / "cold" / "triton"),
            TMPDIR=str(tmp_path),
        ),
    )
    assert code == 0, terminal[-4000:]
    shown = visible_lines(terminal)
    (result,) = [line for line in shown if line.startswith("{")]  # not run on after a line
    assert json.loads(result)["matches_eager"] is True
    # One summary, the last line, ending with a newline; no live line left on the screen (a
    # warning of compileq's own may come through the log, a line of its own too).
    (summary,) = [line for line in shown if re.fullmatch(r"compileq: .* in [\d.]+s", line)]
    assert terminal.endswith(summary + "\n")
    left = [line for line in shown if " hits, " in line and line != summary]
    assert left == [], shown
    counters = stats(env, tmp_path)
    # What the line says is what compileq counted: the graphs the worker generated (and any
    # that missed the deadline on a loaded machine and were compiled here).
    graphs, hits, remote, local = counts("graphs", summary)
    assert graphs >= 1 and hits == 0
    assert (remote, local) == (counters["fx_remote_compiles"], counters.get("fx_local_compiles", 0))
    assert counts(r"C\+\+ objects", summary)[0] >= 1

    # A new machine, off a terminal but asked for: the same graphs and objects, all hits.
    again = train(env, tmp_path, "new", width, COMPILEQ_PROGRESS="always")
    assert "\r" not in again.stderr and "\x1b[" not in again.stderr  # no live redraws
    (summary,) = [
        line for line in again.stderr.splitlines() if re.fullmatch(r"compileq: .* in [\d.]+s", line)
    ]
    assert again.stderr.endswith(summary + "\n")
    assert counts("graphs", summary) == (graphs, graphs, 0, 0)
    done, hits, remote, local = counts(r"C\+\+ objects", summary)
    assert done == hits >= 1 and remote == local == 0, summary

    # Off a terminal and not asked for: not a word of progress.
    quiet = train(env, tmp_path, "quiet", width)
    assert " hits, " not in quiet.stderr, quiet.stderr[-2000:]
