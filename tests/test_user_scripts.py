"""Training scripts as users write them, on CPU: the model's classes in the script run as
``__main__`` or in a module the worker cannot import, and DDP under torchrun with each rank on
its own cache dirs. Real redis-server, a real --cpu-only worker, real torch.compile.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import redis

from tests.conftest import Env, Worker, compileq_cmd, stats
from tests.scripts import LLAMA, code_diff, fx_builds, output_code, overlapping, run_script
from tests.test_fx_remote import COMPILES

#: A small model: two graphs (forward, backward), one block (a quarter less time than two).
SMALL = ("--layers", "1")
#: FSDP2 shards each block: two of them.
TWO_BLOCKS = ("--layers", "2")
#: Wide enough for DDP to split the model into three buckets (DDPOptimizer: three subgraphs).
DDP = ("--width", "128", "--layers", "4", "--bucket-mb", "1")


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


def test_a_ddp_job_generates_each_subgraph_once_and_a_second_job_compiles_nothing(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    first = run_script(env, tmp_path, "ddp1", LLAMA, *DDP, nproc=2)
    for rank in first.ranks:
        assert rank["matches_eager"] is True, rank
    after_first = stats(env, tmp_path)
    graphs = first.ranks[0]["graphs"]
    assert graphs >= 6  # forward and backward of three DDP buckets
    assert first.ranks[1]["graphs"] == graphs
    # One codegen per distinct graph for the whole job: the other rank found each graph, or
    # its job in flight, and generated nothing itself.
    assert after_first["fx_remote_compiles"] == graphs
    assert after_first["fx_local_compiles"] == 0 and after_first["fallbacks"] == 0
    # Each bucket's forward compile went on without waiting for its worker (deferred.py), and
    # every forward's output strides were the traced ones: no frame was compiled twice.
    assert after_first["ddp_forwards_deferred"] >= graphs // 2
    assert after_first["ddp_forward_mispredictions"] == 0
    # Each bucket's backward went to the worker beside the later forwards (speculative.py):
    # sent ahead by the rank that sent its forward, the other finding that job in flight or
    # done. (A rank already in its backward pass may ask for a bucket's backward before the
    # other sends it ahead: then that one is sent by its lazy compile, once.)
    assert 1 <= after_first["fx_sent_ahead"] <= graphs // 2
    assert overlapping(fx_builds(env, tmp_path)) >= graphs // 2

    # The same job again on fresh local dirs, as on new machines: nothing compiles anywhere.
    second = run_script(env, tmp_path, "ddp2", LLAMA, *DDP, nproc=2)
    assert [r["losses"] for r in second.ranks] == [r["losses"] for r in first.ranks]
    after = stats(env, tmp_path)
    assert {c: after[c] for c in COMPILES} == {c: after_first[c] for c in COMPILES}
    assert after["kernel_local_compiles"] == after_first["kernel_local_compiles"]
    assert after["fx_hits"] - after_first["fx_hits"] == 2 * graphs
    assert after["fallbacks"] == 0


def test_an_fsdp2_job_generates_each_graph_once_on_the_worker_with_no_fallback(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # fully_shard per block, as FSDP2's docs show: its hooks break the model into several
    # graphs per rank, each with DTensor-backed parameters and FSDP's own classes nearby.
    run = run_script(env, tmp_path, "fsdp", LLAMA, *TWO_BLOCKS, "--fsdp", nproc=2)
    for rank in run.ranks:
        assert rank["matches_eager"] is True, rank
    graphs = run.ranks[0]["graphs"]
    assert graphs >= 2 and run.ranks[1]["graphs"] == graphs
    counters = stats(env, tmp_path)
    assert counters["fx_remote_compiles"] == graphs  # one codegen per graph for both ranks
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
    assert counters["fx_hits"] >= graphs


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
