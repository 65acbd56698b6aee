"""Queue names: one per (toolchain, target), so routing *is* toolchain matching."""

from __future__ import annotations

import re

from compileq import keys
from compileq.fingerprint import FxToolchain, Target, Toolchain


def triton_queue(toolchain: Toolchain, target: Target) -> str:
    return f"{keys.QUEUE_PREFIX}{toolchain.digest}.{target}"


def tune_queue(toolchain: Toolchain, gpu: str) -> str:
    """Served only by workers pinned to a GPU of model ``gpu`` (autotuning times kernels)."""
    return f"{keys.TUNE_QUEUE_PREFIX}{toolchain.digest}.{gpu_slug(gpu)}"


def gpu_slug(gpu: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``: a queue name without spaces."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "unknown"


def fx_queue(toolchain: FxToolchain, target: str) -> str:
    return f"{keys.FX_QUEUE_PREFIX}{toolchain.digest}.{target}"


def cpp_queue(toolchain_digest: str) -> str:
    """Served by every worker whose compiler, torch and CPU build C++ objects as a client's."""
    return f"{keys.CPP_QUEUE_PREFIX}{toolchain_digest}"
