"""The life of one job on a worker, whatever its kind (Triton, FX, C++, tuning).

A worker process holds one ``WorkerContext``, set before Celery forks its pool. Each task is
admitted first (``admit``: a malformed key or one already stored needs no work, a job whose
signature or key fails is refused), its job opened from the store (``open_job``) and, however
it ends, settled (``settle``): its job and lease dropped and every waiting client told.
Each job kind's module (``triton``, ``fx``, ``cpp``, ``tune``) does only its own work in between.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import redis

from compileq import keys
from compileq._log import log
from compileq.cache import building
from compileq.cache.counters import Counter, Reason
from compileq.cache.envelope import open_sealed
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.errors import CompileqError, IntegrityError, ToolchainMismatch
from compileq.fingerprint import FxToolchain, Target, Toolchain
from compileq.scheduler import leases
from compileq.tasks.events import Done, announce
from compileq.tasks.portable import StandInCalled
from compileq.workers.fx_slots import FxSlots


@dataclass
class WorkerContext:
    settings: Settings
    store: RedisStore
    toolchains: dict[Target, Toolchain]
    #: FX targets (fingerprint.fx_target) this worker generates code for, with its toolchain.
    fx_toolchains: dict[str, FxToolchain] = field(default_factory=dict)
    worker_id: str = "worker"
    #: Which pool processes are generating graphs. The default, one slot, is a worker of one
    #: process: no sibling is ever free, so codegen builds its kernels in place.
    fx_slots: FxSlots = field(default_factory=lambda: FxSlots(1))
    #: The FX toolchains the main process found after the pool forked (workers.late_fx): a pool
    #: process finds them itself, once, when it first meets a target it does not know.
    late_fx: Callable[[], dict[str, FxToolchain]] | None = None
    #: The model of the one GPU this worker is pinned to (it times autotuning candidates on
    #: it, see workers/tune.py); None for a --cpu-only worker.
    gpu_name: str | None = None

    def toolchain(self, target: Target | None) -> Toolchain:
        """This worker's toolchain for a job's kernel ``target``; refuses a target it lacks."""
        toolchain = self.toolchains.get(target) if target else None
        if target is None or toolchain is None:
            raise ToolchainMismatch(f"this worker does not build for target {target}")
        return toolchain

    def fx_toolchain(self, target: str) -> FxToolchain | None:
        if target not in self.fx_toolchains and self.late_fx is not None:
            late, self.late_fx = self.late_fx, None
            self.fx_toolchains.update(late())
        return self.fx_toolchains.get(target)


_context: WorkerContext | None = None


def configure(context: WorkerContext) -> None:
    """Set by the worker process before Celery forks its pool (children inherit it)."""
    global _context
    _context = context


def context() -> WorkerContext:
    if _context is None:
        raise CompileqError("worker context not configured (run through `compileq worker`)")
    return _context


def already_done(ctx: WorkerContext, key: object, kind: str) -> str | None:
    """The outcome of a task that needs no build: a malformed key (rejected), or an entry
    already stored (a duplicate delivery, or a client that built it while this waited)."""
    if not isinstance(key, str) or not key.startswith(keys.artifact(kind, "")):
        return reject(ctx, repr(key)[:200], f"malformed task message: expected a {kind} key")
    if ctx.store.get_many([key])[0] is not None:
        settle(ctx.store.client, key)
        return "cached"
    return None


J = TypeVar("J")


def admit(
    key: object, kind: str, load: Callable[[WorkerContext, str], J]
) -> tuple[WorkerContext, str, J] | str:
    """``(context, key, job)`` for a task this worker must run, or the outcome of one it need
    not (malformed, already stored, or a job it refuses: see ``already_done`` and ``reject``).
    ``load`` opens and checks the job; it raises CompileqError or ValueError to refuse it."""
    ctx = context()
    if (outcome := already_done(ctx, key, kind)) is not None:
        return outcome
    assert isinstance(key, str)
    try:
        return ctx, key, load(ctx, key)
    except (CompileqError, ValueError) as e:
        return reject(ctx, key, str(e))


def open_job(ctx: WorkerContext, key: str) -> bytes:
    """The verified bytes of the job stored for ``key`` (any kind); counted and refused if its
    signature fails, since building it means running what it contains."""
    raw = ctx.store.read_bounded([keys.job(key)])[0]
    if raw is None:
        raise CompileqError("job spec missing (expired, or never written by a client)")
    if isinstance(raw, int):  # never read: a client's jobs are sealed under the cap
        ctx.store.count({Counter.INTEGRITY_FAILURES: 1})
        raise CompileqError("job spec rejected: over the size cap, or not a string")
    try:
        return open_sealed(
            ctx.settings.secret_bytes(), keys.job(key), raw, ctx.settings.max_entry_bytes
        )
    except IntegrityError as e:
        ctx.store.count({Counter.INTEGRITY_FAILURES: 1})
        raise CompileqError(f"job spec rejected: {e}") from e


def reject(ctx: WorkerContext, key: str, reason: str) -> str:
    """Refuse a task that is malformed or not ours; whoever waits on it is told at once."""
    log.error("compileq worker: rejected task %s: %s", key, reason)
    ctx.store.count({Counter.REJECTED_TASKS: 1})
    if key.startswith(keys.ARTIFACT):
        with contextlib.suppress(redis.RedisError):
            settle(ctx.store.client, key, reason)
    return "rejected"


#: How often a worker signs a building job's lease again, within these bounds: a third of
#: its lifetime (the sender's deadline and a second: scheduler/roundtrip.lease_ms).
_KEEP_EVERY_S = (0.5, 20.0)


@contextlib.contextmanager
def keeping_lease(key: object) -> Iterator[None]:
    """Keep alive, while this task runs, the lease of the client that sent ``key``'s job, and
    this worker's mark on it (cache/building.py: a client past its deadline waits on for a
    job a live worker is building, rather than compiling it again beside it).

    The sender's lease outlives its own wait by a second, and nothing renewed it while a
    worker built: a build slower than that (a loaded worker, a big graph) let the next
    process asking for the key find no lease, send the job again and have it generated
    twice. Seen with three pytest processes on two cores: a lazy backward compile sent the
    backward already sent ahead, 79 s after it, while the worker was 79 s into its codegen
    (3 codegens for 2 graphs; 7 for 6 under DDP). Now the worker signs the lease again every
    third of its lifetime until the task ends; a worker that dies stops, and the lease lapses
    as before. Rejected alternatives: the worker taking the lease as its own (the sender's
    release and orphan handling go by its owner id); a longer lease from the sender (a
    sender that dies before its job is sent would hold the key that much longer)."""
    if _context is None or not isinstance(key, str) or not key.startswith(keys.ARTIFACT):
        yield
        return
    client, secret = _context.store.client, _context.settings.secret_bytes()
    worker = _context.worker_id
    # Kernels are waited for by the kernel client's listener, which never reads marks.
    marking = not key.startswith(keys.artifact("triton", ""))
    done = threading.Event()
    marked = threading.Event()

    def keep() -> None:
        # The first mark and renewal after the shortest period, not at once: most builds (a
        # Triton kernel, a stored entry found again) end first and cost no Redis call here.
        low, high = _KEEP_EVERY_S
        lease_due = time.monotonic() + low
        pause = low
        while not done.wait(pause):
            with contextlib.suppress(redis.RedisError):
                if marking:
                    building.mark(client, key, secret, worker)
                    marked.set()
                if time.monotonic() >= lease_due:
                    ttl_ms = leases.extend(client, key, secret)
                    every = min(max(ttl_ms / 3000, low), high) if ttl_ms else low
                    lease_due = time.monotonic() + every
            until_lease = max(lease_due - time.monotonic(), low)
            pause = min(building.EVERY_S, until_lease) if marking else until_lease

    keeper = threading.Thread(target=keep, name="compileq-lease-keeper", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        done.set()
        keeper.join(timeout=1.0)
        if marked.is_set():  # settle dropped it; a renewal may have raced that
            with contextlib.suppress(redis.RedisError):
                building.unmark(client, key)


def settle(
    client: redis.Redis, key: str, error: str | None = None, reason: Reason | None = None
) -> None:
    """End a task (built, failed or rejected): drop its job and lease, then tell every waiting
    client how it went: for a failure, ``error`` to log and the ``reason`` it counts under
    (the worker's own error unless said otherwise)."""
    client.delete(keys.lock(key), keys.job(key), keys.building(key))
    if error is not None and reason is None:
        reason = Reason.WORKER_ERROR
    announce(client, Done(key, error is None, error, reason))


def failed(client: redis.Redis, key: str, error: BaseException, limit: int = 2000) -> None:
    """``settle`` for a job whose build raised ``error``: its type and message for the client's
    log, and the reason it falls back for, decided here from the exception itself."""
    settle(client, key, f"{type(error).__name__}: {error}"[:limit], failure_reason(error))


def failure_reason(error: BaseException) -> Reason:
    """``unimportable`` when the job needed the client's own code, not only its name: a
    stand-in of a client class was called (``tasks/portable.py``), a module of the client's
    is not importable here, or the unpickler found no such attribute in a module that is;
    else ``worker-error``. The exception and the ones it was raised from are looked at, since
    Inductor wraps what a lowering raised in its own exception types.

    Rejected alternative (what this replaced): the client searching the error's text for
    marks. The text is whatever Inductor's wrapper makes of it, and the client only has it
    from Redis; the type is known only here."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StandInCalled | ImportError) or _missing_attribute(current):
            return Reason.UNIMPORTABLE
        current = current.__cause__ or current.__context__
    return Reason.WORKER_ERROR


def _missing_attribute(error: BaseException) -> bool:
    """The unpickler's own error for a class or function its module lacks (pickle raises a
    plain AttributeError, told apart only by the words CPython gives it)."""
    return isinstance(error, AttributeError) and str(error).startswith("Can't get attribute")
