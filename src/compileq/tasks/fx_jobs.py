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
FORMAT = 2
FX = "fxcode"

#: Environment read by codegen that is not in Inductor's config: the client's value travels
#: with the job and the worker generates under it (``cpu_vec_isa`` honours it).
CODEGEN_ENV = ("ATEN_CPU_CAPABILITY",)


@dataclass(frozen=True)
class CodegenState:
    """Process state codegen reads that Inductor's pickled input leaves behind.

    * ``threads``: ``torch.get_num_threads()``. With ``cpp.threads`` unset, C++ codegen sizes
      its parallel loops by it; the worker generates under the client's value, so the code is
      the client's, not one written for the worker's cores.
    * ``donated``: the backward's donated inputs (AOTAutograd's ``bw_donated_idxs``). They sit
      in the tracing context's ``fw_metadata``, which Inductor's pickler does not carry; without
      them a worker's backward allocates buffers the client's would reuse in place.
    """

    threads: int = 0
    donated: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "threads": self.threads,
            "donated": None if self.donated is None else list(self.donated),
        }

    @classmethod
    def from_json(cls, value: object) -> CodegenState:
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError("FX job header 'state' must be an object")
        threads, donated = value.get("threads", 0), value.get("donated")
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
            raise ValueError("FX job header 'state.threads' must be a whole number")
        if donated is not None and not (
            isinstance(donated, list) and all(type(i) is int for i in donated)
        ):
            raise ValueError("FX job header 'state.donated' must be a list of whole numbers")
        return cls(threads, None if donated is None else tuple(donated))


@dataclass(frozen=True)
class FxJob:
    target: str  # fingerprint.fx_target() of the client
    toolchain: str  # the client's FxToolchain digest
    pickled_input: bytes
    env: dict[str, str] = field(default_factory=dict)
    #: The graph's identity as ``scheduler.fx_key`` computes it (stable across processes and
    #: GPU indices); None where Inductor would not hash the graph: the input bytes stand in.
    graph_key: str | None = None
    state: CodegenState = field(default_factory=CodegenState)

    def key(self) -> str:
        """sha256 over kind, format, toolchain, target, env and the graph key (else the input
        bytes).

        Equal graphs give equal keys, from any rank: a second client sending the same graph
        while the first waits joins the same build (its lease), or finds its output. A worker
        cannot recompute a graph key (it is a hash of the client's objects), so for such a job
        the signature, not the worker, vouches that key and input belong together.
        """
        digest = hashlib.sha256()
        head = {"kind": FX, "format": FORMAT, **self._header()}
        digest.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
        if self.graph_key is None:
            digest.update(b"\0")
            digest.update(self.pickled_input)
        return keys.artifact(FX, digest.hexdigest())

    def _header(self) -> dict[str, object]:
        """What travels ahead of the pickled input; with kind and format, what the key covers."""
        head: dict[str, object] = {
            "target": self.target,
            "toolchain": self.toolchain,
            "env": self.env,
            "state": self.state.to_json(),
        }
        if self.graph_key is not None:
            head["graph"] = self.graph_key
        return head

    def to_bytes(self) -> bytes:
        return json.dumps(self._header(), sort_keys=True).encode() + b"\n" + self.pickled_input

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
        graph = head.get("graph")
        if graph is not None and not isinstance(graph, str):
            raise ValueError("FX job header 'graph' must be a string")
        state = CodegenState.from_json(head.get("state"))
        return cls(head["target"], head["toolchain"], body, dict(env), graph, state)
