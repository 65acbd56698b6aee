"""The autotuning job: time one Triton template candidate on a GPU of the client's model.

max-autotune writes each candidate config of a GEMM (or other template) as a module of its own
and times it (``TritonBenchmarkRequest.benchmark``). The job carries that module's source and
the request, pickled, both as if written for ``cuda:0``: a worker is pinned to one GPU, and
every GPU index of every node then shares one timing per candidate. Like an FX job it is a
pickle, so it travels only as a signed store entry (``compileq:job:<key>``); a worker opens it
only after the signature checks out.

The key is what decides the timing: the module's source (its kernel's own name and Inductor's
``backend_hash`` left out), the request's fields other than where its module lies, the input and output tensors'
dtypes, sizes, strides and offsets, the GPU's model and the toolchain that builds the kernel.
Not the tensors' names or device index: the same GEMM of another graph or rank times the same.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
from dataclasses import dataclass
from typing import Any

from compileq import keys
from compileq.fingerprint import Target, Toolchain

KIND = "tune"
#: Bump when the payload format or key derivation changes: old entries then simply miss.
FORMAT = 1
#: Stands in for the kernel's own name when the module source is hashed.
_NAME = "\x00compileq:kernel-name\x00"
#: Inductor's ``backend_hash`` in a kernel's metadata hashes Triton's key and the ptxas version
#: the generating process saw, which depends on whether that process had already pointed
#: Triton at torch's ptxas (a worker's codegen had, a client's first graph had not: two
#: hashes of one toolchain on the H100). It decides no timing, and the toolchain in the key
#: names the assembler that really builds: left out of the hash.
_BACKEND_HASH = re.compile(r"'backend_hash': '[0-9A-Fa-f]+'")
#: Request fields that say where its module lies on the sending machine, or that a benchmark
#: or precompile in this process left behind; none of them decides a timing.
_PLACE = frozenset(
    {"module_path", "module_cache_key", "kernel_name", "n_regs", "_benchmark_module"}
)
_TENSORS = ("input_tensor_meta", "output_tensor_meta")


@dataclass(frozen=True)
class TuneJob:
    name: str
    #: The candidate's module source, written for ``cuda:0``.
    source: str
    #: The ``TritonBenchmarkRequest``, its tensors on ``cuda:0`` and its module paths cleared.
    request: Any
    #: ``torch.cuda.get_device_name()``: timings are shared by GPUs of one model only.
    gpu: str

    @property
    def target(self) -> Target | None:
        return Target.from_source(self.source)

    def key_material(self, toolchain: Toolchain) -> dict[str, Any]:
        canonical = self.source.replace(self.name, _NAME) if self.name else self.source
        canonical = _BACKEND_HASH.sub("'backend_hash': ''", canonical)
        return {
            "kind": KIND,
            "format": FORMAT,
            "toolchain": toolchain.digest,
            "gpu": self.gpu,
            "source": hashlib.sha256(canonical.encode()).hexdigest(),
            "request": describe(self.request),
        }

    def key(self, toolchain: Toolchain) -> str:
        return keys.artifact_of(KIND, self.key_material(toolchain))

    def to_bytes(self) -> bytes:
        return pickle.dumps(
            {"name": self.name, "source": self.source, "request": self.request, "gpu": self.gpu},
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> TuneJob:
        """Only ever called on a job whose signature was checked (see workers/tune.py)."""
        obj = pickle.loads(data)
        if not isinstance(obj, dict) or not all(
            isinstance(obj.get(k), str) for k in ("name", "source", "gpu")
        ):
            raise ValueError("tune job must hold string 'name', 'source' and 'gpu'")
        return cls(obj["name"], obj["source"], obj["request"], obj["gpu"])


def describe(request: Any) -> dict[str, str]:
    """The request's fields that decide a timing, each spelled by ``repr`` (sorted by name)."""
    out: dict[str, str] = {}
    for name, value in sorted(vars(request).items()):
        if name in _PLACE:
            continue
        if name in _TENSORS:
            metas = value if isinstance(value, list | tuple) else [value]
            out[name] = repr([_tensor(m) for m in metas])
        else:
            out[name] = repr(value)
    return out


def _tensor(meta: Any) -> tuple[str, tuple[int, ...], tuple[int, ...], int]:
    return (
        str(meta.dtype),
        tuple(int(s) for s in meta.sizes),
        tuple(int(s) for s in meta.strides),
        int(meta.offset),
    )


def timing_payload(ms: float, by: str, error: str | None = None) -> bytes:
    """What a worker stores: the candidate's time in ms; ``null`` where it failed (inf)."""
    finite = ms if math.isfinite(ms) else None
    return json.dumps({"ms": finite, "by": by, "error": error}).encode()


def timing_of(payload: bytes) -> float | None:
    """The stored time in ms (``inf`` for a candidate that failed), or None if unreadable."""
    try:
        return _ms(json.loads(payload)["ms"])
    except (ValueError, KeyError, TypeError):
        return None


def _ms(value: Any) -> float | None:
    """A stored time: ms, ``null`` for a choice that failed (inf); None for anything else."""
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return None
    return float(value)


#: A GEMM's whole table: the time of every one of its choices, Triton's and ATen's, as the
#: process that autotuned it first measured them (``inductor/autotune.py``).
TABLE_KIND = "tunetable"
#: A table lists tens of choices; anything far larger is not one compileq wrote.
_MAX_TABLE = 4096


def table_key(identities: list[str], gpu: str, toolchain: Toolchain) -> str:
    """The key of a GEMM's table: its choices (a Triton candidate by its timing key, which holds
    the sizes, strides and GPU model; another choice by Inductor's ``hash_key``), order aside."""
    material = {
        "kind": TABLE_KIND,
        "format": FORMAT,
        "toolchain": toolchain.digest,
        "gpu": gpu,
        "choices": sorted(identities),
    }
    return keys.artifact_of(TABLE_KIND, material)


def table_payload(timings: dict[str, float], by: str) -> bytes:
    """Every choice's time in ms by identity; ``null`` for one that failed (inf)."""
    times = {k: (ms if math.isfinite(ms) else None) for k, ms in timings.items()}
    return json.dumps({"ms": times, "by": by}).encode()


def table_of(payload: bytes, identities: list[str]) -> dict[str, float] | None:
    """The stored time of each of ``identities``; None unless the table holds every one, each a
    time in ms (or ``null``: inf)."""
    try:
        times = json.loads(payload)["ms"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(times, dict) or len(times) > _MAX_TABLE:
        return None
    out: dict[str, float] = {}
    for identity in identities:
        ms = _ms(times.get(identity, -1))  # a choice the table lacks reads as -1: refused
        if ms is None:
            return None
        out[identity] = ms
    return out
