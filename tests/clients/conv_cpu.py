"""A training step of a small convolutional net (a convolution, batch norm, ReLU), its class
defined here, in ``__main__``. Prints one JSON line: whether the output and gradients equal
eager's.

Inductor lays a convolution net's activations out channels-last (layout optimization: always
on CPU with oneDNN, and on a GPU for nets of enough convolutions), so the activations the
forward saves for the backward come back with strides the partitioned graph did not trace,
and AOTAutograd restrides the backward's inputs to them before its lazy compile.
"""

from __future__ import annotations

import json

import torch
from eager_check import step_matches_eager
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


def main() -> None:
    torch.manual_seed(0)
    same = step_matches_eager(Net(), Net(), torch.randn(2, 3, 16, 16), atol=1e-4)
    print(json.dumps({"matches_eager": bool(same)}), flush=True)


if __name__ == "__main__":
    main()
