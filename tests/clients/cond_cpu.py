"""A model whose graph holds ``torch.cond``, a higher-order op Inductor will not serialize for
an out-of-process compile (``FxGraphCache._check_for_hop``): compiled, run forward and backward,
compared with eager. Prints one JSON line like train_cpu.py.
"""

from __future__ import annotations

import json

import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        h = torch.cond(h.sum() > 0, lambda t: t.relu() * 2, lambda t: t.sigmoid() - 1, (h,))
        return self.down(h).tanh()


def main() -> None:
    torch.manual_seed(0)
    model, x = Gated(), torch.randn(8, 16)
    eager_out = model(x)
    eager_out.square().sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    out = torch.compile(model, fullgraph=True)(x)
    out.square().sum().backward()
    same = torch.allclose(out, eager_out, atol=1e-5) and all(
        torch.allclose(p.grad, g, atol=1e-5)
        for p, g in zip(
            [p for p in model.parameters() if p.grad is not None], eager_grads, strict=True
        )
    )
    import compileq.scheduler as sched

    print(json.dumps({"matches_eager": same, "compileq": sched.installed_pool() is not None}))


if __name__ == "__main__":
    main()
