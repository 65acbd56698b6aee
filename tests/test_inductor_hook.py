"""compileq.install() and the pool Inductor submits to, in this process."""

from __future__ import annotations

import functools
import json
import operator
import sys
from pathlib import Path

import pytest
import torch
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.codecache import _load_triton_kernel_from_source
from torch._inductor.runtime.compile_tasks import _worker_compile_triton

import compileq
from compileq.config import Settings
from compileq.localstack import RedisServer, free_port
from compileq.scheduler.pool import CompileqPool
from compileq.scheduler.recognise import inductor_extra_config, recognise
from tests.conftest import FIXTURES, INDUCTOR_CLIENT, Env, client_json, manifest_rows, run_cli

ROW = manifest_rows(FIXTURES / "gpt_head.jsonl")[0]
LOAD = functools.partial(_load_triton_kernel_from_source, ROW["name"], ROW["source"])


def test_inductors_triton_job_is_recognised() -> None:
    env = {"TRITON_CACHE_DIR": "/tmp/x"}
    got = recognise(_worker_compile_triton, (LOAD, env, inductor_extra_config()), {})
    assert got is not None
    job, extra_env = got
    assert (job.name, job.source, extra_env) == (ROW["name"], ROW["source"], env)


@pytest.mark.parametrize(
    "fn, args",
    [
        (operator.add, (LOAD, {}, {})),  # another function
        (_worker_compile_triton, (functools.partial(print, "a", "b"), {}, {})),  # another loader
        (_worker_compile_triton, (LOAD, {"TRITON_LIBDEVICE_PATH": "/here"}, {})),  # a local path
        (_worker_compile_triton, (LOAD, {}, {"x": object()})),  # config that is not JSON
        (
            _worker_compile_triton,
            (functools.partial(_load_triton_kernel_from_source, "k", "src"), {}, {}),
        ),
    ],
)
def test_anything_else_is_left_to_stock(fn: object, args: tuple[object, ...]) -> None:
    assert recognise(fn, args, {}) is None  # type: ignore[arg-type]


def test_install_replaces_the_process_pool_and_uninstall_restores_it(
    installed: CompileqPool,
) -> None:
    assert AsyncCompile.process_pool() is installed
    assert AsyncCompile.use_process_pool()  # the readiness probe resolves at once
    AsyncCompile.process_pool.cache_clear()  # what Inductor does after a fork
    assert compileq.install()  # a second call is harmless


def test_jobs_compileq_does_not_recognise_run_in_the_stock_pool(installed: CompileqPool) -> None:
    assert installed.submit(operator.add, 2, 3).result(timeout=120) == 5


def test_without_a_secret_compileq_stays_off_and_inductor_is_untouched(settings: Settings) -> None:
    original = AsyncCompile.__dict__["process_pool"]
    assert compileq.install(settings.model_copy(update={"secret": None})) is False
    assert AsyncCompile.__dict__["process_pool"] is original


def test_torch_compile_with_compileq_installed_matches_eager(installed: CompileqPool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    expected = model(x)
    expected.sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    compiled = torch.compile(model)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, expected)
    for p, g in zip(model.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_the_inductor_path_falls_back_to_a_local_build_when_redis_is_down(
    env: Env, tmp_path: Path
) -> None:
    down = Env(f"redis://127.0.0.1:{free_port()}/0", env.home)
    manifest = FIXTURES / "gpt_head.jsonl"
    got, proc = client_json(down, INDUCTOR_CLIENT, str(manifest), caches=tmp_path)
    assert got["kernels"] == len(manifest_rows(manifest)) and got["cubins"] >= got["kernels"]
    assert proc.stderr.count("compiling locally") == 1


def test_a_forked_child_gets_its_own_listener_and_never_hangs(
    installed: CompileqPool, worker: object, clean_cache: object
) -> None:
    import os

    rows = manifest_rows(FIXTURES / "gpt_head.jsonl")
    config = inductor_extra_config()

    def submit(row: dict[str, str]) -> object:
        load = functools.partial(_load_triton_kernel_from_source, row["name"], row["source"])
        return installed.submit(_worker_compile_triton, load, {}, config).result(timeout=120)

    submit(rows[0])  # the parent's listener is running now
    pid = os.fork()
    if pid == 0:  # child: a remote build must still resolve (or fall back), within the deadline
        code = 1
        try:
            kernel, _ = submit(rows[1])  # type: ignore[misc]
            code = 0 if kernel.compile_results else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_under_compileq_run_a_kernel_no_worker_serves_is_built_in_stocks_pool(
    redis_server: RedisServer, env: Env, tmp_path: Path
) -> None:
    # A database no worker registered in: every build falls back to stock's process pool,
    # whose compile-worker subprocess inherits `compileq run`'s start-up file. compileq must
    # stay out of it (it died there once, and its parent waited forever on the kernels).
    alone = Env(redis_server.url(3), env.home)
    redis_server.client(3).flushdb()
    manifest = FIXTURES / "gpt_head.jsonl"
    proc = run_cli(
        alone,
        "run",
        "--no-fx",
        "--",
        sys.executable,
        str(INDUCTOR_CLIENT),
        str(manifest),
        tmp=tmp_path,
        timeout=240,
    )
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["kernels"] == len(manifest_rows(manifest)) and got["cubins"] >= got["kernels"]
    assert "no live worker" in proc.stderr
