"""The zoo's models: PyTorch's own Inductor benchmark suites, as its model lists name them
(``benchmarks/dynamo/timm_models_list.txt``, 18 models, and ``huggingface_models_list.txt``, 55,
at pytorch/pytorch 06d9861 and 0fb2b95), each with how ``python -m bench zoo`` builds it at
random init with no download, its task, and its sizes.

Two sizes. ``tiny`` is for a CPU: two layers, width 64, a vocabulary of 1,000, batch 2 at 32
tokens or 64 x 64 images, so that a 2-core machine compiles each model in under a minute or
two (timm models whose family takes no depth or width keep their architecture, at a small
image). ``gpu`` is for one GPU: the config class's own widths (the suites' checkpoints are
those defaults or close), four layers, the suites' batch sizes (their list file's, divided as
their yaml divides them, at most 32), their sequence lengths up to 512, images at the model's
own size: each compiles in 10-90 s on an H200.

The suites build HuggingFace models from ``AutoConfig.from_pretrained`` for a few names (a
checkpoint on the hub); here the config class is built in code with what distinguishes that
checkpoint where it matters (``DistillGPT2``: six layers at ``gpu`` size). The LLMs the suite
runs with ``generate()`` from pretrained weights are trained here from their config like the
rest; not here are the three the suite itself skips as too big (gemma-3-4b-it,
Mistral-7B-Instruct, gpt-oss-20b) and whisper-tiny (audio features, not tokens or images).
Rejected: downloading checkpoints (no hub here, and the zoo measures compiles, not
weights), and the suites' own harness (its accuracy checks run eager and compiled in one
process; compileq's question is a fresh process's first step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_V, _H, _L, _NH = 1000, 64, 2, 2
_FF, _P = 4 * _H, 128
_BERT = dict(
    vocab_size=_V,
    hidden_size=_H,
    num_hidden_layers=_L,
    num_attention_heads=_NH,
    intermediate_size=_FF,
    max_position_embeddings=_P,
)
_BART = dict(
    vocab_size=_V,
    d_model=_H,
    encoder_layers=_L,
    decoder_layers=_L,
    encoder_attention_heads=_NH,
    decoder_attention_heads=_NH,
    encoder_ffn_dim=_FF,
    decoder_ffn_dim=_FF,
    max_position_embeddings=_P,
)
_T5 = dict(
    vocab_size=_V,
    d_model=_H,
    d_kv=_H // _NH,
    d_ff=_FF,
    num_layers=_L,
    num_decoder_layers=_L,
    num_heads=_NH,
)
_GPT2 = dict(vocab_size=_V, n_embd=_H, n_layer=_L, n_head=_NH, n_positions=_P)
_LLAMA = dict(
    vocab_size=_V,
    hidden_size=_H,
    intermediate_size=_FF,
    num_hidden_layers=_L,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=_P,
)

#: Each config class's keyword arguments at ``tiny`` size.
TINY_CONFIG: dict[str, dict[str, Any]] = {
    "AlbertConfig": {**_BERT, "embedding_size": _H},
    "LongformerConfig": {**_BERT, "attention_window": 16},
    "BartConfig": _BART,
    "MBartConfig": _BART,
    "PLBartConfig": _BART,
    "BlenderbotConfig": _BART,
    "BlenderbotSmallConfig": _BART,
    "PegasusConfig": _BART,
    "M2M100Config": _BART,
    "BertConfig": _BERT,
    "CamembertConfig": _BERT,
    "RobertaConfig": _BERT,
    "LayoutLMConfig": _BERT,
    "MegatronBertConfig": _BERT,
    "DebertaV2Config": _BERT,
    "ElectraConfig": {**_BERT, "embedding_size": _H},
    "ConvBertConfig": {**_BERT, "embedding_size": _H},
    "FNetConfig": {k: v for k, v in _BERT.items() if k != "num_attention_heads"},
    "MobileBertConfig": {
        **_BERT,
        "embedding_size": 32,
        "intra_bottleneck_size": 32,
        "true_hidden_size": 32,
        "intermediate_size": 128,
        "num_feedforward_networks": 2,
    },
    "DistilBertConfig": dict(
        vocab_size=_V, dim=_H, n_layers=_L, n_heads=_NH, hidden_dim=_FF, max_position_embeddings=_P
    ),
    "GPT2Config": _GPT2,
    "GPTJConfig": {**_GPT2, "n_head": 4, "rotary_dim": 8},
    "GPTNeoConfig": dict(
        vocab_size=_V,
        hidden_size=_H,
        num_layers=_L,
        num_heads=_NH,
        intermediate_size=_FF,
        max_position_embeddings=_P,
        window_size=16,
        attention_types=[[["global", "local"], 1]],
    ),
    "OPTConfig": dict(
        vocab_size=_V,
        hidden_size=_H,
        num_hidden_layers=_L,
        num_attention_heads=_NH,
        ffn_dim=_FF,
        word_embed_proj_dim=_H,
        max_position_embeddings=_P,
    ),
    "T5Config": _T5,
    "MT5Config": _T5,
    "TrOCRConfig": dict(
        vocab_size=_V,
        d_model=_H,
        decoder_layers=_L,
        decoder_attention_heads=_NH,
        decoder_ffn_dim=_FF,
        max_position_embeddings=_P,
    ),
    "XGLMConfig": dict(
        vocab_size=_V,
        d_model=_H,
        num_layers=_L,
        attention_heads=_NH,
        ffn_dim=_FF,
        max_position_embeddings=_P,
    ),
    "XLNetConfig": dict(vocab_size=_V, d_model=_H, n_layer=_L, n_head=_NH, d_inner=_FF),
    "LlamaConfig": _LLAMA,
    "Qwen3Config": _LLAMA,
    "Gemma2Config": {**_LLAMA, "sliding_window": 16},
}
#: The keys that count a config's layers: four each at ``gpu`` size.
_LAYER_KEYS = frozenset(("num_hidden_layers", "encoder_layers", "decoder_layers", "num_layers")) | {
    "num_decoder_layers",
    "n_layer",
    "n_layers",
}
GPU_LAYERS = 4
_NEO_GPU = {"attention_types": [[["global", "local"], GPU_LAYERS // 2]]}


@dataclass(frozen=True)
class ZooModel:
    """One model of a suite's list, and how the zoo's training script is asked to build it."""

    name: str
    suite: str  # "timm" or "hf"
    #: timm's model name, or the transformers model class.
    arch: str
    #: The transformers config class (HuggingFace only).
    config: str = ""
    task: str = "lm"  # lm, seq2seq, cls, qa, image
    #: The suite's GPU batch size (its list file's, divided as its yaml divides it).
    batch: int = 8
    #: The suite's sequence length (tokens), or the image's side.
    length: int = 128
    #: ``create_model``'s or the config's keyword arguments at ``tiny`` size, beyond
    #: ``TINY_CONFIG`` (timm: its depth and width where the family takes them).
    tiny: dict[str, Any] = field(default_factory=dict)
    #: The same at ``gpu`` size.
    gpu: dict[str, Any] = field(default_factory=dict)
    tiny_size: int = 0  # the image's side at tiny size (0: 64)
    #: bf16 autocast on a GPU. Off for a model with an op that has no bf16 kernel, which eager
    #: fails on too; fp16, the suite's ``--amp``, is no way out for an FFT: cuFFT computes
    #: half precision only for sizes that are powers of two (FNet's width is 768).
    autocast: bool = True

    def model_config(self, size: str) -> dict[str, Any]:
        if self.suite == "timm":
            return dict(self.tiny if size == "tiny" else self.gpu)
        tiny = {**TINY_CONFIG.get(self.config, {}), **self.tiny}
        if size == "tiny":
            return tiny
        layers = {k: GPU_LAYERS for k in tiny if k in _LAYER_KEYS}
        return {**layers, **self.gpu}

    def args(self, size: str) -> list[str]:
        """``examples/llama_script.py``'s arguments for this model at ``size``."""
        prefix = "timm" if self.suite == "timm" else "hf"
        if size == "tiny":
            batch = 2
            length = (self.tiny_size or 64) if self.task == "image" else 32
        else:
            batch, length = min(self.batch, 32), min(self.length, 512)
        return [
            "--model", f"{prefix}:{self.arch}", "--task", self.task,
            "--model-config", json.dumps(self.model_config(size)),
            "--batch", str(batch), "--size", str(length),
            *([] if self.autocast else ["--no-autocast"]),
        ]  # fmt: skip


def _hf(
    name: str, batch: int, config: str, arch: str = "", length: int = 512, **more: Any
) -> ZooModel:
    task = (
        "qa"
        if name.endswith("QuestionAnswering")
        else "cls"
        if name.endswith("SequenceClassification")
        else "seq2seq"
        if (arch or name).endswith("ConditionalGeneration")
        else "lm"
    )
    return ZooModel(name, "hf", arch or name, config, task, batch, length, **more)


def _timm(name: str, batch: int, side: int = 224, **more: Any) -> ZooModel:
    return ZooModel(name, "timm", name, task="image", batch=batch, length=side, **more)


#: A vision transformer at tiny size: two blocks of width 64 on 64 x 64 images.
_VIT_TINY = {"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 64}

MODELS: tuple[ZooModel, ...] = (
    # -- timm_models_list.txt: batch sizes as listed, divided as timm_models.yaml divides them.
    _timm("adv_inception_v3", 128, 299, tiny_size=75),
    _timm("beit_base_patch16_224", 64, tiny=_VIT_TINY),
    _timm(
        "convnextv2_nano.fcmae_ft_in22k_in1k",
        128,
        tiny={"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)},
    ),
    _timm("deit_base_distilled_patch16_224", 64, tiny=_VIT_TINY),
    _timm("deit_tiny_patch16_224.fb_in1k", 128, tiny=_VIT_TINY),
    _timm("dm_nfnet_f0", 128, 192),
    _timm("ghostnet_100", 512),
    _timm("inception_v3", 128, 299, tiny_size=75),
    _timm("mobilenetv2_100", 128),
    _timm("mobilenetv3_large_100", 512),
    _timm("mobilevit_s", 64, 256),
    _timm("nfnet_l0", 128),
    _timm("repvgg_a2", 128),
    _timm(
        "swin_base_patch4_window7_224",
        64,
        tiny={"depths": (1, 1, 1, 1), "embed_dim": 32, "num_heads": (1, 2, 4, 8)},
        tiny_size=224,
    ),
    _timm("tf_efficientnet_b0", 128),
    _timm("visformer_small", 128, tiny={"img_size": 64}),  # it asserts its input size
    _timm(
        "vit_base_patch14_dinov2.lvd142m",
        128,
        tiny={**_VIT_TINY, "img_size": 56},
        gpu={"img_size": 224},
        tiny_size=56,
    ),
    _timm("vit_base_patch16_siglip_256", 128, 256, tiny=_VIT_TINY),
    # -- huggingface_models_list.txt: batch sizes as listed, divided as huggingface.yaml does,
    # sequence lengths as huggingface.py sets them (at most 512 here).
    _hf("AlbertForMaskedLM", 4, "AlbertConfig"),
    _hf("AlbertForQuestionAnswering", 8, "AlbertConfig"),
    # Position ids start after the padding index (RoBERTa's family): 512 tokens need 514
    # positions, as the checkpoints have (the config classes' default, 512, does not).
    _hf(
        "AllenaiLongformerBase",
        4,
        "LongformerConfig",
        "LongformerForMaskedLM",
        gpu={"max_position_embeddings": 4098},
    ),
    _hf("BartForCausalLM", 4, "BartConfig"),
    _hf("BartForConditionalGeneration", 4, "BartConfig"),
    _hf("BertForMaskedLM", 16, "BertConfig"),
    _hf("BertForQuestionAnswering", 32, "BertConfig"),
    _hf("BlenderbotForCausalLM", 4, "BlenderbotConfig", length=128),
    _hf("BlenderbotForConditionalGeneration", 16, "BlenderbotConfig", length=128),
    _hf("BlenderbotSmallForCausalLM", 256, "BlenderbotSmallConfig", length=128),
    _hf("BlenderbotSmallForConditionalGeneration", 128, "BlenderbotSmallConfig", length=128),
    _hf("CamemBert", 32, "CamembertConfig", "CamembertForMaskedLM", 128),
    _hf("DebertaV2ForMaskedLM", 2, "DebertaV2Config"),
    _hf("DebertaV2ForQuestionAnswering", 8, "DebertaV2Config"),
    _hf("DistilBertForMaskedLM", 128, "DistilBertConfig", length=128),
    _hf("DistilBertForQuestionAnswering", 512, "DistilBertConfig", length=128),
    _hf("DistillGPT2", 16, "GPT2Config", "GPT2LMHeadModel", gpu={"n_layer": 6}),
    _hf("ElectraForCausalLM", 32, "ElectraConfig"),
    _hf("ElectraForQuestionAnswering", 128, "ElectraConfig"),
    _hf("GPT2ForSequenceClassification", 4, "GPT2Config"),
    _hf("GPTJForCausalLM", 1, "GPTJConfig", length=128),
    _hf("GPTJForQuestionAnswering", 1, "GPTJConfig", length=128),
    # The config class counts its layers from attention_types (24 by default): four here.
    _hf("GPTNeoForCausalLM", 32, "GPTNeoConfig", length=128, gpu=_NEO_GPU),
    _hf("GPTNeoForSequenceClassification", 32, "GPTNeoConfig", length=128, gpu=_NEO_GPU),
    # FFT: "Unsupported dtype BFloat16" (ZooModel.autocast).
    _hf("GoogleFnet", 16, "FNetConfig", "FNetForMaskedLM", autocast=False),
    _hf("LayoutLMForMaskedLM", 16, "LayoutLMConfig"),
    _hf("LayoutLMForSequenceClassification", 32, "LayoutLMConfig"),
    _hf("M2M100ForConditionalGeneration", 16, "M2M100Config", length=128),
    _hf("MBartForCausalLM", 4, "MBartConfig"),
    _hf("MBartForConditionalGeneration", 4, "MBartConfig"),
    _hf("MT5ForConditionalGeneration", 16, "MT5Config", length=128),
    _hf("MegatronBertForCausalLM", 4, "MegatronBertConfig"),
    _hf("MegatronBertForQuestionAnswering", 16, "MegatronBertConfig"),
    _hf("MobileBertForMaskedLM", 128, "MobileBertConfig", length=128),
    _hf("MobileBertForQuestionAnswering", 256, "MobileBertConfig", length=128),
    _hf("OPTForCausalLM", 2, "OPTConfig"),
    _hf("PLBartForCausalLM", 8, "PLBartConfig"),
    _hf("PLBartForConditionalGeneration", 8, "PLBartConfig"),
    _hf("PegasusForCausalLM", 32, "PegasusConfig", length=128),
    _hf("PegasusForConditionalGeneration", 64, "PegasusConfig", length=128),
    _hf("RobertaForCausalLM", 16, "RobertaConfig", gpu={"max_position_embeddings": 514}),
    _hf("RobertaForQuestionAnswering", 32, "RobertaConfig", gpu={"max_position_embeddings": 514}),
    _hf("T5ForConditionalGeneration", 4, "T5Config"),
    _hf("T5Small", 4, "T5Config", "T5ForConditionalGeneration"),
    _hf("TrOCRForCausalLM", 32, "TrOCRConfig", length=256),
    _hf("XGLMForCausalLM", 8, "XGLMConfig", length=128),
    _hf("XLNetLMHeadModel", 8, "XLNetConfig"),
    _hf("YituTechConvBert", 16, "ConvBertConfig", "ConvBertForMaskedLM"),
    # The suite's LLMs (generate() from pretrained weights there): trained from their config.
    # At gpu size with their checkpoints' widths: the config classes' defaults are other
    # models (LlamaConfig's is a 7B).
    _hf(
        "meta-llama/Llama-3.2-1B",
        1,
        "LlamaConfig",
        "LlamaForCausalLM",
        gpu={
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
        },
    ),
    _hf(
        "google/gemma-2-2b",
        1,
        "Gemma2Config",
        "Gemma2ForCausalLM",
        gpu={
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
        },
    ),
    _hf(
        "Qwen/Qwen3-0.6B",
        1,
        "Qwen3Config",
        "Qwen3ForCausalLM",
        gpu={
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
        },
    ),
)


#: How a model outside the lists is named to ``python -m bench zoo --models``.
extra = ("timm:", "hf:")


def size_for(gpu: bool) -> str:
    """The zoo's size on a machine with or without a GPU: the suites' own on a GPU, tiny on
    the CPU (``bench zoo --size`` and ``bench.ddp --zoo`` both)."""
    return "gpu" if gpu else "tiny"


def named(name: str) -> ZooModel | None:
    """The zoo's model called ``name``: one of the lists, or one of your own (``timm:NAME``,
    ``hf:CLASS``: :func:`unlisted`); None for a name that is neither. What ``python -m bench
    zoo --models`` and ``python -m bench.ddp --zoo`` both take."""
    listed = next((m for m in MODELS if m.name == name), None)
    if listed is not None or not name.startswith(extra):
        return listed
    return unlisted(name)


def unlisted(name: str) -> ZooModel:
    """``timm:NAME`` or ``hf:CLASS`` (with its config class, ``<Family>Config``): a model of
    your own in the zoo, at the sizes its library gives it (``tiny`` shrinks only what
    ``TINY_CONFIG`` knows)."""
    suite, _, arch = name.partition(":")
    if suite == "timm":
        return ZooModel(name, "timm", arch, task="image", batch=32)
    import transformers

    config = getattr(transformers, arch).config_class.__name__
    return _hf(name, 8, config, arch)
