"""A max-autotune training step as users write one: the model's class defined right here, run
as ``__main__``. An MLP of ``--layers`` blocks (Linear, GELU, Linear, residual) in bf16
autocast, compiled with ``mode="max-autotune-no-cudagraphs"``, one forward, backward and AdamW
step per ``--steps``. Needs a CUDA GPU (max-autotune's Triton templates).

    python mlp_autotune.py [--device cuda:K] [--dim D] [--hidden H] [--layers L] [--batch B]

Prints one JSON line: the losses, the first step's time and when it ended (``finished_at``,
wall clock), and then the compiled step's own speed: ``--rounds`` rounds of ``--timed-steps``
steps each, in milliseconds per step (``step_ms``), which is what the GEMMs' picks decide.
Inductor prints each GEMM's candidates and timings (``AUTOTUNE ...``) to stderr.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim, hidden) for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timed-steps", type=int, default=50, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (0: none)")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    model = MLP(args.dim, args.hidden, args.layers).to(device)
    x = torch.randn(args.batch, args.dim, device=device)
    target = torch.randn(args.batch, args.dim, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    @torch.compile(mode="max-autotune-no-cudagraphs")
    def step() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        return loss

    losses, first_step_s = [], 0.0
    for i in range(args.steps):
        started = time.perf_counter()
        loss = step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()))
        if i == 0:
            first_step_s = time.perf_counter() - started
            finished_at = time.time()
    step_ms = []
    for _ in range(args.rounds):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(args.timed_steps):
            step()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        step_ms.append(round((time.perf_counter() - started) * 1000 / args.timed_steps, 4))
    print(
        json.dumps(
            {
                "losses": losses,
                "first_step_s": first_step_s,
                "finished_at": finished_at,
                "step_ms": step_ms,
            }
        )
    )


if __name__ == "__main__":
    main()
