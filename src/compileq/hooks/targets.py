"""What a feature hooks in torch or Triton, named, and checked against the release installed.

compileq replaces about forty functions, methods and flags inside Inductor, AOTAutograd,
Dynamo and Triton, none of them public API; each release moves some. A :class:`Target` names
one of them as a feature expects it: the module, the attribute path inside it and, for a
function compileq wraps or calls, the leading parameters it passes or reads by position. A
feature lists its targets (``Feature.targets``); before it is enabled, and again once each of
its modules has finished importing, the targets are checked (:meth:`Target.misfit`). One that
does not fit turns that feature off with one line naming the release and the target, and the
job runs as stock there; the other features stay on. So a torch newer than the newest tested
installs and runs, and what moved is said once instead of failing in the middle of a run.

The rejected alternatives: an upper pin on torch (``<2.14``) refused the release most users had
(2.15.0) though compileq mostly worked there; a table of versions per feature would be right
only for the releases someone tested, and wrong for the next one, which the check reads off the
code that is there. The check reads names and signatures, not behaviour: a function that keeps
its name and parameters and changes what it does is caught by the release tests
(``make test-releases``), not here.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from compileq.hooks.import_hooks import loaded
from compileq.hooks.ledger import ABSENT, LEDGER

#: The releases the suite runs on (``make test`` on the newest, ``make test-releases`` on the
#: others; docs/RELEASES.md). A newer one installs: its targets are checked as any other's.
TESTED_TORCH = ("2.11", "2.12", "2.13", "2.14", "2.15")


@dataclass(frozen=True)
class Target:
    """``module.path`` as a feature expects it: there, and (``leading``) a function whose first
    parameters have these names, in this order (``self`` included for a method)."""

    module: str
    path: str
    leading: tuple[str, ...] = ()
    #: The feature works without it (a release that lacks it, handled where it is used): only
    #: a changed signature is a misfit, its absence is not.
    optional: bool = False

    @property
    def ident(self) -> str:
        return f"{self.module}.{self.path}"

    def misfit(self, module: ModuleType | None = None) -> str | None:
        """What is wrong with this target in the torch installed, in a few words; None where it
        fits. Imports the module unless it is given."""
        if module is None:
            try:
                module = importlib.import_module(self.module)
            except Exception as e:  # a missing or broken module is a misfit, not a crash
                return (
                    None if self.optional else f"has no module {self.module} ({type(e).__name__})"
                )
        found: Any = module
        for part in self.path.split("."):
            owner = found
            try:  # static: a property or descriptor is not run, a staticmethod stays one
                found = inspect.getattr_static(owner, part)
            except AttributeError:
                if not hasattr(owner, part):  # torch's config modules answer __getattr__ only
                    return None if self.optional else f"has no {self.ident}"
                found = getattr(owner, part)
        # torch's own, not another feature's wrapper of it (one that takes *args, **kwargs).
        own = LEDGER.torchs_own(owner, part)
        found = found if own is ABSENT else own  # ABSENT: inherited, not the owner's own
        if isinstance(found, (staticmethod, classmethod)):
            found = found.__func__
        if not self.leading:
            return None
        try:
            params = tuple(inspect.signature(found).parameters)
        except (TypeError, ValueError):
            return f"has {self.ident}, which is not a Python function"
        if params[: len(self.leading)] != self.leading:
            shown = ", ".join(params[: len(self.leading) + 1])
            return f"has {self.ident}({shown}, ...), not ({', '.join(self.leading)}, ...)"
        return None


def first_misfit(targets: tuple[Target, ...], modules: frozenset[str] | None = None) -> str | None:
    """The first target that does not fit, among those whose module has loaded (and is in
    ``modules``, where given); None where all fit or none can be checked yet."""
    for target in targets:
        if modules is not None and target.module not in modules:
            continue
        module = loaded(target.module)
        if module is None:
            continue
        problem = target.misfit(module)
        if problem is not None:
            return problem
    return None


def torch_release() -> str:
    """``2.15.0`` for ``2.15.0+cu132``: the release a line about a misfit names."""
    import torch

    return str(torch.__version__).split("+")[0]


def tested(release: str) -> bool:
    """Whether ``release`` (``2.15.0``) is one the suite runs on."""
    return ".".join(release.split(".")[:2]) in TESTED_TORCH
