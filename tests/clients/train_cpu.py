"""A model the tests have not special-cased: compiled, trained one step, compared with eager.

Prints one JSON line: whether outputs and gradients match eager, and the first call's time.
"""

from __future__ import annotations

import json
import sys
import time

import torch

# The packaged demo's CPU model (conv + LayerNorm + MLP): the C++ path, a few graphs.
from compileq.demo_step import ConvNet


def main() -> None:
    torch.manual_seed(0)
    # An optional hidden width gives a model (and kernels) no earlier run has compiled.
    model, x = ConvNet(*(int(a) for a in sys.argv[1:2])), torch.randn(4, 8, 32)
    eager_out = model(x)
    eager_out.square().sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model)
    started = time.perf_counter()
    out = compiled(x)
    out.square().sum().backward()
    first_call_s = time.perf_counter() - started
    same = torch.allclose(out, eager_out, atol=1e-5) and all(
        torch.allclose(p.grad, g, atol=1e-5)
        for p, g in zip(model.parameters(), eager_grads, strict=True)
    )
    import compileq.features as features

    print(
        json.dumps(
            {
                "matches_eager": same,
                "first_call_s": first_call_s,
                "compileq": features.installed_pool() is not None,
                # A client that sent nothing never imported Celery (tasks/names.py).
                "celery_imported": "celery" in sys.modules,
            }
        )
    )


if __name__ == "__main__":
    main()
