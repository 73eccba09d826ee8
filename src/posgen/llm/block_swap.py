"""A second reading of "positional or semantic" per head: block-swap scores (docs/method.md section 3D).

Urrutia et al. (ICLR 2026) call a head *positional* when its logits are invariant under a permutation of the key
vectors (attention depends on where the keys are, not on what they are) and *symbolic* when the logits move with
the keys (equivariance). Their own metric could not be read here (no network); this score is ours, built on those
two definitions alone, and labelled so wherever it is shown.

For one window: the keys at positions 1 .. m-1 (``m = T - n_queries``; the sink at 0 stays) are cut into blocks
of ``block`` tokens, and the blocks are put in a seeded random order pi (a block swap). The queries are the last
``n_queries`` tokens, so every moved key stays in each query's past (a short window scales both down,
:func:`fitted`). With the true logits
``L[i, j] = s (R_i q_i).(R_j k_j)`` and the logits with the key contents moved and the positions kept
``L'[i, j] = s (R_i q_i).(R_j k_pi(j))``, each row centred over its keys (softmax ignores a shift):

    d_pos = sum_ij (L'[i, j] - L[i, j])^2         zero for a purely positional head
    d_sym = sum_ij (L'[i, j] - L[i, pi(j)])^2     zero for a purely symbolic head
    P     = d_sym / (d_pos + d_sym)                1 positional, 0 symbolic, NaN where both vanish

summed over the query rows and the windows before the ratio. Per RoPE band the dot product is restricted to the
band's two dimensions (band l pairs dims l and l + d/2, posgen.rope). The decomposition's own reading of a head is
its f share ``r2_f / (r2_f + r2_g)`` under Method A (posgen.llm.head_ablation.per_head_split: the variance of the
logits that f alone explains against g alone; sink column excluded, as here).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import xarray as xr
from scipy import stats

from posgen.llm.head_ablation import per_head_split
from posgen.rope import rotate
from posgen.stats import spearman
from posgen.store import carried_attrs, open_dataset, provenance, read_rope, write_netcdf

BLOCK = 16  # tokens per swapped block
N_QUERIES = 32  # the last tokens of the window, whose past holds every moved key
SEED = 0
AGREE_LEVEL = 0.95  # "the readings agree": Spearman rho over heads with its Fisher interval above 0


def block_order(n_keys: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """pi over key positions 1 .. n_keys: whole blocks of ``block`` tokens in a random order (a last short block
    stays last), position 0 fixed; (n_keys + 1,) indices."""
    starts = np.arange(1, n_keys + 1, block)
    full = starts[starts + block <= n_keys + 1]
    order = rng.permutation(len(full))
    moved = np.concatenate([np.arange(full[o], full[o] + block) for o in order]) if len(full) else np.zeros(0, int)
    tail = np.arange(1 + len(moved), n_keys + 1)
    return np.concatenate([[0], moved, tail]).astype(np.int64)


def swap_distances(q, k, inv_freq, scaling: float, attention_scaling: float, pi: np.ndarray, n_queries: int):
    """(d_pos, d_sym), each (head, band) of band-restricted sums, for one layer of one window. ``q``: (head, T, d),
    ``k``: (head, T, d) pre-RoPE (KV heads expanded); ``pi``: the block order over keys 0 .. m-1."""
    T, d = q.shape[-2], q.shape[-1]
    m = len(pi)
    positions = torch.arange(T)
    queries, keys = positions[T - n_queries :], positions[1:m]  # the last Q tokens; keys 1 .. m-1
    q_rot = rotate(q[:, queries], queries, inv_freq, attention_scaling)  # (H, Q, d)
    k_rot = rotate(k[:, keys], keys, inv_freq, attention_scaling)  # (H, K, d)
    k_moved = rotate(k[:, torch.as_tensor(pi[1:])], keys, inv_freq, attention_scaling)  # (H, K, d): k_pi(j) at j
    half = d // 2
    # per band: the two dims of band l are l and l + d/2
    prod = q_rot[:, :, None, :] * k_rot[:, None, :, :]  # (H, Q, K, d)
    moved = q_rot[:, :, None, :] * k_moved[:, None, :, :]  # (H, Q, K, d)
    band = (prod[..., :half] + prod[..., half:]) * scaling  # (H, Q, K, band)
    band_moved = (moved[..., :half] + moved[..., half:]) * scaling  # (H, Q, K, band)
    band = band - band.mean(2, keepdim=True)  # rows centred over their keys
    band_moved = band_moved - band_moved.mean(2, keepdim=True)
    follow = band[:, :, torch.as_tensor(pi[1:] - 1)]  # L[i, pi(j)]: (H, Q, K, band)
    d_pos = ((band_moved - band) ** 2).sum((1, 2))  # (H, band)
    d_sym = ((band_moved - follow) ** 2).sum((1, 2))  # (H, band)
    # the whole head: band logits add, then the same distances
    whole, whole_moved, whole_follow = band.sum(-1), band_moved.sum(-1), follow.sum(-1)  # (H, Q, K)
    d_pos_head = ((whole_moved - whole) ** 2).sum((1, 2))  # (H,)
    d_sym_head = ((whole_moved - whole_follow) ** 2).sum((1, 2))  # (H,)
    return d_pos.double(), d_sym.double(), d_pos_head.double(), d_sym_head.double()


def ratio(d_sym: np.ndarray, d_pos: np.ndarray) -> np.ndarray:
    """P = d_sym / (d_pos + d_sym), NaN where both vanish (a head whose centred logits are zero)."""
    total = d_pos + d_sym
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, d_sym / np.where(total > 0, total, 1.0), np.nan)


def fitted(n_tokens: int, n_queries: int, block: int) -> tuple[int, int]:
    """(queries, block) for windows of ``n_tokens``: at most a quarter of the window for the queries and at least
    four blocks of keys before them (a short window scales both down, as recorded in the output's attrs)."""
    n_queries = min(n_queries, n_tokens // 4)
    block = min(block, (n_tokens - n_queries - 1) // 4)
    if n_queries < 1 or block < 1:
        raise ValueError(f"block swap: windows of {n_tokens} tokens are too short for queries and four key blocks")
    return n_queries, block


def block_swap_scores(qk: xr.Dataset, *, block: int = BLOCK, n_queries: int = N_QUERIES, seed: int = SEED):
    """block_swap.nc's dataset from a qk.h5 dataset: ``positional_score`` (layer, head) and ``band_score``
    (layer, head, band), over every window it keeps."""
    rope = read_rope(qk)
    n_tokens = qk.sizes["token"]
    n_queries, block = fitted(n_tokens, n_queries, block)
    kv_group = torch.as_tensor(rope.kv_group)
    n_layers, n_heads, half = qk.sizes["layer"], qk.sizes["head"], qk.sizes["dim"] // 2
    sums = {name: np.zeros((n_layers, n_heads, half)) for name in ("d_pos", "d_sym")}
    heads = {name: np.zeros((n_layers, n_heads)) for name in ("d_pos", "d_sym")}
    rng = np.random.default_rng(seed)
    for sample in qk["sample"].values:
        pi = block_order(n_tokens - n_queries - 1, block, rng)  # one order per window, every layer alike
        for layer in range(n_layers):
            q = torch.from_numpy(np.asarray(qk["q"].sel(sample=sample).isel(layer=layer).values, np.float32))
            k = torch.from_numpy(np.asarray(qk["k"].sel(sample=sample).isel(layer=layer).values, np.float32))
            table = rope.layer(layer)
            inv_freq = torch.as_tensor(table.inv_freq, dtype=torch.float32)
            k = k[kv_group]  # (head, T, d)
            rope_args = (inv_freq, float(table.scaling), float(table.attention_scaling), pi, n_queries)
            # one head at a time: Q x K x d floats each, whatever the model's head count
            parts = [swap_distances(q[h : h + 1], k[h : h + 1], *rope_args) for h in range(n_heads)]
            d_pos, d_sym, d_pos_h, d_sym_h = (torch.cat(part) for part in zip(*parts))
            sums["d_pos"][layer] += d_pos.numpy()
            sums["d_sym"][layer] += d_sym.numpy()
            heads["d_pos"][layer] += d_pos_h.numpy()
            heads["d_sym"][layer] += d_sym_h.numpy()
    return xr.Dataset(
        {
            "positional_score": (("layer", "head"), ratio(heads["d_sym"], heads["d_pos"])),
            "band_score": (("layer", "head", "band"), ratio(sums["d_sym"], sums["d_pos"])),
            "inv_freq": (("layer", "band"), np.asarray(rope.inv_freq, dtype=np.float64)),
        },
        coords={"layer": qk["layer"].values, "head": qk["head"].values, "band": np.arange(half)},
        attrs={
            "block": block,
            "n_queries": n_queries,
            "block_seed": seed,
            "windows": int(qk.sizes["sample"]),
            "n_tokens": int(n_tokens),
            "score": "P = d_sym / (d_pos + d_sym): 1 positional, 0 symbolic (posgen.llm.block_swap; after the "
            "definitions of Urrutia et al., ICLR 2026, not their metric)",
        },
    )


def agreement(score: np.ndarray, f_share: np.ndarray) -> dict:
    """Spearman rho over heads between the block-swap score and the decomposition's f share, with its Fisher-z
    interval; the readings agree when the interval lies above 0."""
    x, y = np.ravel(score), np.ravel(f_share)
    n = int((np.isfinite(x) & np.isfinite(y)).sum())
    rho = spearman(x, y)
    half = stats.norm.ppf(0.5 + AGREE_LEVEL / 2) / np.sqrt(max(n - 3, 1))
    lo, hi = (float(np.tanh(np.arctanh(np.clip(rho, -0.999999, 0.999999)) + s * half)) for s in (-1, 1))
    return {"rho": rho, "lo": lo, "hi": hi, "heads": n, "agree": int(lo > 0)}


def block_swap_job(qk_path, decomposition_path, out_path, config_hash: str = "", **options) -> xr.Dataset:
    """block_swap.nc: the scores of qk.h5's windows, the decomposition's f share per head beside them, and their
    agreement in the attrs; ``options``: :func:`block_swap_scores`' (its defaults in the workflow)."""
    qk = open_dataset(qk_path)
    scores = block_swap_scores(qk, **options)
    scores["f_share"] = per_head_split(open_dataset(decomposition_path, lazy=False))["f_share"]
    agree = agreement(scores["positional_score"].values, scores["f_share"].values)
    scores.attrs.update({f"agreement_{key}": value for key, value in agree.items()})
    scores.attrs.update(provenance(**carried_attrs(qk), config_hash=config_hash))
    write_netcdf(scores, out_path)
    return scores


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("qk")
    parser.add_argument("decomposition")
    parser.add_argument("out")
    parser.add_argument("--block", type=int, default=BLOCK)
    parser.add_argument("--n-queries", type=int, default=N_QUERIES)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    ds = block_swap_job(
        args.qk, args.decomposition, args.out, block=args.block, n_queries=args.n_queries, seed=args.seed
    )
    a = {key.removeprefix("agreement_"): value for key, value in ds.attrs.items() if key.startswith("agreement_")}
    print(
        f"{args.out}: mean positional score {float(ds['positional_score'].mean()):.3f}; Spearman rho with the "
        f"decomposition's f share {a['rho']:+.3f} [{a['lo']:+.3f}, {a['hi']:+.3f}] over {a['heads']} heads: "
        f"{'agree' if a['agree'] else 'do not agree'}"
    )


if __name__ == "__main__":
    main()


def block_swap_step(job):
    """Rule block_swap's job (a :class:`posgen.workflow.job.StepJob`)."""
    i = job.input
    return block_swap_job(i["qk"], i["decomposition"], job.output["block_swap"], job.params["config_hash"])


def reproduction_section(paths) -> str:
    """reproduction.md's section on the second reading per head: per model variant, the mean block-swap score and
    its Spearman correlation over heads with the decomposition's f share (posgen.llm.block_swap)."""
    lines = [
        "## A second reading per head: block swaps (diagnostic)",
        "",
        "Keys moved block by block, positions kept: a head whose logits stay put is positional (score 1), one "
        "whose logits move with the keys symbolic (0); our measure after the definitions of Urrutia et al. "
        "(ICLR 2026), not their metric (docs/method.md section 3D). The readings agree where the Spearman "
        "correlation over heads with the decomposition's f share r_f^2 / (r_f^2 + r_g^2) has its 95 % "
        "interval above 0.",
        "",
        "| model | variant | windows x tokens | mean score | Spearman rho with the f share [95 %] | heads | readings |",
        "|---|---|---|---:|---|---:|---|",
    ]
    for path in paths:
        ds = open_dataset(path, lazy=False)
        a = {key.removeprefix("agreement_"): ds.attrs[key] for key in ds.attrs if key.startswith("agreement_")}
        lines.append(
            f"| {ds.attrs.get('model', '')} | {ds.attrs.get('variant', '')} | {ds.attrs['windows']} x "
            f"{ds.attrs['n_tokens']} | {float(ds['positional_score'].mean()):.3f} | {a['rho']:+.3f} "
            f"[{a['lo']:+.3f}, {a['hi']:+.3f}] | {a['heads']} | {'agree' if a['agree'] else 'do not agree'} |"
        )
        ds.close()
    return "\n".join(lines) + "\n"
