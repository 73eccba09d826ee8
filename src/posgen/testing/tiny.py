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


def _family_config(arch: str, common: dict):
    """The transformers config of one tiny family (2 layers unless the family needs more to show a feature)."""
    import transformers as tf

    two = dict(num_hidden_layers=2, **common)
    default_rope = {"rope_type": "default", "rope_theta": 10000.0}
    if arch == "llama":
        return tf.LlamaConfig(rope_parameters=default_rope, **two)
    if arch == "llama-llama3":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0}
        rope |= {"high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return tf.LlamaConfig(rope_parameters=rope, **two)
    if arch == "llama-yarn":
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256}
        return tf.LlamaConfig(rope_parameters=rope, **two)
    if arch == "gemma3":
        return tf.Gemma3TextConfig(
            num_hidden_layers=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            sliding_window=16,
            query_pre_attn_scalar=16,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
            **common,
        )
    if arch == "gemma4":  # larger heads with proportional (partly unrotated) RoPE on full layers, shared keys
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
    if arch == "olmo3":  # sliding-window layers, q/k norms over the whole projection
        return tf.Olmo3Config(
            num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=16, **common
        )
    if arch == "qwen3.5":  # linear-attention layer, then a gated attention layer with partial rotary
        return tf.Qwen3_5TextConfig(**_linear_then_full(two))
    if arch == "ministral3":  # YaRN with Llama 4's attention temperature
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256}
        rope |= {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
        return tf.Ministral3Config(rope_parameters=rope | {"llama_4_scaling_beta": 0.1}, **two)
    if arch == "gemma2":
        return tf.Gemma2Config(sliding_window=16, query_pre_attn_scalar=16, attn_logit_softcapping=50.0, **two)
    simple = {
        "mistral": tf.MistralConfig,
        "qwen2": tf.Qwen2Config,
        "qwen3": tf.Qwen3Config,
        "olmo2": tf.Olmo2Config,
        "granite": tf.GraniteConfig,
    }
    if arch in simple:
        return simple[arch](rope_parameters=default_rope, **two)
    if arch == "gpt-neox":  # fused per-head [q, k, v] projection, first quarter of each head rotated
        no_gqa = {k: v for k, v in two.items() if k not in ("num_key_value_heads", "head_dim")}
        return tf.GPTNeoXConfig(rope_parameters=default_rope | {"partial_rotary_factor": 0.25}, **no_gqa)
    if arch == "phi3":  # fused [all q | all k | all v] projection
        return tf.Phi3Config(rope_parameters=default_rope | {"partial_rotary_factor": 0.75}, **two)
    if arch == "phi":
        rope = default_rope | {"partial_rotary_factor": 0.5}
        return tf.PhiConfig(rope_parameters=rope, qk_layernorm=True, **_no_head_dim(two))
    if arch == "stablelm":
        rope = default_rope | {"partial_rotary_factor": 0.25}
        return tf.StableLmConfig(rope_parameters=rope, qk_layernorm=True, **_no_head_dim(two))
    if arch == "cohere":  # interleaved pairs
        return tf.CohereConfig(rope_parameters=default_rope, use_qk_norm=True, **_no_head_dim(two))
    if arch == "cohere2":  # interleaved, and no rotation on its full-attention layers
        return tf.Cohere2Config(
            rope_parameters=default_rope, layer_types=["sliding_attention", "full_attention"], sliding_window=16, **two
        )
    if arch == "llama4":  # interleaved (complex) RoPE, a NoPE layer, an L2 q/k norm after the rotation
        return tf.Llama4TextConfig(
            rope_parameters=default_rope,
            no_rope_layers=[1, 0],
            num_local_experts=2,
            intermediate_size_mlp=128,
            **two,
        )
    if arch == "smollm3":  # NoPE on its second layer
        return tf.SmolLM3Config(rope_parameters=default_rope, no_rope_layers=[1, 0], **two)
    if arch == "gpt-oss":  # attention sinks, sliding-window layers, YaRN
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 256}
        rope |= {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
        return tf.GptOssConfig(
            rope_parameters=rope, num_local_experts=4, num_experts_per_tok=2, sliding_window=16, **two
        )
    if arch == "qwen3-next":  # a linear-attention layer before an attention layer
        return tf.Qwen3NextConfig(
            **_linear_then_full(two),
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    if arch == "glm":  # interleaved pairs in the first half of each head
        return tf.GlmConfig(rope_parameters=default_rope | {"partial_rotary_factor": 0.5}, **two)
    if arch == "gptj":
        return tf.GPTJConfig(
            vocab_size=common["vocab_size"], n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=1024
        )
    if arch == "falcon":
        return tf.FalconConfig(
            vocab_size=common["vocab_size"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4
        )
    if arch == "deepseek-v2":  # MLA without the low-rank query (q_proj), complex-number RoPE
        return tf.DeepseekV2Config(q_lora_rank=None, **_mla(two))
    if arch == "deepseek-v3":  # MLA: [nope | rope] heads, one RoPE key shared by all heads
        return tf.DeepseekV3Config(q_lora_rank=16, **_mla(two))
    raise ValueError(f"unknown tiny architecture {arch!r} (have {', '.join(ARCHITECTURES)})")


def _no_head_dim(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k != "head_dim"}


# every architecture make_tiny builds
ARCHITECTURES = (
    "llama",
    "llama-llama3",
    "llama-yarn",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "gemma4",
    "olmo2",
    "olmo3",
    "granite",
    "gpt-neox",
    "phi3",
    "phi",
    "stablelm",
    "cohere",
    "cohere2",
    "llama4",
    "smollm3",
    "gpt-oss",
    "qwen3-next",
    "qwen3.5",
    "ministral3",
    "glm",
    "gptj",
    "falcon",
    "deepseek-v2",
    "deepseek-v3",
)
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
    return _family_config(arch, common)


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
