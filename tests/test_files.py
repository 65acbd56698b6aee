"""compileq._files: a file is replaced whole, with the mode asked for, and no temporary left."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from compileq._files import write_atomically


def test_a_file_written_atomically_replaces_the_old_whole_with_its_mode_and_leaves_no_part(
    tmp_path: Path,
) -> None:
    target = tmp_path / "obj.so"
    write_atomically(target, b"old")
    write_atomically(target, b"new", mode=0o755)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["obj.so"]


def test_a_write_that_fails_leaves_the_old_file_and_no_part(tmp_path: Path) -> None:
    target = tmp_path / "matrix.json"
    write_atomically(target, b"kept")
    with pytest.raises(TypeError):
        write_atomically(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"kept"
    assert [p.name for p in tmp_path.iterdir()] == ["matrix.json"]
