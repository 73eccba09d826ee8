"""Position-generalisation experiments (docs/method.md section 7) and their jobs: perturbed token order / position
ids (perturb.nc), and RoPE distance capping (cap.nc).

The pieces live elsewhere: the seeded perturbation draws in :mod:`posgen.llm.draws`, Method A's terms and their
matched change in :mod:`posgen.llm.method_a`, the capturing and capped attention backends and the forward passes in
:mod:`posgen.llm.capture`. This module runs them over the windows and writes the datasets.

Perplexity (same target tokens)
-------------------------------
``nll`` of a sample is the mean over the T - 1 targets of ``-log p(y_t | y_<t)`` for t = 1..T-1, where y is
the (perturbed) sequence fed to the model with its position ids. Because position 0 never moves, the targets
are exactly the original tokens 1..T-1 in every perturbation: each original token is scored once, given
the perturbed context that precedes it. ``ppl_ratio = exp(nll - nll_unperturbed)``.
A second reading isolates the effect of the perturbed *context*: ``ppl_ratio_kept`` compares perturbed and
unperturbed NLL on the targets K whose token and position id did not change (moved tokens are themselves
hard to predict, which dominates ``ppl_ratio`` for token kinds): ``exp(mean_K nll - mean_K nll_unperturbed)``.

f/g change
----------
Method A (:mod:`posgen.llm.method_a`) on the pre-RoPE q/k captured in each forward pass, in the sink-free reading,
with the position ids p of that pass (under a distance cap C, distances beyond C are seen as C); the per-head
Pearson r between perturbed and unperturbed terms over matched pairs, averaged over heads.
"""

from __future__ import annotations

import time

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from posgen.llm import capture
from posgen.llm.draws import KINDS, draw_perturbation, rng_for, word_starts
from posgen.llm.method_a import Terms, fg_change
from posgen.llm.options import CapOptions, PerturbOptions
from posgen.llm.run import ModelRun

# --------------------------------------------------------------------------------------------------------
# Experiments


def _masked_mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row means of ``values`` over ``mask``; NaN for a row with nothing kept."""
    count = mask.sum(-1)
    total = np.where(mask, values, 0.0).sum(-1)
    return np.divide(total, count, out=np.full(len(count), np.nan), where=count > 0)


def _layer_coords(terms: Terms) -> dict:
    """The layer coordinate and the dummy distance each layer's f/g were scored at (docs/method.md)."""
    return {
        "layer": np.arange(len(terms.dummy_distance_used)),
        "dummy_distance_used": ("layer", terms.dummy_distance_used),
    }


def _perturb_dataset(out, f_corr, g_corr, ref_pass, ref, kinds, rates, sample_ids, seed, jitter, dummy_distance):
    """perturb.nc's dataset from :func:`run_perturbations`' arrays (docs/data-model.md)."""
    n_tokens = out["order"].shape[-1]
    dims = ("kind", "rate", "sample")
    ds = xr.Dataset(
        {
            "nll": (dims, out["nll"]),
            "ppl_ratio": (dims, np.exp(out["nll"] - ref_pass.nll[None, None, :])),
            "nll_unperturbed": (("sample",), ref_pass.nll),
            "ppl_ratio_kept": (dims, np.exp(out["nll_kept"] - out["nll_kept_ref"])),
            "nll_kept": (dims, out["nll_kept"]),
            "moved": (dims, out["moved"]),
            "moved_units": (dims, out["moved_units"]),
            "f_corr": (dims + ("layer",), f_corr),
            "g_corr": (dims + ("layer",), g_corr),
            "order": (dims + ("token",), out["order"]),
            "position_ids": (dims + ("token",), out["position_ids"]),
        },
        coords={
            "kind": list(kinds),
            "rate": rates,
            "sample": sample_ids,
            "token": np.arange(n_tokens),
            **_layer_coords(ref),
        },
        attrs={
            "perturb_seed": seed,
            "jitter": jitter,
            "dummy_distance": dummy_distance,
            "sink": "without",
            "seed_rule": "numpy default_rng([seed, kind_index, round(rate*1e6), sample])",
            "kinds": list(kinds),
        },
    )
    return ds


def run_perturbations(
    model,
    token_ids: np.ndarray,
    token_strings: list[list[str]],
    options: PerturbOptions,
    *,
    kinds: tuple[str, ...] = KINDS,
    sample_ids=None,
    progress: bool = True,
) -> xr.Dataset:
    """Every (kind, rate) perturbation of the windows ``token_ids`` (N, T), one batched forward pass each, at
    ``options``' rates, draw seed and jitter, f and g read at its dummy distance.

    ``sample_ids`` are the windows' global indices (default ``0..N-1``): they seed each window's draws, so a
    shard draws what the unsharded run draws for its windows.

    The model must be loaded with a capturing backend (``posgen.llm.capture.backend_for``). Returns the
    perturb.nc dataset (docs/data-model.md) without provenance attrs.
    """
    token_ids = np.asarray(token_ids)
    n_samples, n_tokens = token_ids.shape
    sample_ids = np.arange(n_samples) if sample_ids is None else np.asarray(sample_ids, dtype=np.int64)
    if n_tokens < 3:
        raise ValueError(f"perturbation windows need at least 3 tokens, got {n_tokens}")
    starts = [word_starts(tokens) for tokens in token_strings]
    rates, seed, jitter, dummy_distance = (
        [float(r) for r in options.rates],
        options.seed,
        options.jitter,
        options.dummy_distance,
    )
    shape = (len(kinds), len(rates), n_samples)
    out = {
        "nll": np.empty(shape),
        "moved": np.empty(shape),
        "moved_units": np.empty(shape),
        "nll_kept": np.empty(shape),
        "nll_kept_ref": np.empty(shape),
        "order": np.empty(shape + (n_tokens,), dtype=np.int64),
        "position_ids": np.empty(shape + (n_tokens,), dtype=np.int64),
    }
    with capture.Capture(model) as recorder:
        ref_pass = capture.forward_pass(model, recorder, token_ids)
        rope_info = recorder.rope()
        n_layers = recorder.n_layers
        f_corr = np.empty(shape + (n_layers,))
        g_corr = np.empty(shape + (n_layers,))
        ref = Terms(ref_pass, rope_info, dummy_distance, keep=True)
        jobs = [(ki, ri) for ki in range(len(kinds)) for ri in range(len(rates))]
        for ki, ri in tqdm(jobs, desc="perturb", unit="pass", disable=not progress):
            kind, rate = kinds[ki], rates[ri]
            draws = [
                draw_perturbation(
                    kind, rate, n_tokens, rng_for(seed, kind, rate, int(sample_ids[s])), starts[s], jitter
                )
                for s in range(n_samples)
            ]
            orders = np.stack([d.order for d in draws])
            positions = np.stack([d.position_ids for d in draws])
            out["order"][ki, ri], out["position_ids"][ki, ri] = orders, positions
            out["moved"][ki, ri] = [d.moved for d in draws]
            out["moved_units"][ki, ri] = [d.moved_units for d in draws]
            if all(d.is_identity for d in draws):  # rate 0: the unperturbed pass itself, r = 1
                out["nll"][ki, ri] = out["nll_kept"][ki, ri] = out["nll_kept_ref"][ki, ri] = ref_pass.nll
                f_corr[ki, ri] = g_corr[ki, ri] = 1.0
                continue
            perturbed_ids = np.take_along_axis(token_ids, orders, axis=1)
            new_pass = capture.forward_pass(model, recorder, perturbed_ids, positions)
            out["nll"][ki, ri] = new_pass.nll
            # targets whose token and position id are unchanged: only their context was perturbed
            kept = ((orders == np.arange(n_tokens)) & (positions == np.arange(n_tokens)))[:, 1:]
            out["nll_kept"][ki, ri] = _masked_mean(new_pass.token_nll, kept)
            out["nll_kept_ref"][ki, ri] = _masked_mean(ref_pass.token_nll, kept)
            f_corr[ki, ri], g_corr[ki, ri] = fg_change(ref, Terms(new_pass, rope_info, dummy_distance), orders)

    return _perturb_dataset(out, f_corr, g_corr, ref_pass, ref, kinds, rates, sample_ids, seed, jitter, dummy_distance)


def run_caps(
    model,
    token_ids: np.ndarray,
    *,
    distance_caps: list[int],
    dummy_distance: int,
    sample_ids=None,
    progress: bool = True,
) -> xr.Dataset:
    """Perplexity and f/g change of the windows ``token_ids`` (N, T) with RoPE distances capped at each C.

    The model must be loaded with ``attn_implementation=capture.CAPPED_BACKEND``. Returns cap.nc without
    provenance.
    """
    token_ids = np.asarray(token_ids)
    n_samples, n_tokens = token_ids.shape
    sample_ids = np.arange(n_samples) if sample_ids is None else np.asarray(sample_ids, dtype=np.int64)
    identity = np.tile(np.arange(n_tokens), (n_samples, 1))
    with capture.Capture(model) as recorder:
        # One uncapped pass first: it also yields the per-layer RoPE table the capped backend needs.
        ref_pass = capture.forward_pass(model, recorder, token_ids)
        rope_info = recorder.rope()
        ref = Terms(ref_pass, rope_info, dummy_distance, keep=True)
        n_layers = recorder.n_layers
        nll = np.empty((len(distance_caps), n_samples))
        f_corr = np.empty((len(distance_caps), n_samples, n_layers))
        g_corr = np.empty((len(distance_caps), n_samples, n_layers))
        for ci, c in enumerate(tqdm(distance_caps, desc="cap", unit="pass", disable=not progress)):
            with capture.capped_distances(model, int(c), rope_info.inv_freq):
                new_pass = capture.forward_pass(model, recorder, token_ids)
            nll[ci] = new_pass.nll
            terms = Terms(new_pass, rope_info, dummy_distance, distance_cap=int(c))
            f_corr[ci], g_corr[ci] = fg_change(ref, terms, identity)

    return xr.Dataset(
        {
            "nll": (("cap", "sample"), nll),
            "ppl_ratio": (("cap", "sample"), np.exp(nll - ref_pass.nll[None, :])),
            "nll_uncapped": (("sample",), ref_pass.nll),
            "f_corr": (("cap", "sample", "layer"), f_corr),
            "g_corr": (("cap", "sample", "layer"), g_corr),
        },
        coords={
            "cap": np.asarray(distance_caps, dtype=np.int64),
            "sample": sample_ids,
            **_layer_coords(ref),
        },
        attrs={"dummy_distance": dummy_distance, "sink": "without", "n_tokens": n_tokens},
    )


# --------------------------------------------------------------------------------------------------------
# Jobs (one model variant each, or one shard of its windows)


def _run_job(experiment, run: ModelRun, options: PerturbOptions | CapOptions, backend=None) -> xr.Dataset:
    """Load the model with a capturing ``backend`` (None: the one its config needs), run ``experiment(model,
    tokenizer, token_ids, sample_ids)`` on the shard of the first ``options.n_samples`` windows
    (``options.seq_len`` tokens each), write its dataset with provenance to ``run.out``."""
    start = time.perf_counter()
    token_ids, sample_ids = run.token_windows(options.n_samples, options.seq_len, section="perturb")
    model, tokenizer, manifest = run.load(backend=backend)
    ds = experiment(model, tokenizer, token_ids, sample_ids)
    return run.write(ds, model, manifest, start, attn_implementation=model.config._attn_implementation)


def perturb_job(run: ModelRun, options: PerturbOptions) -> xr.Dataset:
    """Write ``perturb.nc`` of one model variant, or of its shard ``run.samples`` (docs/data-model.md)."""

    def experiment(model, tokenizer, token_ids, sample_ids):
        strings = [tokenizer.convert_ids_to_tokens(row.tolist()) for row in token_ids]
        ds = run_perturbations(model, token_ids, strings, options, sample_ids=sample_ids)
        ds["token_id"] = (("sample", "token"), token_ids)
        return ds

    return _run_job(experiment, run, options)


def cap_job(run: ModelRun, options: CapOptions) -> xr.Dataset:
    """Write ``cap.nc`` of one model variant, or of its shard ``run.samples`` (docs/data-model.md)."""

    def experiment(model, _tokenizer, token_ids, sample_ids):
        return run_caps(
            model,
            token_ids,
            distance_caps=options.distance_caps,
            dummy_distance=options.dummy_distance,
            sample_ids=sample_ids,
        )

    return _run_job(experiment, run, options, backend=capture.CAPPED_BACKEND)


def perturb_step(job) -> xr.Dataset:
    """Rule perturb's job (a :class:`posgen.workflow.job.StepJob`)."""
    return perturb_job(ModelRun.of_job(job), PerturbOptions.of(job.params))


def cap_step(job) -> xr.Dataset:
    """Rule cap's job."""
    return cap_job(ModelRun.of_job(job), CapOptions.of(job.params))
