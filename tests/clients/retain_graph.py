"""A training step whose backward keeps its graph (``loss.backward(retain_graph=True)``), with
the model's class defined here, in ``__main__``. Prints one JSON line: whether the output and
gradients equal eager's.

Keeping the graph turns buffer donation off at the first backward call, after AOTAutograd
partitioned the graph: the backward compiled then differs from the one sent ahead of it.
"""

from __future__ import annotations

import json

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def main() -> None:
    torch.manual_seed(0)
    model, reference, x = Mlp(), Mlp(), torch.randn(4, 32)
    reference.load_state_dict(model.state_dict())
    eager = reference(x)
    eager.sum().backward(retain_graph=True)
    out = torch.compile(model)(x)
    out.sum().backward(retain_graph=True)
    same = torch.allclose(out, eager, atol=1e-5) and all(
        torch.allclose(p.grad, q.grad, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    print(json.dumps({"matches_eager": bool(same)}), flush=True)


if __name__ == "__main__":
    main()
