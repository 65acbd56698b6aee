"""The suite's compiler cache (tests/compiler_cache.py): real g++, real files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import compiler_cache

SCRIPT = Path(compiler_cache.__file__).resolve()


def _real_gxx() -> str:
    """The system's g++, not the suite's (conftest puts that first on PATH)."""
    real = shutil.which("g++", path=os.defpath)
    if real is None:
        pytest.skip("no g++")
    return real


def _gxx(root: Path | str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``g++ ARGS`` through the cache at ``root`` ("" for none), as the suite's shim runs it."""
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), _real_gxx(), *args],
        cwd=cwd,
        env={"PATH": os.environ["PATH"], compiler_cache.DIR_VAR: str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _log(root: Path) -> list[str]:
    path = root / "log"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_the_same_source_built_in_another_dir_is_copied_and_an_edited_one_is_built(
    tmp_path: Path,
) -> None:
    root, first, second = tmp_path / "cache", tmp_path / "a", tmp_path / "b"
    for d in (root, first, second):
        d.mkdir()
    source = "int answer() { return 42; }\n"
    (first / "k.cpp").write_text(source)
    (second / "k.cpp").write_text(source)
    assert _gxx(root, first, "k.cpp", "-c", "-O1", "-o", "k.o").returncode == 0
    assert _gxx(root, second, "k.cpp", "-c", "-O1", "-o", "k.o").returncode == 0
    assert _log(root) == ["miss", "hit"]
    assert (first / "k.o").read_bytes() == (second / "k.o").read_bytes()
    # Another flag, or another source under the same name: built, not copied.
    assert _gxx(root, second, "k.cpp", "-c", "-O2", "-o", "k.o").returncode == 0
    (second / "k.cpp").write_text("int answer() { return 43; }\n")
    assert _gxx(root, second, "k.cpp", "-c", "-O1", "-o", "k.o").returncode == 0
    assert _log(root) == ["miss", "hit", "miss", "miss"]


def test_a_failing_build_fails_every_time_and_is_never_stored(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (tmp_path / "bad.cpp").write_text("int answer() { return }\n")
    for _ in range(2):
        done = _gxx(root, tmp_path, "bad.cpp", "-c", "-o", "bad.o")
        assert done.returncode != 0 and "error" in done.stderr
    assert _log(root) == []
    assert not (tmp_path / "bad.o").exists()


def test_without_a_cache_dir_or_an_output_the_compiler_answers_itself(tmp_path: Path) -> None:
    version = _gxx(tmp_path / "none", tmp_path, "--version")
    assert version.returncode == 0 and "Free Software Foundation" in version.stdout
    (tmp_path / "k.cpp").write_text("int f() { return 1; }\n")
    off = _gxx(compiler_cache.OFF[compiler_cache.DIR_VAR], tmp_path, "k.cpp", "-c")
    assert off.returncode == 0 and (tmp_path / "k.o").exists()
