"""What a test client prints about its training step: whether ``torch.compile`` gave the
output and gradients eager gave. Imported by the client scripts beside it (each runs as
``__main__`` from this directory, in a fresh process)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def step_matches_eager(
    model: nn.Module, reference: nn.Module, x: torch.Tensor, atol: float, **backward: Any
) -> bool:
    """One step of ``reference`` in eager and of ``model`` compiled, from the same weights;
    ``backward``: arguments of both ``.backward()`` calls (``retain_graph=True``)."""
    reference.load_state_dict(model.state_dict())
    eager = reference(x)
    eager.sum().backward(**backward)
    out = torch.compile(model)(x)
    out.sum().backward(**backward)
    return torch.allclose(out, eager, atol=atol) and all(
        p.grad is not None and q.grad is not None and torch.allclose(p.grad, q.grad, atol=atol)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
