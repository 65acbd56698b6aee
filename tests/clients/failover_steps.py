"""Two compiled training steps in one process, for tests that change the cluster between them.

    python failover_steps.py WIDTH_A WIDTH_B [--pause]

Each step is a linear layer and a GELU of its own width (so the two compile different graphs),
forward and backward, compared with eager. After the first step it prints one JSON line; with
``--pause`` it then waits for a line on stdin before the second, so a test can fail Redis over
meanwhile and see whether this same process, without a restart, uses the new master. Prints a
last JSON line with both results.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn


def step(width: int) -> bool:
    """One compiled training step; whether its output and gradients match eager."""
    torch.manual_seed(width)
    model, x = nn.Linear(width, 8), torch.randn(4, width)
    reference = nn.Linear(width, 8)
    reference.load_state_dict(model.state_dict())
    eager_out = torch.nn.functional.gelu(reference(x))
    eager_out.sum().backward()
    compiled = torch.compile(lambda t: torch.nn.functional.gelu(model(t)))
    out = compiled(x)
    out.sum().backward()
    return torch.allclose(out, eager_out, atol=1e-5) and all(
        p.grad is not None and q.grad is not None and torch.allclose(p.grad, q.grad, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )


def main() -> None:
    first, second = int(sys.argv[1]), int(sys.argv[2])
    results = {"first": step(first)}
    print(json.dumps(results), flush=True)
    if "--pause" in sys.argv[3:]:
        sys.stdin.readline()
    results["second"] = step(second)
    import compileq.features as features

    print(json.dumps({**results, "compileq": features.installed_pool() is not None}), flush=True)


if __name__ == "__main__":
    main()
