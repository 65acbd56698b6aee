"""Which of the zoo's backwards compileq holds for its forward's strides, read on this machine.

    python -m bench.zoo_padding [--models A,B] [--out DIR]

Each model of bench/zoo_models.py (all by default) is built at ``gpu`` size (batch 2: a
batch is the outermost dimension, so no stride the rule reads changes with it), traced by
Dynamo and AOTAutograd under bf16 autocast as the zoo's training step traces it, and
partitioned as Inductor partitions it; nothing is generated (each forward returns empty
tensors of its outputs' sizes). Each partition's forward is then read as a GPU graph (its
values' device made a GPU's, as fake tensors: no GPU needed) for what decides whether
compileq sends its backward at once or holds it for the strides the forward's worker stores
once lowered (codegen/speculative.py): Inductor's own layout heuristic
(``decide_layout_opt``: a convolution net's channels-last) and the padding rule
(codegen/padding.py). One fresh process per model. Writes ``padding.json`` and
``padding.md`` to ``--out`` (default ``bench-out/padding``).

A CPU trace is not the GPU's own (attention kernels, some decompositions differ): the GPU
zoo's counters (``fx_held_for_padding``, ``fx_held_not_padded``, codegens against graphs)
are the verdict; this is the quick look over every model that those calls cannot afford.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def partitions() -> Iterator[list[tuple[Any, slice]]]:
    """Within: every forward graph AOTAutograd's partition makes, with the slice of its
    outputs saved for the backward, appended to the list yielded. No cache is read: an
    AOTAutograd entry of an earlier run would skip the partition."""
    import torch
    from torch._functorch._aot_autograd import graph_compile
    from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta

    found: list[tuple[Any, slice]] = []
    original = graph_compile._aot_stage2a_partition

    def partition(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        meta = next(a for a in [*args, *kwargs.values()] if isinstance(a, ViewAndMutationMeta))
        found.append((result[0], meta.tensors_saved_for_backwards_slice))
        return result

    graph_compile._aot_stage2a_partition = partition
    try:
        with (
            torch._functorch.config.patch(enable_autograd_cache=False),
            torch._inductor.config.patch(fx_graph_cache=False),
        ):
            yield found
    finally:
        graph_compile._aot_stage2a_partition = original


def traced_only() -> Callable[..., Any]:
    """A ``torch.compile`` backend that partitions as Inductor does and generates nothing:
    each graph returns zeroed tensors of its outputs' sizes and strides (the graph itself,
    where an output is no tensor)."""
    import torch
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import compile_fx

    def inner(gm: Any, example_inputs: Any, **_: Any) -> Any:
        output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        values = [getattr(n, "meta", {}).get("val") for n in output]
        if not all(v is None or isinstance(v, torch.Tensor) for v in values):
            return make_boxed_func(gm.forward)

        def run(*args: Any) -> list[Any]:
            return [None if v is None else _zeros_like(torch, v) for v in values]

        return make_boxed_func(run)

    return functools.partial(compile_fx, inner_compile=inner)


def _zeros_like(torch: Any, value: Any) -> Any:
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).zero_()


@contextmanager
def on_a_gpu(fw: Any) -> Iterator[Any]:
    """Within: ``fw`` with every value's device a GPU's (fake tensors of the same sizes,
    strides and dtypes), a CPU-only machine's stand-in for the graph a GPU would trace; its
    own values are put back after."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode, kept = FakeTensorMode(), {}
    for node in fw.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            kept[node] = value
            meta = torch.empty_strided(
                value.shape, value.stride(), dtype=value.dtype, device="meta"
            )
            node.meta["val"] = FakeTensor(mode, meta, torch.device("cuda"))
    try:
        yield fw
    finally:
        for node, value in kept.items():
            node.meta["val"] = value


def read(fw: Any, saved: slice) -> dict[str, bool]:
    """What decides a held backward, for ``fw`` read as a GPU graph."""
    from torch._inductor.graph import GraphLowering

    from compileq.codegen import padding

    with on_a_gpu(fw):
        laid_out = bool(GraphLowering.decide_layout_opt(fw, is_inference=False))
        return {"laid_out_anew": laid_out, "may_pad": padding.may_pad(fw, saved)}


def one(name: str) -> dict[str, Any]:
    """Trace ``name``'s training step's forward (in this process) and read each partition."""
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    import llama_script

    from bench.zoo_models import MODELS

    model = {m.name: m for m in MODELS}[name]
    args = model.args("gpu")
    args[args.index("--batch") + 1] = "2"
    sys.argv = ["llama_script", "--device", "cpu", *args]
    workload = llama_script.Workload(llama_script.parse())
    torch.manual_seed(0)
    net = workload.build().train()
    inputs, targets = workload.batch(0, torch.Generator().manual_seed(0))
    with partitions() as found:
        compiled = torch.compile(net, backend=traced_only())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=model.autocast):
            workload.loss(workload.forward(compiled, inputs), targets)
    return {"model": name, "graphs": [read(fw, saved) for fw, saved in found]}


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | graphs | held: laid out anew | held: may pad | sent at once |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        graphs = row.get("graphs")
        if graphs is None:
            lines.append(f"| {row['model']} | failed: {row.get('error', '?')} | | | |")
            continue
        laid = sum(g["laid_out_anew"] for g in graphs)
        pads = sum(g["may_pad"] and not g["laid_out_anew"] for g in graphs)
        lines.append(
            f"| {row['model']} | {len(graphs)} | {laid} | {pads} | {len(graphs) - laid - pads} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-out" / "padding")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # a model, in this process
    args = p.parse_args()
    if args.one:
        print("PADDING " + json.dumps(one(args.one)), flush=True)
        return
    from bench.zoo_models import MODELS

    known = [m.name for m in MODELS]
    names = [n for n in args.models.split(",") if n] or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; the zoo's are: {', '.join(known)}")
    rows = []
    for name in names:
        done = subprocess.run(
            [sys.executable, "-m", "bench.zoo_padding", "--one", name],
            cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PADDING ")), "")
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        row = json.loads(line[8:]) if line else {"model": name, "error": tail[:200]}
        print(render([row]).splitlines()[-1], flush=True)
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "padding.json").write_text(json.dumps(rows, indent=1))
    (args.out / "padding.md").write_text(render(rows))


if __name__ == "__main__":
    main()
