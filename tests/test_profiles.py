"""Job profiles (inductor/profiles.py), on CPU: a job saves what it compiled at exit, and the
same job on a new machine loads it into its local caches while it imports. Real redis-server,
a real --cpu-only worker, real torch.compile under ``compileq run``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.inductor.profiles import PROFILE, _merge_into, profile_key
from tests.conftest import Env, RedisServer, Worker, restore_cache, stats
from tests.scripts import LLAMA, ColdJob, cold_job, run_script

#: One block: what a profile holds does not depend on the model, and a job is a quarter shorter.
SMALL = ("--layers", "1")
#: Profiles are opt-in.
ON = {"COMPILEQ_PROFILES": "1"}
#: Remote graph lookups: a new machine that loaded its profile makes none of these.
REMOTE_GRAPH_LOOKUPS = ("fx_hits", "fx_misses", "aot_hits", "aot_misses")


def profiles(client: redis.Redis) -> list[bytes]:
    return sorted(client.scan_iter(match=keys.artifact(PROFILE, "*")))


@pytest.fixture(scope="module")
def first_job(
    env: Env, worker: Worker, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> ColdJob:
    """The job's first run on a cold cluster, once for the tests that start from it; each
    restores the cache it left (restore_cache) instead of running it again."""
    tmp = tmp_path_factory.mktemp("profiles")
    return cold_job(env, redis_server.client(), tmp, "first", LLAMA, *SMALL, extra_env=ON)


def test_a_new_machine_loads_the_jobs_profile_and_finds_its_graphs_locally(
    env: Env, first_job: ColdJob, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    restore_cache(clean_cache, first_job.left)
    first = first_job.run
    assert first.ranks[0]["matches_eager"] is True
    after_first = stats(env, tmp_path)
    assert after_first["profile_saves"] == 1 and after_first["profile_misses"] == 1
    assert len(profiles(clean_cache)) == 1

    # The same job on empty local dirs (another --rank-caches path: a path is not the job).
    second = run_script(env, tmp_path, "second", LLAMA, *SMALL, extra_env=ON)
    assert second.ranks[0]["losses"] == first.ranks[0]["losses"]
    assert second.ranks[0]["matches_eager"] is True
    after = stats(env, tmp_path)
    assert after["profile_loads"] == 1 and after["profile_rejected"] == 0
    assert after["profile_bytes"] > 0
    # Inductor found both graphs and the AOTAutograd entry in its local dirs: no remote
    # graph lookup, no codegen anywhere, nothing saved again.
    assert {c: after[c] for c in REMOTE_GRAPH_LOOKUPS} == {
        c: after_first[c] for c in REMOTE_GRAPH_LOOKUPS
    }
    assert after["fx_remote_compiles"] == after_first["fx_remote_compiles"]
    assert after["fx_local_compiles"] == 0 and after["fallbacks"] == 0
    assert after["profile_saves"] == 1


def test_a_changed_script_does_not_use_the_old_profile(
    env: Env, first_job: ColdJob, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    restore_cache(clean_cache, first_job.left)
    edited = tmp_path / "llama_script.py"
    edited.write_text(LLAMA.read_text().replace("def forward", "def forward", 1) + "\n# edited\n")
    run = run_script(env, tmp_path, "edited", edited, *SMALL, extra_env=ON)
    assert run.ranks[0]["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["profile_loads"] == 0 and counters["profile_misses"] == 2
    assert len(profiles(clean_cache)) == 2  # each script its own job


def test_a_tampered_truncated_or_oversized_profile_is_ignored_counted_and_the_job_completes(
    env: Env, first_job: ColdJob, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    restore_cache(clean_cache, first_job.left)
    [key] = profiles(clean_cache)
    good = clean_cache.get(key)
    assert good is not None
    spoiled = {
        "tampered": good[:-40] + bytes(b ^ 1 for b in good[-40:]),
        "truncated": good[: len(good) // 2],
    }
    for name, value in spoiled.items():
        clean_cache.set(key, value)
        run = run_script(env, tmp_path, name, LLAMA, *SMALL, extra_env=ON)
        assert run.ranks[0]["matches_eager"] is True, name
    counters = stats(env, tmp_path)
    assert counters["profile_rejected"] == 2 and counters["profile_loads"] == 0
    assert counters["integrity_failures"] >= 2

    # Over the cap this client reads: refused before it is read, counted.
    clean_cache.set(key, good)
    small = str(len(good) // 4)
    run = run_script(
        env, tmp_path, "capped", LLAMA, *SMALL, extra_env={**ON, "COMPILEQ_MAX_ENTRY_BYTES": small}
    )
    assert run.ranks[0]["matches_eager"] is True
    assert stats(env, tmp_path)["profile_rejected"] == 3


def _profile(*artifacts: tuple[str, str, bytes]) -> bytes:
    """A profile as ``torch.compiler.save_cache_artifacts`` writes one, holding ``artifacts``
    (kind, key, content): torch's own recorder and serializer, as a process at exit."""
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager._ensure_cache_artifacts_registered()
    with CacheArtifactManager.with_fresh_cache():
        for kind, key, content in artifacts:
            CacheArtifactManager.record_artifact(kind, key, content)
        saved = CacheArtifactManager.serialize()
    assert saved is not None
    return saved[0]


def _artifacts(profile: bytes) -> list[tuple[str, str, bytes]]:
    from torch.compiler._cache import CacheArtifactManager

    read = CacheArtifactManager.deserialize(profile)
    assert read is not None
    return sorted((kind, a.key, a.content) for kind, found in read.items() for a in found)


def test_profiles_saved_by_two_processes_of_a_job_merge_into_one_holding_each_artifact_once(
    settings: Settings, clean_cache: redis.Redis
) -> None:
    # What two pipeline stages save at exit: a graph each, and an AOTAutograd entry both have.
    stage0 = _profile(("inductor", "g0", b"graph 0"), ("aot_autograd", "a", b"aot"))
    stage1 = _profile(("inductor", "g1", b"graph 1"), ("aot_autograd", "a", b"aot"))
    store = RedisStore(clean_cache, settings)
    name = profile_key("pipeline")
    _merge_into(store, name, stage0)
    _merge_into(store, name, stage1)
    stored = store.get_many([name])[0]
    assert stored is not None
    assert _artifacts(stored.payload()) == [
        ("aot_autograd", "a", b"aot"),
        ("inductor", "g0", b"graph 0"),
        ("inductor", "g1", b"graph 1"),
    ]
    assert not list(clean_cache.scan_iter(match=keys.LOCK + "*"))  # the merge's lease dropped
    # A stored profile torch cannot read (another torch's, or junk under a valid seal) is
    # replaced by this process's own, never merged into or failed on.
    store.replace(name, b"not a profile")
    _merge_into(store, name, stage0)
    stored = store.get_many([name])[0]
    assert stored is not None and stored.payload() == stage0


#: In `make test-all`: two cold jobs and two new machines, a minute and a half of the 2-core
#: machine. CI keeps both halves of its path: the merge of two processes' profiles under the
#: job's lease in Redis (the test above) and a new machine loading a job's profile
#: (test_a_new_machine_loads_the_jobs_profile_...).
@pytest.mark.slow
def test_processes_of_one_job_compiling_different_graphs_share_one_merged_profile(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # Two processes of one job that compile different graphs, as pipeline stages do (here two
    # model widths under one COMPILEQ_JOB_ID): each merges what it compiled into the profile.
    job = {**ON, "COMPILEQ_JOB_ID": "pipeline"}
    stages = {"stage0": (*SMALL, "--width", "64"), "stage1": (*SMALL, "--width", "96")}
    first = {
        name: run_script(env, tmp_path, name, LLAMA, *args, extra_env=job).ranks[0]
        for name, args in stages.items()
    }
    assert len(profiles(clean_cache)) == 1
    before = stats(env, tmp_path)
    assert before["profile_saves"] == 2

    # Each stage again on a new machine: both find all their graphs in the one profile.
    for name, args in stages.items():
        again = run_script(env, tmp_path, f"{name}-new", LLAMA, *args, extra_env=job).ranks[0]
        assert again["losses"] == first[name]["losses"] and again["matches_eager"] is True
    after = stats(env, tmp_path)
    assert after["profile_loads"] - before["profile_loads"] == 2
    assert {c: after[c] for c in REMOTE_GRAPH_LOOKUPS} == {
        c: before[c] for c in REMOTE_GRAPH_LOOKUPS
    }
    assert after["fx_remote_compiles"] == before["fx_remote_compiles"]
    assert after["profile_saves"] == 2  # nothing new to merge
