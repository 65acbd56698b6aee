"""`compileq stats` breakdowns and `compileq explain`, against a real worker and real clients."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from compileq import keys
from compileq.cache import meta
from compileq.cache.stats import render, snapshot
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.fingerprint import differences, flatten
from compileq.ops import explain
from compileq.tasks.probe import check_probe, make_probe
from tests.conftest import FIXTURES, Env, Worker, manifest_rows, run_cli, warm_json

GPT = FIXTURES / "gpt_head.jsonl"
FP_FUSION = "toolchain.codegen_env.TRITON_DEFAULT_FP_FUSION"


def small_manifest(tmp: Path, k: int) -> Path:
    """The first ``k`` kernels of GPT: the fewest builds that show the behaviour."""
    path = tmp / f"first{k}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in manifest_rows(GPT)[:k]))
    return path


def explain_json(env: Env, tmp: Path, *args: str, **more: str) -> object:
    proc = run_cli(env, "explain", *args, "--json", tmp=tmp, **more)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_stats_break_hits_down_per_queue_with_slowest_builds_and_live_workers(
    env: Env, worker: Worker, empty_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    manifest = small_manifest(tmp_path, 2)
    names = {row["name"] for row in manifest_rows(manifest)}
    n = len(names)
    warm_json(env, manifest, tmp_path / "cold")
    warm_json(env, manifest, tmp_path / "warm")
    proc = run_cli(env, "stats", "--json", "--reset", tmp=tmp_path)
    values = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (values["kernel_hits"], values["kernel_misses"]) == (n, n)
    assert values["kernel_hit_rate"] == 0.5
    (queue,) = [q for q, row in values["queues"].items() if "kernel_hits" in row]  # type: ignore[attr-defined]
    row = values["queues"][queue]  # type: ignore[index]
    assert (row["kernel_hits"], row["kernel_misses"], row["kernel_remote_compiles"]) == (n, n, n)
    assert row["kernel_local_compiles"] == 0 and row["kernel_hit_rate"] == 0.5
    (live,) = row["workers"]
    assert live["cpu_only"] is True and live["host"] and live["toolchain"]["torch_version"]
    slowest = values["slowest"]["triton"]  # type: ignore[index]
    assert {r["name"] for r in slowest} == names
    assert all(r["seconds"] > 0 and r["by"] == live["id"] for r in slowest)

    text = render(values, everything=True)
    assert f"queue {queue}" in text and "slowest triton builds" in text
    assert f"kernels: {n} hits, {n} misses (hit rate 50.0%)" in text

    after = snapshot(RedisStore(empty_cache, settings))
    assert after["kernel_hits"] == 0 and after["slowest"] == {}
    assert "kernel_hits" not in after["queues"][queue]  # type: ignore[index]
    assert after["entries"] == n  # a reset zeroes counters, never entries


def test_explain_names_the_triton_variable_that_made_a_run_miss(
    env: Env,
    worker: Worker,
    clean_cache: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 2
    manifest = small_manifest(tmp_path, n)
    assert warm_json(env, manifest, tmp_path / "a")["remote"] == n
    changed = warm_json(env, manifest, tmp_path / "b", TRITON_DEFAULT_FP_FUSION="0")
    assert changed["hits"] == 0  # every kernel missed

    result = explain_json(env, tmp_path, "--last-misses", str(n))
    assert isinstance(result, dict)
    misses = result["misses"]
    # Logged: the last n; counted: the cold run's n misses and the changed run's n.
    assert len(misses) == n and result["counted"]["Triton kernels"] == 2 * n
    for miss in misses:
        assert miss["nearest"] is not None, miss
        # Exactly the one setting that changed, with both values.
        assert miss["differences"] == [{"component": FP_FUSION, "miss": "0", "stored": None}]

    text = run_cli(env, "explain", "--last-misses", "1", tmp=tmp_path).stdout
    assert f"differs in {FP_FUSION}: miss '0', stored None" in text

    # The same answer from a stored entry against this machine with the variable set, and
    # from this machine's toolchain against the live worker's (in this process: the CLI's
    # functions, without paying another torch import in a subprocess).
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    here = explain.explain_key(clean_cache, misses[0]["nearest"], "here")
    assert [d["component"] for d in here["differences"]] == [FP_FUSION]
    assert here["components"]["target"] == "cuda-90-w32"
    assert here["components"]["toolchain.torch_version"]
    against = explain.explain_toolchains(clean_cache, "cpu", [])
    (target,) = against["targets"]
    assert [d["component"] for d in target["differences"]] == [FP_FUSION]


def test_explain_names_the_inductor_config_flag_that_made_a_run_miss(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    n = 2
    manifest = small_manifest(tmp_path, n)
    warm_json(env, manifest, tmp_path / "a")
    # Same toolchain, so the worker builds these too; only Inductor's extra_config differs.
    changed = warm_json(env, manifest, tmp_path / "b", TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER="0")
    assert (changed["hits"], changed["remote"]) == (0, n)
    result = explain_json(env, tmp_path, "--last-misses", str(n))
    assert isinstance(result, dict)
    for miss in result["misses"]:
        assert miss["differences"] == [
            {"component": "config.use_static_triton_launcher", "miss": False, "stored": True}
        ]


def test_explain_says_plainly_when_nothing_is_recorded(env: Env, tmp_path: Path) -> None:
    proc = run_cli(env, "explain", keys.artifact("triton", "0" * 64), tmp=tmp_path, check=False)
    assert proc.returncode == 2 and "no key material recorded" in proc.stderr


def test_differences_name_nested_components_and_skip_digests() -> None:
    mine = flatten({"toolchain": {"digest": "a", "codegen_env": {"TRITON_X": "1"}, "v": "2"}})
    theirs = flatten({"toolchain": {"digest": "b", "codegen_env": {}, "v": "2"}})
    assert differences(mine, theirs) == ["toolchain.codegen_env.TRITON_X"]


def test_a_probe_verifies_only_under_the_secret_and_id_it_was_signed_with() -> None:
    probe = make_probe(b"s1", "host:gpu0:1")
    assert check_probe(b"s1", "host:gpu0:1", probe)
    assert not check_probe(b"s2", "host:gpu0:1", probe)
    assert not check_probe(b"s1", "host:gpu1:1", probe)
    assert not check_probe(b"s1", "host:gpu0:1", {**probe, "wall": probe["wall"] + 1})
    assert not check_probe(b"s1", "host:gpu0:1", None)


def test_a_graph_entry_records_its_toolchain_and_build_time_for_stats_and_explain(
    clean_cache: redis.Redis, settings: Settings
) -> None:
    from compileq.inductor import graph_cache

    graph_cache.enable(RedisStore(clean_cache, settings), deadline_s=5)
    try:
        # What Inductor calls on its remote FX cache: a miss, then the put after codegen.
        backend = graph_cache.FxGraphBackend()
        assert backend._get("fxgraph-example-key") is None
        backend._put("fxgraph-example-key", b"generated graph")
    finally:
        graph_cache.disable()
    name = backend._key("fxgraph-example-key")
    info = explain.explain_key(clean_cache, name)
    assert info["components"]["inductor_key"] == "fxgraph-example-key"
    assert info["components"]["toolchain.torch_version"]
    assert "cannot say which part of the graph changed" in info["note"]
    (slow,) = meta.slowest(clean_cache, "fx", 10)
    assert slow["key"] == name and slow["seconds"] >= 0


def test_last_misses_covers_every_kind_not_only_kernels(
    env: Env, clean_cache: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    from compileq.inductor import graph_cache

    graph_cache.enable(RedisStore(clean_cache, settings), deadline_s=5)
    try:
        # Inductor's remote FX cache asked for two graphs no one stored: two graph misses.
        backend = graph_cache.FxGraphBackend()
        assert backend._get("fxgraph-missing-1") is None
        assert backend._get("fxgraph-missing-2") is None
    finally:
        graph_cache.disable()
    text = run_cli(env, "explain", "--last-misses", tmp=tmp_path).stdout
    assert "no kernel misses recorded" not in text and "no misses recorded" not in text
    assert "FX graphs: 2" in text, text
    assert "compileq explain KEY" in text  # what can be asked of a graph's miss
    result = explain_json(env, tmp_path, "--last-misses")
    assert result == {"misses": [], "counted": {"FX graphs": 2}, "problems": []}

    clean_cache.delete(keys.STATS)
    text = run_cli(env, "explain", "--last-misses", tmp=tmp_path).stdout
    assert text.strip() == "no misses recorded since the counters were last zeroed"
