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

from compileq.demo_step import TinyGPT


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
    model = TinyGPT(vocab, args.d, args.layers, args.seq).to(device)
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
