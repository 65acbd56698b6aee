"""How ``compileq worker`` yields the CPUs to the training processes beside it.

On a GPU node the ranks' own tracing (Dynamo, AOTAutograd: one thread each) is what the job
waits for, and the worker generates and builds exactly while they trace. Two knobs, both from
``COMPILEQ_WORKER_NICE``:

- the worker processes' niceness (:func:`lower_process`), inherited by the pool Celery forks
  and every compiler it runs;
- the niceness of the worker's *autogroup* (:func:`lower_session`). With Linux's autogroup
  scheduling on (``/proc/sys/kernel/sched_autogroup_enabled``, the default of most
  distributions), the scheduler first shares the CPUs fairly between sessions, and niceness
  only weighs processes within one session: a worker started in a session of its own (by
  systemd, a container runtime, a launcher) at nice 10 still took half the CPUs from the ranks
  of another session. Measured on the 2-core CI machine, two gloo ranks beside one worker
  (``python -m bench.ddp --runs stock_cold,compileq_cold_nice0,compileq_cold``): all ranks
  done in 20.3-20.9 s with the autogroup lowered, 22.7-24.2 s at nice 0 (docs/BENCHMARKS.md).
  On two H200s with 32 cores, where the worker kept less than one CPU busy on average, it made
  no measurable difference.

The autogroup is lowered only by a supervisor that leads its own session: one started from a
shell shares the shell's session (and its autogroup) with whatever else that terminal runs,
a training job included, and lowering it would lower them too. Rejected alternative: starting
each child in a new session of its own, which would take the children out of the process group
that launchers, Slurm and our tests signal and kill as one.

Inside a cgroup with a CPU controller (a Kubernetes pod, a systemd service) the autogroup plays
no part: the cgroups' CPU weights share the CPUs (docs/DEPLOY.md says how to set them).
"""

from __future__ import annotations

import os
from pathlib import Path

from compileq._log import log

_AUTOGROUP = Path("/proc/self/autogroup")


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The niceness of process ``pid``'s autogroup; None where it has none to set: a kernel
    without autogroups, or a process still in the root group's default autogroup (a process
    whose session was never started anew: the kernel then prints nothing, and that group's
    weight cannot be changed)."""
    try:
        return parse_autogroup(Path(f"/proc/{pid}/autogroup").read_text())
    except OSError:
        return None


def parse_autogroup(text: str) -> int | None:
    """The niceness in a ``/proc/PID/autogroup`` file ("/autogroup-7 nice 10"); None for the
    empty file of the default autogroup."""
    fields = text.split()
    return int(fields[2]) if len(fields) == 3 and fields[1] == "nice" else None


def lower_process(nice: int) -> None:
    """This process (and every process it starts after) at niceness ``nice``."""
    if nice:
        os.nice(nice)


def lower_session(nice: int, autogroup: Path = _AUTOGROUP) -> bool:
    """This session's autogroup at niceness ``nice``, if this process leads its session;
    whether it was set. Never fails the worker: a kernel without autogroups, or one that
    refuses, leaves things as they are."""
    if not nice or os.getsid(0) != os.getpid():
        return False
    try:
        autogroup.write_text(f"{nice}\n")
    except OSError as e:
        log.info("compileq worker: autogroup left as it is (%s)", e)
        return False
    return True
