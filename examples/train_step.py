"""A small GPT training step under torch.compile; prints one JSON line with loss and timing.

    python examples/train_step.py [--compileq] [--layers 2] [--steps 1]

With --compileq it calls compileq.install() first (settings from COMPILEQ_* variables), so its
Triton kernels come from the cluster. Used by the GPU checks and benchmarks.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn


class Block(nn.Module):
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


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.blocks(self.tok(idx) + self.pos(pos)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compileq", action="store_true")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    if args.compileq:
        import compileq

        assert compileq.install(), "compileq.install() failed"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    vocab = 8192
    model = GPT(vocab, args.d, 8, args.layers, args.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, vocab, (args.batch, args.seq + 1), device=device)

    @torch.compile
    def step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.float().view(-1, vocab), targets.reshape(-1))
        loss.backward()
        return loss

    losses, times = [], []
    for _ in range(args.steps):
        started = time.perf_counter()
        loss = step(data[:, :-1], data[:, 1:])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - started)
    print(json.dumps({"device": device, "loss": losses, "first_step_s": times[0], "step_s": times}))


if __name__ == "__main__":
    main()
