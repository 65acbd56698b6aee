"""``compileq run`` with a Python that cannot import compileq (issue 36, item 4).

Every Python of the job runs compileq's start-up hook (``_boot/sitecustomize.py``, through
PYTHONPATH), also one compileq is not installed for. It used to say only ``compileq: no profile
prefetch: No module named 'compileq'``, as if compileq ran and a prefetch failed; it says now
that compileq is not active there, and why. A real venv without compileq, a real job.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import compileq
from tests.conftest import Env, compileq_cmd


def test_a_python_without_compileq_is_told_compileq_is_not_active_there_and_runs_as_is(
    env: Env, tmp_path: Path
) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    assert subprocess.run([python, "-c", "import compileq"], capture_output=True).returncode
    proc = subprocess.run(
        compileq_cmd("run", "--", str(python), "-c", "print('the job ran')"),
        env=env.vars(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "the job ran\n"
    installed = Path(compileq.__file__).parent.parent
    assert proc.stderr.splitlines() == [
        f"compileq: not active in this process: {python} cannot import compileq (it is "
        f"installed under {installed}, for another Python); run the job with that Python, or "
        "install compileq into this one"
    ]
