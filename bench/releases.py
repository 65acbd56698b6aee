"""docs/RELEASES.md's table: compileq's features on each torch release, read off each release's
own code (``compileq.features.survey``: every target each feature hooks, imported and checked),
one interpreter per release.

    python -m bench.releases .venv-torch-2.11.0/bin/python ... .venv/bin/python [--docs docs/RELEASES.md]

Each interpreter runs the survey in a fresh process, with every setting on (profiles, big
graphs in parts) so that a feature off by its setting does not hide a moved target. The table
goes to stdout, and with ``--docs`` between the ``releases-table`` markers of that file.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

_SURVEY = """
import json, torch
from compileq.config import Settings
from compileq.features import survey
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "none"
settings = Settings(secret="s" * 32, profiles=True, split_graphs="gpu")
print(json.dumps({
    "torch": torch.__version__, "triton": triton_version,
    "features": [[s.name, s.on, s.why] for s in survey(settings)],
}))
"""

BEGIN, END = "<!-- releases-table -->", "<!-- /releases-table -->"


def survey(python: str) -> dict[str, Any]:
    proc = subprocess.run(
        [python, "-c", _SURVEY], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{python}: the survey failed:\n{proc.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def render(surveys: list[dict[str, Any]]) -> str:
    releases = [f"{s['torch'].split('+')[0]} (Triton {s['triton']})" for s in surveys]
    names = [name for name, _, _ in surveys[0]["features"]]
    lines = ["| feature | " + " | ".join(releases) + " |", "|---|" + "---|" * len(surveys)]
    for name in names:
        cells = []
        for s in surveys:
            state = next(((on, why) for n, on, why in s["features"] if n == name), None)
            cells.append("-" if state is None else "on" if state[0] else f"off: {state[1]}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.releases", description=__doc__)
    parser.add_argument("pythons", nargs="+", help="one interpreter per torch release")
    parser.add_argument("--docs", default=None, help="a file with the releases-table markers")
    args = parser.parse_args(argv)
    table = render([survey(p) for p in args.pythons])
    print(table)
    if args.docs:
        path = Path(args.docs)
        text = path.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no {BEGIN} ... {END} markers")
        path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{table}{END}", text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
