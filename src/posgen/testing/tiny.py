"""Tiny random-weight checkpoints of every supported decoder family, with a real tokenizer, for tests and demos.

They exercise the same code paths as the real models (GQA, q/k norms, sliding-window layers with their own
RoPE base) in seconds and need no download: the tokenizer is a small byte-level BPE trained on the
embedded corpus.
"""

from __future__ import annotations

from pathlib import Path

import torch


def corpus_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the first 200 k characters of the embedded corpus."""
    from posgen.corpus import load_text
    from posgen.trajectory.train import train_tokenizer

    return train_tokenizer(load_text("embedded")[:200_000], vocab_size)


def _mla(two: dict) -> dict:
    """DeepSeek's multi-head latent attention and MoE at tiny size (head dims replace ``head_dim``)."""
    return dict(
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        **{k: v for k, v in two.items() if k != "head_dim"},
    )


def _linear_then_full(two: dict) -> dict:
    """Qwen's hybrids at tiny size: a linear-attention layer, then an attention layer rotating a quarter of its dims."""
    return dict(
        layer_types=["linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        **two,
    )


# The tiny families: name -> a builder of its transformers config from ``two`` (2 layers and the shared sizes),
# ``common`` (the shared sizes alone) and ``rope`` (default RoPE). 2 layers unless a family needs more to show a
# feature. The registry's order is the order the tests take them in.
FAMILIES = {}
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256}


def family(name: str):
    """Register the decorated builder under ``name``."""

    def register(builder):
        FAMILIES[name] = builder
        return builder

    return register


def _simple(name: str, config_class: str, **extra):
    """Register a family that is its config class with default RoPE and ``extra`` settings."""
    family(name)(lambda tf, two, common: getattr(tf, config_class)(rope_parameters=ROPE, **extra, **two))


_simple("llama", "LlamaConfig")
family("llama-llama3")(
    lambda tf, two, common: tf.LlamaConfig(
        rope_parameters=ROPE
        | {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        | {"original_max_position_embeddings": 64},
        **two,
    )
)
family("llama-yarn")(lambda tf, two, common: tf.LlamaConfig(rope_parameters=YARN, **two))
_simple("mistral", "MistralConfig")
_simple("qwen2", "Qwen2Config")
_simple("qwen3", "Qwen3Config")
family("gemma2")(
    lambda tf, two, common: tf.Gemma2Config(
        sliding_window=16, query_pre_attn_scalar=16, attn_logit_softcapping=50.0, **two
    )
)


@family("gemma3")
def _gemma3(tf, two, common):
    return tf.Gemma3TextConfig(
        num_hidden_layers=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=16,
        query_pre_attn_scalar=16,
        rope_parameters={"sliding_attention": ROPE, "full_attention": ROPE | {"rope_theta": 1000000.0}},
        **common,
    )


@family("gemma4")
def _gemma4(tf, two, common):
    """Larger heads with proportional (partly unrotated) RoPE on full layers, shared keys."""
    return tf.Gemma4TextConfig(
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        num_kv_shared_layers=2,  # layers 2 and 3 attend with the keys of layers 0 and 1
        sliding_window=16,
        global_head_dim=32,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=common["vocab_size"],
        **common,
    )


_simple("olmo2", "Olmo2Config")
family("olmo3")(  # sliding-window layers, q/k norms over the whole projection
    lambda tf, two, common: tf.Olmo3Config(
        layer_types=["sliding_attention", "full_attention"], sliding_window=16, **two
    )
)
_simple("granite", "GraniteConfig")


@family("gpt-neox")
def _gpt_neox(tf, two, common):
    """A fused per-head [q, k, v] projection, the first quarter of each head rotated."""
    no_gqa = {k: v for k, v in two.items() if k not in ("num_key_value_heads", "head_dim")}
    return tf.GPTNeoXConfig(rope_parameters=ROPE | {"partial_rotary_factor": 0.25}, **no_gqa)


family("phi3")(  # fused [all q | all k | all v] projection
    lambda tf, two, common: tf.Phi3Config(rope_parameters=ROPE | {"partial_rotary_factor": 0.75}, **two)
)
family("phi")(
    lambda tf, two, common: tf.PhiConfig(
        rope_parameters=ROPE | {"partial_rotary_factor": 0.5}, qk_layernorm=True, **_no_head_dim(two)
    )
)
family("stablelm")(
    lambda tf, two, common: tf.StableLmConfig(
        rope_parameters=ROPE | {"partial_rotary_factor": 0.25}, qk_layernorm=True, **_no_head_dim(two)
    )
)
family("cohere")(  # interleaved pairs
    lambda tf, two, common: tf.CohereConfig(rope_parameters=ROPE, use_qk_norm=True, **_no_head_dim(two))
)
family("cohere2")(  # interleaved, and no rotation on its full-attention layers
    lambda tf, two, common: tf.Cohere2Config(
        rope_parameters=ROPE, layer_types=["sliding_attention", "full_attention"], sliding_window=16, **two
    )
)
family("llama4")(  # interleaved (complex) RoPE, a NoPE layer, an L2 q/k norm after the rotation
    lambda tf, two, common: tf.Llama4TextConfig(
        rope_parameters=ROPE, no_rope_layers=[1, 0], num_local_experts=2, intermediate_size_mlp=128, **two
    )
)
_simple("smollm3", "SmolLM3Config", no_rope_layers=[1, 0])  # NoPE on its second layer
family("gpt-oss")(  # attention sinks, sliding-window layers, YaRN
    lambda tf, two, common: tf.GptOssConfig(
        rope_parameters=YARN | {"rope_theta": 150000.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=16,
        **two,
    )
)
family("qwen3-next")(  # a linear-attention layer before an attention layer
    lambda tf, two, common: tf.Qwen3NextConfig(
        **_linear_then_full(two),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    )
)
# a linear-attention layer, then a gated attention layer with partial rotary
family("qwen3.5")(lambda tf, two, common: tf.Qwen3_5TextConfig(**_linear_then_full(two)))
family("ministral3")(  # YaRN with Llama 4's attention temperature
    lambda tf, two, common: tf.Ministral3Config(
        rope_parameters=YARN
        | {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1},
        **two,
    )
)
family("glm")(  # interleaved pairs in the first half of each head
    lambda tf, two, common: tf.GlmConfig(rope_parameters=ROPE | {"partial_rotary_factor": 0.5}, **two)
)
family("gptj")(  # refused by the capture: its attention does not go through AttentionInterface
    lambda tf, two, common: tf.GPTJConfig(
        vocab_size=common["vocab_size"], n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=1024
    )
)
family("falcon")(
    lambda tf, two, common: tf.FalconConfig(
        vocab_size=common["vocab_size"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4
    )
)
# MLA without the low-rank query (q_proj), complex-number RoPE
family("deepseek-v2")(lambda tf, two, common: tf.DeepseekV2Config(q_lora_rank=None, **_mla(two)))
# MLA: [nope | rope] heads, one RoPE key shared by all heads
family("deepseek-v3")(lambda tf, two, common: tf.DeepseekV3Config(q_lora_rank=16, **_mla(two)))


def _no_head_dim(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k != "head_dim"}


ARCHITECTURES = tuple(FAMILIES)  # every architecture make_tiny builds
# weights scaled up so that attention is far from uniform (fused projections: the whole q/k/v block)
_SCALED = ("q_proj.weight", "k_proj.weight", "qkv_proj.weight", "query_key_value.weight", "q_b_proj.weight")


def tiny_family_config(arch: str, tokenizer):
    """The transformers config of the tiny ``arch`` checkpoint (:func:`make_tiny`) for ``tokenizer``'s vocabulary."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=True,
    )
    import transformers as tf

    if arch not in FAMILIES:
        raise ValueError(f"unknown tiny architecture {arch!r} (have {', '.join(ARCHITECTURES)})")
    return FAMILIES[arch](tf, dict(num_hidden_layers=2, **common), common)


def make_tiny(path: str | Path, arch: str = "llama", seed: int = 1234, tokenizer=None) -> Path:
    """Save a tiny random checkpoint of ``arch`` (one of :data:`ARCHITECTURES`) with its tokenizer to ``path``."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    tokenizer = tokenizer or corpus_tokenizer(512)
    config = tiny_family_config(arch, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Larger weights than the default init make attention far from uniform, which the checks need.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(_SCALED):
                param.mul_(8.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_job(model_dir, windows, out, *, model: str = "tiny", variant: str = "trained", **run):
    """A :class:`posgen.llm.run.ModelRun` of a tiny checkpoint for a test: ``model_dir``'s ``variant`` on
    ``windows`` writing ``out``, in float32 on the CPU unless ``run`` says otherwise (samples, config_hash, ...)."""
    from posgen.llm.run import ModelRun

    return ModelRun(model_dir, windows, out, model=model, variant=variant, **run)
