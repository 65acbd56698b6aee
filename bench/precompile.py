"""Dynamo's caching precompile, tried as a way to start a new machine (issue 14, item 3).

    python -m bench.precompile [--runs A,B] [--out DIR]

torch's experimental ``torch._dynamo.config.caching_precompile`` adds Dynamo's compiled frames
(bytecode, guards, with the AOTAutograd and Inductor output bundled) to the Mega-Cache that
``torch.compiler.save_cache_artifacts`` returns, which compileq's job profiles carry
(inductor/profiles.py). A new machine that loads it would skip Dynamo and AOTAutograd tracing
too. This probe runs stock torch only (no compileq: whether the feature is safe does not
depend on how its blob travels), each run a fresh process on its own cache dirs, the model a
small GPT (``compileq.demo_step.TinyGPT``) trained one step:

* ``cold``, ``cold_precompile``: empty caches; each saves its Mega-Cache;
* ``warm_local``: ``cold``'s own dirs again (a machine that ran the job before);
* ``new_megacache``: empty dirs, ``cold``'s blob loaded first (what compileq profiles do);
* ``new_precompile``: empty dirs, ``cold_precompile``'s blob loaded first, precompile on;
* ``new_precompile_recompile``: the same, then a second batch size (a recompile, as an eval
  pass or a short last batch makes): does the job survive?

Per run: the first step, the process's time from launch to the end of its first step, the
loss, and the error if it failed. Writes ``precompile.json`` and ``precompile.md`` to
``--out`` (default ``$OUT``, else ``bench-out/``), with each run's output as
``precompile-<run>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import ROOT, new_workdir

#: name, precompile, whose blob is loaded, whose dirs are reused, a second batch size
RUNS = (
    ("cold", False, None, None, False),
    ("cold_precompile", True, None, None, False),
    ("warm_local", False, None, "cold", False),
    ("new_megacache", False, "cold", None, False),
    ("new_precompile", True, "cold_precompile", None, False),
    ("new_precompile_recompile", True, "cold_precompile", None, True),
)


def child(args: argparse.Namespace) -> None:
    """One run, in its own process: load a blob, compile, one step (two batch sizes with
    --recompile), save the blob; one JSON line."""
    import torch

    torch._dynamo.config.caching_precompile = args.precompile
    if args.load:
        torch.compiler.load_cache_artifacts(Path(args.load).read_bytes())
    from compileq.demo_step import TinyGPT

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TinyGPT(d=128, layers=2).to(device)
    compiled = torch.compile(model)

    def step(batch: int) -> float:
        data = torch.randint(0, 4096, (batch, 129), generator=torch.Generator().manual_seed(1))
        data = data.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = compiled(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), data[:, 1:].flatten()
        )
        loss.backward()
        return float(loss)

    result: dict[str, Any] = {}
    try:
        started = time.perf_counter()
        result["loss"] = step(8)
        if device == "cuda":
            torch.cuda.synchronize()
        result["first_step_s"] = round(time.perf_counter() - started, 3)
        result["process_s"] = round(time.time() - args.launched, 3)
        if args.recompile:
            result["loss_batch_4"] = step(4)
        result["ok"] = True
    except Exception as e:  # the finding this probe exists to record
        result["ok"] = False
        lines = str(e).strip().splitlines()  # torch 2.11 raises a bare AssertionError
        result["error"] = f"{type(e).__name__}: {lines[-1][:200] if lines else '(no message)'}"
    if args.save and result["ok"]:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            Path(args.save).write_bytes(saved[0])
            result["blob_bytes"] = len(saved[0])
    result["dynamo_cache"] = dict(_counters())
    print(json.dumps(result), flush=True)


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return dict(counters["dynamo_cache"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precompile", description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench-out"))
    parser.add_argument(
        "--runs",
        default=",".join(r[0] for r in RUNS),
        help="which runs, comma-separated (a run loading another's blob needs that run too)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precompile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--recompile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = args.runs.split(",")
    work = new_workdir()
    blobs = work / "blobs"  # each run's Mega-Cache
    blobs.mkdir()
    results: dict[str, dict[str, Any]] = {}
    for name, precompile, load, reuse, recompile in RUNS:
        if name not in chosen:
            continue
        dirs = work / (reuse or name)
        argv_ = [sys.executable, "-m", "bench.precompile", "--child", "--save", str(blobs / name)]
        argv_ += ["--precompile"] if precompile else []
        argv_ += ["--recompile"] if recompile else []
        argv_ += ["--load", str(blobs / load)] if load else []
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(dirs / "inductor"),
            "TRITON_CACHE_DIR": str(dirs / "triton"),
        }
        argv_ += ["--launched", repr(time.time())]
        proc = subprocess.run(argv_, env=env, cwd=ROOT, capture_output=True, text=True)
        (out / f"precompile-{name}.log").write_text(proc.stdout + proc.stderr)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        results[name] = json.loads(lines[-1]) if lines else {"ok": False}
        if not lines:
            results[name]["error"] = proc.stderr.strip().splitlines()[-1][:200]
        print(name, results[name], flush=True)
    meta = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only",
        "torch": torch.__version__,
    }
    (out / "precompile.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    (out / "precompile.md").write_text(render(meta, results))
    print(render(meta, results))
    return 0


def render(meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    warm = results.get("warm_local", {}).get("process_s")
    lines = [
        f"Dynamo caching precompile ({meta['device']}, torch {meta['torch']})",
        "",
        "| run | first step (s) | process to first step done (s) | vs warm local | loss | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        process = r.get("process_s")
        ratio = f"{process / warm:.2f}x" if process and warm else "-"
        outcome = "ok" if r.get("ok") else f"FAILED: {r.get('error', '?')}"
        lines.append(
            f"| {name} | {r.get('first_step_s', '-')} | {process or '-'} | {ratio} "
            f"| {r.get('loss', '-')} | {outcome} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
