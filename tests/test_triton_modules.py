"""Triton's C helper modules (``cuda_utils``, launchers) shared through the store.

Each process is fresh, with a Triton cache dir of its own, as on a new machine. The module is a
real Python extension built by Triton's own ``compile_module_from_src`` with the C compiler; a
process that must not build gets ``CC=/bin/false``, so a build would fail it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from compileq import keys
from compileq.cache.counters import read_counters
from tests.conftest import CLIENTS, Env

pytest.importorskip("triton.knobs")

CLIENT = CLIENTS / "triton_module_client.py"
SOURCE = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
/* %s */
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cq_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_cq_probe(void) { return PyModule_Create(&module); }
"""


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A module no earlier test stored: its source carries a fresh nonce."""
    path = tmp_path / "cq_probe.c"
    path.write_text(SOURCE % uuid.uuid4().hex)
    return path


def run_client(env: Env, source: Path, triton_dir: Path, **more: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(CLIENT), str(source)],
        env=env.vars(TRITON_CACHE_DIR=str(triton_dir), **more),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


def counters(env: Env) -> dict[str, int]:
    return read_counters(redis.Redis.from_url(env.redis_url))


def delta(before: dict[str, int], after: dict[str, int], *names: str) -> dict[str, int]:
    return {name: after[name] - before[name] for name in names}


NAMES = ("triton_module_hits", "triton_module_misses", "triton_module_builds")


def test_a_module_built_on_one_machine_loads_on_a_new_one_without_the_c_compiler(
    env: Env, source: Path, tmp_path: Path
) -> None:
    before = counters(env)
    first = run_client(env, source, tmp_path / "machine-a")
    built = counters(env)
    assert first["answer"] == 42 and first["manager"] == "CompileqCacheManager"
    assert delta(before, built, *NAMES) == dict(
        triton_module_hits=0, triton_module_misses=1, triton_module_builds=1
    )

    second = run_client(env, source, tmp_path / "machine-b", CC="/bin/false")
    assert second["answer"] == 42
    assert delta(built, counters(env), *NAMES) == dict(
        triton_module_hits=1, triton_module_misses=0, triton_module_builds=0
    )
    # Written into the new machine's own cache dir, where Triton finds it from now on.
    assert list((tmp_path / "machine-b").glob("*/cq_probe*.so"))


def test_a_tampered_module_in_the_store_is_refused_and_built_here(
    env: Env, source: Path, tmp_path: Path
) -> None:
    run_client(env, source, tmp_path / "machine-a")
    client = redis.Redis.from_url(env.redis_url)
    stored = [k for k in client.scan_iter(match=keys.artifact("triton-so", "*"))]
    for key in stored:  # flip a byte in each: the signature no longer matches
        blob = bytearray(client.get(key) or b"")
        blob[-1] ^= 0xFF
        client.set(key, bytes(blob))
    before = counters(env)

    rebuilt = run_client(env, source, tmp_path / "machine-b")
    after = counters(env)
    assert rebuilt["answer"] == 42
    assert after["integrity_failures"] > before["integrity_failures"]
    assert delta(before, after, "triton_module_hits", "triton_module_builds") == dict(
        triton_module_hits=0, triton_module_builds=1
    )


def test_with_redis_down_the_module_is_built_here_as_without_compileq(
    env: Env, source: Path, tmp_path: Path
) -> None:
    with_nothing_listening = "redis://127.0.0.1:9/0"
    result = run_client(env, source, tmp_path / "alone", COMPILEQ_REDIS_URL=with_nothing_listening)
    assert result["answer"] == 42


def test_a_cache_manager_the_user_configured_is_left_alone(
    env: Env, source: Path, tmp_path: Path
) -> None:
    result = run_client(
        env,
        source,
        tmp_path / "own",
        TRITON_CACHE_MANAGER="triton.runtime.cache:FileCacheManager",
    )
    assert result["installed"] and result["answer"] == 42
    assert result["manager"] == "FileCacheManager"
    assert "Triton's C modules not shared" in result["stderr"]


def test_uninstall_gives_triton_its_own_cache_manager_back(installed: Any) -> None:
    from triton import knobs

    import compileq

    assert knobs.cache.manager_class is not None
    assert knobs.cache.manager_class.__name__ == "CompileqCacheManager"
    compileq.uninstall()
    assert knobs.cache.manager_class is None
    assert compileq.install(installed.client.settings)  # the fixture uninstalls it again


_DRIVER = """
import json, torch
torch.cuda.init()
import compileq
assert compileq.install()
from triton.runtime import driver
driver.active.utils  # Triton's CUDA driver starts: it needs its cuda_utils module
print(json.dumps({"device": driver.active.get_current_device()}))
"""


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (Triton's driver)"
)
def test_tritons_cuda_driver_starts_on_a_new_machine_from_the_store_without_the_c_compiler(
    env: Env, tmp_path: Path
) -> None:
    def fresh_process(triton_dir: Path, **more: str) -> None:
        proc = subprocess.run(
            [sys.executable, "-c", _DRIVER],
            env=env.vars(TRITON_CACHE_DIR=str(triton_dir), **more),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]

    fresh_process(tmp_path / "machine-a")  # built here, or served if an earlier test built it
    before = counters(env)
    fresh_process(tmp_path / "machine-b", CC="/bin/false")
    assert delta(before, counters(env), *NAMES)["triton_module_hits"] == 1
    assert list((tmp_path / "machine-b").glob("*/cuda_utils*.so"))
