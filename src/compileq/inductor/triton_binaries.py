"""Triton kernel binaries a client compiles in its own process, content-addressed in the store.

Kernels Inductor sends to its pool are built by workers and come back whole (a
``CachingAutotuner`` with its cubins). A client still runs Triton's compiler itself for configs
that exist only at run time: coordinate-descent tuning (the max-autotune modes) compiles each
neighbour config it times; a best config found so is compiled again by every later process that
loads the graph (``StaticAutotunerFuture`` -> ``recheck_autotune_cache`` ->
``slow_precompile_config``); ``_dynamic_scale_rblock`` likewise. On an H100 a new machine under
max-autotune ran 67 such compiles in its first step (3.7 s of 12.5 s), where stock's warm
local cache found every one in Triton's own file cache (docs/BENCHMARKS.md).

Triton names each compile by its own cache key (the kernel's source, the target, the options,
Triton's version and environment: what decides the binary) and writes the compile's files as one
group (``put_group``, with the metadata ``<name>.json``). compileq's Triton cache manager
(``triton_modules``) hands a group a client built to :func:`share`, which stores it under that key
as one entry; a group missing from Triton's file cache is looked up by :func:`fetch`, its files
written into place through Triton's own ``put`` (a temporary file, then ``os.replace``) before the
group file that names them, so Triton finds a whole group or none.

A worker's groups are not stored: its kernels travel whole, as pool results, and storing them
again would double every cold build's traffic. The metadata file may name the directory it was
written to; that is stored as a placeholder and written back as this machine's directory.

Rejected: Triton's remote cache manager (``knobs.cache.remote_manager_class``). It replaces the
file cache rather than backing it, would send every file of every compile through Redis (workers'
too, one round trip per file), and reads back whatever it finds, unverified; here an entry is
signed (``cache/store.py``) and its file names are checked before anything is written.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import redis

from compileq import keys
from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.cache.store import RedisStore
from compileq.errors import CompileqError
from compileq.scheduler import boundary

KIND = "triton-bin"
#: Bump when the payload format or key derivation changes: old entries then simply miss.
FORMAT = 1
#: Stands in for the group's directory inside its metadata file.
_DIR = b"\x00compileq:triton-dir\x00"
#: A group is at most this many files (Triton 3.6 writes seven: ttir, ttgir, llir, ptx, cubin,
#: json, source); more is not a group Triton wrote.
_MAX_FILES = 32


def group_key(cache_key: str, filename: str) -> str:
    """The store key of one compile's files: Triton's own cache key (which hashes the source,
    target, options, Triton's version and the environment that changes a binary) and the
    metadata file's name."""
    import triton

    material = {
        "kind": KIND,
        "format": FORMAT,
        "triton_key": cache_key,
        "file": filename,
        "triton": triton.__version__,
    }
    return keys.artifact_of(KIND, material)


def is_kernel_group(filename: str) -> bool:
    """Whether ``get_group``/``put_group`` is about a kernel compile (its metadata file)."""
    return filename.endswith(".json") and os.sep not in filename


def pack(files: dict[str, bytes], directory: str) -> bytes:
    """One entry for a group: a JSON header naming each file and its length, then the bytes.
    Rejected: pickle, which a reader would have to trust before it could check anything."""
    raw_dir = directory.encode()
    body = []
    names = []
    for name, data in sorted(files.items()):
        if name.endswith(".json"):
            if _DIR in data:
                raise ValueError(f"{name} holds compileq's placeholder")
            data = data.replace(raw_dir, _DIR)
        names.append([name, len(data)])
        body.append(data)
    header = json.dumps({"files": names}).encode()
    return len(header).to_bytes(4, "big") + header + b"".join(body)


def unpack(payload: bytes, metadata: str, directory: str) -> dict[str, bytes]:
    """The files of an entry :func:`pack` wrote for the group whose metadata file is
    ``metadata``; ValueError for anything else (a name outside the group, a path, a short or
    long body)."""
    size = int.from_bytes(payload[:4], "big")
    header = json.loads(payload[4 : 4 + size])
    entries = header["files"]
    if not isinstance(entries, list) or not 0 < len(entries) <= _MAX_FILES:
        raise ValueError("not a group")
    stem = re.escape(metadata[: -len(".json")])
    allowed = re.compile(rf"{stem}\.[A-Za-z0-9_]+\Z")
    files: dict[str, bytes] = {}
    at = 4 + size
    for name, length in entries:
        if not isinstance(name, str) or not allowed.match(name) or name in files:
            raise ValueError(f"file name {name!r} is not in group {metadata!r}")
        if not isinstance(length, int) or length < 0 or at + length > len(payload):
            raise ValueError("truncated group")
        data = payload[at : at + length]
        at += length
        if name.endswith(".json"):
            data = data.replace(_DIR, directory.encode())
        files[name] = data
    if at != len(payload) or metadata not in files:
        raise ValueError("a group without its metadata, or with bytes after it")
    return files


def _not_fetched(cache: Any, filename: str) -> dict[str, str] | None:
    return None


@boundary.guard("the Triton binary cache", instead=_not_fetched)
def fetch(cache: Any, filename: str) -> dict[str, str] | None:
    """Write the group of ``filename`` into ``cache`` (a Triton file cache manager) from the
    store: Triton's ``{file name: path}``, or None where the store has no good entry (Triton then
    compiles)."""
    store = FEATURE.store
    if store is None:
        return None
    from triton.runtime.cache import FileCacheManager

    key = group_key(cache.key, filename)
    try:
        entry = store.get_many([key])[0]
        if entry is None:
            store.count({Counter.TRITON_BINARY_MISSES: 1})
            return None
        try:
            files = unpack(entry.payload(), filename, cache.cache_dir)
        except (ValueError, KeyError, TypeError) as e:
            # Signed with our secret, yet not a group: never loaded, counted, and replaced by
            # this process's compile (a plain put would keep it: the key holds a signed value).
            FEATURE.bad.add(key)
            store.count({Counter.TRITON_BINARY_MISSES: 1, Counter.INTEGRITY_FAILURES: 1})
            log.warning("compileq: Triton binary entry for %s rejected: %s", filename, e)
            return None
        paths = {
            name: str(FileCacheManager.put(cache, data, name, binary=True))
            for name, data in files.items()
        }
        FileCacheManager.put_group(cache, filename, paths)
        store.count({Counter.TRITON_BINARY_HITS: 1})
    except redis.RedisError as e:
        warn_once("triton-binaries", "compileq: Triton binary cache unavailable (%s)", e)
        return None
    log.debug("compileq: Triton binaries %s from the store", filename)
    return paths


def _not_shared(cache: Any, filename: str, group: dict[str, str]) -> None:
    return None


@boundary.guard("the Triton binary cache", instead=_not_shared)
def share(cache: Any, filename: str, group: dict[str, str]) -> None:
    """Store the group Triton just compiled here; failing to only costs other machines a
    compile."""
    store = FEATURE.store
    if store is None or not FEATURE.share:
        return
    try:
        files = {}
        for name, path in group.items():
            with open(path, "rb") as f:
                files[os.path.basename(name)] = f.read()
        payload = pack(files, cache.cache_dir)
        store.count({Counter.TRITON_BINARY_BUILDS: 1})
        key = group_key(cache.key, filename)
        if key in FEATURE.bad:
            FEATURE.bad.discard(key)
            store.replace(key, payload)
        else:
            store.put(key, payload)
    except (OSError, ValueError, redis.RedisError, CompileqError) as e:
        warn_once("triton-binaries-put", "compileq: Triton binaries not cached: %s", e)


class TritonBinaries:
    """Where :func:`fetch` and :func:`share` find the store: set by the Triton cache manager's
    feature (``triton_modules.TritonModules``), which serves both C modules and binaries."""

    def __init__(self) -> None:
        self.store: RedisStore | None = None
        #: Whether groups built here are stored (clients: yes; a worker's codegen: no).
        self.share = False
        #: Keys whose signed entry was not a group: the next compile here replaces them.
        self.bad: set[str] = set()


FEATURE = TritonBinaries()
