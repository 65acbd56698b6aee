"""Client side: the pool Inductor submits to, cache lookup, single-flight, routing, fallback."""

from compileq.scheduler.client import Built, KernelClient, Outcome
from compileq.scheduler.install import install, installed_pool, uninstall

__all__ = ["Built", "KernelClient", "Outcome", "install", "installed_pool", "uninstall"]
