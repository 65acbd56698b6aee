"""The README stays true to the code it documents."""

from __future__ import annotations

from pathlib import Path

from compileq.cli import build_parser
from compileq.config import Settings

README = (Path(__file__).parents[1] / "README.md").read_text()


def test_every_setting_is_in_the_readmes_configuration_table() -> None:
    for name in Settings.model_fields:
        assert f"| `COMPILEQ_{name.upper()}` |" in README, name


def test_every_command_is_in_the_readme() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in commands:
        assert f"compileq {command}" in README, command


def test_the_readme_gives_the_two_quickstart_commands_ci_runs() -> None:
    assert "make demo" in README and "make test" in README
    assert "make test" in (Path(__file__).parents[1] / ".ci" / "run").read_text()
