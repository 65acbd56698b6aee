"""The job a client hands a worker, and the content key of what it builds.

A job travels as signed JSON in the store (``compileq:job:<key>``), never inline in the Celery
message: the message carries only the key, and the worker refuses any job whose signature or
key does not check out, since building a kernel means executing its Python source.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from compileq import keys
from compileq.fingerprint import Target, Toolchain

#: Bump when the payload format or key derivation changes: old entries then simply miss.
FORMAT = 2
TRITON = "triton"
#: Stands in for the kernel's own name when its source is hashed (see ``TritonJob.source_sha``).
_NAME = "\x00compileq:kernel-name\x00"


@dataclass(frozen=True)
class TritonJob:
    """Inductor's Triton build: ``_worker_compile_triton(partial(load, name, source), env, cfg)``."""

    name: str
    source: str
    extra_config: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property  # parsed once: the hit path asks several times per kernel
    def target(self) -> Target | None:
        return Target.from_source(self.source)

    @functools.cached_property
    def source_sha(self) -> str:
        """sha256 of the source with the kernel's own name replaced by a placeholder.

        Inductor names a kernel after its place in the graph (``triton_poi_fused_add_7``) and
        writes that name into a source it generated with a placeholder; it dedupes kernels on
        the placeholder form (``src_to_kernel`` in ``codegen/triton.py``). Keying that same
        form means an edit early in a model, which renumbers every later kernel, does not
        turn the later, unchanged kernels into misses. The rejected alternative, hashing the
        name too, made 42 of 71 kernels of an edited convnet miss on the GPU. A kernel served
        under another name keeps the name it was built with inside its cubin and launcher;
        only profiler traces show that name.
        """
        canonical = self.source.replace(self.name, _NAME) if self.name else self.source
        return hashlib.sha256(canonical.encode()).hexdigest()

    def key_material(self, toolchain: Toolchain, target: Target) -> dict[str, Any]:
        """Everything the key covers (the name only through ``source_sha``). The one source of
        truth: :meth:`key` hashes it, and workers and clients record it next to the entry
        (``compileq explain`` reads it), so the recorded material can never drift from what
        was hashed."""
        return {
            "kind": TRITON,
            "format": FORMAT,
            "toolchain": toolchain.digest,
            "target": str(target),
            "source": self.source_sha,
            "config": self.extra_config,
        }

    def key(self, toolchain: Toolchain, target: Target) -> str:
        """The artifact key: kind, source (name-independent), config, target, toolchain."""
        return key_of(self.key_material(toolchain, target))

    def to_json(self) -> bytes:
        return json.dumps(
            {"name": self.name, "source": self.source, "extra_config": self.extra_config},
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TritonJob:
        obj = json.loads(data)
        if (
            not isinstance(obj, dict)
            or not isinstance(obj.get("name"), str)
            or not isinstance(obj.get("source"), str)
        ):
            raise ValueError("job spec must be an object with string 'name' and 'source'")
        config = obj.get("extra_config", {})
        if not isinstance(config, dict):
            raise ValueError("job spec 'extra_config' must be an object")
        return cls(obj["name"], obj["source"], config)


def key_of(material: dict[str, Any]) -> str:
    """The artifact key of a kernel's key material (see :meth:`TritonJob.key_material`)."""
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return keys.artifact(str(material["kind"]), hashlib.sha256(blob).hexdigest())
