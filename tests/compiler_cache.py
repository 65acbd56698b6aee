"""The suite's compiler cache: ``g++`` for every process the tests start, which runs the real
compiler once per distinct command and copies its output for every later equal one.

Why: the suite's real jobs build about 560 C++ objects (Inductor's CPU kernels, the probes,
the precompiled headers), over 1,000 CPU-s of the 2-core CI machine's 2,500, and most of them
again and again: tests wipe Redis between them, so each cold test's worker rebuilds what the
test before it built. What compileq counts (a worker built it, the client did not) does not
change: the worker still runs ``g++``; only ``g++`` answers from this cache. It lives in a
directory made for one ``make test`` and removed after it, so every run of the suite still
compiles everything once. ``COMPILEQ_TEST_CXX_CACHE=0`` turns it off.

A command's key is its words, with the output path (the word after ``-o``) left out and every
word naming a file replaced by a hash of that file's bytes; plus the real compiler's path,
size and time, and the environment variables the compiler reads. So the same source built
in another temporary dir (a worker builds in a fresh one for each job, a client in its own
Inductor dir) is one entry, and an edited source or header passed on the command line is
another. Headers found through ``-I`` are not hashed: they are torch's and the system's,
which do not change during a run.

Only a command that exits 0 and writes its output is stored, so a failing build fails as it
would. Rejected: Debian's ``ccache``, which treats Inductor's one-step compile-and-link
(``x.cpp -shared -o x.so``) as a link and never caches it, and refuses its precompiled
headers.

Run as ``python -I -S compiler_cache.py REAL_COMPILER ARGS...`` by the ``g++`` script that
``tests/conftest.py`` writes: standard library only, since ``-S`` skips site-packages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile

#: The cache's directory. Not a ``COMPILEQ_`` name: the tests' process environments drop
#: those (``Env.vars``), and this must reach every process a test starts.
DIR_VAR = "SUITE_CXX_CACHE_DIR"

#: For a process whose compiles must take their real time (a test of what happens while a
#: worker is still probing its CPU): its ``g++`` runs the compiler every time.
OFF = {DIR_VAR: ""}

#: Environment variables GCC reads that change what it builds.
_COMPILER_ENV = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "SOURCE_DATE_EPOCH",
)

#: Outputs above this are built every time rather than copied (a precompiled header is
#: 155 MB; copying it is still far cheaper than building it, but the cache dir is in /tmp).
_MAX_ENTRY_BYTES = 512 * 2**20


def key(compiler: str, args: list[str]) -> str | None:
    """The command's key, or None where it is not cached (no ``-o``, a version query)."""
    if "-o" not in args[:-1] or any(a in ("--version", "-v", "-###", "-") for a in args):
        return None  # no output to keep (or a malformed line g++ itself should answer)
    h = hashlib.sha256()
    st = os.stat(compiler)
    h.update(f"{os.path.realpath(compiler)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for name in _COMPILER_ENV:
        h.update(f"{name}={os.environ.get(name, '')}\0".encode())
    skip = False
    for word in args:
        if skip:
            h.update(b"<out>\0")
            skip = False
        elif word == "-o":
            h.update(b"-o\0")
            skip = True
        elif os.path.isfile(word):
            with open(word, "rb") as f:
                h.update(b"<file " + hashlib.sha256(f.read()).digest() + b">\0")
        else:
            h.update(word.encode() + b"\0")
    return h.hexdigest()


def main(argv: list[str]) -> int:
    compiler, args = argv[0], argv[1:]
    root = os.environ.get(DIR_VAR, "")
    k = key(compiler, args) if root else None
    if k is None:
        os.execv(compiler, [compiler, *args])
    out = args[args.index("-o") + 1]
    entry = os.path.join(root, k[:2], k)
    if os.path.isfile(entry):
        _copy(entry, out)
        _log(root, "hit", k)
        return 0
    import subprocess  # here, not at the top: a hit never needs it, and every hit imports this

    done = subprocess.run([compiler, *args])
    if done.returncode == 0 and os.path.isfile(out) and os.path.getsize(out) <= _MAX_ENTRY_BYTES:
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        _copy(out, entry)
        _log(root, "miss", k)
    return done.returncode


def _copy(src: str, dst: str) -> None:
    """Copy through a temporary name and rename, so no reader sees half a file (two processes
    may build or read the same entry at once; the last rename wins, and both are equal)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dst)), prefix=".cxx-")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise


def _log(root: str, what: str, k: str) -> None:
    with open(os.path.join(root, "log"), "a") as f:
        f.write(f"{what} {k[:16]}\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
