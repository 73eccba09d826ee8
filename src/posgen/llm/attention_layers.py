"""Which modules of a transformers model are its attention layers, and their shapes: head size per layer (Gemma 4's
full layers have wider heads), the number of key heads, and which layers attend with an earlier layer's keys
(Gemma 4's KV sharing)."""

from __future__ import annotations

from posgen.llm import families


def attention_modules(model) -> list:
    """Self-attention modules in layer order (hybrid stacks: only the layers that have attention)."""
    found = [m for m in model.modules() if is_attention(m)]
    if not found:
        raise families.UnsupportedModelError(
            f"{type(model).__name__}: not supported: no attention module with q_proj/k_proj, qkv_proj or "
            "query_key_value"
        )
    return sorted(found, key=lambda m: m.layer_idx)


def shares_keys(m) -> bool:
    """True for a layer that attends with an earlier layer's keys (Gemma 4's KV sharing)."""
    return bool(getattr(m, "is_kv_shared_layer", False))


def key_readers(modules, where: str) -> dict[int, list[int]]:
    """Attention layer -> the layers that attend with its keys: itself, and the later KV-sharing layers of its
    layer type (they read the keys of the last earlier layer of that type that stores them)."""
    readers = {i: [i] for i, m in enumerate(modules) if not shares_keys(m)}
    for i, m in enumerate(modules):
        if shares_keys(m):
            stores = [j for j in range(i) if getattr(modules[j], "store_full_length_kv", False)]
            stores = [j for j in stores if getattr(modules[j], "layer_type", None) == getattr(m, "layer_type", None)]
            if not stores:
                raise families.UnsupportedModelError(
                    f"{where} layer {m.layer_idx}: not supported: shares keys with no earlier layer of its type"
                )
            readers[stores[-1]].append(i)
    return readers


def head_size(m, config, n_heads: int) -> int:
    """One attention layer's q/k head size: the module's own (it varies by layer in Gemma 4), else the config's."""
    for name in ("qk_head_dim", "head_dim"):  # MLA: q/k heads are [nope | rope]
        if isinstance(getattr(m, name, None), int):
            return getattr(m, name)
    return getattr(config, "head_dim", None) or config.hidden_size // n_heads


def kv_heads(modules, config, n_heads: int, where: str) -> int:
    """The number of key heads, the same in every layer (the store has one ``kv_head`` dimension)."""
    counts = {n_heads // m.num_key_value_groups for m in modules if getattr(m, "num_key_value_groups", None)}
    if len(counts) > 1:
        raise families.UnsupportedModelError(
            f"{where}: not supported: the number of key/value heads differs across layers ({sorted(counts)})"
        )
    return counts.pop() if counts else (getattr(config, "num_key_value_heads", None) or n_heads)


def is_attention(m) -> bool:
    fused = hasattr(m, "qkv_proj") or hasattr(m, "query_key_value") or hasattr(m, "kv_a_proj_with_mqa")
    has_qk = (hasattr(m, "q_proj") and (hasattr(m, "k_proj") or shares_keys(m))) or fused
    return hasattr(m, "layer_idx") and has_qk
