"""Results of ``python -m bench`` as markdown tables with ratios and targets, and a PNG chart.

    python -m bench.report results.json [--docs docs/BENCHMARKS.md]

With ``--docs`` the tables replace the section between this run's markers in that file (one
section per device), so a rerun updates the numbers instead of appending.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


#: The issue's first-step targets: (label, compileq run, stock run, most compileq may take).
FIRST_STEP_TARGETS = [
    ("cold, one rank: compileq / stock <= 1.05x", "cq_cold", "stock_cold", 1.05),
    ("new machine: compileq / stock Redis remote <= 0.9x", "cq_new", "stock_remote_new", 0.9),
    ("new machine: within 10% of stock warm local", "cq_new", "stock_warm", 1.1),
    (
        "edited model, new machine: compileq / stock Redis remote <= 0.6x",
        "cq_edit",
        "stock_remote_edit",
        0.6,
    ),
]


def first_step_table(fs: dict[str, Any]) -> tuple[str, list[tuple[str, str, bool]]]:
    m = fs["median_s"]
    rows = [
        ("stock, cold (local process pool)", "stock_cold"),
        ("stock, warm local cache", "stock_warm"),
        ("stock Redis remote cache, filling run", "stock_remote_fill"),
        ("stock Redis remote cache, new machine", "stock_remote_new"),
        ("stock Redis remote cache, new machine, edited model", "stock_remote_edit"),
        ("compileq, cold cluster", "cq_cold"),
        ("compileq, new machine, warm cluster", "cq_new"),
        ("compileq, new machine, edited model", "cq_edit"),
    ]
    lines = [
        f"**{fs['workload']}** (median of the fresh processes under 'all reps': "
        f"{fs['reps']} complete repetitions, then any runs of a repetition cut short; first step = "
        "forward and backward including compilation, then the optimizer step)",
        "",
        "| run | first step (s) | all reps (s) | vs stock cold | loss equal stock |",
        "|---|---|---|---|---|",
    ]
    for label, key in rows:
        if key not in m:  # a half run (``--only``) not merged with its other half
            lines.append(f"| {label} | not run | | | |")
            continue
        equal = fs["loss_equal_stock"].get(key)
        versus = _x(m[key], m["stock_cold"]) if "stock_cold" in m else "-"
        lines.append(
            f"| {label} | {m[key]:.2f} | {', '.join(f'{v:.2f}' for v in fs['all_s'][key])} | "
            f"{versus} | {'-' if equal is None else ('yes' if equal else 'NO')} |"
        )
    # Targets compare both halves: none for a half run not merged with its other half.
    targets = (
        []
        if any(key not in m for _, key in rows)
        else [
            (label, _x(m[ours], m[stock]), m[ours] <= limit * m[stock])
            for label, ours, stock, limit in FIRST_STEP_TARGETS
        ]
    )
    counters = fs.get("counters_last_rep", {})
    if counters:
        lines += ["", "compileq cluster counters, last repetition (deltas per run):", ""]
        for run, delta in counters.items():
            shown = ", ".join(f"{k} {v}" for k, v in sorted(delta.items()) if v) or "none"
            lines.append(f"- {run}: {shown}")
    return "\n".join(lines), targets


def herd_table(h: dict[str, Any]) -> tuple[str, list[tuple[str, str, bool]]]:
    s, c = h["stock"], h["compileq"]
    lines = [
        f"**herd: {h['ranks']} ranks of {h['workload']} start cold at once on one node** "
        f"({h['unique_graphs']} unique graphs, {h['unique_kernels']} kernels per rank)",
        "",
        "| measure | stock | compileq | compileq / stock |",
        "|---|---|---|---|",
        f"| one cold rank alone: launch to first step done (s) | {s['single_rank_done_s']:.2f} | "
        f"{c['single_rank_done_s']:.2f} | {_x(c['single_rank_done_s'], s['single_rank_done_s'])} |",
        f"| all ranks done (s) | {s['all_done_s']:.2f} | {c['all_done_s']:.2f} | "
        f"{_x(c['all_done_s'], s['all_done_s'])} |",
        f"| skew first to last (s) | {s['skew_s']:.2f} | {c['skew_s']:.2f} | |",
        f"| compile CPU-seconds (ranks' process trees; compileq adds its worker's "
        f"{c['worker_cpu_s']:.1f}) | {s['compile_cpu_s']:.1f} | {c['compile_cpu_s']:.1f} | "
        f"{_x(c['compile_cpu_s'], s['compile_cpu_s'])} |",
        f"| graph codegens (per unique graph) | {s['graph_compiles']} "
        f"({s['graph_compiles'] / max(1, h['unique_graphs']):.1f}) | {c['graph_compiles']} "
        f"({c['graph_compiles'] / max(1, h['unique_graphs']):.1f}) | |",
        f"| kernel compiles (per unique kernel) | {s['kernel_compiles']} "
        f"({s['kernel_compiles'] / max(1, h['unique_kernels']):.1f}) | {c['kernel_compiles']} "
        f"({c['kernel_compiles'] / max(1, h['unique_kernels']):.1f}) | |",
        f"| losses equal across ranks | {s['loss_equal']} | {c['loss_equal']} | |",
    ]
    targets = [
        (
            "herd: compile work <= 1/8 of stock's (CPU-seconds)",
            _x(c["compile_cpu_s"], s["compile_cpu_s"]),
            c["compile_cpu_s"] <= s["compile_cpu_s"] / 8,
        ),
        (
            "herd: each unique graph and kernel compiled once",
            f"{c['graph_compiles']} graphs / {h['unique_graphs']}, "
            f"{c['kernel_compiles']} kernels / {h['unique_kernels']}",
            c["graph_compiles"] <= h["unique_graphs"]
            and c["kernel_compiles"] <= h["unique_kernels"],
        ),
        (
            "herd: all ranks done <= 1.1x a single cold stock rank",
            _x(c["all_done_s"], s["single_rank_done_s"]),
            c["all_done_s"] <= 1.1 * s["single_rank_done_s"],
        ),
        ("herd: skew <= 1 s", f"{c['skew_s']:.2f} s", c["skew_s"] <= 1.0),
    ]
    return "\n".join(lines), targets


def scaling_table(sc: dict[str, Any]) -> tuple[str, list[tuple[str, str, bool]]]:
    lines = [
        f"**scaling: the max-autotune MLP's kernels ({sc['manifest']}) built by N worker "
        "processes, cold cluster**",
        "",
        "| workers | kind | kernels | wall (s) | kernels/s | speed-up | efficiency |",
        "|---|---|---|---|---|---|---|",
    ]
    targets = []
    for label, series in sc["series"].items():
        for p in series:
            lines.append(
                f"| {p['workers']} | {label} | {p['kernels']} | {p['wall_s']:.2f} | "
                f"{p['kernels'] / p['wall_s']:.1f} | {p['speedup']:.2f}x | {p['efficiency']:.2f} |"
            )
        last = series[-1]
        targets.append(
            (
                f"scaling {label}: >= 0.7x linear from 1 to {last['workers']}",
                f"{last['efficiency']:.2f}",
                last["efficiency"] >= 0.7,
            )
        )
    return "\n".join(lines), targets


def queue_table(q: dict[str, Any]) -> str:
    h, r = q["hit_path"], q["round_trip"]
    lat = r["latency_ms"] or [float("nan"), float("nan")]
    return "\n".join(
        [
            "**queue overhead**",
            "",
            "| measure | value |",
            "|---|---|",
            f"| stock local hit p50 / p99 ({h['stock_hit_kind']}) | "
            f"{h['stock_hit_ms'][0]:.2f} / {h['stock_hit_ms'][1]:.2f} ms |",
            f"| compileq hit p50 / p99 | {h['compileq_hit_ms'][0]:.2f} / "
            f"{h['compileq_hit_ms'][1]:.2f} ms |",
            f"| compileq / stock hit, p50 | {_x(h['compileq_hit_ms'][0], h['stock_hit_ms'][0])} |",
            f"| batched lookup of 1,000 keys p50 / p99 | {h['lookup_1000_ms'][0]:.1f} / "
            f"{h['lookup_1000_ms'][1]:.1f} ms |",
            f"| no-op compile round trip, one at a time, p50 / p99 | {lat[0]:.2f} / {lat[1]:.2f} ms"
            + (f" (first: {r['first_ms']:.2f} ms, not counted) |" if r.get("first_ms") else " |"),
            f"| no-op compile round trips, burst of {r['burst']} ({r['burst_done']} done) | "
            f"{r['tasks_per_s']:.0f} tasks/s |",
        ]
    )


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    parts = [
        f"Device: {meta['device']}, {meta['cores']} cores; torch {meta['torch']}, "
        f"triton {meta['triton']}; {meta['date']}; command: `{meta['command']}`",
        "",
    ]
    targets: list[tuple[str, str, bool]] = []
    for fs in results.get("first_steps", []):
        text, t = first_step_table(fs)
        parts += [text, ""]
        targets += [(f"{fs['workload']}: {a}", b, c) for a, b, c in t]
    for h in results.get("herd", []):
        text, t = herd_table(h)
        parts += [text, ""]
        targets += t
    if sc := results.get("scaling"):
        text, t = scaling_table(sc)
        parts += [text, ""]
        targets += t
    if q := results.get("queue"):
        parts += [queue_table(q), ""]
    if targets:
        parts += ["**targets**", "", "| target | measured | verdict |", "|---|---|---|"]
        parts += [f"| {a} | {b} | {_met(c)} |" for a, b, c in targets]
    return "\n".join(parts) + "\n"


def chart(results: dict[str, Any], path: Path) -> bool:
    """Draw ``bench.png``; False (and nothing written) without matplotlib, which only the
    ``bench`` extra installs: the tables do not need it."""
    try:
        import matplotlib
    except ImportError:
        print(f"{path} not written: no matplotlib (pip install -e '.[bench]')", file=sys.stderr)
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(results.get("first_steps", [])) + bool(results.get("scaling"))
    panels += bool(results.get("herd"))
    if not panels:
        return False
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    ax_iter = iter(axes[0])
    pairs = [
        ("cold", "stock_cold", "cq_cold"),
        ("new machine", "stock_remote_new", "cq_new"),
        ("edited, new machine", "stock_remote_edit", "cq_edit"),
    ]
    for fs in results.get("first_steps", []):
        ax = next(ax_iter)
        m = fs["median_s"]
        xs = range(len(pairs))
        # A half run (--only) draws its own bars only; a run it lacks is a bar of height 0.
        ax.bar([x - 0.2 for x in xs], [m.get(s, 0.0) for _, s, _ in pairs], 0.4, label="stock")
        ax.bar([x + 0.2 for x in xs], [m.get(c, 0.0) for _, _, c in pairs], 0.4, label="compileq")
        if "stock_warm" in m:
            ax.axhline(m["stock_warm"], ls="--", c="gray", lw=1, label="stock warm local")
        ax.set_xticks(list(xs), [p[0] for p in pairs])
        ax.set_ylabel("first step (s)")
        ax.set_title(f"{fs['workload']}: stock (remote cache) vs compileq")
        ax.legend()
    if results.get("herd"):
        ax = next(ax_iter)
        h = results["herd"][0]
        labels = ["all ranks done (s)", "compile CPU-s / 10"]
        stock = [h["stock"]["all_done_s"], h["stock"]["compile_cpu_s"] / 10]
        ours = [h["compileq"]["all_done_s"], h["compileq"]["compile_cpu_s"] / 10]
        ax.bar([x - 0.2 for x in range(2)], stock, 0.4, label="stock")
        ax.bar([x + 0.2 for x in range(2)], ours, 0.4, label="compileq")
        ax.set_xticks(range(2), labels)
        ax.set_title(f"herd: {h['ranks']} cold ranks of {h['workload']}")
        ax.legend()
    if sc := results.get("scaling"):
        ax = next(ax_iter)
        for label, series in sc["series"].items():
            ns = [p["workers"] for p in series]
            ax.plot(ns, [p["speedup"] for p in series], marker="o", label=label)
        top = max(p["workers"] for s in sc["series"].values() for p in s)
        ax.plot([1, top], [1, top], ls="--", c="gray", lw=1, label="linear")
        ax.set_xlabel("worker processes")
        ax.set_ylabel("speed-up")
        ax.set_title("max-autotune kernels: build scaling")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def update_docs(docs: Path, results: dict[str, Any], body: str) -> None:
    tag = re.sub(r"[^a-z0-9]+", "-", results["meta"]["device"].lower()).strip("-")
    start, end = f"<!-- bench:{tag}:start -->", f"<!-- bench:{tag}:end -->"
    section = f"{start}\n{body}{end}"
    text = docs.read_text()
    if start in text and end in text:
        text = text[: text.index(start)] + section + text[text.index(end) + len(end) :]
    else:
        heading = f"\n## `python -m bench` on {results['meta']['device']}\n\n"
        text = text.rstrip("\n") + "\n" + heading + section + "\n"
    docs.write_text(text)


def merge_runs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table per workload from several invocations on one device: the two halves of a
    repetition (``--only stock`` then ``--only compileq``, back to back) and repetitions made
    in separate calls (one device call holds about one repetition of the GPT). Each run's
    first-step times are pooled and its median taken over them all; a workload's complete
    repetitions are those of its least-run measurement; counters are the last entry's."""
    import statistics

    from bench.scenarios import loss_equal_stock

    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        twin = out.get(entry["workload"])
        if twin is None:
            out[entry["workload"]] = {
                **entry,
                "all_s": {k: list(v) for k, v in entry["all_s"].items()},
                "losses": {k: list(v) for k, v in entry.get("losses", {}).items()},
            }
            continue
        for name, times in entry["all_s"].items():
            twin["all_s"].setdefault(name, []).extend(times)
        for name, losses in entry.get("losses", {}).items():
            twin["losses"].setdefault(name, []).extend(losses)
        twin["counters_last_rep"] = {
            **twin.get("counters_last_rep", {}),
            **entry.get("counters_last_rep", {}),
        }
        for field in ("stock_graphs", "stock_kernels"):
            twin[field] = twin.get(field) if twin.get(field) is not None else entry.get(field)
    for merged in out.values():
        merged["median_s"] = {k: statistics.median(v) for k, v in merged["all_s"].items()}
        merged["reps"] = min(len(v) for v in merged["all_s"].values())
        merged["loss_equal_stock"] = loss_equal_stock(merged["losses"])
    return list(out.values())


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.report")
    parser.add_argument("results", nargs="+", help="results.json files of one device, merged")
    parser.add_argument("--docs", help="update this markdown file (e.g. docs/BENCHMARKS.md)")
    parser.add_argument("--png", help="write the chart here")
    args = parser.parse_args()
    merged: dict[str, Any] = {}
    for path in args.results:  # merge_runs pools a workload's runs over the files
        part = json.loads(Path(path).read_text())
        for key, value in part.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
            elif key == "meta" and "meta" in merged:
                merged["meta"]["command"] += f"; {value['command']}"
            else:
                merged[key] = value
    merged["first_steps"] = merge_runs(merged.get("first_steps", []))
    body = render(merged)
    print(body)
    if args.png:
        chart(merged, Path(args.png))
    if args.docs:
        update_docs(Path(args.docs), merged, body)


if __name__ == "__main__":
    main()
