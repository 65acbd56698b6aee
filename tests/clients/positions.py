"""A training step whose graphs hold ``prims`` ops: positions from ``torch.arange`` (lowered to
``prims.iota``), as in any transformer with learned position embeddings. Inductor's own graph
pickler refuses every op outside ``aten`` for its caches; compileq's wire must still carry such
graphs to a worker. Prints one JSON line like train_cpu.py.

    python positions.py [DEVICE]     # cpu (default) or cuda
"""

from __future__ import annotations

import json
import sys

import torch
from eager_check import step_matches_eager
from torch import nn


class Positional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Embedding(32, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        return self.proj(x + self.pos(positions)).tanh()


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    torch.manual_seed(0)
    model, reference = Positional().to(device), Positional().to(device)
    same = step_matches_eager(model, reference, torch.randn(4, 24, 16, device=device), atol=1e-4)
    import compileq.features as sched

    print(json.dumps({"matches_eager": same, "compileq": sched.installed_pool() is not None}))


if __name__ == "__main__":
    main()
