"""Prefix content or position? The geometry of each window's key trajectory across window sets (docs/method.md
section 3E; the named target ``prefix_study``, config.prefix.yaml).

For one model variant and its windows (windows.h5: analysed and held-out, of the entry's ``window_set``), per
window, layer and KV head, with tokens 1..T-1 counted (the sink's outlier key left out, as in section 3C):

* ``kc_j = k_j - kbar``: the key's deviation from its window mean;
* ``d_j``: its smooth trajectory, the fit of k on the degree-8 basis (A-drift's, ``drift_basis``), centred;
* ``s_j``: the shared function of position, the fit of the held-out windows' mean key (A-shared's,
  ``shared_drift``), centred.

Stored per span of ``SPAN`` tokens (span = j // SPAN), so that any range of tokens sums from them: the powers
``||kc||^2``, ``||d||^2``, ``||kc - s||^2``, ``||s||^2``, the cross term ``<kc, s>``, the mean size ``||d_j||`` of
the trajectory, and across windows the mean pairwise cosine of their trajectories' directions at the same token
(from the sum of unit vectors: ``(||sum_w u_w||^2 - n) / (n (n - 1))``). Over a range R of tokens:

    smooth share  S = sum_R ||d||^2 / sum_R ||kc||^2
    shared share  X = 1 - sum_R ||kc - s||^2 / sum_R ||kc||^2       (s as it is: Method A-shared's key)
    scaled share  Xa = (sum_R <kc, s>)^2 / (sum_R ||s||^2 sum_R ||kc||^2)   (one amplitude per window, KV head)

(over every token these are section 3C's shares; over a later range the window mean is the whole window's). The
table (:func:`prefix_table`) compares window sets of one model: the corpus windows, the same windows with their
tokens shuffled, and windows that share their first N tokens, under readings registered before the study ran
(posgen.verdict_rules: PC_SHUFFLE, PC_RISE, PC_SIZE, PC_DIRECTION).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr
from tqdm.auto import tqdm

from posgen.corpus import prefix_length, read_windows
from posgen.decomposition.drift import SMOOTH_DEGREE, drift_basis, drift_fit, shared_drift
from posgen.llm.capture import Capture
from posgen.llm.extract import capture_window
from posgen.llm.first_token import first_token_replaced
from posgen.llm.run import ModelRun
from posgen.store import atomic_path, open_dataset, stable_provenance
from posgen.verdict_rules import cite, value

SPAN = 10  # tokens per span of the stored profiles
POWERS = ("key_power", "drift_power", "residual_power", "shared_power", "shared_cross", "drift_size")
SHUFFLE = value("PC_SHUFFLE")  # shuffling 'keeps' the smooth share: the difference's interval within +-this
RISE = value("PC_RISE")  # a shared prefix 'raises' the shared share after it: the difference's interval above this
SIZE = value("PC_SIZE")  # size profiles 'shared': mean pairwise correlation over windows at least this
DIRECTION = value("PC_DIRECTION")  # directions 'not shared': mean pairwise cosine at most this; 'shared' above 0.5


def window_terms(k: np.ndarray, shared: torch.Tensor, basis: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """One window's per-token terms, tokens 1..T-1: {name of POWERS: (layer, kv_head, T - 1)} and the unit
    directions of its trajectory (layer, kv_head, T - 1, d), float64. ``k`` (layer, kv_head, T, d) pre-RoPE keys;
    ``shared`` s(j) (layer, kv_head, T, d), centred over tokens 1..T-1; ``basis`` A-drift's (T, M)."""
    k64 = torch.from_numpy(np.asarray(k)).double()  # (L, H, T, d)
    kc = k64[..., 1:, :] - k64[..., 1:, :].mean(-2, keepdim=True)  # (L, H, T-1, d)
    fit = drift_fit(k64, basis)[..., 1:, :]  # (L, H, T-1, d)
    d = fit - fit.mean(-2, keepdim=True)  # (L, H, T-1, d)
    s = shared[..., 1:, :]  # (L, H, T-1, d)
    size = d.norm(dim=-1)  # (L, H, T-1)
    terms = {
        "key_power": (kc * kc).sum(-1),
        "drift_power": size**2,
        "residual_power": ((kc - s) ** 2).sum(-1),
        "shared_power": (s * s).sum(-1),
        "shared_cross": (kc * s).sum(-1),
        "drift_size": size,
    }
    unit = d / size.clamp_min(1e-30)[..., None]  # (L, H, T-1, d)
    return terms, unit


def spans(values: torch.Tensor, mean: bool = False) -> np.ndarray:
    """(..., T - 1) per-token values (tokens 1..T-1) summed (or averaged) per span j // SPAN: (..., n_spans)."""
    n_tokens = values.shape[-1] + 1
    index = torch.arange(1, n_tokens) // SPAN  # (T-1,)
    n_spans = int(index[-1]) + 1
    out = torch.zeros(*values.shape[:-1], n_spans, dtype=torch.float64).index_add_(-1, index, values.double())
    if mean:
        out /= torch.bincount(index, minlength=n_spans).double()
    return out.numpy()


def trajectory_dataset(model, windows: xr.Dataset, label: str = "", first_token: str = "model") -> xr.Dataset:
    """prefix_content.nc's dataset of one model variant on ``windows`` (windows.h5's dataset): every analysed
    window's span sums, and across windows the mean pairwise cosine of their trajectories' directions (module
    docstring); the held-out windows give s(j). ``model``: loaded with a capturing backend."""
    ids, heldout = windows["token_id"].values, windows["heldout_token_id"].values
    if len(heldout) == 0 or len(ids) < 2:
        raise ValueError("prefix content: needs held-out windows (heldout_windows, s(j)) and 2 analysed windows")
    n_tokens = ids.shape[1]
    device = next(model.parameters()).device
    positions = torch.arange(n_tokens, device=device)[None]
    basis = drift_basis(n_tokens, SMOOTH_DEGREE)
    capture = Capture(model, [], check_tokens=0)
    per_window, unit_sum = {name: [] for name in POWERS}, None
    with torch.inference_mode(), capture, first_token_replaced(model, first_token):
        total = None
        for row in tqdm(heldout, desc=f"held-out {label}", unit="window"):
            _, k = capture_window(model, capture, row, positions)  # (L, H, T, d)
            total = k.astype(np.float64) if total is None else total + k
        shared = shared_drift(torch.from_numpy(total / len(heldout)), basis)  # (L, H, T, d)
        for row in tqdm(ids, desc=f"windows {label}", unit="window"):
            _, k = capture_window(model, capture, row, positions)
            terms, unit = window_terms(k, shared, basis)
            for name in POWERS:
                per_window[name].append(spans(terms[name], mean=name == "drift_size"))
            unit_sum = unit if unit_sum is None else unit_sum + unit
    n = len(ids)
    cosine = ((unit_sum**2).sum(-1) - n) / (n * (n - 1))  # (L, H, T-1): mean pairwise cosine at each token
    dims = ("sample", "layer", "kv_head", "span")
    data = {name: (dims, np.stack(per_window[name])) for name in POWERS}
    data["direction_cosine"] = (dims[1:], spans(cosine, mean=True))
    n_spans = data["key_power"][1].shape[-1]
    window_set = windows.attrs.get("window_set", "corpus")
    return xr.Dataset(
        data,
        coords={"sample": windows["sample"].values, "span_start": ("span", np.maximum(1, np.arange(n_spans) * SPAN))},
        attrs={
            "window_set": window_set,
            "prefix_tokens": prefix_length(window_set),
            "heldout_windows": len(heldout),
            "span_tokens": SPAN,
            "degree": SMOOTH_DEGREE,
            "n_tokens": n_tokens,
            "first_token": first_token,
        },
    )


def prefix_content_job(run: ModelRun, first_token: str = "model") -> xr.Dataset:
    """Write ``prefix_content.nc`` (``run.out``) of one model variant."""
    start = time.perf_counter()
    model, _, manifest = run.load()
    ds = trajectory_dataset(model, read_windows(run.windows), run.label, first_token)
    return run.write(ds, model, manifest, start)


def prefix_content_step(job) -> xr.Dataset:
    """Rule prefix_content's job (a :class:`posgen.workflow.job.StepJob`)."""
    return prefix_content_job(ModelRun.of_job(job), first_token=job.params["first_token"])


# ------------------------------------------------------------------------------------------------ the table


def window_shares(ds: xr.Dataset, start: int = 1) -> dict[str, np.ndarray]:
    """Per analysed window (sample,): the smooth, shared and scaled shares over the tokens from ``start`` on (the
    spans that start there or later), each the mean over layers and KV heads of its ratio (module docstring)."""
    keep = ds["span_start"].values >= start
    sums = {name: ds[name].values[..., keep].sum(-1) for name in POWERS[:5]}  # (sample, layer, kv_head)
    key = sums["key_power"]
    return {
        "smooth": (sums["drift_power"] / key).mean((1, 2)),
        "shared": (1 - sums["residual_power"] / key).mean((1, 2)),
        "scaled": (sums["shared_cross"] ** 2 / (sums["shared_power"] * key)).mean((1, 2)),
    }


def geometry(ds: xr.Dataset) -> dict[str, float]:
    """Across the analysed windows: the mean pairwise correlation of their trajectories' size profiles (over the
    spans; per layer and KV head, then averaged) and the mean pairwise cosine of their directions."""
    size = ds["drift_size"].values  # (sample, layer, kv_head, span)
    n = size.shape[0]
    off = ~np.eye(n, dtype=bool)
    r = [
        np.corrcoef(size[:, layer, head])[off].mean() for layer in range(size.shape[1]) for head in range(size.shape[2])
    ]
    return {"size_r": float(np.mean(r)), "direction_cosine": float(ds["direction_cosine"].values.mean())}


def paired(difference: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    """Mean of per-window differences between two window sets (windows paired by index) and its 95 % bootstrap
    interval over windows."""
    idx = np.random.default_rng(seed).integers(0, len(difference), size=(n_boot, len(difference)))
    boots = difference[idx].mean(1)
    return float(difference.mean()), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def shuffle_reading(diff: tuple[float, float, float]) -> str:
    """PC_SHUFFLE: shuffled minus corpus smooth share over the whole window."""
    _, lo, hi = diff
    if -SHUFFLE <= lo and hi <= SHUFFLE:
        return "kept: a running-average convergence (the drift does not need the text's order)"
    if hi < -SHUFFLE:
        return "lowered: the order of the content drives the drift"
    if lo > SHUFFLE:
        return "raised: the order of the content holds the drift back"
    return "inconclusive"


def prefix_reading(diff: tuple[float, float, float]) -> str:
    """PC_RISE: shared-prefix minus corpus shared share (s(j) as it is) over the tokens after the prefix."""
    _, lo, hi = diff
    if lo > RISE:
        return "prefix content: windows that share a prefix share their key trajectory after it"
    if hi < RISE:
        return "no rise: after the shared prefix each window's trajectory stays its own"
    return "inconclusive"


def shape_reading(size_r: float, cosine: float) -> str:
    """PC_SIZE, PC_DIRECTION: the corpus windows' trajectories, size profile against direction."""
    if cosine > 0.5:
        return "a shared trajectory (its direction is common to the windows)"
    if size_r >= SIZE and cosine <= DIRECTION:
        return "each window's own trajectory: a common size profile, its own direction"
    return "neither"


def _fmt(point: float, lo: float, hi: float) -> str:
    return f"{point:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def prefix_table(contents: dict[str, xr.Dataset], origin: pd.DataFrame, n_boot: int, seed: int) -> tuple:
    """(the per-set table, the readings) of one model's window sets: ``contents`` {entry name: its random-init
    prefix_content.nc}, ``origin`` the gap-origin table (posgen.llm.gap_origin.origin_table) of the run."""
    sets = {ds.attrs["window_set"]: (name, ds) for name, ds in contents.items()}
    if "corpus" not in sets:
        raise ValueError("prefix study: no entry reads the corpus windows (a models entry without window_set)")
    prefixed = [ws for ws in sets if ws.startswith("prefix")]
    after = int(sets[prefixed[0]][1].attrs["prefix_tokens"]) if prefixed else 1
    rows, shares = [], {}
    for window_set, (name, ds) in sets.items():
        whole, late = window_shares(ds), window_shares(ds, after)
        shares[window_set] = (whole, late)
        gap = origin[(origin["model"] == name) & (origin["variant"] != "trained")]
        row = {"model": name, "window_set": window_set, "windows": ds.sizes["sample"]}
        for label, part in (("", whole), (f"_from{after}", late)):
            for key, values in part.items():
                row[f"{key}{label}"] = float(values.mean())
        row.update(geometry(ds))
        for column in ("gap", "drift_closes", "shared_closes", "outcome"):
            row[column] = gap[column].iloc[0] if len(gap) else ""
        rows.append(row)
    corpus_whole, corpus_late = shares["corpus"]
    readings = {}
    if "shuffled" in shares:
        diff = paired(shares["shuffled"][0]["smooth"] - corpus_whole["smooth"], n_boot, seed)
        readings["shuffled"] = (diff, shuffle_reading(diff), cite(["PC_SHUFFLE"]))
    for window_set in prefixed:
        diff = paired(shares[window_set][1]["shared"] - corpus_late["shared"], n_boot, seed)
        readings[window_set] = (diff, prefix_reading(diff), cite(["PC_RISE"]))
    corpus_row = next(r for r in rows if r["window_set"] == "corpus")
    readings["shape"] = (
        (corpus_row["size_r"], corpus_row["direction_cosine"]),
        shape_reading(corpus_row["size_r"], corpus_row["direction_cosine"]),
        cite(["PC_SIZE", "PC_DIRECTION"]),
    )
    return pd.DataFrame(rows), readings, after


def prefix_markdown(table: pd.DataFrame, readings: dict, after: int, regime: str) -> str:
    """The study's section: the per-set numbers and each registered reading with its outcome."""
    columns = ["smooth", "shared", "scaled", f"smooth_from{after}", f"shared_from{after}", f"scaled_from{after}"]
    lines = [
        "## Prefix content or position? (the prefix study)",
        "",
        f"Regime: {regime}. Shares of the random-init keys' variance (tokens 1..T-1; 'from {after}': the tokens from "
        f"{after} on) that each window's smooth trajectory (S), the shared function s(j) of the held-out windows as "
        "it is (X) and with one fitted amplitude per window and KV head (Xa) explain; the windows' trajectories' "
        "size profiles (mean pairwise correlation) and directions (mean pairwise cosine); Method A's gap and what "
        "A-drift and A-shared close (docs/method.md sections 3C, 3E).",
        "",
        "| entry | window set | S | X | Xa | S from "
        + str(after)
        + " | X from "
        + str(after)
        + " | Xa from "
        + str(after)
        + " | size r | direction cos | gap | A-drift closes | A-shared closes | gap origin |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        cells = [f"{r[c]:.3f}" for c in columns] + [f"{r.size_r:.3f}", f"{r.direction_cosine:+.3f}"]
        gap = f"{r.gap:+.3f}" if isinstance(r.gap, float) else str(r.gap)
        lines.append(
            f"| {r.model} | {r.window_set} | " + " | ".join(cells) + f" | {gap} | {r.drift_closes} | "
            f"{r.shared_closes} | {r.outcome} |"
        )
    lines += ["", "Readings, registered before the study ran (`python -m posgen.verdict_rules`):", ""]
    for name, (numbers, outcome, rules) in readings.items():
        if name == "shape":
            what = f"corpus windows: size r {numbers[0]:.3f}, direction cosine {numbers[1]:+.3f}"
        elif name == "shuffled":
            what = f"shuffled minus corpus S {_fmt(*numbers)}"
        else:
            what = f"{name} minus corpus X from token {after} {_fmt(*numbers)}"
        lines.append(f"- **{outcome}** ({what}; {rules})")
    return "\n".join(lines) + "\n"


def prefix_table_step(job) -> None:
    """Rule prefix_table's job (a :class:`posgen.workflow.job.StepJob`): results/prefix_content.{csv,md}."""
    from posgen.llm.gap_origin import origin_table
    from posgen.workflow.job import listed

    paths = listed(job.input["contents"])
    contents = {Path(path).parts[-3]: open_dataset(path, lazy=False) for path in paths}  # results/<model>/<variant>/
    origin = origin_table(pd.read_csv(job.input["summary"]))
    table, readings, after = prefix_table(contents, origin, job.params["n_boot"], job.params["seed"])
    first = next(iter(contents.values()))
    regime = (
        f"{', '.join(contents)}; random-init {Path(paths[0]).parts[-2]}, {first.sizes['sample']} windows of "
        f"{first.attrs['n_tokens']} tokens and {first.attrs['heldout_windows']} held-out windows per set"
    )
    with atomic_path(job.output["csv"]) as tmp:
        table.assign(config_hash=job.params["config_hash"]).to_csv(tmp, index=False, float_format="%.6g")
    prov = stable_provenance(config_hash=job.params["config_hash"])
    text = "# " + prefix_markdown(table, readings, after, regime).removeprefix("## ")
    text += f"\nFrom `{job.input['summary']}` and the window sets' prefix_content.nc; config_hash "
    text += f"{prov['config_hash']}, posgen {prov['posgen_version']}.\n"
    with atomic_path(job.output["md"]) as tmp:
        Path(tmp).write_text(text)
