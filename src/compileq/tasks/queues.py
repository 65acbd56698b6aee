"""Queue names: one per (toolchain, target), so routing *is* toolchain matching."""

from __future__ import annotations

from compileq import keys
from compileq.fingerprint import FxToolchain, Target, Toolchain


def triton_queue(toolchain: Toolchain, target: Target) -> str:
    return f"{keys.QUEUE_PREFIX}{toolchain.digest}.{target}"


def fx_queue(toolchain: FxToolchain, target: str) -> str:
    return f"{keys.FX_QUEUE_PREFIX}{toolchain.digest}.{target}"
