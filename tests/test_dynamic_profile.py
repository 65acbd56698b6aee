"""Which sizes went dynamic, shared through the store (``inductor/dynamic_profile.py``).

compileq is installed in this process against the session's redis-server, and real
``torch.compile`` calls go through Dynamo with a backend that records what it was given.
Another process (another machine) is this one with Dynamo reset, its code state forgotten and
an empty local cache dir. The whole path (torchrun jobs, workers, a new machine generating
nothing) is ``tests/test_training_configs.py``'s "ddp, a length that changes" (in one
process: its "a length that changes", marked slow).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from compileq.cache.counters import Counter, read_counters
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.inductor import dynamic_profile, profiles
from tests.clients import decorated_lengths
from tests.conftest import CLIENTS, Env, run_cli

DECORATED = CLIENTS / "decorated_lengths.py"


@pytest.fixture
def job(installed: Any, clean_cache: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A job of its own (``COMPILEQ_JOB_ID``), so no test reads another's profile."""
    name = f"dynamic-profile-{uuid.uuid4().hex}"
    monkeypatch.setenv("COMPILEQ_JOB_ID", name)
    yield name
    torch._dynamo.reset()
    torch._dynamo.pgo.reset_code_state()


def another_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    """What a new machine has: no compiled frame, no code state read, an empty local cache."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / name))
    torch._dynamo.reset()
    torch._dynamo.pgo.reset_code_state()


def run_lengths(graphs: list[bool], *lengths: int) -> None:
    """A function compiled anew, undecorated, on inputs of each length; its backend records
    whether each graph it gets is dynamic."""
    decorated_lengths.run_lengths(
        torch.compile(decorated_lengths.arithmetic, backend=decorated_lengths.recording(graphs)),
        *lengths,
    )


def test_a_new_machine_compiles_a_frame_dynamic_at_once_where_the_first_saw_sizes_vary(
    job: str, clean_cache: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first: list[bool] = []
    another_process(monkeypatch, tmp_path, "first")
    run_lengths(first, 4, 5, 6)
    assert first == [False, True]  # static, then again dynamic at the second length
    assert read_counters(clean_cache)[Counter.DYNAMIC_PROFILE_WRITES.value] >= 1

    new: list[bool] = []
    another_process(monkeypatch, tmp_path, "new")
    run_lengths(new, 4, 5, 6)
    assert new == [True]  # one trace, of the graph the first process ended with
    assert read_counters(clean_cache)[Counter.DYNAMIC_PROFILE_HITS.value] >= 1


def test_another_job_does_not_read_this_ones_profile(
    job: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    another_process(monkeypatch, tmp_path, "first")
    run_lengths([], 4, 5)
    monkeypatch.setenv("COMPILEQ_JOB_ID", f"{job}-other")
    other: list[bool] = []
    another_process(monkeypatch, tmp_path, "other")
    run_lengths(other, 4, 5)
    assert other == [False, True]


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed-junk"])
def test_a_planted_profile_costs_the_static_compile_and_nothing_else(
    signed: bool,
    job: str,
    settings: Settings,
    clean_cache: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Read from Redis, untrusted until verified: a value anybody could write (unsigned) is
    absent; a signed one that is no code state is dropped by torch's reader. Either way the
    frame compiles as without a profile, and its compile replaces the value."""
    another_process(monkeypatch, tmp_path, "first")
    torch_key = str(torch._dynamo.pgo.get_cache_key())
    assert profiles.job_id() in torch_key  # this job's (COMPILEQ_JOB_ID), as torch formats it
    key = dynamic_profile.store_key(torch_key)
    if signed:
        RedisStore(clean_cache, settings).replace(key, b"not a pickle")
    else:
        clean_cache.set(key, b"\x80\x04N.")  # pickle.dumps(None): unsigned, so never read

    planted: list[bool] = []
    run_lengths(planted, 4, 5, 6)
    assert planted == [False, True]

    new: list[bool] = []
    another_process(monkeypatch, tmp_path, "new")
    run_lengths(new, 4, 5)
    assert new == [True]  # the planted value was replaced by the first process's state


def test_a_job_id_given_to_torch_and_a_remote_profile_cache_turned_off_are_kept(
    job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._dynamo import config, pgo

    with torch.compiler.config.patch(job_id="mine"):
        assert str(pgo.get_cache_key()).startswith("mine:")
    assert isinstance(pgo.get_remote_cache(), dynamic_profile.StoreProfiles)
    with config.patch(automatic_dynamic_remote_pgo=False):
        assert pgo.get_cache_key() is None  # no state at all: torch's own default
        assert pgo.get_remote_cache() is None


def test_a_decorated_frame_found_dynamic_is_compiled_dynamic_at_once_in_another_process(
    env: Env, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    """torch keys a frame's state by its code and a hash of the functions in its closure, and
    that hash was ``hash()`` of their code objects: salted per process (string hashing), so a
    decorated frame (every transformers model's forward) never found its state in another
    process, compileq's shared state and stock's local one alike (docs/BENCHMARKS.md: a
    transformers Llama's new machine compiled static, then again dynamic). Separate processes
    here: within one the salt is the same and the bug does not show."""
    job = {"COMPILEQ_JOB_ID": f"decorated-{uuid.uuid4().hex}"}

    def run(name: str) -> list[bool]:
        proc = run_cli(env, "run", "--", sys.executable, str(DECORATED), tmp=tmp_path / name, **job)
        return list(json.loads(proc.stdout.strip().splitlines()[-1])["dynamic"])

    assert run("first") == [False, True]  # static, then again dynamic at the second length
    assert run("new") == [True]  # one trace, of the graph the first process ended with
    assert read_counters(clean_cache)[Counter.DYNAMIC_PROFILE_HITS.value] >= 1
