"""Python's frame stack chunks, kept instead of unmapped at every call (compileq/stack_chunks.py).

Each case runs in a fresh interpreter: the keeper changes the process's arena allocator for good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SECRET

SRC = str(Path(__file__).resolve().parents[1] / "src")

#: Calls whose depth sweeps back and forth over many chunk boundaries, as a compiler pass's
#: recursive walk over a graph does; prints the page faults they cost and what keep() said.
SWEEP = """
import json, resource, sys
from compileq import stack_chunks

kept = stack_chunks.keep() if sys.argv[1] == "keep" else False

def down(n):
    return 0 if n == 0 else 1 + down(n - 1)

def sweep():
    return sum(down(depth) for depth in range(1, 600) for _ in range(20))

sweep()  # the first sweep maps the chunks the stack needs at its deepest
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
total = sweep()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"kept": kept, "faults": faults, "total": total,
                  "reused": stack_chunks.reused()}))
"""


def sweep(mode: str, tmp: Path, **env: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", SWEEP, mode],
        env={**os.environ, "PYTHONPATH": SRC, "TMPDIR": str(tmp), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="no chunked frame stack before 3.11")
def test_calls_across_a_chunk_boundary_reuse_a_kept_chunk_instead_of_mapping_one(
    tmp_path: Path,
) -> None:
    stock = sweep("stock", tmp_path)
    kept = sweep("keep", tmp_path)
    assert kept["kept"] and not stock["kept"]
    assert kept["total"] == stock["total"]  # the same calls, the same results
    # Every crossing mapped a chunk (and faulted its first page in); kept, none did.
    assert stock["faults"] > 2_000, stock
    assert kept["faults"] < stock["faults"] / 20, (kept, stock)
    assert kept["reused"] > 2_000 and stock["reused"] == 0


def test_without_a_c_compiler_nothing_changes_and_nothing_fails(tmp_path: Path) -> None:
    # No compiler on PATH and none in $CC: keep() says no and the program runs on as stock.
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    result = sweep("keep", tmp_path, PATH=str(bare), CC="/nonexistent/cc")
    assert result["kept"] is False and result["reused"] == 0
    assert result["total"] == sum(range(1, 600)) * 20
    assert not list(tmp_path.glob("compileq-*/stack-chunks-*.so"))


def test_processes_starting_together_each_load_a_whole_library(tmp_path: Path) -> None:
    # Ranks of one job start at once on an empty machine: each builds under a name of its own
    # and renames it into place, so none loads a half-written file.
    code = "from compileq import stack_chunks; print(stack_chunks.keep())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": SRC, "TMPDIR": str(tmp_path)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    answers = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert answers == ["True"] * 4
    (built,) = tmp_path.glob("compileq-*/stack-chunks-*.so")
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")]  # no leftovers


def test_install_keeps_the_chunks_unless_told_not_to(tmp_path: Path) -> None:
    code = (
        "import sys, compileq; from compileq.config import Settings; "
        "from compileq import stack_chunks; "
        "compileq.install(Settings(redis_url='redis://127.0.0.1:1/0', secret=sys.argv[1])); "
        "print(stack_chunks._library is not None)"
    )
    for setting, expected in (("1", "True"), ("0", "False")):
        done = subprocess.run(
            [sys.executable, "-c", code, SECRET],
            env={
                **os.environ,
                "PYTHONPATH": SRC,
                "TMPDIR": str(tmp_path),
                "COMPILEQ_KEEP_STACK_CHUNKS": setting,
            },
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        assert done.stdout.strip().splitlines()[-1] == expected, done.stderr[-2000:]


def test_a_library_dir_someone_else_could_have_planted_is_never_loaded_from(
    tmp_path: Path,
) -> None:
    # /tmp/compileq-<uid> made first by someone else, or open to others: a library there could
    # be theirs. keep() refuses it, loads nothing, and the program runs on as stock.
    planted = tmp_path / f"compileq-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    result = sweep("keep", tmp_path)
    assert result["kept"] is False and result["reused"] == 0
    assert list(planted.iterdir()) == [] and planted.stat().st_mode & 0o777 == 0o777


def test_a_private_dir_is_made_for_this_user_alone_and_anything_else_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compileq._private_dir import private_dir
    from compileq.errors import UnsafeDirError

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    made = private_dir("mine")
    assert made == tmp_path / "mine" and made.stat().st_mode & 0o777 == 0o700
    assert private_dir("mine") == made  # found again, as made
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "link").symlink_to(made)
    (tmp_path / "file").write_text("")
    for name, why in (
        ("open", "writable by others"),
        ("link", "not a directory"),
        ("file", "not a directory"),
    ):
        with pytest.raises(UnsafeDirError, match=why):
            private_dir(name)
    if os.getuid() == 0:  # only root can give a directory away to another user
        (tmp_path / "theirs").mkdir(mode=0o700)
        os.chown(tmp_path / "theirs", 12345, -1)
        with pytest.raises(UnsafeDirError, match="belongs to uid 12345"):
            private_dir("theirs")
