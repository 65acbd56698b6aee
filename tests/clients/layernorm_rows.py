"""A LayerNorm over many rows, its backward under bf16 autocast: on a GPU, Inductor fuses the
rows' gradient with the weight and bias sums into one mix-order reduction, whose code reads
``V.interpreter`` outside any loop body (a channels-last convnet's norm, timm's
convnext_tiny). A worker's codegen of that backward raised on the poisoned value and the
graph compiled again in the client (workers/fx_input.py). Prints one JSON line like
train_cpu.py.

    python layernorm_rows.py [DEVICE]     # cuda (default) or cpu
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    torch.manual_seed(0)
    # Rows x columns over 5 * 2**20, rows at least twice the columns: a mix-order reduction.
    x = torch.randn(65536, 128, device=device, requires_grad=True)
    model, reference = nn.LayerNorm(128).to(device), nn.LayerNorm(128).to(device)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model)
    grads = []
    for net, params in ((reference, reference), (compiled, model)):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = net(x)
        out.float().sum().backward()
        grads.append([x.grad.clone(), *(p.grad.clone() for p in params.parameters())])
        x.grad = None
    same = all(torch.allclose(a, b, atol=5e-2, rtol=5e-2) for a, b in zip(*grads, strict=True))
    import compileq.features as sched

    print(json.dumps({"matches_eager": same, "compileq": sched.installed_pool() is not None}))


if __name__ == "__main__":
    main()
