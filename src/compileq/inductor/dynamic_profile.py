"""Which sizes went dynamic, shared: a new machine compiles such a frame dynamic at once.

A frame that sees a second input size is compiled again by Dynamo with that dimension
symbolic (automatic dynamic shapes): a job whose sequence length changes compiles every such
frame twice, static and then dynamic, and a new machine pays both traces again even when every
graph is a cache hit. On two H200s (script Llama, a length that changes at steps 1 and 2,
docs/BENCHMARKS.md) stock's warm local cache took 2.1-2.7 s at step 0 and 2.3-2.7 s at step 1,
2.26 s of it Dynamo tracing the symbolic graph: the recompile cost more than the first compile,
and compileq's new machine (1.39 s, then 2.61 s) gained nothing on it. With the state shared,
on the 2-core CPU machine, a new machine took 0.98-1.16 s to steady state against 1.43-1.58 s
without it (stock's warm local cache: 3.20-3.30 s); not yet measured on a GPU.

Dynamo already remembers which dimensions went dynamic (its profile-guided "code state",
``torch._dynamo.pgo``), and a process that reads that state marks them dynamic from its first
trace: one compile per frame, of the graph the first job ended with. Stock keeps the state
only where ``torch.compiler.config.job_id`` names the job (``TORCH_COMPILE_JOB_ID``), in the
local cache dir, and on another machine only through its own Redis cache of unsigned pickles.
Here, where the user named no job, the job is compileq's own job identity
(``profiles.job_id``: the script, its content and non-path arguments, the world size, torch's
version; ``COMPILEQ_JOB_ID`` overrides it), and the state travels through compileq's store,
signed like every entry. torch still adds the rank to its key, so each rank finds its own.

A frame whose closure holds functions (a decorated forward, as every transformers model's)
is found in that state by a hash torch salts per process; compileq makes it the same in every
process (``_stable_closures``), or such a frame would never be found again, by stock either.

Untrusted until verified: an entry not signed with the cluster's secret is absent to the store;
a signed one torch cannot read is logged by torch and ignored (the frame then compiles static
first, as without this). Redis away: nothing shared, as stock. A write that fails is lost,
never the compile that made it. Where the user configured torch's remote profile cache
(``automatic_dynamic_remote_pgo``) that one is used, and turned off, none.

Rejected: setting ``torch.compiler.config.job_id`` (a global other code may read and that
``uninstall()`` would have to put back; wrapping ``get_cache_key`` is in the ledger); marking
dimensions dynamic from the FX entries found (the sizes that vary are Dynamo's knowledge, not
Inductor's); ``mark_dynamic`` from the first step for every input (a graph that never varies
would run slower kernels).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import redis

from compileq import keys
from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.errors import CompileqError
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.scheduler import boundary

KIND = "dynamo-pgo"
#: Bump when the payload format or key derivation changes: old entries then simply miss.
FORMAT = 1
_PGO = "torch._dynamo.pgo"


class DynamicProfile(Feature):
    """Dynamo's code state keyed by compileq's job identity and kept in the store, in clients."""

    name = "dynamic-profile"
    without = "a new machine compiles a frame static, then again dynamic, as stock does"
    # CodeId.make (closures hashed alike) and format_cache_key are used where torch has them.
    targets = (
        Target(_PGO, "get_cache_key"),
        Target(_PGO, "get_remote_cache"),
        Target(_PGO, "CodeId.make", optional=True),  # wrapped where it keys closures
    )

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache and ctx.settings.dynamic_profile and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_PGO: self._wrap}

    def _wrap(self, module: Any) -> None:
        if not all(hasattr(module, n) for n in ("get_cache_key", "get_remote_cache")):
            return  # a torch without profile-guided state (or still loading): nothing to serve
        self.patches.wrap(module, "get_cache_key", _keyed)
        self.patches.wrap(module, "get_remote_cache", _remote)
        code_id = getattr(module, "CodeId", None)
        if code_id is not None and "closure_hash" in getattr(code_id, "__dataclass_fields__", {}):
            self.patches.wrap_static(code_id, "make", _stable_closures)

    def read(self, key: str) -> bytes | None:
        """The state stored under torch's profile key ``key``; None where there is none to
        trust."""
        entry = self.entry(store_key(key), "shared dynamic profiles")
        if entry is None:
            return None
        self.count(Counter.DYNAMIC_PROFILE_HITS)
        return entry.payload()

    def write(self, key: str, payload: bytes) -> None:
        """Store ``payload`` as the state under ``key``, whatever was there: torch writes the
        state it read at start with what this process learned since, so the latest is the
        fullest. Lost, never raised, where Redis fails."""
        client = self.client
        if client is None or client.redis_down():
            return
        try:
            client.store.replace(store_key(key), payload)
        except (redis.RedisError, CompileqError) as e:
            warn_once("dynamic-profile-put", "compileq: dynamic profile not shared: %s", e)
            return
        self.count(Counter.DYNAMIC_PROFILE_WRITES)


FEATURE = DynamicProfile()


def store_key(key: str) -> str:
    """The store key of torch's profile key ``key`` (job, rank, tag) under this torch."""
    import torch

    material = {"kind": KIND, "format": FORMAT, "torch": torch.__version__, "key": key}
    return keys.artifact_of(KIND, material)


class StoreProfiles:
    """torch's ``RemoteCache`` interface (``get``, ``put`` of ``{"data": base64 pickle}``, as
    ``torch._dynamo.pgo`` reads and writes it) over compileq's signed store."""

    def get(self, key: str) -> dict[str, Any] | None:
        return _read(key)

    def put(self, key: str, value: Any) -> None:
        _write(key, value)


def _unread(key: str) -> dict[str, Any] | None:
    return None


def _unwritten(key: str, value: Any) -> None:
    return None


def _no_key() -> str | None:
    return None


@boundary.guard("dynamic profiles", instead=_unread)
def _read(key: str) -> dict[str, Any] | None:
    payload = FEATURE.read(key)
    if payload is None:
        return None
    return {"data": base64.b64encode(payload).decode("ascii")}


@boundary.guard("dynamic profiles", instead=_unwritten)
def _write(key: str, value: Any) -> None:
    data = value.get("data") if isinstance(value, dict) else None
    if not isinstance(data, str):  # another torch's format: not ours to store
        log.debug("compileq: a dynamic profile of another format not stored")
        return
    FEATURE.write(key, base64.b64decode(data))


def _keyed(original: Callable[[], str | None]) -> Callable[[], str | None]:
    """``get_cache_key``: the user's job id (or torch's own) where there is one, else
    compileq's job identity."""

    @functools.wraps(original)
    def get_cache_key() -> str | None:
        key = original()
        return key if key is not None else _job_key()

    return get_cache_key


@boundary.guard("dynamic profiles", instead=_no_key)
def _job_key() -> str | None:
    """compileq's job identity as torch's profile key (torch adds the rank and the cache
    tag); None where caches are off or the user turned the remote profile cache off."""
    import torch
    from torch._dynamo import pgo

    from compileq.inductor import profiles

    # torch 2.13 reads this switch from torch.compiler.config, earlier torch from Inductor's.
    disabled = getattr(torch.compiler.config, "force_disable_caches", False)
    if disabled or torch._inductor.config.force_disable_caches or not _remote_wanted():
        return None
    job = f"compileq:{profiles.job_id()}"
    formatted = getattr(pgo, "format_cache_key", None)
    if formatted is not None:
        return str(formatted(job))
    # A torch that formats the key inside get_cache_key: the same job, rank and tag.
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
    return f"{job}:{rank}:{torch.compiler.config.cache_key_tag}"


def _remote_wanted() -> bool:
    """Whether the state should travel: not where the user turned torch's remote profile
    cache off (``automatic_dynamic_remote_pgo`` False)."""
    from torch._dynamo import config

    return config.automatic_dynamic_remote_pgo is not False


def _stable_closures(original: Callable[..., Any]) -> Callable[..., Any]:
    """``CodeId.make``: the same frame's identity in every process.

    torch tells apart two frames of one code (a decorator's wrapper around two functions) by a
    hash of the functions in their closure, and that hash is ``hash()`` of their code objects,
    which Python salts per process (string hashing): a frame with a function in its closure
    (a decorated forward, as every transformers model's) never found its state in another
    process, neither in compileq's store nor in stock's local dir. A transformers Llama's new
    machine compiled static, then again dynamic, with the state stored (docs/BENCHMARKS.md).
    Here the hash is of what names each function (its qualified name, first line and file
    name) and of its bytecode, digested: equal in every process. Rejected: a fixed ``PYTHONHASHSEED`` for the job
    (set before the interpreter starts, so not by ``install()``; and it changes every dict
    and set order of the user's program)."""

    @functools.wraps(original)
    def make(code: Any, closure: Any = None) -> Any:
        code_id = original(code, closure)
        if not closure or code_id.closure_hash is None:
            return code_id
        return _with_stable_closure(code_id, closure)

    return make


def _as_made(code_id: Any, closure: Any) -> Any:
    return code_id


@boundary.guard("dynamic profiles", instead=_as_made)
def _with_stable_closure(code_id: Any, closure: Any) -> Any:
    return dataclasses.replace(code_id, closure_hash=closure_digest(closure))


def closure_digest(closure: tuple[Any, ...]) -> int:
    """A signed 64-bit digest of the functions in ``closure`` (``None`` for another value or
    an empty cell, as torch counts them), equal in every process."""
    names: list[object] = []
    for cell in closure:
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            content = None
        code = getattr(content, "__code__", None) if callable(content) else None
        if code is None:
            names.append(None)
        else:
            qualname = getattr(code, "co_qualname", code.co_name)
            body = hashlib.sha256(code.co_code).hexdigest()  # two lambdas on one line differ
            names.append([qualname, code.co_firstlineno, os.path.basename(code.co_filename), body])
    digest = hashlib.sha256(json.dumps(names).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _remote(original: Callable[[], Any]) -> Callable[[], Any]:
    """``get_remote_cache``: the user's own remote profile cache where configured, else the
    store's."""

    @functools.wraps(original)
    def get_remote_cache() -> Any:
        theirs = original()
        if theirs is not None or not _remote_wanted():
            return theirs
        return StoreProfiles()

    return get_remote_cache
