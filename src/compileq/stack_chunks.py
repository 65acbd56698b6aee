"""Python's frame stack, kept instead of unmapped and mapped again at every call.

Since 3.11 CPython keeps its frames on a stack of 16 KiB chunks that it takes from and gives
back to the *arena allocator* (``mmap`` and ``munmap``) as the stack grows past a chunk and
shrinks below it. A call made over and over right at a chunk's boundary, as compiler passes
walking a graph make them, maps and unmaps a chunk on every call: a page fault, two system calls
and a TLB flush each time. In a two-rank DDP compile on the CPU (``python -m bench.ddp
--strace``) the ranks made 640,715 ``mmap`` calls, nearly all for a 16 KiB chunk unmapped again;
rank 0's joint-graph passes took 2.02 s, 0.48 s with the chunks kept, and its partitioner 1.20
s, 0.33 s (docs/BENCHMARKS.md). Where the boundary falls depends only on how deep the compile
runs: the same passes cost compileq's ranks, whose hooks reach AOTAutograd at another depth,
more than stock's, and under cProfile, which slows every call, the difference drowned.

:func:`keep` puts a small allocator in front of the arena allocator (``PyObject_SetArenaAllocator``,
public C API since 3.4): up to :data:`KEPT` freed blocks of at most 64 KiB (stack chunks; the
object allocator's arenas are 1 MiB and still go back) are kept and handed out again; any other
request goes to the allocator it replaced. At most 1 MiB stays mapped. The allocator is a few
lines of C, compiled once per machine and Python with the C compiler torch.compile needs anyway
(Triton builds its launchers with it), under a temporary name renamed into place; without a
compiler, or if anything fails, nothing changes. Once in place it stays for the process's life
(``uninstall()`` leaves it: it changes no result, only how often chunks are mapped).

Rejected alternatives: ``PYTHONMALLOC`` and glibc's ``MALLOC_*`` tunables (the arena allocator
bypasses both: measured, no change) and ctypes callbacks (Python code cannot run while the
interpreter pushes a frame).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from compileq._log import log
from compileq._private_dir import private_dir

#: Blocks kept at most (16 KiB chunks: 256 KiB; the C code never keeps more than 1 MiB).
KEPT = 16

_SOURCE = r"""
#include <stddef.h>
typedef struct {
    void *ctx;
    void *(*alloc)(void *ctx, size_t size);
    void (*free)(void *ctx, void *ptr, size_t size);
} ArenaAllocator;
extern void PyObject_GetArenaAllocator(ArenaAllocator *allocator);
extern void PyObject_SetArenaAllocator(ArenaAllocator *allocator);

#define KEPT @KEPT@
#define KEEP_AT_MOST (64 * 1024)
static ArenaAllocator original;
static struct { void *ptr; size_t size; } kept[KEPT];
static int n_kept, installed;
static char lock;
static unsigned long long reused;

/* The interpreter calls these holding its lock; a free-threaded build, or interpreters with
   locks of their own, may not: a spin lock, held for a few instructions. */
static void take(void) { while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE)) {} }
static void give(void) { __atomic_clear(&lock, __ATOMIC_RELEASE); }

static void *keeping_alloc(void *ctx, size_t size) {
    (void)ctx;
    take();
    for (int i = n_kept - 1; i >= 0; i--) {
        if (kept[i].size == size) {
            void *ptr = kept[i].ptr;
            kept[i] = kept[--n_kept];
            reused++;
            give();
            return ptr;
        }
    }
    give();
    return original.alloc(original.ctx, size);
}

static void keeping_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if (ptr != NULL && size <= KEEP_AT_MOST) {
        take();
        if (n_kept < KEPT) {
            kept[n_kept].ptr = ptr;
            kept[n_kept].size = size;
            n_kept++;
            give();
            return;
        }
        give();
    }
    original.free(original.ctx, ptr, size);
}

int compileq_keep_stack_chunks(void) {
    if (installed) return 0;
    PyObject_GetArenaAllocator(&original);
    ArenaAllocator keeping = {NULL, keeping_alloc, keeping_free};
    PyObject_SetArenaAllocator(&keeping);
    installed = 1;
    return 1;
}

unsigned long long compileq_stack_chunks_reused(void) { return reused; }
""".replace("@KEPT@", str(KEPT))

_lock = threading.Lock()
_library: ctypes.PyDLL | None = None


def keep() -> bool:
    """Keep freed stack chunks in this process (and in processes it forks after); whether
    they are kept now. Never raises."""
    global _library
    if sys.version_info < (3, 11):  # no chunked frame stack before 3.11
        return False
    with _lock:
        if _library is not None:
            return True
        try:
            # PyDLL: its calls hold the interpreter's lock, so no other thread allocates while
            # the allocator is swapped (ctypes.CDLL would release it around the call).
            library = ctypes.PyDLL(str(_built()))
            library.compileq_stack_chunks_reused.restype = ctypes.c_ulonglong
            library.compileq_keep_stack_chunks()
        except Exception as e:  # a compile may be slower, never failed
            log.info("compileq: Python's stack chunks not kept (%s)", e)
            return False
        _library = library
    return True


def reused() -> int:
    """Chunks handed out again instead of mapped (0 where :func:`keep` did not install)."""
    return int(_library.compileq_stack_chunks_reused()) if _library is not None else 0


def _built() -> Path:
    """The shared library, compiled once per machine, Python and compiler."""
    compiler = _compiler()
    digest = hashlib.sha256(
        "\0".join([_SOURCE, sys.version, sys.platform, os.uname().machine, *compiler]).encode()
    ).hexdigest()[:16]
    where = private_dir(f"compileq-{os.getuid()}")  # a library loaded from here runs in-process
    path = where / f"stack-chunks-{digest}.so"
    if path.exists():
        return path
    # Built under a name of its own and renamed into place: ranks starting together each build
    # one, and none loads another's half-written file.
    with tempfile.TemporaryDirectory(prefix=".stack-chunks-", dir=where) as tmp:
        source, built = Path(tmp, "keep.c"), Path(tmp, "keep.so")
        source.write_text(_SOURCE)
        subprocess.run(
            [*compiler, "-O2", "-shared", "-fPIC", "-o", str(built), str(source)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        os.replace(built, path)
    return path


def _compiler() -> list[str]:
    """``$CC``, else the compiler Python was built with, else ``cc``, ``gcc`` or ``clang``."""
    for candidate in (os.environ.get("CC"), sysconfig.get_config_var("CC")):
        if candidate and shutil.which(shlex.split(candidate)[0]):
            return shlex.split(candidate)[:1]
    for name in ("cc", "gcc", "clang"):
        if found := shutil.which(name):
            return [found]
    raise FileNotFoundError("no C compiler ($CC, cc, gcc, clang)")
