"""Thirty seconds of the chaos soak (tests/chaos.py) in the suite: whatever the driver breaks,
no job gets a wrong result, fails, or waits past the deadline.

The ten-minute soak and its report are ``make chaos``; this runs the same engine, shorter,
with another seed and its faults drawn closer, so the suite keeps it working. The soak waits
6-14 s between faults and a fault lasts about 5 s (docs/RELIABILITY.md: 40 in 600 s); here
1-3 s, so 30 s draw four or five faults (five with this seed, two jobs through them, 73 s of
the 2-core machine), over the three asserted below. Rejected: 45 s at 2-5 s between (four or
five faults too, 95 s), and the soak's own pace for 75 s: each cost the CPU-bound 30-minute
suite (issue 36) more of two runners' time for no more faults.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos import FAULTS, ROOT, RUNNERS

SECONDS = 30
BETWEEN = "1,3"
SEED = 7


def test_thirty_seconds_of_chaos_give_no_wrong_result_no_failed_job_and_no_overdue_wait(
    tmp_path: Path,
) -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is required in CI (make test installs it)")
        pytest.skip("redis-server not installed (apt-get install redis-server)")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "tests.chaos", "--json", "--workdir", str(tmp_path)),
            *("--seconds", str(SECONDS), "--seed", str(SEED), "--between", BETWEEN),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["jobs"] >= RUNNERS, report
    assert (report["wrong"], report["failed"], report["overdue"]) == (0, 0, 0), report["problems"]
    faults = report["faults"]
    assert len(faults) >= 3, report
    # Every fault drawn was injected for real (a partition without root is skipped, said why).
    assert not [f for f in faults if f["note"].startswith("not injected")], faults
    assert {f["name"] for f in faults} <= set(FAULTS) - set(report["skipped"])
