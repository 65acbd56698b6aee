"""``compileq warm``: build every kernel of a JSONL manifest through the cluster."""

from __future__ import annotations

import json
import time
from collections import Counter as Tally
from concurrent.futures import wait
from dataclasses import dataclass
from pathlib import Path

from compileq._log import log
from compileq.config import Settings
from compileq.errors import ManifestError
from compileq.scheduler.client import KernelClient, Outcome
from compileq.scheduler.local import LocalBuilder
from compileq.scheduler.progress import progress
from compileq.scheduler.recognise import inductor_extra_config
from compileq.tasks.jobs import TritonJob


@dataclass(frozen=True)
class WarmReport:
    kernels: int
    hits: int
    remote: int
    local: int
    failed: int
    wall_s: float

    def as_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def _manifest_row(path: Path, number: int, raw: bytes) -> object:
    """One manifest line's JSON value; :class:`ManifestError` naming the line if it has none."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(
            f"{path}:{number}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
        ) from None
    try:
        return json.loads(line)
    except RecursionError:
        # json.loads recurses once per nesting level: '[' * 100000 blows the stack.
        raise ManifestError(f"{path}:{number}: not JSON (nested too deeply)") from None
    except ValueError as e:
        raise ManifestError(f"{path}:{number}: not JSON ({e})") from None


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def read_manifest(path: Path) -> list[TritonJob]:
    """Jobs from a JSONL file whose lines hold at least ``name`` and ``source``."""
    try:
        # Bytes, split on line ends only: each line is decoded alone, so a bad byte is
        # reported with its line, and str.splitlines would also split inside a JSON string at
        # U+2028 and the like, which JSON allows unescaped.
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise ManifestError(f"cannot read manifest {path}: {e}") from e
    config = inductor_extra_config()
    jobs = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        row = _manifest_row(path, number, raw)
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("name"), str)
            or not isinstance(row.get("source"), str)
        ):
            raise ManifestError(f"{path}:{number}: needs string fields 'name' and 'source'")
        if not all(_utf8(row[field]) for field in ("name", "source")):
            # JSON's "\ud800" escape decodes to a lone surrogate, which no key can hash.
            raise ManifestError(f"{path}:{number}: not UTF-8 text (a lone surrogate escape)")
        job = TritonJob(row["name"], row["source"], config)
        if job.target is None:
            raise ManifestError(
                f"{path}:{number}: kernel {row['name']} has no DeviceProperties(...) in its source"
            )
        jobs.append(job)
    return jobs


def warm(jobs: list[TritonJob], settings: Settings) -> WarmReport:
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    get_compile_threads()  # settles config.compile_threads before the stock pool reads it
    started = time.perf_counter()
    client = KernelClient(settings, LocalBuilder(AsyncCompile.process_pool))
    try:
        futures = client.submit_many([(job, {}) for job in jobs])
        wait(futures)
        # Built here while Redis was away: stored once it answers, if within retry_after_s.
        if left := client.store_backlog_within(settings.retry_after_s):
            log.warning(
                "compileq warm: %d kernels built here while Redis was away are not stored "
                "(it did not answer within %.0f s)",
                left,
                settings.retry_after_s,
            )
    finally:
        client.close()
        progress.finish()  # the summary and a cleared live line before the report is printed
    tally: Tally[str] = Tally()
    for job, future in zip(jobs, futures, strict=True):
        error = future.exception()
        if error is not None:
            log.error("compileq warm: %s failed: %s", job.name, error)
            tally["failed"] += 1
        else:
            tally[future.result().outcome.value] += 1
    return WarmReport(
        kernels=len(jobs),
        hits=tally[Outcome.HIT.value],
        remote=tally[Outcome.REMOTE.value],
        local=tally[Outcome.LOCAL.value],
        failed=tally["failed"],
        wall_s=round(time.perf_counter() - started, 3),
    )


def stock_baseline(jobs: list[TritonJob]) -> WarmReport:
    """The same builds in stock Inductor's local process pool, with no cluster: the baseline."""
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    get_compile_threads()
    started = time.perf_counter()
    builder = LocalBuilder(AsyncCompile.process_pool)
    futures = [builder.submit(job, {}) for job in jobs]
    wait(futures)
    failed = sum(f.exception() is not None for f in futures)
    return WarmReport(
        kernels=len(jobs),
        hits=0,
        remote=0,
        local=len(jobs) - failed,
        failed=failed,
        wall_s=round(time.perf_counter() - started, 3),
    )
