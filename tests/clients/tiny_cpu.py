"""The smallest training step with a forward and a backward graph, for tests that only need
Inductor to compile *something* (a few C++ kernels, not dozens). Prints one JSON line like
train_cpu.py.
"""

from __future__ import annotations

import json

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model, x = nn.Linear(16, 8), torch.randn(4, 16)
    eager_out = torch.nn.functional.gelu(model(x))
    eager_out.sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    step = torch.compile(lambda t: torch.nn.functional.gelu(model(t)))
    out = step(x)
    out.sum().backward()
    same = torch.allclose(out, eager_out, atol=1e-5) and all(
        torch.allclose(p.grad, g, atol=1e-5)
        for p, g in zip(model.parameters(), eager_grads, strict=True)
    )
    import compileq.scheduler as sched

    print(json.dumps({"matches_eager": same, "compileq": sched.installed_pool() is not None}))


if __name__ == "__main__":
    main()
