"""Files written whole: a reader sees the old file or the new one, never part of either.

Write-then-rename in the file's own directory (``os.replace`` is atomic within one file
system). Rejected: writing in place, where a concurrent reader (Inductor loading a C++
object, another rank reading a memo) meets a half-written file, and a writer stopped midway
(a SIGTERM raising SystemExit inside ``write``) leaves one behind; and ``tempfile.mkstemp``,
whose 0600 file would change the permissions every caller's file had before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """``data`` as ``path``, made executable or otherwise by ``mode``; the temporary file is
    named per process and thread, so concurrent writers of one path never share it."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
