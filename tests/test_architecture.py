"""The architecture contract (pyproject's ``[tool.importlinter]``, docs/DESIGN.md) holds, and
would catch the two ways a house like this decays: an import that runs back up the layers, and
a circle between two modules of one package.

The contract is checked against the real source, and against a copy of it with one bad import
planted, so that a contract that stopped checking anything (a typo in a layer's name, a layer
import-linter silently skips) fails here rather than passing for ever.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists() and not os.environ.get("CI"),
    reason="import-linter is not installed (the dev extra has it; CI requires it)",
)


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's own contract, over the package under ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src" / "compileq", tmp_path / "src" / "compileq")
    return tmp_path


def _plant(tree: Path, module: str, line: str) -> None:
    path = tree / "src" / Path(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_source_keeps_the_architecture_contract() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " kept, 0 broken." in result.stdout


def test_the_contract_names_every_package_of_compileq_in_its_layers() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    packages = {
        f"compileq.{p.name}"
        for p in (ROOT / "src" / "compileq").iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }
    assert packages <= named, packages - named


@pytest.mark.parametrize(
    ("module", "planted", "reported"),
    [
        # upward: the store importing the worker side
        (
            "compileq.cache.store",
            "import compileq.workers.heartbeat",
            "compileq.cache.store -> compileq.workers.heartbeat",
        ),
        # a circle inside one package, invisible to the layers: client imports leases
        (
            "compileq.scheduler.leases",
            "import compileq.scheduler.client",
            "No cycles are allowed in compileq.scheduler",
        ),
    ],
    ids=["an-upward-import", "a-circle-in-one-package"],
)
def test_a_planted_bad_import_breaks_the_contract(
    tmp_path: Path, module: str, planted: str, reported: str
) -> None:
    tree = _copy(tmp_path)
    _plant(tree, module, planted)
    result = _lint(tree)
    assert result.returncode != 0
    assert reported in result.stdout
