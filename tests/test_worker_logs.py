"""A worker's log (issue 36, item 5): compileq's own lines, not Celery's banner nor exit noise.

It used to open with Celery's 25-line banner and its superuser warning, and to end with about
30 lines of nanobind's "leaked" report for libtriton's objects (kept alive at exit because the
worker froze them for the collector before forking its pool). A real worker, started and
stopped as a deployment does.
"""

from __future__ import annotations

from pathlib import Path

from compileq.localstack import stop
from compileq.workers.process import _quiet_celery
from tests.conftest import Env, start_worker

#: Lines of Celery's banner, its superuser warning, and nanobind's report at exit.
NOISE = (
    "[config]",
    "[queues]",
    "[tasks]",
    ".> transport:",
    "SecurityWarning",
    "superuser privileges",
    "nanobind",
    "leaked",
)


def test_a_workers_log_holds_no_celery_banner_and_no_leak_report_at_exit(
    env: Env, tmp_path: Path
) -> None:
    worker = start_worker(env, tmp_path)
    stop(worker.process, timeout=300)  # SIGTERM: Celery's warm shutdown, then its exit
    assert worker.process.returncode == 0
    text = worker.log.read_text()
    assert [line for line in text.splitlines() if any(n in line for n in NOISE)] == []
    # What the banner said that matters is in compileq's own ready line: the queues.
    (ready,) = [line for line in text.splitlines() if "compileq worker cpu: ready" in line]
    assert "queues compileq." in ready
    assert "heartbeat withdrawn" in text  # it did stop through its shutdown, not a kill


def test_the_banner_stays_for_a_log_asked_for_in_detail() -> None:
    assert _quiet_celery("debug") == []
    assert _quiet_celery("INFO") == ["--quiet"]
