"""The smallest training step with a forward and a backward graph, for tests that only need
Inductor to compile *something* (a few C++ kernels, not dozens). Prints one JSON line like
train_cpu.py.

    python tiny_cpu.py [WIDTH]

With WIDTH (65536: 2 MB of weights) it also compiles the optimizer step, whose graph holds
the weights themselves: Dynamo installs a compiled optimizer's parameters on its graph, so they
reach Inductor as real tensors (``TracingContext.params_flat``), not as fake inputs.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    width = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    model, x = nn.Linear(width, 8), torch.randn(4, width)
    reference = nn.Linear(width, 8)
    reference.load_state_dict(model.state_dict())
    eager_out = torch.nn.functional.gelu(reference(x))
    eager_out.sum().backward()
    eager_grads = [p.grad.clone() for p in reference.parameters()]
    step = torch.compile(lambda t: torch.nn.functional.gelu(model(t)))
    out = step(x)
    out.sum().backward()
    same = torch.allclose(out, eager_out, atol=1e-5) and all(
        torch.allclose(p.grad, g, atol=1e-5)
        for p, g in zip(model.parameters(), eager_grads, strict=True)
    )
    if len(sys.argv) > 1:
        eager_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        eager_opt.step()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.compile(opt.step)()
        same = same and all(
            torch.allclose(p, q, atol=1e-6)
            for p, q in zip(model.parameters(), reference.parameters(), strict=True)
        )
    import compileq.features as features

    print(json.dumps({"matches_eager": same, "compileq": features.installed_pool() is not None}))


if __name__ == "__main__":
    main()
