"""Where two cProfile'd runs differ, below one function (``bench.ddp --cprofile`` writes them).

    python -m bench.profile_report SLOW.pstats FAST.pstats [--root NAME] [--top N]
    python -m bench.profile_report --names NAME[,NAME...] FILE.pstats [FILE.pstats ...]

Lists the functions reached from ``--root`` (a function name, default Dynamo's
``call_user_compiler``) by how much longer they took under it, cumulatively, in the first file
than in the second, with their call counts (all calls, from anywhere). With ``--names``: each named function's
whole cumulative time and calls in each file.
"""

from __future__ import annotations

import argparse
import pstats

Func = tuple[str, int, str]


def label(func: Func) -> str:
    path, line, name = func
    short = "/".join(path.split("/")[-2:])
    return f"{name} ({short}:{line})"


def below(stats: pstats.Stats, root: str) -> dict[Func, tuple[int, float]]:
    """Each function's calls and the cumulative seconds it spent under functions named ``root``.

    A function called from under the root and from elsewhere (an import, say) counts only what
    its calls from under the root took: each caller's share of its time under the root is
    passed down its call edges, as gprof does, a few rounds so that recursion settles. (Taking
    every descendant's cumulative time whole, the first version, put all of ``import torch``
    under the compile: importlib's functions are reached from both.)
    """
    table = stats.stats  # type: ignore[attr-defined]
    under: dict[Func, float] = {f: row[3] for f, row in table.items() if f[2] == root}
    roots = set(under)
    order = sorted(table, key=lambda f: -table[f][3])
    for _ in range(8):
        for func in order:
            if func in roots:
                continue
            total = 0.0
            for caller, edge in table[func][4].items():
                share, ct = under.get(caller, 0.0), table[caller][3] if caller in table else 0.0
                if share > 0 and ct > 0:
                    total += edge[3] * min(1.0, share / ct)
            if total > 0:
                under[func] = min(total, table[func][3])
    return {f: (table[f][1], t) for f, t in under.items()}


def named(paths: list[str], names: list[str]) -> None:
    for path in paths:
        table = pstats.Stats(path).stats  # type: ignore[attr-defined]
        print(path)
        for func, row in sorted(table.items(), key=lambda item: -item[1][3]):
            if func[2] in names:
                print(f"  {row[3]:8.3f} s {row[1]:6d} calls  {label(func)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_report", description=__doc__)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--root", default="call_user_compiler")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--names", default=None)
    args = parser.parse_args(argv)
    if args.names:
        named(args.files, args.names.split(","))
        return 0
    if len(args.files) != 2:
        parser.error("give two files: the slow run's and the fast run's")
    args.slow, args.fast = args.files
    a = below(pstats.Stats(args.slow), args.root)
    b = below(pstats.Stats(args.fast), args.root)
    rows = sorted(
        ((a.get(f, (0, 0.0)), b.get(f, (0, 0.0)), f) for f in set(a) | set(b)),
        key=lambda row: row[1][1] - row[0][1],
    )
    print(f"below {args.root}: {args.slow} against {args.fast}")
    print(f"{'+s':>7} {'slow s':>7} {'calls':>6} {'fast s':>7} {'calls':>6}  function")
    for (n_slow, t_slow), (n_fast, t_fast), func in rows[: args.top]:
        print(
            f"{t_slow - t_fast:+7.3f} {t_slow:7.3f} {n_slow:6d} {t_fast:7.3f} {n_fast:6d}  "
            f"{label(func)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
