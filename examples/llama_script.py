"""A training script as users write them: the model's classes defined right here, run as
``__main__`` (directly, or by torchrun). A Llama-style decoder: RMSNorm, rotary positions,
grouped-query attention, SwiGLU; AdamW; bf16 autocast on a GPU.

    python llama_script.py [--device cpu|cuda|cuda:K] [--steps N] [--width W]
                           [--bucket-mb MB] [--fsdp] [--mode MODE] [--dump-code DIR]
                           [--model NAME] [--compile-blocks] [--dynamic] [--mark-dynamic]
                           [--compile-optimizer] [--float32-rotary]
                           [--sdpa-backend NAME] [--no-autocast] [--eager]
    torchrun --nproc-per-node 2 llama_script.py ...     # DDP (gloo on CPU, NCCL on GPUs)
    torchrun --nproc-per-node 2 llama_script.py --fsdp  # FSDP2: fully_shard per block

Each rank trains a compiled copy and an eager copy from the same weights and prints one JSON
line: its losses, whether they (and the final weights) equal eager's, the first step's time,
and how many graphs it compiled (distinct output code) and looked up. ``--dump-code DIR`` writes every output-code module this process
loaded, for comparing codegen on a worker with codegen in process.

The training configurations of ``python -m bench matrix``:

* ``--model``: ``script`` (the classes below, the default) or a library model built at random
  from its config, no download: ``hf-llama``, ``hf-gpt2`` (transformers), ``timm-resnet``,
  ``timm-vit`` (timm; images and 100 classes instead of tokens); or any model of ``python -m
  bench zoo``: ``timm:NAME`` (``timm.create_model``), ``hf:CLASS`` (a transformers class from
  its config class), with ``--model-config JSON`` (keyword arguments of the model's config,
  or of ``create_model``), ``--task`` (``lm``: a logit per token; ``seq2seq``: the tokens
  also as the decoder's; ``cls``: a label per sequence; ``qa``: an answer's start and end
  position per sequence; ``image``), ``--batch`` and ``--size``
  (tokens, or the image's side);
* ``--compile-blocks``: each block compiled (``Module.compile``) instead of the whole model,
  as torchtitan does under FSDP2;
* ``--dynamic``: the sequence (or image) length changes at steps 1 and 2, so Dynamo compiles
  a dynamic graph after the static one; with ``--mark-dynamic`` the length is dynamic from the
  first step (``torch._dynamo.mark_dynamic``);
* ``--compile-optimizer``: the optimizer's step compiled too;
* ``--float32-rotary``: the rotary angles computed inside ``torch.autocast(enabled=False)``, as
  transformers' Llama computes them (an autocast region in the graph);
* ``--sdpa-backend NAME``: attention inside ``torch.nn.attention.sdpa_kernel(SDPBackend.NAME)``
  (``MATH``, ``FLASH_ATTENTION``, ``EFFICIENT_ATTENTION``, ``CUDNN_ATTENTION``), as a model
  that picks its attention kernel does (an SDPA-backend region in the graph);
* ``--no-autocast``: float32 on a GPU too (a zoo model with an op that has no bf16 kernel:
  GoogleFnet's FFT);
* ``--eager``: nothing compiled (the baseline a compile's first step is measured against).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

#: Wall-clock marks of this process's start (where the time before the first step goes).
STARTUP = {"script": time.time()}
import torch  # noqa: E402

STARTUP["torch imported"] = time.time()
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            x
            * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).type_as(x)
            * (self.weight)
        )


#: ``--float32-rotary``: the rotary angles computed with autocast off (set by ``main``).
FLOAT32_ROTARY = False
#: ``--sdpa-backend``: the one attention backend allowed, or None for torch's choice.
SDPA_BACKEND: str | None = None


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding over the last dimension (pairs of channels)."""
    seq, half = x.shape[-2], x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    positions = torch.arange(seq, device=x.device, dtype=torch.float32)
    # As transformers' Llama does with --float32-rotary: an autocast region in the graph.
    region = (
        torch.autocast(device_type=x.device.type, enabled=False)
        if FLOAT32_ROTARY
        else contextlib.nullcontext()
    )
    with region:
        angles = torch.outer(positions, freqs)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def attention_backend() -> contextlib.AbstractContextManager[object]:
    """The region ``--sdpa-backend`` names (nothing in the graph without it)."""
    if SDPA_BACKEND is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKEND))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        q, k = rotary(q), rotary(k)
        with attention_backend():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, 2 * dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(dim), Attention(dim, heads, kv_heads)
        self.mlp_norm, self.mlp = RMSNorm(dim), SwiGLU(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads=4, kv_heads=2) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def compile_phases() -> dict[str, float]:
    """Where this process's compiles have spent their time so far: torch's own phase timers
    (``dynamo_timed``), summed per phase (seconds; Inductor's pass-by-pass timers left out)."""
    from torch._dynamo.utils import compile_times

    names, values = compile_times(repr="csv", aggregate=True)
    return {
        str(n): round(float(v), 3)
        for n, v in zip(names, values, strict=False)
        if not str(n).startswith("pass.")
    }


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP bucket cap (small: more)")
    p.add_argument(
        "--fsdp", action="store_true", help="under torchrun: FSDP2 (fully_shard per block) not DDP"
    )
    p.add_argument(
        "--mode", default=None, help="torch.compile's mode, e.g. max-autotune-no-cudagraphs"
    )
    p.add_argument("--model", default="script", help=f"{', '.join(MODELS)}, timm:NAME, hf:CLASS")
    p.add_argument("--model-config", default="{}", help="a zoo model's config, as JSON")
    p.add_argument("--task", default="lm", choices=("lm", "seq2seq", "cls", "qa", "image"))
    p.add_argument("--batch", type=int, default=None, help="a zoo model's batch")
    p.add_argument("--size", type=int, default=None, help="a zoo model's tokens or image side")
    p.add_argument(
        "--compile-blocks", action="store_true", help="compile each block, not the model"
    )
    p.add_argument("--dynamic", action="store_true", help="another length at steps 1 and 2")
    p.add_argument(
        "--mark-dynamic", action="store_true", help="the length marked dynamic from the first step"
    )
    p.add_argument("--compile-optimizer", action="store_true", help="compile the optimizer step")
    p.add_argument(
        "--float32-rotary",
        action="store_true",
        help="the rotary angles computed with autocast off, as transformers' Llama does",
    )
    p.add_argument(
        "--sdpa-backend",
        default=None,
        choices=["MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"],
        help="the one attention backend allowed (a torch.nn.attention.sdpa_kernel region)",
    )
    p.add_argument(
        "--no-autocast",
        action="store_true",
        help="float32 on a GPU too, not bf16 autocast (a model with an op bf16 lacks: an FFT)",
    )
    p.add_argument("--eager", action="store_true", help="compile nothing")
    p.add_argument("--dump-code", default=None)
    p.add_argument(
        "--rank-caches",
        default=None,
        help="give each rank its own Inductor and Triton cache dirs under this one (as if each "
        "ran on a node of its own)",
    )
    args = p.parse_args()
    if args.model not in MODELS and not args.model.startswith(("timm:", "hf:")):
        p.error(f"--model {args.model}: not one of {', '.join(MODELS)}, timm:NAME or hf:CLASS")
    if args.model != "script" and (args.float32_rotary or args.sdpa_backend):
        p.error("--float32-rotary and --sdpa-backend shape the script's own model only")
    return args


class Workload:
    """What a training step needs of a model: the model, its blocks, a batch, its loss."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.name, self.args = args.model, args
        self.zoo = self.name.startswith(("timm:", "hf:"))
        self.task = "image" if self.name.startswith(("timm-", "timm:")) else args.task
        self.images = self.task == "image"

    def build(self) -> nn.Module:
        width, layers = self.args.width, self.args.layers
        if self.zoo:
            return self.build_zoo(json.loads(self.args.model_config))
        if self.name == "script":
            return Llama(dim=width, layers=layers)
        if self.name == "hf-llama":
            from transformers import LlamaConfig, LlamaForCausalLM

            config = LlamaConfig(
                vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width,
                num_hidden_layers=layers, num_attention_heads=max(1, width // 64),
                num_key_value_heads=max(1, width // 128), max_position_embeddings=512,
            )  # fmt: skip
            return LlamaForCausalLM(config)
        if self.name == "hf-gpt2":
            from transformers import GPT2Config, GPT2LMHeadModel

            config = GPT2Config(
                vocab_size=VOCAB, n_embd=width, n_layer=layers, n_head=max(1, width // 64),
                n_positions=512,
            )  # fmt: skip
            return GPT2LMHeadModel(config)
        import timm

        arch = {"timm-resnet": "resnet26", "timm-vit": "vit_tiny_patch16_224"}[self.name]
        return timm.create_model(arch, pretrained=False, num_classes=100)

    def build_zoo(self, config: dict[str, object]) -> nn.Module:
        """A model of PyTorch's own benchmark suites (bench/zoo_models.py), at random init."""
        suite, _, name = self.name.partition(":")
        if suite == "timm":
            import timm

            return timm.create_model(name, pretrained=False, num_classes=100, **config)
        import transformers

        cls = getattr(transformers, name)
        made = cls.config_class(**config)
        if self.task == "cls":
            made.num_labels, made.pad_token_id = 10, made.pad_token_id or 0
        return cls(made)  # type: ignore[no-any-return]

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The repeated units FSDP2 shards and ``--compile-blocks`` compiles one by one."""
        inner = getattr(model, "module", model)  # DDP's wrapper
        for path in ("blocks", "model.layers", "transformer.h", "layer1"):
            owner: object = inner
            for part in path.split("."):
                owner = getattr(owner, part, None)
            if isinstance(owner, nn.ModuleList | nn.Sequential):
                if path == "layer1":  # a ResNet's four stages
                    return [getattr(inner, f"layer{i}") for i in range(1, 5)]
                return list(owner)
        raise SystemExit(f"{self.name}: no blocks found")

    def batch(self, step: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of a step; with ``--dynamic`` steps 1 and 2 have other lengths."""
        grow = step if self.args.dynamic and step < 3 else 0
        if self.images:
            size = self.args.size or (224 if self.name == "timm-vit" else 128 + 32 * grow)
            batch = self.args.batch or 8
            images = torch.randn(batch, 3, size, size, generator=generator)
            return images, torch.randint(0, 100, (batch,), generator=generator)
        batch, length = self.args.batch or 4, (self.args.size or 32) + 16 * grow
        tokens = torch.randint(0, VOCAB, (batch, length + 1), generator=generator)
        if self.task == "cls":
            return tokens[:, :-1], torch.randint(0, 10, (batch,), generator=generator)
        if self.task == "qa":  # the answer's start and end positions
            return tokens[:, :-1], torch.randint(0, length, (2, batch), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    def forward(self, net: nn.Module, inputs: torch.Tensor) -> object:
        if self.task == "seq2seq":  # an encoder-decoder: the tokens are the decoder's too
            return net(input_ids=inputs, decoder_input_ids=inputs)
        return net(inputs)

    def loss(self, out: object, targets: torch.Tensor) -> torch.Tensor:
        if self.task == "qa":
            starts, ends = getattr(out, "start_logits"), getattr(out, "end_logits")  # noqa: B009
            return F.cross_entropy(starts.float(), targets[0]) + F.cross_entropy(
                ends.float(), targets[1]
            )
        logits = getattr(out, "logits", out)
        assert isinstance(logits, torch.Tensor)
        return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


VOCAB = 256
MODELS = ("script", "hf-llama", "hf-gpt2", "timm-resnet", "timm-vit")


def main() -> None:
    global FLOAT32_ROTARY, SDPA_BACKEND
    args = parse()
    FLOAT32_ROTARY, SDPA_BACKEND = args.float32_rotary, args.sdpa_backend
    if os.environ.get("BENCH_DEBUG_LOG"):  # compileq's debug lines on stderr (bench/matrix.py)
        import logging

        logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("compileq").setLevel(logging.DEBUG)
    distributed = "RANK" in os.environ
    rank = int(os.environ.get("RANK", "0"))
    if args.rank_caches:  # read lazily by Inductor and Triton: set before the first compile
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{args.rank_caches}/rank{rank}/inductor"
        os.environ["TRITON_CACHE_DIR"] = f"{args.rank_caches}/rank{rank}/triton"
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    workload = Workload(args)
    torch.manual_seed(0)
    model = workload.build().to(device)
    reference = workload.build().to(device)
    reference.load_state_dict(model.state_dict())
    if args.compile_blocks and not args.eager:  # before sharding, as torchtitan orders it
        for block in workload.blocks(model):
            block.compile(mode=args.mode)
    if distributed and args.fsdp:
        shard(model, workload.blocks(model), device)
        shard(reference, workload.blocks(reference), device)
    elif distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        cap = {"bucket_cap_mb": args.bucket_mb} if args.bucket_mb else {}
        model = DDP(model, device_ids=ids, **cap)  # type: ignore[assignment]
        reference = DDP(reference, device_ids=ids, **cap)  # type: ignore[assignment]
    STARTUP["models built"] = time.time()
    whole = not (args.eager or args.compile_blocks)
    compiled = torch.compile(model, mode=args.mode) if whole else model
    STARTUP["compile wrapped"] = time.time()
    # A tensor learning rate: a compiled step does not recompile when a schedule changes it.
    lr = torch.tensor(1e-3) if args.compile_optimizer else 1e-3
    optimizers = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (model, reference)]
    generator = torch.Generator().manual_seed(1 + rank)
    autocast = torch.autocast(
        device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and not args.no_autocast
    )

    def update(optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    compiled_update = torch.compile(update) if args.compile_optimizer and not args.eager else update

    def step(
        net: nn.Module,
        optimizer: torch.optim.Optimizer,
        batch: tuple[torch.Tensor, ...],
        fn: Callable[[torch.optim.Optimizer], None] = update,
    ) -> float:
        inputs, targets = batch
        with autocast:
            out = workload.forward(net, inputs)
        loss = workload.loss(out, targets)
        loss.backward()
        fn(optimizer)
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    losses, eager, steps_s, first_step_s, finished_at = [], [], [], 0.0, 0.0
    phases: dict[str, float] = {}
    # The phases each of the first steps added (a dynamic graph compiles at step 1, a CUDA
    # graph records at step 2): where a later step's compile went, not only the first's.
    step_phases: list[dict[str, float]] = []
    seen: dict[str, float] = {}
    for i in range(args.steps):
        batch = tuple(t.to(device) for t in workload.batch(i, generator))
        if args.mark_dynamic:
            torch._dynamo.mark_dynamic(batch[0], 2 if workload.images else 1)
        if i == 0:
            STARTUP["first step starts"] = time.time()
        started = time.perf_counter()
        losses.append(step(compiled, optimizers[0], batch, compiled_update))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # To 10 us: a steady step on a GPU is 9-50 ms, and stock's against compileq's is
        # judged to a few per cent (whole milliseconds hid that).
        steps_s.append(round(time.perf_counter() - started, 5))
        if i == 0:
            first_step_s = steps_s[0]
            finished_at = time.time()
            phases = compile_phases()
        if i < 3:
            now = compile_phases()
            added = {k: round(v - seen.get(k, 0.0), 3) for k, v in now.items()}
            step_phases.append({k: v for k, v in added.items() if v > 0})
            seen = now
        eager.append(step(reference, optimizers[1], batch))

    tolerance = 2e-2 if device.type == "cuda" else 1e-4
    same = all(
        abs(a - b) <= tolerance * max(1.0, abs(b)) for a, b in zip(losses, eager, strict=False)
    )
    same = same and all(
        torch.allclose(local(p).float(), local(q).float(), atol=tolerance * 5, rtol=tolerance)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    if args.dump_code:
        dump_output_code(Path(args.dump_code) / f"rank{rank}")
    from torch._inductor.codecache import PyCodeCache

    # Graphs this rank compiled, each counted once: DDP recompiles some at later steps.
    distinct = {m.__file__ for m in list(PyCodeCache.modules) if hasattr(m, "call")}
    from torch._dynamo.utils import counters

    import compileq.features as features

    result = {
        "rank": rank,
        "device": str(device),
        "losses": losses,
        "eager_losses": eager,
        "matches_eager": same,
        "first_step_s": round(first_step_s, 3),
        "steps_s": steps_s,  # every step of the compiled copy, the first included
        "finished_at": finished_at,  # wall clock at the end of the first step
        "graphs": len(distinct),
        "graph_lookups": sum(
            counters["inductor"][k] for k in ("fxgraph_cache_miss", "fxgraph_cache_hit")
        ),
        "compileq": features.installed_pool() is not None,
    }
    # The timings go to the result file only: ranks share stdout, and a line longer than the
    # chunks a launcher forwards (srun: 1 KiB) can come out spliced with another rank's.
    print(json.dumps({k: v for k, v in result.items() if k != "steps_s"}), flush=True)
    if args.rank_caches:
        # Of the first step; then what each of the first three steps added.
        timings = {"compile_phases": phases, "step_phases": step_phases, "startup": STARTUP}
        path = Path(args.rank_caches, f"rank{rank}", "result.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**result, **timings}))
    if distributed:
        import torch.distributed as dist

        dist.destroy_process_group()


def local(p: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter (FSDP2 holds DTensors, each rank a shard)."""
    to_local = getattr(p, "to_local", None)
    return to_local() if to_local is not None else p


def shard(model: nn.Module, blocks: list[nn.Module], device: torch.device) -> None:
    """FSDP2 as its docs show it: each block its own unit, then the root."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def dump_output_code(into: Path) -> None:
    """Every output-code module this process loaded (the ones with a ``call``), one file each
    named by position, so two runs of one script compare file by file."""
    from torch._inductor.codecache import PyCodeCache

    into.mkdir(parents=True, exist_ok=True)
    sources = sorted(
        Path(module.__file__).read_text()
        for module in list(PyCodeCache.modules)
        if hasattr(module, "call") and getattr(module, "__file__", None)
    )
    for i, source in enumerate(sources):
        (into / f"graph{i}.py").write_text(source)


if __name__ == "__main__":
    main()
