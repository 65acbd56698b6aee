"""A training step whose forward saves an activation Inductor pads, the model's class defined
here, in ``__main__``. Prints one JSON line: whether the output and gradients equal eager's.

With padding on for the CPU as it is on a GPU (``disable_padding_cpu`` off), Inductor pads a
saved activation whose rows are over 1024 elements and not a multiple of 128 bytes: here
1,032 float32 values. Nothing predicts that before the forward is generated, so the backward
sent ahead has the traced strides, and AOTAutograd restrides its inputs once the forward is
compiled.
"""

from __future__ import annotations

import json

import torch
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
    model, reference, x = Mlp(), Mlp(), torch.randn(4, 16)
    reference.load_state_dict(model.state_dict())
    eager = reference(x)
    eager.sum().backward()
    out = torch.compile(model)(x)
    out.sum().backward()
    same = torch.allclose(out, eager, atol=1e-5) and all(
        torch.allclose(p.grad, q.grad, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    print(json.dumps({"matches_eager": bool(same)}), flush=True)


if __name__ == "__main__":
    main()
