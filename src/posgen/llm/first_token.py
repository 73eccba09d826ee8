"""The first-token control (docs/method.md section 3C; rule FIRST_TOKEN of posgen.verdict_rules): the model's input
embedding at position 0 replaced by the mean input embedding over its vocabulary, the same vector in every window,
so that the first token carries no window-specific identity.

What that vector is depends on the weights. In a trained model it is the centroid of the embeddings. At random init
the rows are independent draws, and the mean of V of them has about 1/sqrt(V) of a row's norm (SmolLM2, V = 49,152:
0.45 % for a draw of its N(0, 0.02) embedding; the trained centroid has 68 %): position 0 then holds a near-null
token, not a token inside the embedding distribution. Kept so (issue 50) rather than a fixed real token: the control
asks whether the first token's window-specific residual stream makes the random-init keys drift, and a near-null
token removes that stream more completely than any real token would, while a real token would put its own content,
at full norm, into every window.

Absolute position reaches a RoPE model's keys through the causal mask's normaliser and through the first token's
residual stream (arXiv 2606.06160); this control takes the second away. It applies to the extraction (a models
entry's ``first_token``), hence to every statistic of decomposition.nc and bands.nc, held-out windows included.
"""

from __future__ import annotations

import contextlib

import torch

from posgen.verdict_rules import value

CONTROL = value("FIRST_TOKEN")  # the first-token control (docstring: what it is at random init)
FIRST_TOKEN = ("model", CONTROL)  # a models entry's first_token: the model's own first token, or the control
CHUNK = 8192  # vocabulary rows embedded at a time for the mean (Gemma's 262k rows at once would be ~0.7 GB)


@torch.no_grad()
def mean_embedding(embed: torch.nn.Module, vocab_size: int) -> torch.Tensor:
    """(hidden,) the mean of ``embed``'s output over every token id, through the module itself, so that a scaled
    embedding (Gemma multiplies by sqrt(hidden)) is averaged as the model sees it; summed in float64."""
    device = next(embed.parameters()).device
    total = None
    for start in range(0, vocab_size, CHUNK):
        ids = torch.arange(start, min(start + CHUNK, vocab_size), device=device)[None]  # (1, n)
        part = embed(ids)[0].double().sum(0)  # (hidden,)
        total = part if total is None else total + part
    return total / vocab_size


@contextlib.contextmanager
def first_token_replaced(model, how: str = "model"):
    """Inside, every forward pass of ``model`` sees the mean input embedding at position 0 (``how`` =
    "mean-embedding"); "model" changes nothing."""
    if how not in FIRST_TOKEN:
        raise ValueError(f"models[].first_token: {how!r} is not one of {', '.join(FIRST_TOKEN)}")
    if how == "model":
        yield
        return
    embed = model.get_input_embeddings()
    mean = mean_embedding(embed, embed.num_embeddings if hasattr(embed, "num_embeddings") else embed.weight.shape[0])

    def replace(_module, _inputs, output):  # output (batch, tokens, hidden)
        output = output.clone()
        output[:, 0] = mean.to(output.dtype)
        return output

    handle = embed.register_forward_hook(replace)
    try:
        yield
    finally:
        handle.remove()
