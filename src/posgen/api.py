"""The notebook face of posgen: the workflow's own steps, called on data in memory (README, "From Python").

* :func:`load`: a model as the extraction loads it, from a source (``embedded:smollm2-135m``, ``hf:<org>/<repo>``,
  ``local:<folder>``: acquired into a cache folder) or an acquired model folder;
* :func:`windows`: token windows cut from a corpus as rule ``windows`` cuts them (windows.h5's dataset);
* :func:`capture_qk`: the pre-RoPE q/k of those windows (or of any token ids or text), named as in qk.h5, with the
  extraction's self-check;
* :func:`decompose`: the dataset decomposition.nc holds, by the store path's own code;
* :func:`ablate_heads`: the dataset head_ablation.nc holds (the loss increase of every head on the windows and on
  a repeat probe);
* :func:`draw`: any paper figure from those datasets, by the figure rules' own loader and drawing function;
* :func:`heads`, :func:`classifier_heads`: a run's per-head tables (results/heads.parquet,
  results/synthetic/heads.parquet) as DataFrames;
* :func:`verdicts`: both papers' verdicts (results/verdicts.csv) as one DataFrame.

Options not given take the config schema's defaults (schemas/config.schema.yaml), as the workflow does.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import xarray as xr

from posgen import paths
from posgen.atlas.tables import CLASSIFIER_KEYS, HEAD_KEYS
from posgen.claims import VERDICT_COLUMNS
from posgen.config import schema_default, schema_defaults
from posgen.corpus import cut_windows, load_text
from posgen.decomposition.options import DecompositionOptions
from posgen.decomposition.table import decompose_dataset
from posgen.figures import registry
from posgen.llm.capture import CAPTURING_BACKENDS, Capture, backend_for
from posgen.llm.extract import capture_attrs, capture_window, effective_rtol, verify_logits
from posgen.llm.head_ablation import head_ablation, join_decomposition
from posgen.llm.options import ExtractOptions, HeadAblationOptions
from posgen.llm.run import ModelRun
from posgen.models import acquire, manifest_attrs
from posgen.parquet import read_table
from posgen.store import provenance, qk_dataset
from posgen.workflow.figures import FIGURES


def model_folder(source: str | Path, cache: str | Path | None = None) -> Path:
    """An acquired model folder: ``source`` itself if it is a folder, else ``source`` acquired (once) into
    ``cache/<name>`` (``cache`` None: a new temporary folder)."""
    if Path(source).is_dir():
        return Path(source)
    if ":" not in str(source):
        raise FileNotFoundError(f"{source}: neither a model folder nor a source (embedded:, hf:, local:)")
    name = re.sub(r"[^A-Za-z0-9._-]+", "--", str(source).partition(":")[2]).strip("-.")
    folder = Path(cache or tempfile.mkdtemp(prefix="posgen-")) / name
    if not (folder / "manifest.json").exists():
        acquire(str(source), folder)
    return folder


def load(
    source: str | Path,
    *,
    variant: str = "trained",
    dtype: str = "float32",
    device: str = "cpu",
    cache: str | Path | None = None,
):
    """``(model, tokenizer, manifest)`` of ``source`` (:func:`model_folder`), loaded as the extraction loads it
    (:meth:`posgen.llm.run.ModelRun.load`); ``variant``: trained, random-seed<S> or step<N>."""
    folder = model_folder(source, cache)
    return ModelRun(folder, None, None, model=str(source), variant=variant, dtype=dtype, device=device).load()


def windows(loaded, *, n_samples: int, seq_len: int, corpus: str = "embedded", seed: int | None = None):
    """``n_samples`` windows of ``seq_len`` tokens of ``corpus`` (a config ``corpus.source``; ``embedded``: the
    text of the default config), cut with the tokenizer of ``loaded`` (a :func:`load` triple, or a tokenizer) at
    window seed ``seed`` (None: the schema's): the dataset windows.h5 holds, so the workflow's windows for the
    same settings."""
    tokenizer = loaded[1] if isinstance(loaded, tuple) else loaded
    seed = schema_default("window_seed") if seed is None else seed
    return cut_windows(load_text(corpus), tokenizer, n_samples, seq_len, seed, corpus)


def _loaded(loaded, variant: str):
    """(model, tokenizer, manifest) of a :func:`load` / :func:`posgen.models.load_model` triple, or loaded from a
    source or folder."""
    if isinstance(loaded, (str, Path)):
        return load(loaded, variant=variant)
    model, tokenizer, manifest = loaded
    return model, tokenizer, manifest


def _token_rows(tokens, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(token ids (sample, token), the windows' global indices) of a windows dataset, token ids (T,) or
    (N, T), or a text (tokenized as the tokenizer does by default, BOS included where it adds one)."""
    if isinstance(tokens, xr.Dataset):
        return tokens["token_id"].values.astype(np.int64), tokens["sample"].values
    if isinstance(tokens, str):
        tokens = tokenizer(tokens).input_ids
    ids = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    if ids.ndim != 2:
        raise ValueError(f"token ids: shape {ids.shape}, not (token,) or (sample, token)")
    return ids, np.arange(len(ids))


@contextlib.contextmanager
def _capturing_backend(model):
    """The model switched to the capturing backend its config needs (one loaded with transformers' default
    attention, e.g. by posgen.models.load_model), and back afterwards."""
    own = model.config._attn_implementation
    if own in CAPTURING_BACKENDS:
        yield
        return
    model.set_attn_implementation(backend_for(model.config))
    try:
        yield
    finally:
        model.set_attn_implementation(own)


def capture_qk(
    loaded,
    tokens,
    *,
    model: str | None = None,
    variant: str = "trained",
    check: bool = True,
    check_tokens: int | None = None,
) -> xr.Dataset:
    """The pre-RoPE q/k of ``tokens`` through ``loaded``, as a dataset named as qk.h5 (docs/data-model.md): q, k,
    token_id and the RoPE table (inv_freq, scaling, attention_scaling, sliding_window, kv_group, the layout),
    with qk.h5's attrs. Each window runs through the extraction's own forward pass and capture.

    ``loaded``: a :func:`load` or :func:`posgen.models.load_model` triple, or a source or model folder;
    ``tokens``: a :func:`windows` dataset (its ``sample`` indices kept), token ids (T,) or (N, T), or a text;
    ``model``: the name recorded (None: the manifest's source); ``variant``: the variant recorded (and loaded,
    for a source). With ``check``, every layer of the first window is self-checked as the extraction does on
    its first ``check_tokens`` tokens (None: the schema's ``extract.check_tokens``; 0: the whole window):
    re-rotated q/k reproduce the model's own logits within ``extract.check_rtol``.
    """
    net, tokenizer, manifest = _loaded(loaded, variant)
    ids, samples = _token_rows(tokens, tokenizer)
    options = ExtractOptions.defaults()
    check_tokens = options.check_tokens if check_tokens is None else check_tokens
    check_tokens = min(check_tokens or ids.shape[1], ids.shape[1]) if check else 0
    dtype = str(next(net.parameters()).dtype).removeprefix("torch.")
    positions = torch.arange(ids.shape[1], device=next(net.parameters()).device)[None]
    rtol = effective_rtol(options.check_rtol, dtype)
    qs, ks, worst = [], [], float("nan")
    with _capturing_backend(net), torch.inference_mode(), Capture(net, check_tokens=check_tokens) as cap:
        for row, token_ids in enumerate(ids):
            q, k = capture_window(net, cap, token_ids, positions, keep_logits=check and row == 0)
            if row == 0:
                rope = cap.rope()
                attrs = capture_attrs(
                    net, cap, manifest, model_name=model or manifest["source"], variant=variant, dtype=dtype
                )
                if check:
                    prefix = {layer: logits[0] for layer, logits in cap.prefix_logits.items()}
                    worst = verify_logits(q, k, rope, prefix, rtol)
            qs.append(q)
            ks.append(k)
    attrs.update(check_rtol=rtol, self_check_tokens=check_tokens, self_check_max_rel_error=worst)
    return qk_dataset(np.stack(qs), np.stack(ks), ids, rope, samples, attrs)


def decompose(qk: xr.Dataset, *, progress: bool = False, **options) -> xr.Dataset:
    """The dataset decomposition.nc holds (docs/data-model.md) of a :func:`capture_qk` (or an opened qk.h5), by the
    store path's own code (:func:`posgen.decomposition.table.decompose_dataset`). ``options``: the config
    section ``decomposition`` (dummy_distances, dummy_distance, lstsq_tol, bound_samples, precision, bound_rows)
    and ``device`` (auto, cpu or cuda), the schema's when not given
    (:meth:`posgen.decomposition.options.DecompositionOptions.defaults`)."""
    options = DecompositionOptions.defaults(**options)
    return decompose_dataset(qk, options, progress=progress, attrs={"analysis": "memory"})


def ablate_heads(
    loaded,
    tokens,
    *,
    decomposition: xr.Dataset | None = None,
    model: str | None = None,
    variant: str = "trained",
    progress: bool = False,
    **options,
) -> xr.Dataset:
    """The dataset head_ablation.nc holds (docs/data-model.md): every head of ``loaded`` ablated on ``tokens`` (as
    :func:`capture_qk` takes them) and on a repeat probe, by the head_ablation job's own code; with a
    ``decomposition`` (:func:`decompose` of the same model), each head's Method A r and f share beside it (what
    the ``head_ablation`` figure draws). ``options``: probe_samples, probe_period, seed, probes of the config
    section ``head_ablation``, the schema's when not given
    (:meth:`posgen.llm.options.HeadAblationOptions.defaults`; its n_samples and seq_len size a job's windows,
    not ``tokens``)."""
    net, tokenizer, manifest = _loaded(loaded, variant)
    ids, _ = _token_rows(tokens, tokenizer)
    ds = head_ablation(net, tokenizer, ids, HeadAblationOptions.defaults(**options), desc="heads" if progress else "")
    if decomposition is not None:
        ds = join_decomposition(ds, decomposition)
    ds.attrs = provenance(**ds.attrs, **manifest_attrs(manifest, model=model or manifest["source"], variant=variant))
    return ds


# figure name -> the roles it reads (posgen.workflow.figures: role -> the path template of its file)
FIGURE_INPUTS = {name: row.inputs for name, row in FIGURES.items() if row.group != "regime_study"}


def draw(name: str, data, *, n_boot: int | None = None, seed: int | None = None):
    """Figure ``name`` (a row of posgen.workflow.figures) as a matplotlib Figure, by the figure rule's own loader and
    drawing function (:func:`posgen.figures.registry.draw`).

    ``data``: the dataset (or path) of the file the figure reads (:data:`FIGURE_INPUTS`), or a dict variant ->
    dataset for a figure that compares variants: decomposition.nc (:func:`decompose`) for ``r_heatmap`` and
    ``dummy_sweep``, head_ablation.nc with a decomposition (:func:`ablate_heads`) for ``head_ablation``,
    examples.nc for ``logit_maps`` and ``scatter``, bands.nc for ``bands``, summary.nc for ``layer_r``,
    perturb.nc for ``perturb_ppl`` and ``perturb_fg``, cap.nc for ``cap``, and the synthetic family's files for
    the others. A single dataset is named by its ``variant`` attr. ``n_boot``, ``seed``: the bootstrap of the
    figures that draw intervals (None: the schema's ``intervals.bootstrap`` and ``intervals.seed``).
    """
    if name not in FIGURE_INPUTS:
        raise KeyError(f"figure {name!r}: unknown (known: {', '.join(FIGURE_INPUTS)})")
    (role,) = FIGURE_INPUTS[name]
    if not isinstance(data, dict):
        variant = data.attrs.get("variant", "trained") if isinstance(data, xr.Dataset) else "trained"
        data = {variant: data}
    intervals = schema_defaults("intervals")
    return registry.draw(
        name,
        {role: list(data.values())},
        variants=list(data),
        n_boot=intervals["bootstrap"] if n_boot is None else n_boot,
        seed=intervals["seed"] if seed is None else seed,
    )


def heads(path: str | Path = paths.HEADS) -> pd.DataFrame:
    """A run's first-paper per-head table (results/heads.parquet, docs/data-model.md): one row per (model, variant,
    layer, head, method, sink) with every per-head statistic and its interval columns."""
    return read_table(path, columns=HEAD_KEYS)


def classifier_heads(path: str | Path = paths.in_collection(paths.CLASSIFIER_HEADS, "run")) -> pd.DataFrame:
    """A run's second-paper per-classifier, per-head table (results/synthetic/heads.parquet): one row per
    (experiment, task, pe, seed, layer, head) with the head's ablation drop and Toeplitz shares."""
    return read_table(path, columns=CLASSIFIER_KEYS)


def verdicts(path: str | Path = paths.REPRODUCTION["verdicts_table"]) -> pd.DataFrame:
    """A run's verdicts of both papers as one table (results/verdicts.parquet, verdicts.csv's digested twin;
    docs/data-model.md): one row per
    (paper, claim, scope) with the outcome, its reason, the regime, the evidence, the rules it cites with their status,
    the registry version and what it was decided on (posgen.claims.VERDICT_COLUMNS)."""
    return read_table(path, columns=list(VERDICT_COLUMNS))
