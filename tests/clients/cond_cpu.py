"""A model whose graph holds ``torch.cond``, a higher-order op Inductor will not serialize for
an out-of-process compile (``FxGraphCache._check_for_hop``): compiled for inference and
compared with eager (one graph keeps the test short). Prints one JSON line like train_cpu.py.
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
    model = Gated()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)
        # The predicate depends on data, so the compiled graph holds both branches.
        inputs = [torch.randn(8, 16), -torch.randn(8, 16) * 3]
        same = all(torch.allclose(compiled(x), model(x), atol=1e-5) for x in inputs)
    import compileq.features as features

    print(json.dumps({"matches_eager": same, "compileq": features.installed_pool() is not None}))


if __name__ == "__main__":
    main()
