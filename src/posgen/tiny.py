"""Tiny random-weight checkpoints (Llama, Gemma 3) with a real tokenizer, for tests and quick demos.

They exercise the same code paths as the real models (GQA, q/k norms, sliding-window layers with their own
RoPE base) in seconds and need no download: the tokenizer is a small byte-level BPE trained on the
embedded corpus.
"""

from __future__ import annotations

from pathlib import Path

import torch


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from posgen.corpus import load_text

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = load_text("embedded")
    tok.train_from_iterator([text[i : i + 10_000] for i in range(0, 200_000, 10_000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")


def make_tiny(path: str | Path, arch: str = "llama", seed: int = 1234) -> Path:
    """Save a tiny random checkpoint of ``arch`` ('llama' or 'gemma3') with its tokenizer to ``path``."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    path = Path(path)
    tokenizer = _tokenizer(512)
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
        tie_word_embeddings=True,
    )
    if arch == "llama":
        config = LlamaConfig(
            num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common
        )
    elif arch == "gemma3":
        config = Gemma3TextConfig(
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
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Larger weights than the default init make attention far from uniform, which the checks need.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(8.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
