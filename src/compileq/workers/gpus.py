"""Finding this node's GPUs without initialising CUDA in the calling process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from compileq.errors import WorkerError
from compileq.fingerprint import Target

# Runs in a child: a process that initialised CUDA must never fork, and the supervisor forks
# (Celery's prefork pool) after this, so the probe may not touch CUDA here.
_PROBE = r"""
import json, torch
out = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    if torch.version.hip:
        target = ["hip", p.gcnArchName.split(":")[0], p.warp_size]
    else:
        target = ["cuda", str(p.major * 10 + p.minor), p.warp_size]
    out.append({"index": i, "name": p.name, "target": target})
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    target: Target


def probe_gpus() -> list[Gpu]:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise WorkerError(f"could not list GPUs: {e}") from e
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [
        Gpu(r["index"], r["name"], Target(r["target"][0], r["target"][1], r["target"][2]))
        for r in rows
    ]


def select_gpus(spec: str, available: list[Gpu]) -> list[Gpu]:
    """``all`` or a comma list of indices (``0,1``), checked against what the node has."""
    if spec.strip() == "all":
        chosen = available
    else:
        try:
            wanted = [int(s) for s in spec.split(",") if s.strip()]
        except ValueError as e:
            raise WorkerError(f"--gpus takes 'all' or indices like 0,1, not {spec!r}") from e
        by_index = {g.index: g for g in available}
        missing = [i for i in wanted if i not in by_index]
        if missing:
            raise WorkerError(f"--gpus {spec}: no GPU {missing} here (found {sorted(by_index)})")
        chosen = [by_index[i] for i in wanted]
    if not chosen:
        raise WorkerError(
            "no GPU found on this machine; to cross-compile without one, run "
            "`compileq worker --cpu-only --arch sm_90`"
        )
    return chosen
