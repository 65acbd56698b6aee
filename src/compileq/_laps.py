"""Seconds per named phase of some piece of work, for one log line."""

from __future__ import annotations

import time


class Laps:
    """Each lap is timed from the previous one (or from creation); a phase named twice adds up.

    One class for the worker's start (``workers/process.py``) and each graph it generates
    (``workers/fx.py``), so both log lines read alike."""

    def __init__(self) -> None:
        self._started = self._last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def total(self) -> float:
        return time.perf_counter() - self._started

    def describe(self, digits: int = 2) -> str:
        return ", ".join(f"{name} {s:.{digits}f}s" for name, s in self.phases.items())
