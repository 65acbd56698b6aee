"""An FX codegen job: Inductor's pickled compile input, and the content key of its output.

The job travels like a kernel job: sealed in the store under ``compileq:job:<key>`` (the
Celery message carries only the key), so a worker unpickles a graph only after the HMAC
proves a client holding the secret wrote it. Its bytes are a one-line JSON header (where the
graph was meant to be generated, and the environment codegen reads) followed by the
``_WireProtocolPickledInput`` bytes, unchanged.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from compileq import keys

#: Bump when the job format or key derivation changes: old entries then simply miss.
FORMAT = 1
FX = "fxcode"

#: Environment read by codegen that is not in Inductor's config: the client's value travels
#: with the job and the worker generates under it (``cpu_vec_isa`` honours it).
CODEGEN_ENV = ("ATEN_CPU_CAPABILITY",)


@dataclass(frozen=True)
class FxJob:
    target: str  # fingerprint.fx_target() of the client
    toolchain: str  # the client's FxToolchain digest
    pickled_input: bytes
    env: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        """sha256 over kind, format, toolchain, target, env and the input bytes.

        Equal inputs give equal keys: used as the Celery task id, a second client sending the
        same graph while the first waits joins the same build.
        """
        digest = hashlib.sha256()
        head = {
            "kind": FX,
            "format": FORMAT,
            "toolchain": self.toolchain,
            "target": self.target,
            "env": self.env,
        }
        digest.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
        digest.update(b"\0")
        digest.update(self.pickled_input)
        return keys.artifact(FX, digest.hexdigest())

    def to_bytes(self) -> bytes:
        head = {"target": self.target, "toolchain": self.toolchain, "env": self.env}
        return json.dumps(head, sort_keys=True).encode() + b"\n" + self.pickled_input

    @classmethod
    def from_bytes(cls, data: bytes) -> FxJob:
        line, sep, body = data.partition(b"\n")
        if not sep:
            raise ValueError("FX job: no header line")
        head = json.loads(line)
        env = head.get("env", {}) if isinstance(head, dict) else None
        if (
            not isinstance(head, dict)
            or not isinstance(head.get("target"), str)
            or not isinstance(head.get("toolchain"), str)
            or not isinstance(env, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            raise ValueError("FX job header must hold string 'target', 'toolchain' and 'env'")
        return cls(head["target"], head["toolchain"], body, dict(env))
