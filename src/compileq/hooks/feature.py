"""A feature: one thing compileq changes in torch, as one object that knows when it is wanted,
how to enable itself, how to finish after a late import, and how to go away.

``compileq.features`` lists them, in order; ``install()`` walks the list once (each feature
wanted and off is enabled, each wanted and on is hooked again, each on and no longer wanted is
disabled) and ``uninstall()`` walks it backwards. Modelled on dramatiq's ``Middleware`` and its
``default_middleware`` list: the order is visible in one place, and a feature's state (its
client, its store, its replacements in the ledger, its import hooks) is on its object, not in
module globals.

The rejected alternative, module functions ``enable()``/``disable()``/``hook()`` called by hand
from ``install()``, wrote each feature's switches twice (first and later call), forgot one on
uninstall (profiles), and let each module keep its originals its own way (see ``ledger``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from compileq._log import log, warn_once
from compileq.hooks.ledger import Patches
from compileq.hooks.targets import Target, first_misfit, torch_release

if TYPE_CHECKING:  # the boot hook imports this module, and must import neither redis nor pydantic
    from compileq.cache.counters import Counter
    from compileq.cache.store import Entry, RedisStore
    from compileq.config import Settings


@dataclass(frozen=True)
class Context:
    """What ``install()`` hands every feature."""

    settings: Settings
    #: The process's ``KernelClient``. Typed ``Any``: ``hooks`` sits below the scheduler in
    #: the layers contract (pyproject's ``[tool.importlinter]``), and may not name it.
    client: Any
    #: Set in a worker's own FX codegen (``workers/fx.py``): whether a sibling pool process is
    #: free to take what this one sends. None in a client.
    on_worker: Callable[[], bool] | None = None
    #: Set with ``on_worker``: a free sibling reserved for one object this codegen sends and
    #: waits on, while the block runs (yields False where none is: build it here).
    send_slot: Callable[[], AbstractContextManager[bool]] | None = None
    #: Whether FX graph codegen goes to workers (``install(fx=...)``, else ``COMPILEQ_FX``).
    fx: bool = False
    #: The ``CompileqPool`` Inductor gets as its process pool (``Any``: as ``client``).
    pool: Any = None

    @property
    def store(self) -> RedisStore:
        store: RedisStore = self.client.store
        return store

    @property
    def in_worker(self) -> bool:
        return self.on_worker is not None


class Feature:
    """One of compileq's changes to torch. Subclasses say when they are wanted, and what to
    wrap once which module is imported (``imports``); ``enable``/``disable`` add their state.

    A feature is enabled at most once at a time (``install`` keeps track); ``hook`` may come
    any number of times while it is on.
    """

    #: The feature's name: in the ledger (each entry's ``by``) and in the log.
    name: ClassVar[str] = "feature"
    #: What is lost when torch lacks something it wraps, for the log.
    without: ClassVar[str] = ""
    #: What it replaces or calls in torch, as it expects it (``hooks/targets.py``): checked
    #: before it is enabled and as each module loads; one that does not fit turns it off.
    targets: ClassVar[tuple[Target, ...]] = ()

    def __init__(self) -> None:
        self.patches = Patches(self.name, self.without)
        #: The context of the ``install()`` that enabled it; None while it is off.
        self.ctx: Context | None = None
        #: What in this torch is not as the feature expects (the first target found so);
        #: None while every target checked fits. Once set, the feature stays off.
        self.misfit: str | None = None

    @property
    def client(self) -> Any:
        """The enabling context's ``KernelClient``; None while off (``Any``: see Context)."""
        return None if self.ctx is None else self.ctx.client

    def __repr__(self) -> str:
        return f"<feature {self.name}>"

    def entry(self, key: str, unavailable: str) -> Entry | None:
        """The verified store entry under ``key``: None where there is none, this feature is
        off, or Redis is away (said once per ``unavailable``, the log's name for what is lost).
        """
        import redis  # here, not at start-up (see above)

        client = self.client
        if client is None or client.redis_down():
            return None
        try:
            found: Entry | None = client.store.get_many([key])[0]
        except redis.RedisError as e:
            warn_once(unavailable, "compileq: %s unavailable (%s)", unavailable, e)
            return None
        return found

    def count(self, counter: Counter) -> None:
        """Count one ``counter`` in the store; a count may be lost (Redis away or failing),
        never a compile."""
        client = self.client
        if client is None or client.redis_down():
            return
        try:
            client.store.count({counter: 1})
        except Exception as e:
            log.debug("compileq: %s not counted (%s)", counter.value, e)

    def wanted(self, ctx: Context) -> bool:
        """Whether ``install()`` with this context wants the feature on."""
        return True

    def imports(self) -> Mapping[str, Callable[[Any], None]]:
        """Module name -> the function that wraps what this feature needs there. Each is run
        now if its module is imported, else once it is; and again at each ``hook``. It must
        check that what it wraps is defined (the module may still be loading) and may run
        twice (the ledger wraps an attribute once per feature)."""
        return {}

    def enable(self, ctx: Context) -> None:
        """Turn the feature on. Subclasses set their own state first, then call this."""
        self.ctx = ctx
        self.hook()

    def hook(self) -> None:
        """Finish what ``enable`` could not: ``install()``'s second call under ``compileq
        run`` comes once ``compile_fx`` has loaded, and a module that was still loading at
        the first call (its function found nothing to wrap, and returned) is complete now."""
        for module in self.imports():
            self.patches.after_import(module, self._patch_module)

    def _patch_module(self, module: Any) -> None:
        """``imports()``'s function for ``module``, once the targets there fit."""
        if self.misfit is not None or not self.fits(frozenset((module.__name__,))):
            return
        patch = self.imports().get(module.__name__)
        if patch is not None:
            patch(module)

    def fits(self, modules: frozenset[str] | None = None) -> bool:
        """Whether every target checked so far fits (those whose module has loaded, and is in
        ``modules`` where given). The first that does not turns the feature off for the
        process: said once, its replacements taken away; the other features stay on."""
        if self.misfit is None:
            problem = first_misfit(self.targets, modules)
            if problem is not None:
                self.misfit = problem
                lost = f"; {self.without}" if self.without else ""
                warn_once(
                    f"misfit-{self.name}",
                    "compileq: %s off: torch %s %s%s",
                    self.name,
                    torch_release(),
                    problem,
                    lost,
                )
                self.patches.undo()
        return self.misfit is None

    def disable(self) -> None:
        """Turn the feature off: its import hooks cancelled, its replacements taken out of
        the ledger (other features' stay). Subclasses clear their own state after this."""
        self.patches.undo()
        self.ctx = None
