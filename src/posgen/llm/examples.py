"""The data behind the example-head figures (logit maps and scatter): ``examples.nc`` of one model variant,
computed from ``qk.h5`` and ``decomposition.nc`` with Method A (torch), by the ``examples`` rule."""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm

from posgen.llm.method_a import method_a_pairs, method_a_terms  # the sink-free reading, as in perturb.nc
from posgen.rope import causal_mask, logits
from posgen.stats import pearson
from posgen.store import open_dataset, provenance, read_rope, require, write_netcdf

SELECTION_RULE = (
    "Method A r (at the dummy distance, sink column dropped) averaged over samples; 'median' is the head at the "
    "lower median of that list, 'worst' the head with the lowest r; ties go to the lowest (layer, head)."
)


def select_heads(decomposition: xr.Dataset) -> dict[str, tuple[int, int, float]]:
    """The example heads of figures 1 and 2: {"median": (layer, head, r), "worst": ...} (see SELECTION_RULE)."""
    require(decomposition, ["r"], "decomposition.nc")
    # a dict, because method= is a keyword of sel()
    r = decomposition["r"].sel({"method": "A", "sink": "without"}).mean("sample").transpose("layer", "head")
    flat = r.values.ravel()
    if not np.isfinite(flat).any():
        raise ValueError("decomposition.nc: r has no finite values for method A, sink 'without'")
    flat = np.where(np.isfinite(flat), flat, np.inf)  # a dead head (NaN r) is never picked
    order = np.argsort(flat, kind="stable")
    n_finite = int(np.isfinite(flat).sum())
    picks = {"median": order[(n_finite - 1) // 2], "worst": order[0]}
    layer, head = np.unravel_index(list(picks.values()), r.shape)
    return {
        name: (int(r["layer"].values[li]), int(r["head"].values[hi]), float(flat[i]))
        for (name, i), li, hi in zip(picks.items(), layer, head)
    }


def distances_used(decomposition: xr.Dataset, n_layers: int) -> np.ndarray:
    """Each layer's dummy distance in the decomposition, (layer,) integers."""
    if "dummy_distance_used" in decomposition.coords:
        return np.asarray(decomposition["dummy_distance_used"].values, dtype=np.int64)
    # written before per-layer distances: one D for every layer
    return np.full(n_layers, int(decomposition.attrs["dummy_distance"]), dtype=np.int64)


def head_maps(q, k, positions, rope, dummy_distance: int, mask: np.ndarray, crop: int) -> dict:
    """One head's W, f and g maps, cropped to ``crop`` tokens with NaN where ``mask`` (T, T) scores nothing, and
    its r over the scored entries. ``q``, ``k``: (1, T, dim) pre-RoPE; ``rope``: (inv_freq, scaling, amplitude)."""
    inv_freq, s, a = rope
    w = logits(q[0], k[0], inv_freq, s, a).numpy()  # (T, T)
    f, g = (t[0].numpy() for t in method_a_terms(q, k, positions, inv_freq, s, a, dummy_distance=dummy_distance))
    keep = mask[:crop, :crop]
    return {
        "W": np.where(keep, w[:crop, :crop], np.nan),
        "f": np.where(keep, f[:crop, :crop], np.nan),
        "g": np.where(keep, g[:crop, :crop], np.nan),
        "r_sample": pearson(w[mask], (f + g)[mask]),
    }


def scored_mask(n_tok: int, sliding_window: int) -> np.ndarray:
    """The entries the examples score, (T, T) booleans: causal, inside a sliding window, and never the sink column
    j = 0 (the attention sink is analysed apart)."""
    mask = causal_mask(n_tok, sliding_window).numpy()
    mask[:, 0] = False
    return mask


def draw_pairs(mask: np.ndarray, n_pool: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A seeded sample of up to ``n_pool`` scored entries of ``mask``, without repeats and in row-major order, so
    that the pool is the same on every run: (query indices, key indices)."""
    valid = np.flatnonzero(mask)
    chosen = np.sort(rng.choice(valid, size=min(n_pool, valid.size), replace=False))
    return np.unravel_index(chosen, mask.shape)


def layer_operands(qs: xr.DataArray, ks: xr.DataArray, rope, li: int) -> tuple:
    """Layer ``li``'s pre-RoPE q (head, T, dim) and k expanded to the query heads (head, T, dim), float32 tensors,
    and its RoPE as Method A takes it: (inv_freq tensor, scaling, amplitude)."""
    q = torch.from_numpy(np.asarray(qs.isel(layer=li).values, dtype=np.float32))
    k = torch.from_numpy(np.asarray(ks.isel(layer=li).values, dtype=np.float32))[torch.as_tensor(rope.kv_group)]
    layer_rope = rope.layer(li)
    inv_freq = torch.as_tensor(layer_rope.inv_freq, dtype=torch.float32)
    return q, k, (inv_freq, float(layer_rope.scaling), float(layer_rope.attention_scaling))


def pools_and_maps(qk: xr.Dataset, sample: int, used: np.ndarray, heads: dict, crop: int, n_pool: int, seed: int):
    """Every layer of window ``sample`` in turn: a seeded sample of (W, f + g) entries of every head, and the maps
    of the example heads it holds (:func:`head_maps`): (examples.nc's pool variables, {example name: maps})."""
    qs = qk["q"].sel(sample=sample).astype(np.float32)  # float32 whatever the storage dtype
    ks = qk["k"].sel(sample=sample).astype(np.float32)
    n_tok = qs.sizes["token"]
    positions = torch.arange(n_tok)
    rope = read_rope(qk)
    rng = np.random.default_rng(seed)
    layer_ids, head_ids = qk["layer"].values, qk["head"].values
    pool_w = np.full((len(layer_ids), len(head_ids), n_pool), np.nan, np.float32)  # NaN-padded past a layer's draw
    pool_a = np.full_like(pool_w, np.nan)
    pool_ij = np.full((2, len(layer_ids), n_pool), -1, np.int64)
    maps = {}
    for li in tqdm(range(len(layer_ids)), desc="example heads", unit="layer"):
        mask = scored_mask(n_tok, int(rope.sliding_window[li]))
        ii, jj = draw_pairs(mask, n_pool, rng)
        pool_ij[:, li, : len(ii)] = ii, jj
        q, k, layer_rope = layer_operands(qs, ks, rope, li)
        pairs = (torch.from_numpy(ii), torch.from_numpy(jj))
        w_pairs, f_pairs, g_pairs = method_a_pairs(q, k, positions, *layer_rope, int(used[li]), *pairs)
        pool_w[li, :, : len(ii)] = w_pairs.numpy()
        pool_a[li, :, : len(ii)] = (f_pairs + g_pairs).numpy()
        for name, (layer, head, _) in heads.items():
            if layer != layer_ids[li]:
                continue
            h = int(np.flatnonzero(head_ids == head)[0])
            maps[name] = head_maps(q[h : h + 1], k[h : h + 1], positions, layer_rope, int(used[li]), mask, crop)
    pools = {
        "pool_W": (("layer", "head", "pair"), pool_w),
        "pool_A": (("layer", "head", "pair"), pool_a),
        "pool_query": (("layer", "pair"), pool_ij[0]),
        "pool_key": (("layer", "pair"), pool_ij[1]),
    }
    return pools, maps


def example_heads(
    qk: xr.Dataset,
    decomposition: xr.Dataset,
    *,
    sample: int = 0,
    map_tokens: int = 256,
    pool_pairs: int = 1000,
    seed: int = 0,
) -> xr.Dataset:
    """W, f, g maps of the example heads and a seeded sample of (W, f + g) entries of every head.

    All on one ``sample`` of qk.h5 with the sink column j = 0 dropped (from kbar and from the entries), at
    each layer's dummy distance of the decomposition (``dummy_distance_used``: inside the window of a
    sliding-window layer). Maps are cropped to the first ``map_tokens`` tokens; NaN
    marks entries that are not scored (j > i, j = 0, outside a sliding window).
    """
    require(qk, ["q", "k", "inv_freq", "scaling", "attention_scaling", "sliding_window", "kv_group"], "qk.h5")
    if sample not in qk["sample"].values:
        kept = qk["sample"].values.tolist()
        raise IndexError(f"config.figures.sample: {sample} is not a window kept in qk.h5 (it keeps {kept})")
    dummy_distance = int(decomposition.attrs["dummy_distance"])
    used = distances_used(decomposition, qk.sizes["layer"])  # (layer,)
    heads = select_heads(decomposition)
    n_tok = qk.sizes["token"]
    crop = min(map_tokens, n_tok)
    n_pool = min(pool_pairs, n_tok * (n_tok - 1) // 2)  # a sliding-window layer may offer fewer: NaN-padded
    pools, maps = pools_and_maps(qk, sample, used, heads, crop, n_pool, seed)
    names = list(heads)
    example_maps = {
        var: (("example", "query", "key"), np.stack([maps[n][var] for n in names]).astype(np.float32))
        for var in ("W", "f", "g")
    }
    coords = {
        "example": names,
        "example_layer": ("example", [heads[n][0] for n in names]),
        "example_head": ("example", [heads[n][1] for n in names]),
        "example_r": ("example", [heads[n][2] for n in names]),
        "example_r_sample": ("example", [maps[n]["r_sample"] for n in names]),
        "query": np.arange(crop),
        "key": np.arange(crop),
        "layer": qk["layer"].values,
        "head": qk["head"].values,
        "pair": np.arange(n_pool),
        "dummy_distance_used": ("layer", used),
    }
    attrs = {
        "sample": sample,
        "dummy_distance": dummy_distance,
        "sink": "without",
        "map_tokens": crop,
        "pool_pairs": n_pool,
        "pool_seed": seed,
        "selection_rule": SELECTION_RULE,
    }
    return xr.Dataset(example_maps | pools, coords=coords, attrs=attrs)


EXAMPLE_OPTIONS = ("sample", "map_tokens", "pool_pairs", "seed")


def examples_job(qk_path, decomposition_path, out_path, options: dict | None = None, **attrs) -> xr.Dataset:
    """examples.nc: :func:`example_heads` of one model variant, with provenance attrs."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(EXAMPLE_OPTIONS))
    if unknown:
        raise KeyError(f"config.figures: unknown key(s) {', '.join(unknown)} (known: {', '.join(EXAMPLE_OPTIONS)})")
    qk = open_dataset(qk_path, lazy=True)
    ds = example_heads(qk, open_dataset(decomposition_path, lazy=False), **options)
    ds.attrs.update(provenance(**attrs))
    write_netcdf(ds, out_path)
    return ds


def examples_step(job):
    """Rule examples' job (a :class:`posgen.workflow.job.StepJob`)."""
    p, w = job.params, job.wildcards
    return examples_job(
        job.input["qk"],
        job.input["decomposition"],
        job.output["examples"],
        options={key: p[key] for key in ("sample", "map_tokens", "pool_pairs", "seed")},
        model=w["model"],
        variant=w["variant"],
        config_hash=p["config_hash"],
    )
