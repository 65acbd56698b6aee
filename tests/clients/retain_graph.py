"""A training step whose backward keeps its graph (``loss.backward(retain_graph=True)``), with
the model's class defined here, in ``__main__``. Prints one JSON line: whether the output and
gradients equal eager's.

Keeping the graph turns buffer donation off at the first backward call, after AOTAutograd
partitioned the graph: the backward compiled then differs from the one sent ahead of it.
"""

from __future__ import annotations

import json

import torch
from eager_check import step_matches_eager
from torch import nn


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def main() -> None:
    torch.manual_seed(0)
    same = step_matches_eager(Mlp(), Mlp(), torch.randn(4, 32), atol=1e-5, retain_graph=True)
    print(json.dumps({"matches_eager": bool(same)}), flush=True)


if __name__ == "__main__":
    main()
