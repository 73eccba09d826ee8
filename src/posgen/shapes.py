"""The exact configs of the paper-scale models, for random-init runs at their real shape without their weights.

Copied by hand from each repository's ``config.json`` at the revision ``config.paper.yaml`` pins (the keys that
define the shape and the attention; everything else takes transformers' defaults). A benchmark or a GPU proof
run builds these with ``from_config``: the weights are random, but every shape, the RoPE variant (llama3
scaling), GQA, soft-capping and sliding windows are the real ones, so time, memory and bytes are too.
"""

from __future__ import annotations

PAPER_SHAPES = {
    "llama-3.1-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": False,
    },
    "mistral-7b": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    },
    "gemma-2-9b": {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    },
}


# The embedded defaults, so that a plan needs no acquired model (their config.json after GGUF de-quantisation).
EMBEDDED_SHAPES = {
    "smollm2-135m": {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "gemma3-270m": {
        "model_type": "gemma3_text",
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "vocab_size": 262144,
        "max_position_embeddings": 32768,
        "query_pre_attn_scalar": 256,
        "sliding_window": 512,
        "tie_word_embeddings": True,
    },
    # opt-in (make setup-scale). The GGUF stores the output matrix beside the embedding (each quantised on its
    # own), so the de-quantised checkpoint is untied: 630 M and 1.78 B stored parameters for 494 M and 1.54 B.
    "qwen2.5-coder-0.5b": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    },
    "qwen2.5-coder-1.5b": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    },
}
SHAPES = {**PAPER_SHAPES, **EMBEDDED_SHAPES}


def shape_config(name: str, n_layers: int | None = None):
    """The transformers config of recorded shape ``name``, optionally truncated to its first ``n_layers`` layers."""
    from transformers import AutoConfig

    if name not in SHAPES:
        raise KeyError(f"{name!r}: no recorded shape (have {', '.join(SHAPES)})")
    kwargs = dict(SHAPES[name])
    model_type = kwargs.pop("model_type")
    config = AutoConfig.for_model(model_type, **kwargs)
    if n_layers is not None:
        config.num_hidden_layers = n_layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:n_layers]
    return config


def parameter_count(config) -> int:
    """Exact parameter count of a config, from a model built on the meta device (no memory, no init)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
