"""Training scripts as users write them, on CPU: the model's classes in the script run as
``__main__`` or in a module the worker cannot import, and DDP under torchrun with each rank on
its own cache dirs (a DDP job's own lines are test_ddp_aot's, on the one cold job they
share; FSDP2's one-codegen-per-graph, no-fallback line is test_training_configs', on its cold
jobs). Real redis-server, a real --cpu-only worker, real torch.compile.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import Env, Worker, compileq_cmd, stats
from tests.scripts import LLAMA, code_diff, output_code, run_script

#: A small model: two graphs (forward, backward), one block (a quarter less time than two).
SMALL = ("--layers", "1")


@pytest.mark.release
def test_a_model_defined_in_the_script_is_generated_on_the_worker_as_the_client_would(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    remote = run_script(env, tmp_path, "remote", LLAMA, *SMALL, "--dump-code", str(tmp_path / "r"))
    [result] = remote.ranks
    assert result["matches_eager"] is True and result["compileq"] is True
    counters = stats(env, tmp_path)
    # Both graphs went to the worker although their metadata names __main__.Block & co.
    assert counters["fx_remote_compiles"] == result["graphs"] == 2
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
    assert "compiling the graph in process" not in remote.stderr
    # The CPU graph queue joined once this CPU's vector ISAs were known, after the worker
    # began taking kernel work (workers.late_fx); its pool processes found the toolchain.
    assert "joined" in worker.log.read_text()

    stock = run_script(
        env, tmp_path, "stock", LLAMA, *SMALL, "--dump-code", str(tmp_path / "s"), compileq=False
    )
    assert stock.ranks[0]["losses"] == result["losses"]
    # No warning stock does not print: on 2.15 the worker's child side set the client's
    # deprecated config keys and replayed two FutureWarnings in every client (workers/fx.py).
    assert remote.stderr.count("Warning:") <= stock.stderr.count("Warning:"), remote.stderr
    # The worker wrote the code the client would have written itself, byte for byte (the
    # thread count and the backward's donated buffers travel with the job).
    ours, theirs = output_code(tmp_path / "r" / "rank0"), output_code(tmp_path / "s" / "rank0")
    assert ours == theirs, code_diff(ours, theirs)


def test_a_model_module_on_the_clients_path_but_not_the_workers_is_generated_remotely(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # models/llama_mod.py beside the script, as in a user's repository: importable by the
    # training script (its folder is on sys.path), not by the worker.
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    shutil.copy(LLAMA, repo / "models" / "llama_mod.py")
    (repo / "models" / "__init__.py").write_text("")
    script = repo / "train.py"
    script.write_text("from models.llama_mod import main\n\nmain()\n")
    run = run_script(env, tmp_path, "module", script, *SMALL, "--width", "48")
    assert run.ranks[0]["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["fx_remote_compiles"] == run.ranks[0]["graphs"] == 2
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0


def test_a_script_importing_inductor_internals_first_still_runs_and_generates_remotely(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # compile_fx_ext imports compile_fx, whose import is where compileq hooks codegen: the
    # hook must not import the half-loaded compile_fx_ext back (an ImportError in the script).
    script = tmp_path / "internals_first.py"
    script.write_text(
        "import torch._inductor.compile_fx_ext  # noqa: F401\n"
        "import json, torch\n"
        "f = torch.compile(lambda x: (x.sin() * 3).sum(-1))\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(8, 8)\n"
        # A sum's order differs between eager and Inductor's vectorised loop: an absolute
        # tolerance too, or a row summing near zero fails on rounding alone.
        "ok = torch.allclose(f(x), (x.sin() * 3).sum(-1), atol=1e-5)\n"
        "print(json.dumps({'ok': bool(ok)}))\n"
    )
    proc = subprocess.run(
        compileq_cmd("run", "--", sys.executable, str(script)),
        env=env.vars(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ok": True}
    assert stats(env, tmp_path)["fx_remote_compiles"] == 1
