"""Extraction: run a model over the token windows and store pre-RoPE q/k, with a built-in self-check."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from posgen import rope
from posgen.capture import Capture, load_capturing
from posgen.corpus import read_windows
from posgen.models import manifest_attrs
from posgen.store import QKWriter


class SelfCheckError(RuntimeError):
    """Re-rotated stored q/k do not reproduce the model's own logits."""


def effective_rtol(rtol: float, dtype: str) -> float:
    """In half precision the model itself rotates and multiplies with ~eps error; float32 recomputation
    cannot match it more closely than that, so the tolerance widens to a few eps of the dtype."""
    if dtype == "float32":
        return rtol
    return max(rtol, 4 * torch.finfo(getattr(torch, dtype)).eps)


def verify_logits(q, k, rope_params: dict, logits_ref: dict, rtol: float) -> float:
    """Compare ``rope.logits`` on stored q/k with the model's own logits for every kept (layer, head).

    ``q``: (layer, head, token, dim) and ``k``: (layer, kv_head, token, dim) arrays of one sample;
    ``logits_ref``: {layer: (head, token, token)}. Returns the worst relative (Frobenius) error.
    """
    worst = 0.0
    for layer, ref in sorted(logits_ref.items()):
        ql = torch.from_numpy(q[layer])
        kl = torch.from_numpy(k[layer])[rope_params["kv_group"]]
        w = rope.logits(
            ql,
            kl,
            torch.from_numpy(rope_params["inv_freq"][layer]),
            float(rope_params["scaling"][layer]),
            float(rope_params["attention_scaling"][layer]),
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
    return worst


def extract(
    model_dir: str | Path,
    windows_path: str | Path,
    out_path: str | Path,
    *,
    model_name: str,
    variant: str,
    dtype: str = "float32",
    device: str = "cpu",
    ref_samples=(0,),
    ref_layers=(0, -1),
    check_rtol: float = 1e-4,
    compression: int = 0,
    config_hash: str = "",
) -> dict:
    """Write ``qk.h5`` for one model variant; returns timing and self-check figures."""
    model, _, manifest = load_capturing(model_dir, variant, dtype=dtype, device=device)
    windows = read_windows(windows_path)
    token_id = windows["token_id"].values
    n_samples, n_tokens = token_id.shape
    capture = Capture(model, ref_layers)
    bad = [s for s in ref_samples if not 0 <= s < n_samples]
    if bad:
        raise ValueError(f"extract.ref_samples: {bad} outside the {n_samples} windows of {windows_path}")
    bad = [l for l in ref_layers if not -capture.n_layers <= l < capture.n_layers]
    if bad:
        raise ValueError(f"extract.ref_layers: {bad} outside the model's {capture.n_layers} layers")
    ref_layers = sorted({l % capture.n_layers for l in ref_layers})
    rtol = effective_rtol(check_rtol, dtype)
    device_obj = next(model.parameters()).device
    positions = torch.arange(n_tokens, device=device_obj)[None]
    writer, worst, seconds = None, 0.0, []
    try:
        with torch.inference_mode(), capture:
            for sample in tqdm(range(n_samples), desc=f"extract {model_name}/{variant}", unit="window"):
                start = time.perf_counter()
                capture.reset(n_tokens, keep_logits=sample in ref_samples)
                ids = torch.from_numpy(token_id[sample])[None].to(device_obj)
                model.base_model(input_ids=ids, position_ids=positions, use_cache=False)
                q, k = capture.stacked()
                if writer is None:
                    params = capture.rope()
                    writer = QKWriter(
                        out_path,
                        n_samples=n_samples,
                        n_layers=capture.n_layers,
                        n_heads=capture.n_heads,
                        n_kv_heads=capture.n_kv_heads,
                        n_tokens=n_tokens,
                        head_dim=capture.head_dim,
                        ref_samples=list(ref_samples),
                        ref_layers=ref_layers,
                        rope=params,
                        compression=compression,
                        attrs={
                            **manifest_attrs(manifest, model=model_name, variant=variant),
                            "dtype": dtype,
                            "device": str(device_obj),
                            "softcap": params["softcap"],
                            "rope_parameters": getattr(model.config, "rope_parameters", None) or {},
                            "capture_point": capture.capture_point,
                            "attn_implementation": model.config._attn_implementation,
                            "corpus_source": windows.attrs.get("corpus_source", ""),
                            "window_seed": int(windows.attrs.get("window_seed", -1)),
                            "check_rtol": rtol,
                            "config_hash": config_hash,
                        },
                    )
                logits_ref = None
                if capture.logits:
                    refs = {layer: capture.logits[layer][0] for layer in ref_layers}
                    worst = max(worst, verify_logits(q, k, params, refs, rtol))
                    logits_ref = np.stack([refs[layer].numpy() for layer in ref_layers])
                writer.write_sample(sample, q, k, token_id[sample], logits_ref)
                if device_obj.type == "cuda":
                    torch.cuda.empty_cache()  # release activations between windows: 8B models run near the limit
                seconds.append(time.perf_counter() - start)
            writer.file.attrs["self_check_max_rel_error"] = worst
        writer.close(ok=True)
    except BaseException:
        if writer is not None:
            writer.close(ok=False)
        raise
    report = {"self_check_max_rel_error": worst, "seconds_per_window": seconds, "n_samples": n_samples}
    print(json.dumps(report))
    return report
