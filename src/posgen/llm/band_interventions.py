"""Band interventions (issue 65; docs/method.md section 6.4): the model run with its RoPE changed per band.

A band is a pair of canonical head dims (l, l + d/2) that RoPE turns by ``inv_freq[l]`` per position
(posgen.llm.families, "Canonical layout"); the rotating bands of a layer are those with ``inv_freq > 0`` (a
partial-rotary head's unrotated dims and a NoPE layer have none), ordered here from the slowest (lowest frequency)
to the fastest. A :class:`posgen.llm.band_settings.BandSetting` changes them in one of three ways:

* ``below``: the lowest ``share`` of the rotating bands stop rotating (angle 0: p-RoPE of Barbero et al. 2025,
  applied to a trained model without retraining);
* ``above``: the highest ``share`` stop rotating;
* ``ablate``: the q and k components of one ``quarter`` of the rotating bands (0 the lowest, 3 the highest) are
  set to zero.

The attention backend :data:`BANDS_BACKEND` (transformers' attention interface; no source patched) receives q and k
rotated by the model, turns the stopped bands back by their positions (so they carry the model's amplitude at angle
0, as an unrotated vector would), zeroes the ablated ones, and attends with the model's own eager attention; a
running :class:`posgen.llm.capture.Capture` sees the modified q and k. Outside :func:`intervening`, or with a setting
that changes no band, it is the model's own eager attention on the model's own q and k.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from posgen import rope
from posgen.llm import attention_layers, families
from posgen.llm.band_settings import BandSetting, grid, layer_masks
from posgen.llm.capture import BANDS_BACKEND, eager_forward, notify


def intervene(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, stop: torch.Tensor, zero: torch.Tensor
) -> torch.Tensor:
    """``x`` (..., T, d), canonical and rotated to ``positions`` (T,) by ``inv_freq`` (d/2,), with the ``stop``
    bands (d/2,) turned back to angle 0 and the ``zero`` bands' two dims set to zero."""
    back = rope.rotate(x, -positions, inv_freq * stop)  # (..., T, d): only the stopped bands turn
    keep = (~zero).to(back.dtype).repeat(2)  # (d,): band l is dims l and l + d/2
    return back * keep


def _band_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``BANDS_BACKEND``: the module's own eager attention on q and k with its bands changed (module docstring)."""
    change = getattr(module, "posgen_bands", None)
    if change is not None:
        inv_freq, stop, zero = (t.to(query.device) for t in change)
        positions = kwargs.get("position_ids")
        positions = torch.arange(query.shape[-2], device=query.device) if positions is None else positions[0]
        layout = getattr(module, "posgen_layout", None)
        query = query if layout is None else families.to_canonical(query, layout)  # (B, H, T, d)
        key = key if layout is None else families.to_canonical(key, layout)  # (B, H_kv, T, d)
        query = intervene(query, positions, inv_freq, stop, zero).to(value.dtype)
        key = intervene(key, positions, inv_freq, stop, zero).to(value.dtype)
    notify(module, query, key, scaling, kwargs)
    out = eager_forward(module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if getattr(module, "posgen_probs", None) is not None:  # band_effects reads the attention rows
        module.posgen_probs.append(out[1].detach().float())
    return out


AttentionInterface.register(BANDS_BACKEND, _band_attention)
AttentionMaskInterface.register(BANDS_BACKEND, eager_mask)


@contextlib.contextmanager
def intervening(model, setting: BandSetting, inv_freq: np.ndarray):
    """Run ``model`` (loaded with ``attn_implementation=BANDS_BACKEND``) under ``setting``: ``inv_freq`` (layer,
    band) the canonical RoPE table (``Capture.rope().inv_freq``). Each layer's head dims are read in the layout a
    Capture that ran on this model left on its module (else as canonical). A setting that changes no band leaves
    the model as it is."""
    if model.config._attn_implementation != BANDS_BACKEND:
        raise RuntimeError(f"load the model with attn_implementation={BANDS_BACKEND!r} to change its bands")
    modules = attention_layers.attention_modules(model)
    stops, zeros = layer_masks(inv_freq, setting)  # (layer, band) each
    for layer, module in enumerate(modules):
        if stops[layer].any() or zeros[layer].any():
            table = torch.as_tensor(inv_freq[layer], dtype=torch.float32)
            module.posgen_bands = (table, torch.as_tensor(stops[layer]), torch.as_tensor(zeros[layer]))
    try:
        yield model
    finally:
        for module in modules:
            module.posgen_bands = None


# Method A's readings of the logits a pass attends with (sink "without", as the per-head split reads them)
READINGS = ("method_a_r", "method_a_r_rc", "method_a_f_share")


class LogitReading:
    """Method A (docs/method.md section 3A) of the logits each pass attends with under its setting: the pass's own
    pre-RoPE q and k (a running :class:`posgen.llm.capture.Capture`, its layouts found on an unmodified pass) with
    the ablated bands' dims set to zero, decomposed with the stopped bands' frequencies set to 0 (a stopped band is
    an unrotated one). The error and bound pass is not run. Before the decomposition, the rebuilt logits of the
    recorder's ``ref_layers`` are checked against those the backend attended with (``rtol``)."""

    def __init__(self, recorder, decomposer, rtol: float):
        self.recorder = recorder
        self.decomposer = decomposer
        self.rope = recorder.rope()  # (layer, band) canonical, the unmodified model's
        self.rtol = rtol
        self.check_error = 0.0  # the worst relative error of the rebuilt logits so far

    def start(self, n_tokens: int) -> None:
        """Called before each pass: the recorder keeps the reference layers' logits."""
        self.recorder.reset(n_tokens, keep_logits=True)

    def read(self, setting: BandSetting) -> dict[str, np.ndarray]:
        """:data:`READINGS` of the pass just run, each (N, layer, head)."""
        from posgen.llm.extract import verify_logits

        stops, zeros = layer_masks(self.rope.inv_freq, setting)  # (layer, band) each
        table = dataclasses.replace(self.rope, inv_freq=self.rope.inv_freq * ~stops)  # a stopped band does not turn
        keep = np.tile(~zeros, 2).astype(np.float32)[:, None, None]  # (layer, 1, 1, d): band l is dims l, l + d/2
        out = []
        for b in range(self.recorder.q[0].shape[0]):
            q, k = self.recorder.stacked(b)  # (layer, H, T, d), (layer, H_kv, T, d)
            q, k = q * keep, k * keep
            logits = {layer: ref[b] for layer, ref in self.recorder.logits.items()}  # (H, T, T)
            self.check_error = max(self.check_error, verify_logits(q, k, table, logits, self.rtol))
            out.append(self._window(q, k, table))
        return {name: np.stack([window[name] for window in out]) for name in READINGS}

    def _window(self, q: np.ndarray, k: np.ndarray, table) -> dict[str, np.ndarray]:
        """One window's readings, (layer, head) each."""
        from posgen.decomposition.decomposer import METHODS
        from posgen.decomposition.mask import SINKS

        dec = self.decomposer
        units = [
            dec.statistics(
                torch.as_tensor(q[layer]).to(dec.device),
                torch.as_tensor(k[layer]).to(dec.device),
                table.kv_group,
                table.layer(layer),
                with_bound=False,
            )
            for layer in range(table.n_layers)
        ]
        hosts = dec.to_host(units)  # per layer {name: (H, method, sink)}
        a, without = METHODS.index("A"), SINKS.index("without")
        r, r_rc, r_f, r_g = (np.stack([h[name][:, a, without] for h in hosts]) for name in ("r", "r_rc", "r_f", "r_g"))
        return {"method_a_r": r, "method_a_r_rc": r_rc, "method_a_f_share": r_f**2 / (r_f**2 + r_g**2)}


def _pass(model, ids: torch.Tensor, setting: BandSetting, inv_freq: np.ndarray, reading=None):
    """(loss (N,): mean next-token NLL of each window, probs: per layer (N, H, T, T), readings: ``reading``'s of
    the pass or None) of one forward pass under ``setting``."""
    modules = attention_layers.attention_modules(model)
    for module in modules:
        module.posgen_probs = []
    if reading is not None:
        reading.start(ids.shape[1])
    try:
        with intervening(model, setting, inv_freq), torch.inference_mode():
            logits = model(input_ids=ids, use_cache=False).logits  # (N, T, vocab)
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none"
        )
        probs = [m.posgen_probs[0] for m in modules]
        readings = None if reading is None else reading.read(setting)
        return nll.view(ids.shape[0], -1).double().mean(-1).numpy(), probs, readings
    finally:
        for module in modules:
            module.posgen_probs = None


def _head_changes(ref: torch.Tensor, mod: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(KL, previous-token change, diagonal change), each (N, H), of one layer's attention rows ``mod`` against
    ``ref`` (N, H, T, T): KL(ref || mod) of each query row, and the changes of the weight on key i - 1 and key i,
    means over the rows that have a previous token (i >= 1)."""
    ref, mod = ref.double()[:, :, 1:], mod.double()[:, :, 1:]  # (N, H, T-1, T): rows 1..T-1
    logs = torch.where(ref > 0, torch.log(ref) - torch.log(mod.clamp_min(1e-300)), torch.zeros_like(ref))
    kl = (ref * logs).sum(-1).mean(-1)  # (N, H)
    rows = torch.arange(ref.shape[2])
    prev = (mod - ref)[:, :, rows, rows].mean(-1)  # (N, H): key i - 1 of query row i (rows shifted by one)
    diag = (mod - ref)[:, :, rows, rows + 1].mean(-1)  # (N, H): key i of query row i
    return kl.numpy(), prev.numpy(), diag.numpy()


def band_effects(
    model, token_ids: np.ndarray, settings, inv_freq: np.ndarray, reading: LogitReading | None = None
) -> xr.Dataset:
    """Every setting of ``settings`` (the first must be ``none``) on the windows ``token_ids`` (N, T): the next-token
    loss (nats per token, mean over each window's targets) and its change from the unmodified model's (paired);
    per attention layer and head the KL divergence of its attention rows from the unmodified model's, and the
    changes of its attention to the previous token and to the diagonal (means over query rows 1..T-1); with
    ``reading``, Method A's r, row-centred r and f share of the logits each setting attends with."""
    settings = list(settings)
    if settings[0].kind != "none":
        raise ValueError("band_effects: the first setting must be the unmodified model ('none')")
    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long, device=model.device)
    base = _pass(model, ids, settings[0], inv_freq, reading)
    base_loss, base_probs = base[0], base[1]
    loss, kl, prev, diag, readings = [], [], [], [], []
    for setting in settings:
        this_loss, probs, read = base if setting is settings[0] else _pass(model, ids, setting, inv_freq, reading)
        changes = [_head_changes(ref.cpu(), mod.cpu()) for ref, mod in zip(base_probs, probs, strict=True)]
        loss.append(this_loss)
        readings.append(read)
        for out, index in ((kl, 0), (prev, 1), (diag, 2)):
            out.append(np.stack([c[index] for c in changes], axis=1))  # (N, layer, H)
    dims = ("setting", "sample", "layer", "head")
    data = {
        "loss": (("setting", "sample"), np.stack(loss)),
        "loss_change": (("setting", "sample"), np.stack(loss) - base_loss),
        "kl": (dims, np.stack(kl)),
        "prev_change": (dims, np.stack(prev)),
        "diag_change": (dims, np.stack(diag)),
    }
    if reading is not None:
        data |= {name: (dims, np.stack([read[name] for read in readings])) for name in READINGS}
    return xr.Dataset(
        data,
        coords={
            "setting": [s.label for s in settings],
            "kind": ("setting", [s.kind for s in settings]),
            "share": ("setting", [s.share for s in settings]),
            "quarter": ("setting", [s.quarter for s in settings]),
        },
    )


# ------------------------------------------------------------------------------------------------------ the job


def head_reading(bands_path, decomposition_path) -> xr.Dataset:
    """(layer, head) what the predictions read beside the KL: the keys' low-frequency share (bands.nc, the head's KV
    head) and Method A's f share (posgen.llm.head_ablation.per_head_split: sink 'without', r2_f / (r2_f + r2_g) of
    the window means)."""
    from posgen.llm.head_ablation import per_head_split
    from posgen.llm.readers import band_columns
    from posgen.store import open_dataset

    f_share = per_head_split(open_dataset(decomposition_path, lazy=False))["f_share"]  # (layer, head)
    low = band_columns(bands_path)["low_share_k"]  # (layer, head)
    return xr.Dataset(
        {"f_share": f_share, "low_share_k": (("layer", "head"), low)},
        coords={"layer": np.arange(low.shape[0]), "head": np.arange(low.shape[1])},
    )


def band_job(run, options, bands_path, decomposition_path) -> xr.Dataset:
    """band_interventions.nc of one model variant (docs/data-model.md): :func:`band_effects` of the setting grid
    (:func:`grid` of ``options``) on each window in turn (the attention rows of one window at a time), with Method
    A's reading of every pass (:class:`LogitReading`), the RoPE table and layouts read by a capturing pass first,
    and the heads' readings beside (:func:`head_reading`)."""
    from posgen.decomposition import Decomposer, DecompositionOptions
    from posgen.llm import capture
    from posgen.llm.extract import effective_rtol

    start = time.perf_counter()
    token_ids, sample_ids = run.token_windows(options.n_samples, options.seq_len, section="band_interventions")
    model, _tokenizer, manifest = run.load(backend=BANDS_BACKEND)
    decomposition = DecompositionOptions(  # no error and bound pass: bound_rows and bound_samples unused
        options.dummy_distances,
        options.dummy_distance,
        options.lstsq_tol,
        options.precision,
        bound_rows=0,
        bound_samples=0,
        device=run.device,
    )
    # the last layer's logits rebuilt from the captured q/k under each setting: the reading is of what attention saw
    with capture.Capture(model, ref_layers=(-1,)) as recorder:  # leaves each layer's layout on its module
        capture.forward_pass(model, recorder, token_ids[:1])
        inv_freq = recorder.rope().inv_freq  # (layer, band) canonical
        reading = LogitReading(
            recorder, Decomposer.from_options(decomposition), effective_rtol(options.check_rtol, run.dtype)
        )
        settings = grid(options.shares, options.ablate)
        desc = f"band settings {run.model}/{run.variant}"
        parts = [
            band_effects(model, token_ids[i : i + 1], settings, inv_freq, reading=reading)
            for i in tqdm(range(len(token_ids)), desc=desc, unit="window")
        ]
    ds = xr.concat(parts, "sample").assign_coords(sample=sample_ids, layer=np.arange(inv_freq.shape[0]))
    ds = ds.assign_coords(head=np.arange(ds.sizes["head"])).merge(
        head_reading(bands_path, decomposition_path), join="left"
    )
    ds["inv_freq"] = (("layer", "band"), inv_freq)
    ds.attrs["n_tokens"] = int(token_ids.shape[1])
    ds.attrs["self_check_max_rel_error"] = reading.check_error
    return run.write(ds, model, manifest, start, attn_implementation=BANDS_BACKEND)


def band_step(job) -> xr.Dataset:
    """Rule band_interventions' job (a :class:`posgen.workflow.job.StepJob`)."""
    from posgen.llm.options import BandOptions
    from posgen.llm.run import ModelRun

    options = BandOptions.of(job.params)
    return band_job(ModelRun.of_job(job), options, job.input["bands"], job.input["decomposition"])


# --------------------------------------------------------------------------------------------- the section


def _loss_interval(ds: xr.Dataset, label: str) -> tuple[float, float, float]:
    """Mean change of the loss under setting ``label`` and its 95 % bootstrap interval over windows."""
    from posgen.llm.readers import BOOT_SEED, N_BOOT
    from posgen.stats import bootstrap_indices, interval

    change = ds["loss_change"].sel(setting=label).values  # (sample,)
    idx = bootstrap_indices(change.size, N_BOOT, BOOT_SEED)
    return tuple(float(v) for v in interval(lambda v: v.mean(0), change, idx))


def _rho_interval(ds: xr.Dataset, label: str, reading: str) -> tuple[float, float, float]:
    """Spearman rho over heads between ``reading`` (layer, head) and the KL under ``label`` (mean over windows),
    with its 95 % bootstrap interval over windows."""
    from posgen.llm.readers import BOOT_SEED, N_BOOT
    from posgen.stats import bootstrap_indices, interval, spearman

    kl = ds["kl"].sel(setting=label).transpose("sample", "layer", "head").values  # (sample, layer, head)
    x = ds[reading].transpose("layer", "head").values
    idx = bootstrap_indices(kl.shape[0], N_BOOT, BOOT_SEED)
    return tuple(float(v) for v in interval(lambda v: np.asarray(spearman(x, v.mean(0))), kl, idx))


def _within(lo: float, hi: float, bound: float):
    """'|change| <= bound' decided on the interval [lo, hi]."""
    from posgen.claims import Outcome

    if -bound <= lo and hi <= bound:
        return Outcome.REPRODUCED
    if hi < -bound or lo > bound:
        return Outcome.NOT_REPRODUCED
    return Outcome.INCONCLUSIVE


def _sign(lo: float, hi: float, sign: str):
    """'rho is <sign>' on its interval [lo, hi]."""
    from posgen.claims import Outcome

    holds, fails = (hi < 0, lo > 0) if sign == "negative" else (lo > 0, hi < 0)
    return Outcome.REPRODUCED if holds else Outcome.NOT_REPRODUCED if fails else Outcome.INCONCLUSIVE


def predictions(trained: xr.Dataset, controls: list[xr.Dataset]) -> list[tuple[str, str, str]]:
    """(rule, outcome, evidence) of each registered band prediction (posgen.verdict_rules BAND_*) on the trained
    model, the loss predictions beside every random-init control (BAND_CONTROL)."""
    from posgen.claims import Outcome, against, label
    from posgen.verdict_rules import value

    low, high = "below-25", "above-25"
    if low not in trained["setting"].values or high not in trained["setting"].values:
        return [("BAND_*", Outcome.NOT_TESTED.value, "band_interventions.shares lacks 0.25")]
    out = []
    loss_rules = (
        ("BAND_LOW_LOSS", low, lambda lo, hi: _within(lo, hi, value("BAND_LOW_LOSS"))),
        ("BAND_HIGH_LOSS", high, lambda lo, hi: against(lo, hi, value("BAND_HIGH_LOSS"), above=True)[0]),
    )
    for rule, setting, decide in loss_rules:
        mean, lo, hi = _loss_interval(trained, setting)
        outcome = decide(lo, hi)
        met = [decide(*_loss_interval(c, setting)[1:]) == Outcome.REPRODUCED for c in controls]
        text = f"{setting}: loss change {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] nats per token"
        text += "".join(f"; control {i}: {'meets it' if m else 'does not'}" for i, m in enumerate(met))
        if outcome == Outcome.REPRODUCED and controls and all(met):
            out.append((rule, label(Outcome.NOT_DISCRIMINATIVE, "control meets it"), text))
        else:
            out.append((rule, outcome.value, text))
    for rule, setting, reading in (("BAND_LOW_RHO", low, "low_share_k"), ("BAND_HIGH_RHO", high, "f_share")):
        rho, lo, hi = _rho_interval(trained, setting, reading)
        outcome = _sign(lo, hi, value(rule))
        out.append((rule, outcome.value, f"{setting}: Spearman rho ({reading}, KL) {rho:+.3f} [{lo:+.3f}, {hi:+.3f}]"))
    return out


def reproduction_section(paths) -> str:
    """reproduction.md's section on the low-frequency pattern, tested causally: per model variant the loss change
    of every band setting, then the registered predictions decided on the trained model (a diagnostic: it changes
    no verdict of the paper)."""
    from posgen.paths import owner
    from posgen.store import open_dataset

    by_model: dict = {}
    for path in paths:
        model, variant = owner(path)
        by_model.setdefault(model, {})[variant] = open_dataset(path, lazy=False)
    lines = [
        "## The low-frequency pattern, tested causally: band interventions (diagnostic)",
        "",
        "Each layer's rotating RoPE bands stopped from below (the lowest share p at angle 0: p-RoPE at inference) "
        "or from above, or one quarter zeroed in q and k; the next-token loss change against the unmodified model "
        "on the same windows (nats per token, mean [95 % bootstrap interval over windows]); docs/method.md "
        "section 6.4. The predictions were registered before the step existed (posgen.verdict_rules BAND_*, "
        "docs/results.md); they decide nothing of the paper's verdicts.",
        "",
        "Method A read on the logits each setting attends with (sink-free; means over windows and heads; "
        "the unmodified model's on the first row of each variant): r, row-centred r and the f share.",
        "",
        "| model | variant | windows x tokens | setting | loss change [95 %] | mean KL of the attention rows "
        "| Method A r | row-centred r | f share |",
        "|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    for model, variants in by_model.items():
        for variant, ds in variants.items():
            for setting in ds["setting"].values:
                mean, lo, hi = _loss_interval(ds, setting)
                kl = float(ds["kl"].sel(setting=setting).mean())
                size = f"{ds.sizes['sample']} x {ds.attrs.get('n_tokens', '')}"
                read = " | ".join(
                    f"{float(ds[name].sel(setting=setting).mean()):.3f}" if name in ds else "-" for name in READINGS
                )
                lines.append(
                    f"| {model} | {variant} | {size} | {setting} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] | {kl:.4f} "
                    f"| {read} |"
                )
    lines += ["", "| model | rule | outcome | evidence |", "|---|---|---|---|"]
    for model, variants in by_model.items():
        if "trained" not in variants:
            continue
        controls = [ds for variant, ds in variants.items() if variant.startswith("random-seed")]
        for rule, outcome, evidence in predictions(variants["trained"], controls):
            lines.append(f"| {model} | {rule} | **{outcome}** | {evidence} |")
    return "\n".join(lines) + "\n"


def band_study_step(job) -> None:
    """Rule band_study_table's job (a :class:`posgen.workflow.job.StepJob`): :func:`reproduction_section` of every
    model variant's band_interventions.nc, on its own (target ``band_study``)."""
    from pathlib import Path

    from posgen.store import atomic_path

    text = reproduction_section(job.input["band_interventions"])
    with atomic_path(job.output["md"]) as tmp:
        Path(tmp).write_text(f"{text}\nconfig_hash {job.params['config_hash']}.\n")
