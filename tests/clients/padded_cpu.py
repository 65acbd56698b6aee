"""A training step whose forward saves an activation Inductor pads, the model's class defined
here, in ``__main__``. Prints one JSON line: whether the output and gradients equal eager's.

With padding on for the CPU as it is on a GPU (``disable_padding_cpu`` off), Inductor pads a
saved activation whose rows are over 1024 elements and not a multiple of 128 bytes: here
1,032 float32 values. AOTAutograd restrides the backward's inputs once the forward is
compiled; compileq foresees the padding (codegen/padding.py) and holds the backward until the
forward's worker has lowered it.
"""

from __future__ import annotations

import json

import torch
from eager_check import step_matches_eager
from torch import nn

torch._inductor.config.disable_padding_cpu = False
WIDTH = 1032


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, WIDTH), nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def main() -> None:
    torch.manual_seed(0)
    same = step_matches_eager(Mlp(), Mlp(), torch.randn(4, 16), atol=1e-5)
    print(json.dumps({"matches_eager": bool(same)}), flush=True)


if __name__ == "__main__":
    main()
