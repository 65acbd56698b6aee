"""What each feature hooks in torch, checked against the release installed (hooks/targets.py):
every target fits on a tested release, everything a feature replaces is one of its declared
targets, and a target that moved (simulated: torch's own function replaced by one with other
parameters, or a target compileq expects and this torch lacks) turns that feature off with
one line while the compile runs, and the other features stay on. Real torch, real
redis-server, real torch.compile in fresh processes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import compileq
from compileq.config import Settings
from compileq.features import FEATURES, survey
from compileq.hooks.ledger import LEDGER
from compileq.hooks.targets import Target, first_misfit
from compileq.ops import doctor
from tests.conftest import Env

#: Features that replace nothing of torch's (the stack-chunk keeper swaps CPython's allocator).
NO_TARGETS = frozenset(("stack-chunks",))


@pytest.mark.release
def test_every_feature_fits_the_torch_installed_here(settings: Settings) -> None:
    states = survey(settings.model_copy(update={"profiles": True, "split_graphs": "gpu"}))
    assert [s for s in states if s.moved] == []
    assert all(s.on for s in states), [s for s in states if not s.on]
    line = doctor._features_check(settings)
    assert line.status == doctor.OK and f"of {len(FEATURES)} on" in line.detail, line


def test_every_feature_but_the_stack_keeper_declares_what_it_hooks() -> None:
    missing = [f.name for f in FEATURES if not f.targets and f.name not in NO_TARGETS]
    assert missing == []


def _resolved(target: Target) -> tuple[Any, str]:
    """The object a target's last name is looked up on, and that name."""
    import importlib

    owner: Any = importlib.import_module(target.module)
    *path, name = target.path.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    return owner, name


def test_every_attribute_a_feature_replaces_is_one_of_its_declared_targets(
    settings: Settings,
) -> None:
    import tests.test_features  # noqa: F401  (imports every module a feature patches first)

    everything = settings.model_copy(update={"fx": True, "profiles": True})
    try:
        assert compileq.install(everything)
        # compileq run's second install() checks each module's targets again, now wrapped:
        # against torch's own functions, not the wrappers (which take *args, **kwargs).
        assert compileq.install(everything)
        assert [(f.name, f.misfit) for f in FEATURES if f.misfit] == []
        declared = {
            f.name: {(id(o), n) for o, n in map(_resolved, f.targets) if hasattr(o, n)}
            for f in FEATURES
        }
        undeclared = [
            f"{e.by}: {e.ident}"
            for e in LEDGER
            if (id(e.owner), e.name) not in declared.get(e.by, set())
        ]
    finally:
        compileq.uninstall()
    assert undeclared == []


def test_a_target_that_is_missing_or_takes_other_parameters_is_a_misfit_said_in_words() -> None:
    module = ModuleType("fake_inductor")

    class Cache:
        @staticmethod
        def save(key: str, entry: object) -> None: ...

    def lookup(key: str, inputs: object) -> None: ...

    module.Cache = Cache  # type: ignore[attr-defined]
    module.lookup = lookup  # type: ignore[attr-defined]
    assert Target("fake_inductor", "Cache.save", ("key", "entry")).misfit(module) is None
    assert Target("fake_inductor", "lookup", ("key",)).misfit(module) is None
    assert Target("fake_inductor", "Cache.load").misfit(module) == (
        "has no fake_inductor.Cache.load"
    )
    assert Target("fake_inductor", "Cache.load", optional=True).misfit(module) is None
    assert Target("fake_inductor", "lookup", ("graph", "inputs")).misfit(module) == (
        "has fake_inductor.lookup(key, inputs, ...), not (graph, inputs, ...)"
    )
    assert Target("no.such.module", "f").misfit() is not None
    # Only loaded modules are checked: a target in one not imported yet waits for its import.
    assert first_misfit((Target("no.such.module", "f"),)) is None


#: A script-defined model compiled under compileq.install(), in a fresh process, after
#: ``BEFORE`` has changed torch (or compileq) the way a moved release would.
SCRIPT = """
import sys, torch
{before}
import compileq
from compileq.hooks.ledger import LEDGER
assert compileq.install(fx=False) is {installs}
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.b(torch.relu(self.a(x))).sum()
torch.manual_seed(0)
net, x = Net(), torch.randn(4, 8)
eager = net(x)
compiled = torch.compile(net)(x)
assert torch.allclose(eager, compiled), (eager, compiled)
print("on:", sorted({{e.by for e in LEDGER}}))
"""


def compile_after(env: Env, tmp: Path, before: str, installs: bool = True) -> tuple[str, str]:
    """Run ``SCRIPT`` with ``before``; its ``on:`` line and its stderr."""
    code = SCRIPT.format(before=textwrap.dedent(before), installs=installs)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env.vars(TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor")),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    on = next((line for line in proc.stdout.splitlines() if line.startswith("on:")), "")
    return on, proc.stderr


def test_a_feature_whose_function_takes_other_parameters_is_off_with_one_line_and_the_rest_on(
    env: Env, tmp_path: Path
) -> None:
    # A release that renamed pad_mm's first parameter: compileq's wrapper would pass the key
    # in the wrong place, so pad-decisions is off; the compile runs, every other feature on.
    on, stderr = compile_after(
        env,
        tmp_path,
        """
        from torch._inductor.fx_passes import pad_mm
        stock = pad_mm.get_cached_should_pad
        def get_cached_should_pad(cache_key):
            return stock(cache_key)
        pad_mm.get_cached_should_pad = get_cached_should_pad
        """,
    )
    said = [line for line in stderr.splitlines() if "pad-decisions off" in line]
    assert len(said) == 1, stderr[-3000:]
    assert "get_cached_should_pad(cache_key" in said[0] and "torch 2." in said[0]
    assert "'pad-decisions'" not in on and "'process-pool'" in on and "'graph-cache'" in on, on


def test_a_torch_without_the_process_pool_compileq_expects_compiles_everything_as_stock(
    env: Env, tmp_path: Path
) -> None:
    # The pool is what every feature rides on: where it moved, compileq stays off entirely.
    on, stderr = compile_after(
        env,
        tmp_path,
        """
        from compileq import features
        from compileq.hooks.targets import Target
        type(features._POOL).targets = (
            Target("torch._inductor.async_compile", "AsyncCompile.process_pool_of_a_later_torch"),
        )
        """,
        installs=False,
    )
    said = [line for line in stderr.splitlines() if "process-pool off" in line]
    assert len(said) == 1 and "has no torch._inductor.async_compile" in said[0], stderr[-3000:]
    assert on == "on: []"


def test_doctor_names_a_feature_whose_target_moved(settings: Settings) -> None:
    feature = next(f for f in FEATURES if f.name == "pad-decisions")
    kept = type(feature).targets
    try:
        type(feature).targets = (Target("torch._inductor.fx_passes.pad_mm", "no_such_function"),)
        line = doctor._features_check(settings)
    finally:
        type(feature).targets = kept
    assert line.status == doctor.WARN
    assert "pad-decisions off: this torch has no torch._inductor.fx_passes.pad_mm" in line.detail


def test_the_releases_ci_runs_are_the_ones_compileq_calls_tested() -> None:
    # One list in three places (doctor's warning, make test's torch, make test-releases'):
    # a release added to one and not the others is caught here.
    import re

    from compileq.hooks.targets import TESTED_TORCH

    root = Path(__file__).resolve().parents[1]
    newest = re.search(r"^torch==(\S+)$", (root / "requirements-torch.txt").read_text(), re.M)
    older = re.search(r"^RELEASES \?= (.+)$", (root / "Makefile").read_text(), re.M)
    assert newest is not None and older is not None
    releases = [*older.group(1).split(), newest.group(1)]
    assert [".".join(r.split(".")[:2]) for r in releases] == list(TESTED_TORCH)
