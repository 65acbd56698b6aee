"""docs/RELIABILITY.md stays the record of what the suite injects (`make reliability`)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
DOC = TESTS.parent / "docs" / "RELIABILITY.md"


def recording_calls() -> list[tuple[Path, ast.Call]]:
    """Every ``reliability.record(...)`` call in the tests, with its file."""
    calls = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "record"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "reliability"
            ):
                calls.append((path, node))
    return calls


def injected_faults() -> set[str]:
    """The fault named by every ``reliability.record("...", ...)`` call in the tests."""
    faults = set()
    for path, node in recording_calls():
        first = node.args[0] if node.args else None
        assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
            f"{path.name}:{node.lineno}: name the fault with a string literal"
        )
        faults.add(first.value)
    return faults


def reliability_targets() -> set[str]:
    """The test files ``make reliability`` runs (the Makefile's ``RELIABILITY_TESTS``)."""
    text = (TESTS.parent / "Makefile").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("RELIABILITY_TESTS"))
    return {Path(word).name for word in line.split(":=", 1)[1].split()}


def documented_rows() -> list[list[str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| fault or bad input"):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_reliability_table_lists_every_fault_the_suite_injects_and_nothing_else() -> None:
    faults = injected_faults()
    assert len(faults) >= 15
    documented = {row[0].replace("\\|", "|") for row in documented_rows()}
    assert faults - documented == set(), "run `make reliability` to regenerate the table"
    assert documented - faults == set(), "the table lists faults no test injects any more"


def test_make_reliability_runs_every_test_file_that_records_a_fault() -> None:
    # A file left out of the Makefile's list drops its rows from the regenerated table, and
    # the check above then fails in CI (tests/test_poisoning_starvation.py, split out of
    # tests/test_poisoning.py, was left out so).
    recording = {path.name for path, _ in recording_calls()} - {Path(__file__).name}
    assert recording - reliability_targets() == set()


def test_the_reliability_table_shows_nothing_lost_and_nothing_failed() -> None:
    for row in documented_rows():
        fault, _attacker, _expected, observed, lost, _test = row
        assert lost == "0", fault
        assert "FAILED" not in observed and "not finished" not in observed, fault
