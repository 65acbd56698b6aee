"""The training step ``compileq demo`` and the compose stack's trainer compile.

    python -m compileq.demo_step [--device cpu|cuda]

A module of the installed package, not a file under ``examples/``, so that ``compileq demo``
works from a wheel and the stack's image runs the step without a checkout. It runs one
training step (forward, backward, optimizer) under ``torch.compile``, checks the outputs and
gradients against eager, and prints one JSON line. It knows nothing of compileq: run it under
``compileq run`` to get the cluster, or bare for stock ``torch.compile``.

On CPU it is a conv + LayerNorm + MLP net (Inductor's C++ path); on a GPU a small GPT
(Triton kernels), the shape of step compileq exists for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch
from torch import nn


class ConvNet(nn.Module):  # type: ignore[misc]  # torch is untyped to mypy here
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.norm = nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, hidden), nn.SiLU(), nn.Linear(hidden, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).transpose(1, 2)
        h = self.norm(h)
        return (h + self.mlp(h)).tanh().mean(dim=1)


class Block(nn.Module):  # type: ignore[misc]  # torch is untyped to mypy here
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):  # type: ignore[misc]  # torch is untyped to mypy here
    def __init__(self, vocab: int = 4096, d: int = 256, layers: int = 2, seq: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*(Block(d, 8) for _ in range(layers)))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.blocks(self.tok(idx) + self.pos(pos)))


def _workload(
    device: str,
) -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    if device == "cpu":
        return ConvNet(), torch.randn(4, 8, 32), lambda out: out.square().sum()
    model = TinyGPT().to(device)
    data = torch.randint(0, 4096, (8, 129), device=device)
    inputs, targets = data[:, :-1], data[:, 1:]

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, 4096), targets.reshape(-1))

    return model, inputs, loss_of


def run(device: str) -> dict[str, object]:
    torch.manual_seed(0)
    model, x, loss_of = _workload(device)
    eager_loss = loss_of(model(x))
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)
    started = time.perf_counter()
    loss = loss_of(compiled(x))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    opt.step()
    if device != "cpu":
        torch.cuda.synchronize()
    first_step_s = time.perf_counter() - started
    # Fused kernels reorder float sums; GPU matmuls more so than the CPU path.
    tol = 1e-5 if device == "cpu" else 2e-3
    matches = torch.allclose(loss, eager_loss, atol=tol, rtol=tol) and all(
        torch.allclose(g, e, atol=tol, rtol=tol) for g, e in zip(grads, eager_grads, strict=True)
    )
    return {
        "device": device,
        "matches_eager": bool(matches),
        "loss": float(loss.item()),
        "first_step_s": round(first_step_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compileq.demo_step")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = run(device)
    print(json.dumps(result), flush=True)
    return 0 if result["matches_eager"] else 1


if __name__ == "__main__":
    sys.exit(main())
