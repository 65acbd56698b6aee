"""The ``reliability`` fixture and docs/RELIABILITY.md, written from what the tests observed.

Each fault or bad-input test records one row: what it injected, what the design promises, what
this run observed (counts and results the test then asserts on) and how many kernels were lost.
``pytest --reliability-report docs/RELIABILITY.md`` (``make reliability``) writes the rows as a
table at the end of the session; tests/test_reliability_doc.py checks that the committed table
lists every fault the suite injects, so the document cannot drift from the tests.
"""

from __future__ import annotations

import platform
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_STASH_ROWS = pytest.StashKey[list["Row"]]()


@dataclass
class Row:
    fault: str
    expected: str
    observed: str
    lost: int
    test: str
    attacker: str = "none (a fault)"
    passed: bool | None = None


class Recorder:
    def __init__(self, rows: list[Row], test: str) -> None:
        self._rows = rows
        self._test = test

    def record(
        self, fault: str, expected: str, observed: str, lost: int, *, attacker: str = ""
    ) -> None:
        """One row; ``observed`` and ``lost`` must come from what the test measured.
        ``attacker``: what someone needs to cause this on purpose (a fault needs nobody)."""
        row = Row(fault, expected, observed, lost, self._test)
        if attacker:
            row.attacker = attacker
        self._rows.append(row)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-report",
        metavar="PATH",
        default=None,
        help="write the faults and bad inputs this run tried, and their outcomes, as Markdown",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STASH_ROWS] = []


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    yield Recorder(request.config.stash[_STASH_ROWS], request.node.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    for row in item.config.stash[_STASH_ROWS]:
        if row.test != item.nodeid:
            continue
        if report.failed:
            row.passed = False
        elif report.when == "call" and row.passed is None:
            row.passed = True
    return report


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(rows: list[Row]) -> str:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    lines = [
        "# Reliability: faults and bad inputs, tried for real",
        "",
        "Written by `make reliability` (`pytest --reliability-report docs/RELIABILITY.md`) from",
        "what the tests observed; do not edit by hand. Every row is one fault or bad input injected",
        "into real processes (redis-server, `compileq worker` subprocesses, Inductor builds). *Lost*",
        "counts requested kernels that did not come back as a correct build, or entries left",
        "corrupt. tests/test_reliability_doc.py checks that this table lists every fault the suite",
        "injects.",
        "",
        f"Run: Python {platform.python_version()}, torch {torch.__version__}, "
        f"Triton {triton_version}, {platform.machine()}.",
        "",
        "| fault or bad input | an attacker needs | expected | observed in this run | lost | test |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        status = {True: "", False: " **FAILED**", None: " (not finished)"}[row.passed]
        name = row.test.split("::", 1)[-1]
        lines.append(
            f"| {_cell(row.fault)} | {_cell(row.attacker)} | {_cell(row.expected)} "
            f"| {_cell(row.observed)}{status} "
            f"| {row.lost} | `{_cell(name)}` |"
        )
    lost = sum(r.lost for r in rows)
    failed = sum(r.passed is not True for r in rows)
    lines += ["", f"{len(rows)} faults and bad inputs; {lost} kernels lost; {failed} failed.", ""]
    return "\n".join(lines)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--reliability-report")
    rows = session.config.stash[_STASH_ROWS]
    if path and rows:
        Path(path).write_text(render(rows) + _later_sections(Path(path)))


def _later_sections(path: Path) -> str:
    """The sections other tools keep after the table (``make chaos``'s "Chaos soak"), kept
    as they are when the table is written again."""
    text = path.read_text() if path.exists() else ""
    at = text.find("\n## ")
    return "\n" + text[at + 1 :] if at >= 0 else ""
