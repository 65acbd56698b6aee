"""A directory of this user's under the temporary dir, that no one else can have planted.

compileq keeps things it built once per machine there (Python's stack-chunk keeper, a worker's
precompiled C++ headers) and loads or compiles against them later. The name is predictable
(``/tmp/compileq-<uid>``), so a directory someone else made first, or one others may write
to, or a symlink to elsewhere, could hand this process a library or header of theirs: such a
directory is refused, never used or repaired. The rejected alternative, a fresh random
directory per process, would build the same thing again in every process.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from compileq.errors import UnsafeDirError


def private_dir(name: str) -> Path:
    """``<tempdir>/<name>``, made with mode 0700 if missing; an error if it is a symlink, not
    a directory, not owned by this user, or writable by anyone else."""
    return checked_private(Path(tempfile.gettempdir(), name))


def checked_private(path: Path) -> Path:
    """``path``, made with mode 0700 (its parents as usual) if missing; refused as
    :func:`private_dir` refuses. The local cluster keeps its socket and secret in one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise UnsafeDirError(f"{path} is not a directory")
    if found.st_uid != os.getuid():
        raise UnsafeDirError(f"{path} belongs to uid {found.st_uid}, not to this user")
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirError(f"{path} is writable by others (mode {found.st_mode & 0o777:o})")
    return path
