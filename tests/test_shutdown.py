"""A worker's shutdown signals are handled one at a time (compileq.workers.shutdown)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from types import FrameType

import pytest

from compileq.workers.shutdown import Serialiser, serialise

# Celery's own shutdown handler (``_shutdown_handler``, which install_worker_term_handler puts on
# SIGTERM) on SIGTERM and on SIGALRM, and a second signal arriving while the first one's handler
# runs, as Slurm's SIGTERM and the supervisor's forwarded one arrive. Celery builds the receiver
# list of worker_shutting_down under a lock; a million receivers of another sender widen that
# window from microseconds to about a tenth of a second, and the kernel's timer (armed as the
# first handler starts) sends the second signal 20 ms into it: it lands there every time, not
# once in many CI runs.
_TWO_SIGNALS = """
import json, os, signal, sys, time, faulthandler
from celery import signals
from celery.apps.worker import _shutdown_handler
from celery.utils.dispatch.signal import _make_id

class Worker:
    hostname = "compileq-test@here"

def other(**_):
    pass

shutting_down = signals.worker_shutting_down
shutting_down.receivers.extend(((_make_id(other), n), other) for n in range(1_000_000))
heard = []
shutting_down.connect(lambda sig, **_: heard.append(sig), weak=False)
# Celery runs the callback as its handler starts, before it dispatches worker_shutting_down.
arm = lambda worker: signal.setitimer(signal.ITIMER_REAL, 0.02)
_shutdown_handler(Worker(), sig="SIGTERM", how="Warm", callback=arm)
_shutdown_handler(Worker(), sig="SIGALRM", how="Warm")
if sys.argv[1] == "serialised":
    from compileq.workers.shutdown import serialise
    serialise(signal.SIGTERM, signal.SIGALRM)
faulthandler.dump_traceback_later(5, exit=True)  # a deadlock: the stack, exit code 1
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 3
while len(heard) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps(heard))
"""


def _two_signals(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _TWO_SIGNALS, mode],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_signal_inside_celerys_shutdown_dispatch_is_handled_after_it_not_deadlocked() -> None:
    plain = _two_signals("celery")
    # Celery alone: the nested handler waits on the lock its own thread holds.
    assert plain.returncode == 1 and "_live_receivers" in plain.stderr, plain.stderr[-2000:]
    done = _two_signals("serialised")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == ["SIGTERM", "SIGALRM"]


def _restoring(*signums: int) -> dict[int, object]:
    return {s: signal.getsignal(s) for s in signums}


def test_a_signal_raised_inside_a_handler_runs_after_it_in_order() -> None:
    order: list[str] = []
    serialiser = Serialiser()

    def first(signum: int, _frame: FrameType | None) -> None:
        order.append("first begins")
        nested(signal.SIGUSR1, None)  # what a signal landing here would call
        order.append("first ends")

    def second(signum: int, _frame: FrameType | None) -> None:
        order.append(f"second {signal.Signals(signum).name}")

    nested = serialiser.wrap(second)
    serialiser.wrap(first)(signal.SIGTERM, None)
    assert order == ["first begins", "first ends", "second SIGUSR1"]
    serialiser.wrap(second)(signal.SIGUSR2, None)  # not nested: runs at once
    assert order[-1] == "second SIGUSR2"


def test_a_handler_that_raises_does_not_leave_later_signals_queued_forever() -> None:
    serialiser = Serialiser()
    ran: list[int] = []

    def fails(signum: int, _frame: FrameType | None) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        serialiser.wrap(fails)(signal.SIGTERM, None)
    serialiser.wrap(lambda signum, _frame: ran.append(signum))(signal.SIGINT, None)
    assert ran == [signal.SIGINT]


def test_a_handler_that_installs_the_next_one_keeps_it_serialised() -> None:
    # Celery's first Ctrl-C installs the cold-shutdown handler for the second.
    saved = _restoring(signal.SIGUSR1)
    calls: list[str] = []

    def cold(signum: int, _frame: FrameType | None) -> None:
        calls.append("cold")

    def warm(signum: int, _frame: FrameType | None) -> None:
        calls.append("warm")
        signal.signal(signal.SIGUSR1, cold)

    try:
        signal.signal(signal.SIGUSR1, warm)
        serialise(signal.SIGUSR1)
        installed = signal.getsignal(signal.SIGUSR1)
        assert getattr(installed, "__wrapped__", None) is warm
        signal.raise_signal(signal.SIGUSR1)
        now = signal.getsignal(signal.SIGUSR1)
        assert getattr(now, "__wrapped__", None) is cold
        signal.raise_signal(signal.SIGUSR1)
        assert calls == ["warm", "cold"]
        serialise(signal.SIGUSR1)  # twice: not wrapped again
        assert signal.getsignal(signal.SIGUSR1) is now
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
