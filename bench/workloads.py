"""The benchmark workloads, built in code (no downloads): a GPT, a convnet and an MLP.

Each is a training step: forward, loss and backward under ``torch.compile``, then an eager
AdamW step (fused on a GPU). The optimizer stays out of the compiled region on purpose: a
compiled optimizer step's graph carries the weights and optimizer state themselves (840 MB for
the GPT), takes longer to compile than the model, and is what users most often leave eager. ``edit=True`` changes one block (its activation), which is what a user's
edit between two runs looks like to the caches: new graphs, mostly the same kernels.
Sizes depend on the device: the GPU sizes are the issue's (the GPT is the 8-layer model of the
shared kernel fixtures); the CPU sizes keep a run within seconds on a 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

WORKLOADS = ("gpt", "convnet", "mlp")


@dataclass(frozen=True)
class Step:
    """One compiled training step and its first batch."""

    run: Callable[[], float]  # one step; returns the loss
    compile_mode: str | None


def _act(edit: bool) -> nn.Module:
    return nn.ReLU() if edit else nn.GELU()


class _Block(nn.Module):
    def __init__(self, d: int, heads: int, edited: bool) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), _act(edited), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, edit: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(
            *(_Block(d, heads, edited=edit and i == layers // 2) for i in range(layers))
        )
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


class _ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, edited: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.SiLU() if edited else nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


class ConvNet(nn.Module):
    def __init__(self, widths: tuple[int, ...], edit: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        ]
        cin = widths[0]
        for i, w in enumerate(widths):
            for j in range(2):
                edited = edit and i == len(widths) // 2 and j == 0
                layers.append(_ResBlock(cin, w, 2 if (j == 0 and i > 0) else 1, edited))
                cin = w
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean(dim=(2, 3)))


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int, layers: int, edit: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(
                RMSNorm(d),
                nn.Linear(d, hidden),
                _act(edit and i == layers // 2),
                nn.Linear(hidden, d),
            )
            for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x


def build(name: str, device: str, edit: bool = False) -> Step:
    """The workload ``name`` on ``device``, its weights and data seeded identically every run."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    gpu = device != "cpu"
    torch.manual_seed(0)
    mode: str | None = None
    model: nn.Module
    loss_of: Callable[[torch.Tensor], torch.Tensor]
    if name == "gpt":
        vocab, d, heads, layers, seq, batch = (
            (8192, 768, 12, 8, 512, 8) if gpu else (512, 64, 4, 2, 32, 4)
        )
        model = GPT(vocab, d, heads, layers, seq, edit)
        data = torch.randint(0, vocab, (batch, seq + 1))
        inputs, targets = data[:, :-1], data[:, 1:]

        def loss_of(logits: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.float().reshape(-1, vocab), targets_d.reshape(-1))

    elif name == "convnet":
        widths, batch, size = ((64, 128, 256), 64, 32) if gpu else ((8, 16), 4, 16)
        model = ConvNet(widths, edit)
        inputs = torch.randn(batch, 3, size, size)
        targets = torch.randint(0, 10, (batch,))

        def loss_of(logits: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.float(), targets_d)

    else:
        d, hidden, layers, batch = (1024, 4096, 4, 512) if gpu else (64, 256, 2, 16)
        model = MLP(d, hidden, layers, edit)
        inputs, targets = torch.randn(batch, d), torch.randn(batch, d)
        mode = "max-autotune-no-cudagraphs" if gpu else None

        def loss_of(out: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(out.float(), targets_d)

    model = model.to(device)
    inputs_d, targets_d = inputs.to(device), targets.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=gpu)
    autocast: dict[str, Any] = {"device_type": device.split(":")[0], "dtype": torch.bfloat16}

    @torch.compile(mode=mode)
    def fwd_bwd() -> torch.Tensor:
        with torch.autocast(**autocast, enabled=gpu):
            out = model(inputs_d)
        loss = loss_of(out)
        loss.backward()
        return loss

    def run() -> float:
        loss = fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.item())

    return Step(run, mode)
