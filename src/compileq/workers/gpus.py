"""Finding this node's GPUs without initialising CUDA in the calling process.

``nvidia-smi`` answers in tens of milliseconds; the fallback, torch in a child process, takes
seconds (importing torch: 4.2 s on an H100 node, a quarter of a worker's whole start). torch is
asked only where nvidia-smi is missing (ROCm, a container without the tool) or cannot say which
device CUDA would see (MIG instances, or indices of a mixed node in CUDA's own order).

Each GPU carries ``pin``, the value its worker process gets as ``CUDA_VISIBLE_DEVICES``. It is
the GPU's UUID where known, so pinning holds whatever order CUDA enumerates in, and it respects
a ``CUDA_VISIBLE_DEVICES`` the supervisor was started with (Slurm sets it to the GPUs a job was
given): GPU ``k`` is then the k-th of those, as in the training job's own ``cuda:k``. Rejected
alternative: pinning by index alone, which under Slurm pointed a worker at a GPU of another job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from compileq._log import log
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

_SMI_QUERY = "--query-gpu=index,uuid,name,compute_cap"
#: Every NVIDIA GPU to date schedules warps of 32 threads.
_NVIDIA_WARP = 32


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    target: Target
    #: ``CUDA_VISIBLE_DEVICES`` for a process pinned to this GPU (empty: ``str(index)``).
    pin: str = ""

    @property
    def visible_devices(self) -> str:
        return self.pin or str(self.index)


def visible_entries(environ: dict[str, str] | None = None) -> list[str] | None:
    """The supervisor's own ``CUDA_VISIBLE_DEVICES`` as a list (``None``: unset, all GPUs)."""
    value = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            break
        entries.append(entry)
    return entries


def parse_smi(text: str) -> list[tuple[int, str, str, Target]]:
    """Rows of ``nvidia-smi --query-gpu=index,uuid,name,compute_cap --format=csv,noheader``."""
    rows = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise ValueError(f"unexpected nvidia-smi line {line!r}")
        index, uuid, name, cap = fields
        major, _, minor = cap.partition(".")
        target = Target("cuda", str(int(major) * 10 + int(minor)), _NVIDIA_WARP)
        rows.append((int(index), uuid, name, target))
    return rows


def from_smi_rows(
    rows: list[tuple[int, str, str, Target]], visible: list[str] | None
) -> list[Gpu] | None:
    """The GPUs CUDA would show a process with ``visible``, or ``None`` when that needs CUDA.

    Unset, CUDA's order is fastest first, which equals nvidia-smi's PCI order on a node of one
    GPU model (the GPU nodes compileq serves); a mixed node is left to torch unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes the orders equal.
    """
    same_order = (
        len({r[3] for r in rows}) <= 1 or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    )
    by_index = {str(r[0]): r for r in rows}
    by_uuid = {r[1]: r for r in rows}
    if visible is None:
        if not same_order:
            return None
        chosen = rows
    else:
        chosen = []
        for entry in visible:
            row = by_uuid.get(entry) or (by_index.get(entry) if same_order else None)
            if row is None:  # a MIG instance, a UUID prefix, or a mixed node: torch knows
                return None
            chosen.append(row)
    return [Gpu(k, name, target, uuid) for k, (_, uuid, name, target) in enumerate(chosen)]


def _from_nvidia_smi() -> list[Gpu] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run(
            [smi, _SMI_QUERY, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        rows = parse_smi(proc.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None  # an old driver without compute_cap, or no device: torch decides
    return from_smi_rows(rows, visible_entries())


def _from_torch() -> list[Gpu]:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise WorkerError(f"could not list GPUs: {e}") from e
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    visible = visible_entries() or []
    return [
        Gpu(
            r["index"],
            r["name"],
            Target(r["target"][0], r["target"][1], r["target"][2]),
            visible[r["index"]] if r["index"] < len(visible) else "",
        )
        for r in rows
    ]


def probe_gpus() -> list[Gpu]:
    started = time.monotonic()
    gpus = _from_nvidia_smi()
    how = "nvidia-smi"
    if gpus is None:
        gpus, how = _from_torch(), "torch"
    log.info(
        "compileq worker: %d GPU(s) listed by %s in %.2fs",
        len(gpus),
        how,
        time.monotonic() - started,
    )
    return gpus


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
