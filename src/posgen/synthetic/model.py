"""The encoder classifier: token embeddings, a positional encoding from the registry, pre-LN encoder layers,
mean pooling, a linear head.

Clean (default): every layer's Q, K, V come from its layer-normed hidden state, pads are masked out of the
keys, a final LayerNorm, pooling averages the real tokens. ``faithful`` is the authors' classifier
(``dis_gen/trans.py``; docs/method.md section 8.1): K and V of every layer come from the input embeddings (plus
additive PE), no dropout on those embeddings (only on the attention and FFN outputs), no attention mask, no
final LayerNorm, pooling averages pads too, ALiBi slopes exp(-h/H) and learned positions initialised at the token scale (in
``posgen.synthetic.pe``).

``head_gate (layer, head)`` multiplies each head's value vectors: a 0 ablates that head (its value slice zeroed,
so it adds nothing to the layer's output).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posgen.synthetic.pe import Dims, logit_scale, make_pe


def written_out_attention(q, k, v, mask, dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s math path (the one it runs on a CPU whenever dropout is on), one
    operation per line and in its order, so the same bits (tests/unit/test_synthetic_train.py), without the check
    for fully masked rows that path adds (``_safe_softmax``: three passes over the logits). No row here
    is fully masked: every sequence has a real token. Every operation also has a ``vmap`` batching rule and a
    gradient for a learned bias in ``mask`` (the fused kernels have neither under ``vmap``), so a batched
    ensemble (posgen.synthetic.ensemble) runs as one."""
    half_scale = math.sqrt(logit_scale(q))  # SDPA scales q and k by the square root each
    logits = (q * half_scale) @ (k.transpose(-1, -2) * half_scale)  # (B, H, T, T)
    if mask is not None:
        logits.add_(mask)  # (B or 1, H or 1, T or 1, T), in place as SDPA does: no second (B, H, T, T) tensor
    weights = F.dropout(logits.softmax(-1), dropout_p)  # (B, H, T, T)
    return weights @ v  # (B, H, T, d)


# EncoderLayer.attention: "auto" writes attention out where SDPA would run its math path anyway (dropout on a
# CPU) and calls SDPA elsewhere (its fused kernels: a GPU, or evaluation); "written" always (a vmap ensemble);
# "sdpa" always (the reference the written-out form is tested against).
ATTENTION = ("auto", "written", "sdpa")


class EncoderLayer(nn.Module):
    def __init__(self, dims: Dims, d_ff: int, dropout: float):
        super().__init__()
        D = dims.d_model
        self.dims, self.dropout = dims, dropout
        self.norm_attn = nn.LayerNorm(D)
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out = nn.Linear(D, D)
        self.norm_ffn = nn.LayerNorm(D)
        self.ffn = nn.Sequential(nn.Linear(D, d_ff), nn.ReLU(), nn.Linear(d_ff, D))
        self.attention = "auto"  # one of ATTENTION (Classifier.use_attention)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.dims.n_heads, self.dims.head_dim).transpose(1, 2)  # (B, H, T, d)

    def qkv(self, h, x0, pe, layer: int, gate):
        """Queries and keys as the PE shapes them, values (gated), and the PE's logit bias."""
        x_q = self.norm_attn(h)  # (B, T, D)
        x_k = x0 if self.dims.faithful else x_q
        q, k, v = self.heads(self.query(x_q)), self.heads(self.key(x_k)), self.heads(self.value(x_k))
        if gate is not None:
            v = v * gate[:, None, None]  # (H, 1, 1): zero the ablated heads' values
        q, k, bias = pe.attend(layer, q, k, x_q, x_k)
        return q, k, v, bias

    def forward(self, h, x0, pe, layer: int, key_bias, gate=None):
        q, k, v, bias = self.qkv(h, x0, pe, layer, gate)
        if bias is not None:
            mask = bias[None] if key_bias is None else bias[None] + key_bias  # (1 or B, H, T, T)
        else:
            mask = key_bias
        p = self.dropout if self.training else 0.0
        if self.attention == "written" or (self.attention == "auto" and p > 0 and q.device.type == "cpu"):
            att = written_out_attention(q, k, v, mask, p)  # (B, H, T, d)
        else:
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=logit_scale(q))
        att = att.transpose(1, 2).reshape(h.shape)  # (B, T, D)
        h = h + F.dropout(self.out(att), p, self.training)
        return h + F.dropout(self.ffn(self.norm_ffn(h)), p, self.training)


class Classifier(nn.Module):
    def __init__(
        self,
        *,
        vocab_size: int,
        n_classes: int,
        max_len: int,
        pe: str,
        n_layers: int,
        n_heads: int,
        d_model: int,
        d_ff: int,
        dropout: float,
        faithful: bool = False,
        rope_heads: int = 1,
        rope_base: float = 10000.0,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"synthetic.model.d_model: {d_model} is not a multiple of n_heads {n_heads}")
        self.config = dict(
            vocab_size=vocab_size,
            n_classes=n_classes,
            max_len=max_len,
            pe=pe,
            n_layers=n_layers,
            n_heads=n_heads,
            d_model=d_model,
            d_ff=d_ff,
            dropout=dropout,
            faithful=faithful,
            rope_heads=rope_heads,
            rope_base=rope_base,
        )
        self.dims = Dims(n_layers, n_heads, d_model, max_len, faithful, rope_heads, rope_base)
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pe = make_pe(pe, self.dims)
        self.layers = nn.ModuleList(EncoderLayer(self.dims, d_ff, dropout) for _ in range(n_layers))
        # the authors' classifier pools the last layer's output as it is
        self.norm = nn.Identity() if faithful else nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)
        self.dropout = dropout

    def use_attention(self, kind: str) -> Classifier:
        """How every layer computes attention (one of ``ATTENTION``): the same function either way."""
        if kind not in ATTENTION:
            raise ValueError(f"attention: {kind!r} (expected one of {', '.join(ATTENTION)})")
        for layer in self.layers:
            layer.attention = kind
        return self

    def _inputs(self, tokens: torch.Tensor):
        """The residual stream's input (embeddings with absolute PE; after dropout in clean mode only: the
        authors' classifier has no dropout there), the K/V source of faithful mode (the same embeddings), the
        key-side additive mask (None when faithful) and the real-token mask."""
        real = tokens != 0  # (B, T)
        x0 = self.pe.embed(self.embedding(tokens))  # (B, T, D)
        if self.dims.faithful:
            return x0, x0, None, real
        h = F.dropout(x0, self.dropout, self.training)
        key_bias = torch.zeros(real.shape, dtype=x0.dtype, device=x0.device).masked_fill(~real, float("-inf"))
        return h, h, key_bias[:, None, None, :], real  # (B, 1, 1, T)

    def hidden_states(self, tokens: torch.Tensor, head_gate: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The residual stream (B, T, D) at the input and after every layer: L + 1 tensors."""
        h, x0, key_bias, _ = self._inputs(tokens)
        states = [h]
        for layer, block in enumerate(self.layers):
            h = block(h, x0, self.pe, layer, key_bias, None if head_gate is None else head_gate[layer])
            states.append(h)
        return states

    def forward(self, tokens: torch.Tensor, head_gate: torch.Tensor | None = None) -> torch.Tensor:
        """Class logits (B, n_classes) of token ids (B, T), 0 = pad."""
        return self.classify(self.hidden_states(tokens, head_gate)[-1], tokens != 0)

    def resume(self, tokens: torch.Tensor, layer: int, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Class logits when layer ``layer`` (input ``h``, the residual stream an ungated pass gave it) runs with
        head gate ``gate (H,)`` and the layers above run ungated: a single-layer ablation without recomputing the
        layers below it."""
        _, x0, key_bias, real = self._inputs(tokens)
        for index in range(layer, len(self.layers)):
            h = self.layers[index](h, x0, self.pe, index, key_bias, gate if index == layer else None)
        return self.classify(h, real)

    def classify(self, h: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Class logits (B, n_classes) of the last layer's residual stream ``h (B, T, D)``."""
        h = self.norm(h)  # (B, T, D)
        if self.dims.faithful:
            pooled = h.mean(1)  # pads included, as in the authors' code
        else:
            weight = real.to(h.dtype)[..., None]  # (B, T, 1)
            pooled = (h * weight).sum(1) / weight.sum(1).clamp(min=1)  # (B, D)
        return self.head(pooled)

    @torch.no_grad()
    def attention_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Pre-mask, pre-softmax logits (B, layer, H, T, T) of every layer and head, bias included (eval mode)."""
        was_training = self.training
        self.eval()
        h, x0, key_bias, _ = self._inputs(tokens)
        out = []
        for layer, block in enumerate(self.layers):
            q, k, _, bias = block.qkv(h, x0, self.pe, layer, None)
            logits = q @ k.transpose(-1, -2) * logit_scale(q)  # (B, H, T, T)
            out.append(logits if bias is None else logits + bias)
            h = block(h, x0, self.pe, layer, key_bias)
        self.train(was_training)
        return torch.stack(out, 1)


def batch_tokens(tokens: torch.Tensor, faithful: bool) -> torch.Tensor:
    """Clean mode drops the batch's all-pad tail columns (masked anyway); faithful mode keeps every pad."""
    if faithful:
        return tokens
    used = int((tokens != 0).any(0).nonzero().max()) + 1
    return tokens[:, :used]


def build(config: dict) -> Classifier:
    return Classifier(**config)
