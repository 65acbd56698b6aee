"""What a worker does with one ``compile_cpp`` message: build a client's C++ object.

The job's command lines run in a fresh temporary dir, with the placeholders filled in with
this worker's compiler and dirs (``tasks/cpp_jobs.py``); the object is stored under the
client's key. The worker's queue is its C++ toolchain's, so the compiler, torch and CPU are
the client's: the object is the one a build on the client would have made.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time

from compileq._log import log
from compileq._private_dir import private_dir
from compileq.cache import meta
from compileq.cache.counters import Counter
from compileq.errors import ToolchainMismatch
from compileq.fingerprint import cpp_toolchain
from compileq.tasks.cpp_jobs import CXX, IN, KIND, OUT, PCH, CppJob, Header, fill, machine_dirs
from compileq.workers.lifecycle import WorkerContext, admit, failed, open_job, settle

#: One compiler run: Inductor's heaviest kernels take tens of seconds.
_STEP_TIMEOUT_S = 600.0


def execute_compile_cpp(task_key: object) -> str:
    admitted = admit(task_key, KIND, _load_job)
    if isinstance(admitted, str):
        return admitted
    ctx, key, job = admitted
    started_at, started = time.time(), time.perf_counter()
    try:
        ctx.store.put(key, build(job))
    except Exception as e:  # the compiler's error, or EntryTooLarge: the client builds it
        log.warning("compileq worker: C++ build %s failed: %s", key, e)
        failed(ctx.store.client, key, e)
        return "failed"
    seconds = time.perf_counter() - started
    name = job.output[len(OUT) + 1 :]
    ctx.store.count(
        {Counter.CPP_REMOTE_COMPILES: 1},
        None,
        [meta.record_build_time(KIND, key, name, seconds, ctx.worker_id, started_at)],
    )
    settle(ctx.store.client, key)
    log.info("compileq worker: built C++ object %s in %.2fs", name, seconds)
    return "built"


def _load_job(ctx: WorkerContext, key: str) -> CppJob:
    job = CppJob.from_bytes(open_job(ctx, key))
    if job.toolchain != cpp_toolchain():
        raise ToolchainMismatch("the job's C++ toolchain is not this worker's; not building it")
    return job


def build(job: CppJob) -> bytes:
    """Run the job's command lines in a temporary dir; the object's bytes."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    with tempfile.TemporaryDirectory(prefix="compileq-cpp-") as tmp:
        values = {**machine_dirs(), CXX: get_cpp_compiler(), IN: f"{tmp}/in", OUT: f"{tmp}/out"}
        os.mkdir(values[IN])
        os.mkdir(values[OUT])
        if job.header is not None:
            values[PCH] = _precompiled(job.header, values)
        for name, text in job.files.items():
            with open(fill(name, values), "w", encoding="utf-8") as f:
                f.write(text)
        for step in job.steps:
            _run(step, values, values[OUT])
        with open(fill(job.output, values), "rb") as f:
            return f.read()


def _run(step: tuple[str, ...], values: dict[str, str], cwd: str) -> None:
    done = subprocess.run(
        [fill(word, values) for word in step],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=_STEP_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{step[0]} exited {done.returncode}: {done.stderr[-1500:]}")


def _precompiled(header: Header, values: dict[str, str]) -> str:
    """The dir holding ``header`` and its precompiled form, made once per header and command
    line on this host and kept: precompiling takes seconds (4.3 s for Inductor's CPU prefix
    on the 2-core CI machine), and saves 1.3 s of every object built with it.

    Keyed by a hash of both, so two clients' headers never share a dir unless equal. Made
    under an exclusive lock (the pool processes of this worker, and other workers of the
    host, may need it at once), into a temporary name first: a reader never sees a partial
    one. The rejected alternative, sending the client's own (155 MB) precompiled header.
    """
    digest = hashlib.sha256(
        json.dumps([header.name, header.text, header.step]).encode()
    ).hexdigest()[:32]
    # Refused if someone else could have planted a header there (compileq/_private_dir.py).
    root = str(private_dir(f"compileq-pch-{os.getuid()}"))
    where = os.path.join(root, digest)
    gch = os.path.join(where, header.name + ".gch")
    if os.path.exists(gch):
        return where
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(root, f"{digest}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(gch):
            with open(os.path.join(where, header.name), "w", encoding="utf-8") as f:
                f.write(header.text)
            partial = tempfile.mkdtemp(prefix=".partial-", dir=where)
            try:
                step = tuple(
                    w.replace(PCH + "/" + header.name + ".gch", f"{partial}/out.gch")
                    for w in header.step
                )
                _run(step, {**values, PCH: where}, where)
                os.replace(f"{partial}/out.gch", gch)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    return where
