"""Which CPUs ``compileq worker`` runs on: a CPU list, less the cores it leaves to training.

On a GPU node the worker shares the host with the training ranks, whose own tracing (Dynamo,
AOTAutograd: one thread each) is what the job waits for, and the worker generates and builds
exactly while they trace. Its niceness (``COMPILEQ_WORKER_NICE``) gives the ranks the CPUs
when both want one, but not a core to themselves: on a host with SMT a rank whose sibling
thread runs a build runs slower, however nice the build. So the worker can also leave whole
physical cores, each with its sibling threads, free for the ranks
(``COMPILEQ_WORKER_LEAVE_CORES``), and run only on a CPU list (``COMPILEQ_WORKER_CPUS``).

Each worker process pins itself when it starts, before it forks its pool, so every pool process
and compiler it starts inherits the affinity. The ranks themselves are not pinned: the kernel's
scheduler puts a busy rank on an idle core, and the cores left are idle. Measured on two H200s
(32 cores, no SMT), where the worker kept less than one CPU busy on average: no difference
(docs/BENCHMARKS.md); the default is for hosts where builds and ranks do meet on a core.

Not below ``LEAVE_FROM_CPUS_PER_GPU`` CPUs per GPU, though (``default_leave``): there the
builds, not the ranks, are what the first step waits for. A worker of three CPUs on a host of
four per GPU generates a graph in one pool process and builds its kernels in the other two,
where stock's pool builds them in four beside its in-process codegen. Measured on one H200
cut into 4-core lanes (docs/BENCHMARKS.md, twenty-eighth session): DistilBERT's cold first step
went from 1.45x to 0.77x of stock's, convnext_tiny's from 1.08x to 0.72x, when the worker left
no core; at 8 CPUs per GPU, leaving one, the zoo's models were 0.54-0.75x. Rejected: always
leaving one (the 4-core figures) and a fraction of the CPUs (no host measured where a second
core left would pay).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from compileq.errors import WorkerError

_TOPOLOGY = Path("/sys/devices/system/cpu")


def parse(spec: str) -> set[int]:
    """``"0-3,8,10-11"`` as a set of CPU numbers; a clear error for anything else."""
    chosen: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise WorkerError(f"bad CPU list {spec!r}: {part!r} is not N or N-M") from None
        if first < 0 or last < first:
            raise WorkerError(f"bad CPU list {spec!r}: {part!r} is not an ascending range")
        chosen.update(range(first, last + 1))
    if not chosen:
        raise WorkerError(f"bad CPU list {spec!r}: it names no CPU")
    return chosen


def usable() -> set[int]:
    """The CPUs this process may run on (its affinity, set by a launcher or a cgroup)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def cores(cpus: Iterable[int], topology: Path = _TOPOLOGY) -> list[tuple[int, ...]]:
    """``cpus`` grouped by physical core (SMT siblings together), in order of their lowest
    CPU. A CPU whose topology cannot be read is a core of its own."""
    chosen = set(cpus)
    groups: dict[tuple[int, ...], None] = {}
    for cpu in sorted(chosen):
        siblings_file = topology / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            siblings = parse(siblings_file.read_text())
        except (OSError, WorkerError):
            siblings = {cpu}
        groups.setdefault(tuple(sorted(siblings & chosen or {cpu})), None)
    return list(groups)


# The fewest CPUs per GPU at which a GPU worker, not told otherwise, leaves a core per GPU.
LEAVE_FROM_CPUS_PER_GPU = 8


def default_leave(cpus: set[int], gpus: int) -> int:
    """The physical cores a worker serving ``gpus`` GPUs on ``cpus`` leaves to the ranks when
    not told: one per GPU where it has at least ``LEAVE_FROM_CPUS_PER_GPU`` CPUs per GPU,
    else none (the module's docstring says why)."""
    return gpus if gpus > 0 and len(cpus) >= LEAVE_FROM_CPUS_PER_GPU * gpus else 0


def leaving(cpus: set[int], leave_cores: int, topology: Path = _TOPOLOGY) -> set[int]:
    """``cpus`` less ``leave_cores`` whole physical cores (the first ones). At least one core
    stays for the worker: leaving every core would leave it nothing to build on."""
    if leave_cores < 0:
        raise WorkerError(f"cannot leave {leave_cores} cores")
    groups = cores(cpus, topology)
    kept = groups[min(leave_cores, len(groups) - 1) :]
    return {cpu for group in kept for cpu in group}


def given(spec: str) -> set[int]:
    """The CPUs ``spec`` lists (empty: every CPU this process may use). A listed CPU this
    process may not use is an error."""
    allowed = usable()
    cpus = parse(spec) if spec.strip() else allowed
    if outside := cpus - allowed:
        raise WorkerError(
            f"CPUs {describe(outside)} are not among this process's ({describe(allowed)})"
        )
    return cpus


def choose(spec: str, leave_cores: int, topology: Path = _TOPOLOGY) -> set[int]:
    """The worker's CPUs: ``given(spec)`` less ``leave_cores`` physical cores."""
    return leaving(given(spec), leave_cores, topology)


def pin(cpus: set[int]) -> None:
    """This process (and every process it starts after) runs on ``cpus`` only."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def describe(cpus: set[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    out: list[str] = []
    for cpu in sorted(cpus):
        if out and int(out[-1].rpartition("-")[2]) == cpu - 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)
