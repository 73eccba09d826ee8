"""The Toeplitz view of a classifier's logits, with its null, and the additive-vs-multiplicative test
(docs/method.md section 8.5).

Per (layer, head), over each test sample's real-token block of the (bidirectional) logit matrix, pooled over
samples as ``1 - sum SSE / sum SST``:

* ``toeplitz_share``: the best ``a(i-j)`` fit; ``additive_share``: the best ``a(i-j) + b(i) + c(j)`` fit
  (``posgen.decomposition.toeplitz_shares``);
* their **null**: the same shares of the same matrix with its entries permuted at random (seeded), i.e. what a
  fit with as many free parameters explains in noise (about ``2/(T+1)`` for a(i-j));
* **distance x content**: each entry's factors are its signed distance ``i - j`` and its content
  ``(class of token i, class of token j)`` (every trigger id its own class, all fillers one class). Shares of
  the distance effect alone, the content effect alone, their additive sum (least squares by backfitting) and
  the full distance x content cell means; ``interaction_share = full - additive`` (adjusted R^2 throughout,
  so that sparse cells do not count as explained variance). A purely additive encoding (T5, ALiBi) puts its
  position in ``a(i-j)`` beside the content and leaves the interaction near zero; RoPE multiplies every content
  term by a function of ``i - j`` and should not.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen.decomposition import toeplitz_shares

BACKFIT_ITERATIONS = 50


def _group_means(y: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Mean of ``y`` per group (0 for an empty group), indexed by group."""
    total = np.bincount(groups, weights=y, minlength=n_groups)
    count = np.bincount(groups, minlength=n_groups)
    return np.divide(total, count, out=np.zeros(n_groups), where=count > 0)


def _adjusted(sse: float, sst: float, n: int, parameters: int) -> float:
    if sst <= 0 or n - parameters <= 0:
        return np.nan
    return 1.0 - (sse / (n - parameters)) / (sst / (n - 1))


def distance_content_shares(y: np.ndarray, distance: np.ndarray, content: np.ndarray) -> dict[str, float]:
    """Adjusted variance shares of ``y`` explained by distance, content, both additively, and their cells.

    ``distance`` and ``content``: non-negative integer codes per entry (same shape as ``y``)."""
    y = np.asarray(y, dtype=np.float64).ravel()
    d, c = np.ravel(distance), np.ravel(content)
    n_d, n_c = int(d.max()) + 1, int(c.max()) + 1
    y = y - y.mean()
    sst = float(y @ y)
    n = len(y)
    used_d, used_c = len(np.unique(d)), len(np.unique(c))
    a = _group_means(y, d, n_d)
    by_distance = y - a[d]
    b = _group_means(y, c, n_c)
    by_content = y - b[c]
    a_fit, b_fit = np.zeros(n_d), np.zeros(n_c)
    for _ in range(BACKFIT_ITERATIONS):
        a_fit = _group_means(y - b_fit[c], d, n_d)
        b_fit = _group_means(y - a_fit[d], c, n_c)
    additive = y - a_fit[d] - b_fit[c]
    cell = d * n_c + c
    full = y - _group_means(y, cell, n_d * n_c)[cell]
    used_cells = len(np.unique(cell))
    shares = {
        "distance_share": _adjusted(float(by_distance @ by_distance), sst, n, used_d),
        "content_share": _adjusted(float(by_content @ by_content), sst, n, used_c),
        "distance_content_share": _adjusted(float(additive @ additive), sst, n, used_d + used_c - 1),
        "cell_share": _adjusted(float(full @ full), sst, n, used_cells),
    }
    shares["interaction_share"] = shares["cell_share"] - shares["distance_content_share"]
    return shares


def token_classes(tokens: np.ndarray, n_trigger_ids: int) -> np.ndarray:
    """Content class of each token: its id for a trigger (1..n_trigger_ids), n_trigger_ids + 1 for a filler."""
    return np.where(tokens <= n_trigger_ids, tokens, n_trigger_ids + 1)


def toeplitz_view(model, tokens: torch.Tensor, lengths: np.ndarray, n_trigger_ids: int, seed: int = 0) -> dict:
    """Every share above, (layer, head) arrays, over the samples' real-token blocks.

    ``tokens`` are passed at the width the model is run at (faithful mode: the full pad width); the logits of
    the first ``length`` tokens of each sample are analysed."""
    L, H = model.dims.n_layers, model.dims.n_heads
    rng = np.random.default_rng(seed)
    sse = np.zeros((4, L, H))  # toeplitz, additive, and both for the permuted matrix
    sst = np.zeros((L, H))
    entries = {key: [] for key in ("y", "distance", "content")}
    n_classes = n_trigger_ids + 2
    for sample, T in enumerate(lengths):
        logits = model.attention_logits(tokens[sample : sample + 1])[0, :, :, :T, :T]  # (layer, head, T, T)
        flat = logits.reshape(L, H, T * T)
        permuted = flat[..., torch.as_tensor(rng.permutation(T * T))].reshape(L, H, T, T)
        shares = toeplitz_shares(logits, causal=False) + toeplitz_shares(permuted, causal=False)
        centred = logits.double() - logits.double().mean((-1, -2), keepdim=True)
        total = (centred * centred).sum((-1, -2)).cpu().numpy()  # (layer, head)
        for i, share in enumerate(shares):
            sse[i] += np.nan_to_num((1 - share.cpu().numpy()) * total)
        sst += total
        classes = token_classes(tokens[sample, :T].cpu().numpy(), n_trigger_ids)  # (T,)
        position = np.arange(T)
        entries["y"].append(centred.reshape(L, H, T * T).cpu().numpy())
        entries["distance"].append((position[:, None] - position[None, :] + T - 1).ravel())
        entries["content"].append((classes[:, None] * n_classes + classes[None, :]).ravel())
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = np.where(sst > 0, 1 - sse / sst, np.nan)
    # distances are coded with the longest sample's offset so that one code means one i - j in every sample
    offset = int(max(lengths)) - 1
    distance = np.concatenate([d - (T - 1) + offset for d, T in zip(entries["distance"], lengths)])
    content = np.concatenate(entries["content"])
    y = np.concatenate(entries["y"], -1)  # (layer, head, entries): each sample centred, as in the shares above
    split = {
        key: np.full((L, H), np.nan)
        for key in ("distance_share", "content_share", "distance_content_share", "cell_share", "interaction_share")
    }
    for layer in range(L):
        for head in range(H):
            for key, value in distance_content_shares(y[layer, head], distance, content).items():
                split[key][layer, head] = value
    return {
        "toeplitz_share": pooled[0],
        "additive_share": pooled[1],
        "toeplitz_null": pooled[2],
        "additive_null": pooled[3],
        **split,
    }
