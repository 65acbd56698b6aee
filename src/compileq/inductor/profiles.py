"""Job profiles: what a job compiled, as one signed blob a new machine fetches while Python imports.

A profile is Inductor's own Mega-Cache of one process (``torch.compiler.save_cache_artifacts``):
the FX graphs, AOTAutograd entries, autotune results and Triton kernels it compiled or loaded.
``torch.compiler.load_cache_artifacts`` writes such a blob into this machine's local Inductor
and Triton cache dirs, each file under a temporary name renamed into place, so Inductor then
finds every entry as a warm local one and asks no remote cache. compileq stores the blob signed
and compressed like any entry, under ``compileq:a:profile:<job id>``. The rejected alternative,
a list of compileq keys written into the local dirs by compileq, would copy the on-disk layout
of five caches that change between torch releases; Inductor's own format travels with torch.

**Job identity** (:func:`job_id`): sha256 of a JSON document holding

- the script the process runs (its file name and the sha256 of its content: a model defined
  in the script that changes is another job) and its arguments, less those naming a file or
  directory (an output dir or a checkpoint differs from run to run, the model does not);
- ``WORLD_SIZE`` (another world size is another DDP split), but not the rank: one profile
  per job, merged over its ranks (:func:`merge`). Cache entries are one per graph for every
  GPU index (``index_free``), so what rank 0 compiled serves rank 1; where ranks compile
  different graphs (pipeline stages, or a subgraph keyed per rank), each finds its own in the
  merged profile;
- the torch version.

No host, path or time: equal on every machine and run of the same job. ``COMPILEQ_JOB_ID``
replaces the document (for a launcher whose arguments differ per run). A model edited in
another module keeps the id: its profile then loads entries nobody looks up (the fetch is its
whole cost) and is replaced when the job saves again.

**Opt-in** (``COMPILEQ_PROFILES=1``): measured on the CPU and on an H100 (docs/BENCHMARKS.md),
a new machine with its profile is no faster than one that looks each entry up in compileq's
store as Inductor asks (13.76 s against 13.87 s to the end of the first step on the H100),
and the fetch thread's own imports make ``import torch`` 0.15-0.3 s slower on the 2-core CPU
machine.

**Not carried: Dynamo's compiled frames.** torch's experimental ``caching_precompile`` adds
them to the same Mega-Cache, and a new machine that loads them skips Dynamo and AOTAutograd
tracing too (a CPU job: 0.70x stock's warm local start). But on torch 2.11 the first call after
loading traces again and fails the job, and on 2.13 any later recompile of a loaded frame does
(``AssertionError``: Dynamo's ``__builtins_dict__`` global already in the frame's globals);
loaded frames also lose their ``ID_MATCH``/``DICT_VERSION`` guards, and under DDP torch never
uses them. ``python -m bench.precompile`` reproduces all of it (docs/BENCHMARKS.md).

**When.** Under ``compileq run`` every Python process starts the fetch from its start-up hook,
before ``import torch`` (:func:`prefetch`), on a daemon thread that waits on the socket without
the GIL. The first compile (Dynamo's call into Inductor's ``compile_fx``) waits for it, at most
:data:`_WAIT_S`, and loads it. At exit, a process that compiled anything, or found no
profile to load, merges what it compiled or loaded into the job's profile (under a lease on
it, so that ranks exiting together keep each other's artifacts). A missing, late, tampered, truncated or oversized profile is
counted and ignored: the job compiles as without it.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from compileq import keys
from compileq._log import log, warn_once
from compileq.early_settings import env_flag, env_text
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target

PROFILE = "profile"
#: The longest the first compile waits for a fetch still under way; then it goes on without.
_WAIT_S = 10.0
#: The life of the lease a process holds while it merges its artifacts into the profile.
_MERGE_LEASE_MS = 30_000


class _Fetch:
    """The profile's fetch, started at process start; read once by the first compile."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.started = time.monotonic()
        self.blob: bytes | None = None
        #: pending | found | missing | rejected | failed; then late or loaded at first compile
        self.outcome = "pending"
        self.fetch_s = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="compileq-profile", daemon=True)

    def _run(self) -> None:
        try:
            from compileq.cache.store import RedisStore
            from compileq.config import get_settings
            from compileq.connect import redis_client

            settings = get_settings()
            if settings.secret is None:
                self.outcome = "failed"
                return
            store = RedisStore(redis_client(settings.redis_url, settings), settings)
            key = profile_key(self.job)
            # Read once, then verified: get_many would not tell a missing profile from a bad one.
            raw = store.read_bounded([key])[0]
            if raw is None:
                self.outcome = "missing"
                return
            entry = store.verified(key, raw)
            if entry is None:
                self.outcome = "rejected"
                return
            self.blob, self.outcome = entry.payload(), "found"
        except Exception as e:  # a profile may be lost, never the job
            self.outcome = "failed"
            log.debug("compileq: profile fetch failed: %s", e)
        finally:
            self.fetch_s = time.monotonic() - self.started
            self.done.set()


def job_id(argv: list[str] | None = None) -> str:
    """This process's job identity (see the module's docstring)."""
    explicit = env_text("job_id")  # Settings.job_id, read without pydantic (before torch)
    if explicit:
        return hashlib.sha256(f"explicit:{explicit}".encode()).hexdigest()
    argv = list(sys.argv if argv is None else argv)
    script = argv[0] if argv else ""
    content = ""
    if script.endswith(".py") and os.path.isfile(script):
        with open(script, "rb") as f:
            content = hashlib.sha256(f.read()).hexdigest()
    document = {
        "script": os.path.basename(script),
        "script_sha256": content,
        "args": [a for a in argv[1:] if not _names_a_path(a)],
        "world_size": os.environ.get("WORLD_SIZE", "1"),
        "torch": _torch_version(),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def _names_a_path(arg: str) -> bool:
    value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
    return os.sep in value or (bool(value) and os.path.exists(value))


def _torch_version() -> str:
    # From the package's metadata: importing torch here would cost the seconds the
    # prefetch exists to overlap.
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def profile_key(job: str) -> str:
    return keys.artifact(PROFILE, job)


def prefetch(wanted: bool | None = None) -> None:
    """Start fetching this process's profile (from ``compileq run``'s start-up hook, which
    reads ``COMPILEQ_PROFILES`` by Settings' rule without Settings, which would import pydantic
    before torch; a bad value is a ConfigError, as Settings makes it)."""
    if wanted is None:
        wanted = env_flag("profiles")
    if FEATURE.fetch is not None or not wanted:
        return
    try:
        FEATURE.fetch = _Fetch(job_id())
        FEATURE.fetch.thread.start()
    except Exception as e:  # never break the user's program
        log.debug("compileq: no profile prefetch: %s", e)
        FEATURE.fetch = None


class Profiles(Feature):
    """At install(): load the fetched profile at the first compile; save one at exit (in a
    client: a worker's codegen belongs to no job)."""

    name = "profiles"
    # merge() reads the Mega-Cache's internals, and saves this process's profile alone
    # where they moved.
    targets = (
        Target("torch._inductor.compile_fx", "compile_fx"),
        Target("torch.compiler", "load_cache_artifacts", ("serialized_artifacts",)),
        Target("torch.compiler", "save_cache_artifacts"),
        Target("torch._dynamo.utils", "counters"),
    )

    def __init__(self) -> None:
        super().__init__()
        #: The fetch this process started: at start-up under ``compileq run``
        #: (``prefetch``), else at install(). Kept when the feature is disabled: it is read
        #: once, by the first compile.
        self.fetch: _Fetch | None = None
        self.store: Any = None
        self._at_exit = False

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.profiles and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        # Again at install()'s second call, once ``compile_fx`` has finished loading
        # (``compileq run`` installs while it is still loading).
        return {"torch._inductor.compile_fx": self._load_before_first_compile}

    def enable(self, ctx: Context) -> None:
        if self.fetch is None:
            prefetch(wanted=True)  # install() without `compileq run`: the fetch starts now
        if not self._at_exit:  # once per process; a disabled feature saves nothing
            atexit.register(_save_at_exit)
            self._at_exit = True
        self.store = ctx.store
        super().enable(ctx)

    def disable(self) -> None:
        super().disable()
        self.store = None

    def _load_before_first_compile(self, module: Any) -> None:
        # Dynamo's Inductor backend looks compile_fx up in its module at each call.
        self.patches.before_first_call(module, "compile_fx", load)


FEATURE = Profiles()


def load() -> str:
    """Wait for the fetch (bounded) and hand the profile to Inductor; what happened."""
    from compileq.cache.counters import Counter

    fetch = FEATURE.fetch
    if fetch is None:
        return "off"
    waited_from = time.monotonic()
    if not fetch.done.wait(_WAIT_S):
        warn_once("profile-late", "compileq: job profile not fetched in %.0fs; going on", _WAIT_S)
        fetch.outcome = "late"
    waited = time.monotonic() - waited_from
    counts = {Counter.PROFILE_WAIT_MS: int(waited * 1000)}
    outcome = fetch.outcome
    if outcome == "found" and fetch.blob is not None:
        try:
            import torch

            torch.compiler.load_cache_artifacts(fetch.blob)
            fetch.outcome = "loaded"
            counts[Counter.PROFILE_LOADS] = 1
            counts[Counter.PROFILE_BYTES] = len(fetch.blob)
            counts[Counter.PROFILE_PREFETCH_MS] = int(fetch.fetch_s * 1000)
            log.info("compileq: job profile loaded (%d bytes)", len(fetch.blob))
        except Exception as e:  # a signed blob torch cannot read: another torch wrote it
            warn_once("profile-load", "compileq: job profile not loaded (%s)", e)
            outcome = "rejected"
        fetch.blob = None
    if outcome == "rejected":
        counts[Counter.PROFILE_REJECTED] = 1
    elif outcome in ("missing", "late"):
        counts[Counter.PROFILE_MISSES] = 1
    store = FEATURE.store
    if store is not None:
        try:
            store.count(counts)
        except Exception as e:  # counting must not be what fails a compile
            log.debug("compileq: profile counters not written: %s", e)
    return outcome


def _save_at_exit() -> None:
    """Merge this process's artifacts into the job's profile, if it compiled anything."""
    from compileq.cache.counters import Counter

    store = FEATURE.store
    if store is None or "torch._inductor.compile_fx" not in sys.modules:
        return
    try:
        from torch._dynamo.utils import counters

        inductor, aot = counters["inductor"], counters["aot_autograd"]
        missed = inductor.get("fxgraph_cache_miss") or aot.get("autograd_cache_miss")
        fetch = FEATURE.fetch
        loaded = fetch is not None and fetch.outcome == "loaded"
        if loaded and not missed:
            return  # nothing new: the profile this process loaded stands
        import torch

        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return
        _merge_into(store, profile_key(fetch.job if fetch else job_id()), saved[0])
        store.count({Counter.PROFILE_SAVES: 1})
    except Exception as e:  # EntryTooLarge, Redis gone at exit: the job's result stands
        warn_once("profile-save", "compileq: job profile not saved (%s)", e)


def _merge_into(store: Any, name: str, ours: bytes) -> None:
    """Write ``ours`` into the profile ``name`` with what other processes of the job put there
    (its other ranks, or pipeline stages that compile other graphs), under a lease so that
    ranks exiting together do not drop each other's artifacts. Without the lease in time, or
    with a stored profile this torch cannot read, ours is merged with what is read, or alone."""
    from compileq.scheduler import leases

    # The lease functions, not the Leases class: its refresh thread cannot start at exit
    # (Python 3.12 refuses new threads at interpreter shutdown); a merge takes well under
    # the lease's life.
    owner = leases.new_owner()
    deadline = time.monotonic() + _WAIT_S
    secret = store.secret
    while not (
        held := leases.take_many(store.client, [name], owner, _MERGE_LEASE_MS, secret=secret)[0]
    ):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    try:
        current = store.get_many([name])[0]
        merged = merge(current.payload(), ours) if current is not None else None
        store.replace(name, merged if merged is not None else ours)
    finally:
        if held:
            leases.release(store.client, name, owner)


def merge(theirs: bytes, ours: bytes) -> bytes | None:
    """Two Mega-Cache blobs as one: every artifact of both, each (kind, key, content) once, in
    torch's own format; None if torch cannot read one of them."""
    try:
        from torch.compiler._cache import CacheArtifactManager, _serialize_single_cache
        from torch.utils._appending_byte_serializer import AppendingByteSerializer

        parts = [CacheArtifactManager.deserialize(blob) for blob in (theirs, ours)]
        if any(part is None for part in parts):
            return None
        kinds: dict[str, dict[tuple[str, bytes], Any]] = {}
        for part in parts:
            for kind, artifacts in (part or {}).items():
                same = kinds.setdefault(kind, {})
                for artifact in artifacts:
                    same[(artifact.key, artifact.content)] = artifact
        serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
        serializer.extend((kind, list(same.values())) for kind, same in kinds.items())
        return bytes(serializer.to_bytes())
    except Exception as e:  # another torch's layout: this process's profile alone is saved
        log.debug("compileq: profiles not merged: %s", e)
        return None
