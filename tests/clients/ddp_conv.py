"""``examples/llama_script.py``'s training job (DDP over gloo, every rank its own caches, eager
beside it) for a small convolutional net defined here. Inductor lays a convolution net's
activations out channels-last (always on the CPU with oneDNN), so each DDP subgraph's forward
saves its activations with strides its partition did not trace, and its backward's inputs
take those strides (codegen/deferred.py, codegen/speculative.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import llama_script


class ConvNet(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU()) for _ in range(layers)
        )
        self.head = nn.Linear(width, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


class Conv(llama_script.Workload):
    """The script's workload with this net and small images."""

    def build(self) -> nn.Module:
        return ConvNet(self.args.width, self.args.layers)

    def batch(self, step: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.randn(2, 3, 16, 16, generator=generator)
        return images, torch.randint(0, 100, (2,), generator=generator)


llama_script.Workload = Conv  # type: ignore[misc]

if __name__ == "__main__":
    llama_script.main()
