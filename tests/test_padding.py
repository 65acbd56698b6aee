"""Whether Inductor may pad an activation a forward saves (codegen/padding.py): the rule that
holds a backward sent ahead until its forward's worker has lowered the forward. On graphs that
AOTAutograd itself partitions, in process (real ``torch.compile``, Inductor's own partition;
nothing is generated, which this rule never needs: bench/zoo_padding.py's backend). The
rule at work between a client and a worker: tests/test_speculative.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from bench import zoo_padding
from torch import nn

from compileq.codegen import padding

THRESHOLD, ALIGN_BYTES = 1024, 128


@contextmanager
def _cpu_padding(on: bool) -> Iterator[None]:
    """Inductor's padding on the CPU as on a GPU (``disable_padding_cpu`` off), or as shipped."""
    with torch._inductor.config.patch(disable_padding_cpu=not on):
        yield


def partitioned(model: nn.Module, *inputs: torch.Tensor) -> list[tuple[Any, slice]]:
    """The forward graphs AOTAutograd's partition made of ``model``'s training step, with the
    slice of their outputs saved for the backward, as Inductor's compile partitions them."""
    torch._dynamo.reset()
    try:
        with zoo_padding.partitions() as found:
            out = torch.compile(model, backend=zoo_padding.traced_only())(*inputs)
            (out[0] if isinstance(out, tuple) else out).sum().backward()
    finally:
        torch._dynamo.reset()
    assert found, "no graph was partitioned"
    return found


def may_pad(model: nn.Module, *inputs: torch.Tensor) -> bool:
    [(fw, saved)] = partitioned(model, *inputs)
    return padding.may_pad(fw, saved)


class _Mlp(nn.Module):
    """A GELU between two linears: it saves the GELU's input and a product of its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, width), nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class _Matmuls(nn.Module):
    """Two matmuls in a row: the second's backward saves the first's output, an extern
    kernel's, whose layout Inductor does not choose."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(16, width))
        self.w2 = nn.Parameter(torch.randn(width, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w1) @ self.w2


class _Exp(nn.Module):
    """An exponential's output (1,032 a row) saved for its backward, and maybe returned."""

    def __init__(self, handed_on: bool) -> None:
        super().__init__()
        self.handed_on = handed_on
        self.w = nn.Parameter(torch.randn(16, 1032) / 16)

    def forward(self, x: torch.Tensor) -> Any:
        y = (x @ self.w).exp()
        return (y.sum(), y) if self.handed_on else y.sum()


class _SoftmaxThenConv(nn.Module):
    """A softmax's output (33 x 33 planes: 1,089 values) saved for the backward of what reads
    it: a convolution, or a matmul."""

    def __init__(self, conv: bool) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, 3, 1, 1))
        self.conv = nn.Conv2d(3, 4, 3) if conv else None
        self.w = nn.Parameter(torch.randn(33, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x * self.scale, dim=-1)
        return self.conv(y) if self.conv is not None else y @ self.w


def test_a_saved_activation_whose_rows_inductor_pads_is_foreseen() -> None:
    # 1,032 float32 values a row: over 1,024 and not a multiple of 32 (128 bytes).
    with _cpu_padding(True):
        assert may_pad(_Mlp(1032), torch.randn(4, 16))


def test_rows_of_an_aligned_width_or_under_the_threshold_pad_nothing() -> None:
    with _cpu_padding(True):
        assert not may_pad(_Mlp(1024), torch.randn(4, 16))  # aligned
        assert not may_pad(_Mlp(1020), torch.randn(4, 16))  # under the threshold


def test_on_a_gpu_a_matmuls_output_keeps_its_strides_and_on_the_cpu_inductor_lays_it_out() -> None:
    with _cpu_padding(True):
        [(fw, saved)] = partitioned(_Matmuls(1032), torch.randn(4, 16))
        # It saves a 1,032-long activation, the first matmul's output (transposed, as the
        # backward reads it), which Inductor 2.15 pads on the CPU (its own layout there).
        outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0][saved]
        assert any(tuple(n.meta["val"].shape) == (1032, 4) for n in outputs)
        assert padding.may_pad(fw, saved)
        # The same graph on a GPU: an extern kernel's output, laid out as the kernel gives it.
        with zoo_padding.on_a_gpu(fw):
            assert not padding.may_pad(fw, saved)


def test_an_activation_the_forward_also_hands_on_keeps_its_traced_strides() -> None:
    with _cpu_padding(True):
        assert may_pad(_Exp(handed_on=False), torch.randn(4, 16))
        # The same activation, also an output of the graph (a DDP bucket's for the next):
        # Inductor keeps a user-visible output's strides as traced.
        assert not may_pad(_Exp(handed_on=True), torch.randn(4, 16))


def test_a_cpu_graph_pads_nothing_unless_inductor_is_told_to_pad_the_cpu() -> None:
    with _cpu_padding(True):
        [(fw, saved)] = partitioned(_Mlp(1032), torch.randn(4, 16))
    with _cpu_padding(False):  # as shipped: Inductor pads GPU graphs only
        assert not padding.may_pad(fw, saved)
    with _cpu_padding(True), torch._inductor.config.patch(comprehensive_padding=False):
        assert not padding.may_pad(fw, saved)


@pytest.mark.parametrize(
    ("shape", "dtype", "padded"),
    [
        ((4, 1056), torch.bfloat16, True),  # 1,056 bf16 values: 2,112 bytes, not 128's multiple
        ((4, 1056), torch.float32, False),  # 4,224 bytes: aligned
        ((4, 1025), torch.float32, True),
        ((1025,), torch.float32, False),  # one dimension: nothing above the innermost
        ((2, 3, 33, 33), torch.float32, True),  # 33 x 33 = 1,089 values a plane
        ((2, 32, 49, 49), torch.bfloat16, True),  # swin's windows: 2,401 a plane
        ((2, 197, 768), torch.bfloat16, False),  # a ViT's tokens: 768 a row, 151,296 a plane
    ],
)
def test_a_stride_is_padded_where_it_passes_the_threshold_unaligned(
    shape: tuple[int, ...], dtype: torch.dtype, padded: bool
) -> None:
    assert padding.pads(torch.empty(shape, dtype=dtype), THRESHOLD, ALIGN_BYTES) is padded


def test_the_strides_order_not_the_dimensions_order_decides_and_channels_last_is_kept() -> None:
    # A (1032, 4) view of a (4, 1032) tensor: its first dimension is innermost by stride, so
    # the row above it is 1,032 values long.
    assert padding.pads(torch.empty(4, 1032).t(), THRESHOLD, ALIGN_BYTES)
    # A (4, 1032) view of a (1032, 4) tensor: rows of 4 values innermost.
    assert not padding.pads(torch.empty(1032, 4).t(), THRESHOLD, ALIGN_BYTES)
    planes = torch.empty(2, 3, 33, 33).to(memory_format=torch.channels_last)
    assert not padding.pads(planes, THRESHOLD, ALIGN_BYTES)  # as Inductor: pad_channels_last off
    assert padding.pads(planes, THRESHOLD, ALIGN_BYTES, channels_last=True)


def test_an_activation_a_convolution_reads_is_left_dense() -> None:
    with _cpu_padding(True):
        assert may_pad(_SoftmaxThenConv(conv=False), torch.randn(2, 3, 33, 33))
        # Inductor keeps a convolution's input dense (a padded one would cost a copy), and
        # whatever produces it, back to a reduction.
        assert not may_pad(_SoftmaxThenConv(conv=True), torch.randn(2, 3, 33, 33))
