"""Extraction: run a model over the token windows and store pre-RoPE q/k, with built-in checks.

* transparency check (once per model): the first window's first ``transparency_tokens`` tokens give the same
  output logits through the capturing backend as through the model's own default attention;
* self-check on every layer: on the reference samples, re-rotated stored q/k reproduce the model's own logits on
  the first ``check_tokens`` tokens of every layer, and on the whole window for ``ref_layers`` (whose logits
  are also stored).

Options of :func:`extract` beyond the checks': ``keep_qk``: q/k of the windows with a global index below it are
written (None: every window of the shard; a shard past it writes a qk.h5 of metadata only); ``analysis``: the fused
path, decomposition.nc and bands.nc of every window of the shard computed here (:mod:`posgen.llm.fused`);
``check_tokens``: prefix on which every layer is self-checked (0: the whole window), on the reference windows and
the shard's first window; ``transparency_tokens``: tokens of the shard's first window the transparency check runs
(0: the whole window); ``first_token``: "mean-embedding" runs every pass with the first token's input embedding
replaced by the mean over the vocabulary (:mod:`posgen.llm.first_token`, the first-token control; a models entry's key).
"""

from __future__ import annotations

import copy
import itertools
import json
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from posgen import rope
from posgen.corpus import read_windows
from posgen.decomposition.drift import heldout_coefficients
from posgen.llm.capture import Capture
from posgen.llm.first_token import first_token_replaced
from posgen.llm.fused import Analysis
from posgen.llm.options import ExtractOptions
from posgen.llm.run import ModelRun
from posgen.models import manifest_attrs
from posgen.rope_table import RopeTable
from posgen.store import QKLayout, QKWriter, carried_attrs


class SelfCheckError(RuntimeError):
    """Re-rotated stored q/k do not reproduce the model's own logits."""


class TransparencyError(RuntimeError):
    """The capturing backend changes the model's output logits."""


def effective_rtol(rtol: float, dtype: str) -> float:
    """In half precision the model itself rotates and multiplies with ~eps error; float32 recomputation
    cannot match it more closely than that, so the tolerance widens to a few eps of the dtype."""
    if dtype == "float32":
        return rtol
    return max(rtol, 4 * torch.finfo(getattr(torch, dtype)).eps)


def verify_logits(q, k, table: RopeTable, logits_ref: dict, rtol: float, errors: dict | None = None) -> float:
    """Compare ``rope.logits`` on stored q/k with the model's own logits for every kept (layer, head).

    ``q``: (layer, head, token, dim) and ``k``: (layer, kv_head, token, dim) arrays of one sample (or of the first
    P tokens, with P x P reference logits); ``table``: the model's RoPE table; ``logits_ref``: {layer: (head,
    token, token)}. Returns the worst relative (Frobenius) error; ``errors``, if given, collects the worst error
    of each layer.
    """
    worst = 0.0
    for layer, ref in sorted(logits_ref.items()):
        n = ref.shape[-1]
        ql = torch.from_numpy(q[layer][:, :n])  # (head, n, dim)
        kl = torch.from_numpy(k[layer][:, :n])[table.kv_group]  # (head, n, dim)
        w = rope.logits(
            ql,
            kl,
            torch.from_numpy(table.inv_freq[layer]),
            float(table.scaling[layer]),
            float(table.attention_scaling[layer]),
        )
        ref = ref.to(torch.float32)
        err = torch.linalg.matrix_norm(w - ref) / torch.linalg.matrix_norm(ref)
        for head, e in enumerate(err.tolist()):
            if not e <= rtol:  # also catches NaN
                raise SelfCheckError(
                    f"self-check failed at layer {layer} head {head}: re-rotated q/k give relative error "
                    f"{e:.2e} against the model's own logits (tolerance {rtol:.1e})"
                )
            worst = max(worst, e)
            if errors is not None:
                errors[layer] = max(errors.get(layer, 0.0), e)
    return worst


def default_attention(model) -> str:
    """The attention implementation transformers picks for this model when none is asked for."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    config._attn_implementation_internal = None
    with torch.device("meta"):  # no weights: only the choice is wanted
        # custom code was allowed when the model itself was loaded (manifest trust_remote_code)
        fresh = AutoModelForCausalLM.from_config(config, trust_remote_code=bool(getattr(config, "auto_map", None)))
    return fresh.config._attn_implementation


def transparency_check(model, capture, token_ids: torch.Tensor, rtol: float) -> tuple[float, str]:
    """Output logits of ``token_ids`` (1, N) through the capturing backend (inside ``capture``) against the same
    model with its own default attention; returns (relative error, that attention's name) or raises
    :class:`TransparencyError` naming the architecture."""
    capturing = model.config._attn_implementation
    own = default_attention(model)
    arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    with torch.inference_mode():
        capture.reset(token_ids.shape[1])
        captured = model(input_ids=token_ids, use_cache=False).logits.float()  # (1, N, vocab)
        model.set_attn_implementation(own)
        try:
            if model.config._attn_implementation != own:  # transformers only warns when it cannot switch
                raise TransparencyError(
                    f"transparency check impossible for {arch}: the model cannot switch to its own {own!r} attention"
                )
            reference = model(input_ids=token_ids, use_cache=False).logits.float()  # (1, N, vocab)
        finally:
            model.set_attn_implementation(capturing)
    err = float(torch.linalg.vector_norm(captured - reference) / torch.linalg.vector_norm(reference))
    if not err <= rtol:  # also catches NaN
        raise TransparencyError(
            f"transparency check failed for {arch}: output logits through the capturing backend {capturing!r} "
            f"differ from the model's own {own!r} attention by {err:.2e} (relative; tolerance {rtol:.1e})"
        )
    return err, own


def capture_window(model, capture: Capture, token_ids: np.ndarray, positions: torch.Tensor, keep_logits: bool = False):
    """One window's forward pass inside a running ``capture``: its pre-RoPE (q, k), (layer, head, token, dim) and
    (layer, kv_head, token, dim). ``token_ids`` (T,); ``positions`` (1, T) on the model's device."""
    capture.reset(len(token_ids), keep_logits=keep_logits)
    ids = torch.from_numpy(np.asarray(token_ids))[None].to(positions.device)
    model.base_model(input_ids=ids, position_ids=positions, use_cache=False)
    return capture.stacked()


def heldout_mean_keys(model, capture: Capture, token_ids: np.ndarray, positions: torch.Tensor, label: str = ""):
    """The mean pre-RoPE key at every position over held-out windows ``token_ids`` (n, T), (layer, kv_head, token,
    dim) float32, summed in float64 (None: no held-out window): Method A-shared's source (docs/method.md 3C)."""
    if len(token_ids) == 0:
        return None
    total = None
    for ids in tqdm(token_ids, desc=f"held-out windows {label}", unit="window"):
        _, k = capture_window(model, capture, ids, positions)  # (layer, kv_head, T, d)
        total = k.astype(np.float64) if total is None else total + k
    return (total / len(token_ids)).astype(np.float32)


def capture_attrs(model, capture: Capture, manifest: dict, *, model_name: str, variant: str, dtype: str) -> dict:
    """qk.h5's attrs that name the model, its weights and how it was captured (after one captured pass)."""
    return {
        **manifest_attrs(manifest, model=model_name, variant=variant),
        "dtype": dtype,
        "device": str(next(model.parameters()).device),
        "softcap": capture.softcap,
        "rope_parameters": getattr(model.config, "rope_parameters", None) or {},
        "capture_point": capture.capture_point,
        "attn_implementation": model.config._attn_implementation,
    }


def reference_layers(ref_samples, ref_layers, n_windows: int, n_layers: int, windows_path) -> list[int]:
    """The reference layers as indices 0..n_layers-1, after refusing reference windows or layers out of range."""
    bad = [s for s in ref_samples if not 0 <= s < n_windows]
    if bad:
        raise ValueError(f"extract.ref_samples: {bad} outside the {n_windows} windows of {windows_path}")
    bad = [l for l in ref_layers if not -n_layers <= l < n_layers]
    if bad:
        raise ValueError(f"extract.ref_layers: {bad} outside the model's {n_layers} layers")
    return sorted({l % n_layers for l in ref_layers})


def qk_attrs(run, model, capture: Capture, manifest: dict, windows, **checks) -> dict:
    """qk.h5's attrs: the model and how it was captured, the windows, the checks' settings and outcomes, the job's
    config hash."""
    named = capture_attrs(model, capture, manifest, model_name=run.model, variant=run.variant, dtype=run.dtype)
    return {**named, **windows_attrs(windows), **checks, "config_hash": run.config_hash}


def windows_attrs(windows) -> dict:
    """What qk.h5 carries of the windows file: the corpus and the window draw."""
    return {
        "corpus_source": windows.attrs.get("corpus_source", ""),
        "window_seed": int(windows.attrs.get("window_seed", -1)),
    }


def check_window(capture, q, k, params, rtol: float, layer_errors: dict, ref_layers) -> tuple[float, np.ndarray | None]:
    """Self-check a captured window against the model's own logits, where the pass kept any (a reference window
    or a shard's first): (worst relative error, 0.0 for a window without references; the reference layers'
    logits to store, (ref_layer, H, T, T), or None)."""
    if not (capture.logits or capture.prefix_logits):
        return 0.0, None
    prefix = {layer: logits[0] for layer, logits in capture.prefix_logits.items()}
    worst = verify_logits(q, k, params, prefix, rtol, layer_errors)
    refs = {layer: capture.logits[layer][0] for layer in ref_layers}
    worst = max(worst, verify_logits(q, k, params, refs, rtol, layer_errors))
    if not ref_layers:  # none for long windows: H T^2 floats each (the prefix check remains)
        return worst, None
    return worst, np.stack([refs[layer].numpy() for layer in ref_layers])


def open_writer(out_path, capture, params, attrs: dict, kept, n_tokens: int, refs, storage) -> QKWriter:
    """qk.h5's writer for the captured model's shapes: the ``kept`` windows, ``refs`` = (reference windows to
    store, reference layers), ``storage`` = (gzip level, q/k dtype)."""
    (ref_samples, ref_layers), (compression, qk_dtype) = refs, storage
    layout = QKLayout(
        samples=kept,
        n_layers=capture.n_layers,
        n_heads=capture.n_heads,
        n_kv_heads=capture.n_kv_heads,
        n_tokens=n_tokens,
        head_dim=capture.head_dim,
        ref_samples=ref_samples,
        ref_layers=ref_layers,
        compression=compression,
        qk_dtype=qk_dtype,
    )
    return QKWriter(out_path, layout, rope=params, attrs=attrs)


def transparency_attrs(model, capture: Capture, token_ids: np.ndarray, n_tokens: int, rtol: float) -> dict:
    """:func:`transparency_check` on the first ``n_tokens`` of ``token_ids`` (0: all), also the pass on which each
    layer's RoPE layout is detected; qk.h5's attrs of its outcome."""
    n_check = min(n_tokens or len(token_ids), len(token_ids))
    device = next(model.parameters()).device
    first = torch.from_numpy(np.asarray(token_ids[:n_check]))[None].to(device)
    error, own = transparency_check(model, capture, first, rtol)
    return {"transparency_rel_error": error, "transparency_tokens": n_check, "transparency_reference": own}


def captured_windows(model, capture: Capture, token_id: np.ndarray, shard, positions, check_samples, label: str):
    """One forward pass per window of ``shard`` inside a running ``capture``, in order: (global index, q, k, the
    time its pass started); the model's own logits are kept on ``check_samples`` for the self-check."""
    for sample in tqdm(shard.tolist(), desc=f"extract {label}", unit="window"):
        t0 = time.perf_counter()
        q, k = capture_window(model, capture, token_id[sample], positions, keep_logits=sample in check_samples)
        yield sample, q, k, t0


def extract(run: ModelRun, options: ExtractOptions, analysis: Analysis | None = None) -> dict:
    """Write ``qk.h5`` (``run.out``) for one model variant (the shard ``run.samples`` of its windows); returns
    timing and check figures. ``options``: config ``extract.<name>`` and the models entry's ``first_token``
    (:meth:`ExtractOptions.defaults`: the schema's), each described in the module docstring.
    """
    ref_samples, first_token, keep_qk = options.ref_samples, options.first_token, options.keep_qk
    model, _, manifest = run.load()
    windows = read_windows(run.windows)
    token_id = windows["token_id"].values
    n_windows, n_tokens = token_id.shape
    start, stop = run.window_range(n_windows, run.windows)
    shard = np.arange(start, stop)  # global window indices
    kept = shard[shard < keep_qk] if keep_qk is not None else shard
    check_tokens = min(options.check_tokens or n_tokens, n_tokens)
    capture = Capture(model, options.ref_layers, check_tokens=check_tokens)
    ref_layers = reference_layers(ref_samples, options.ref_layers, n_windows, capture.n_layers, run.windows)
    rtol = effective_rtol(options.check_rtol, run.dtype)
    device = next(model.parameters()).device
    positions = torch.arange(n_tokens, device=device)[None]
    writer, worst, seconds, layer_errors = None, 0.0, [], {}
    try:
        with torch.inference_mode(), capture, first_token_replaced(model, first_token):
            checked = transparency_attrs(
                model,
                capture,
                token_id[start],
                options.transparency_tokens,
                effective_rtol(options.transparency_rtol, run.dtype),
            )
            heldout_ids = windows["heldout_token_id"].values if "heldout_token_id" in windows else token_id[:0]
            heldout_k = heldout_mean_keys(model, capture, heldout_ids, positions, run.label)
            # Method A-shared reads them only through their smooth fit: its coefficients are what is kept
            heldout_coef = None if heldout_k is None else heldout_coefficients(heldout_k, n_tokens).numpy()
            # every shard self-checks its first window, so that no job goes unchecked
            passes = captured_windows(model, capture, token_id, shard, positions, set(ref_samples) | {start}, run.label)
            first_pass = next(passes)  # the RoPE table is read after a whole window's pass (dynamic RoPE)
            params = capture.rope()
            checks = dict(check_rtol=rtol, self_check_tokens=check_tokens, first_token=first_token, **checked)
            attrs = qk_attrs(run, model, capture, manifest, windows, **checks)
            # the fused path checks the reference logits in memory and does not store them: H T^2 floats per
            # reference layer, 58 of the 106 GB a paper run would keep
            refs = (list(ref_samples) if analysis is None else [], ref_layers)
            storage = (options.compression, options.qk_dtype)
            writer = open_writer(run.out, capture, params, attrs, kept, n_tokens, refs, storage)
            if heldout_coef is not None:
                writer.write_heldout_coefficients(heldout_coef, len(heldout_ids))
            if analysis is not None:
                analysis.start(params, n_tokens, capture.n_kv_heads, shard, heldout_coef, len(heldout_ids))
            for sample, q, k, t0 in itertools.chain([first_pass], passes):
                error, logits_ref = check_window(capture, q, k, params, rtol, layer_errors, ref_layers)
                worst = max(worst, error)
                if writer.holds(sample):
                    writer.write_sample(sample, q, k, token_id[sample], logits_ref)
                if analysis is not None:
                    analysis.add(sample, q, k)
                if device.type == "cuda":
                    torch.cuda.empty_cache()  # release activations between windows: 8B models run near the limit
                seconds.append(time.perf_counter() - t0)
            writer.file.attrs["self_check_max_rel_error"] = worst
            writer.write_layer_errors(np.array([layer_errors.get(i, np.nan) for i in range(capture.n_layers)]))
        if analysis is not None:
            analysis.write({**carried_attrs(attrs), "source": str(run.windows), "self_check_max_rel_error": worst})
        writer.close(ok=True)
    except BaseException:
        if writer is not None:
            writer.close(ok=False)
        raise
    report = dict(self_check_max_rel_error=worst, transparency_rel_error=checked["transparency_rel_error"])
    report.update(seconds_per_window=seconds, n_samples=len(shard))
    print(json.dumps(report))
    return report


def extract_step(job) -> dict:
    """Rule extract's job (a :class:`posgen.workflow.job.StepJob`): the fused path (extract.analysis: fused)
    also writes the shard's decomposition.nc and bands.nc and keeps q/k of the first keep_qk windows only; the
    store path keeps every window's."""
    from posgen.decomposition.options import DecompositionOptions

    p, out = job.params, job.output
    fused = p["analysis"] == "fused"
    analysis = (
        Analysis(
            DecompositionOptions.of(p),
            decomposition_path=out["decomposition"],
            bands_path=out["bands"],
            config_hash=p["config_hash"],
        )
        if fused
        else None
    )
    return extract(ModelRun.of_job(job, out="qk"), ExtractOptions.of(p), analysis=analysis)
