"""Per-head ablation on pretrained LLMs (docs/method.md section 8.6): which attention head carries position?
A first-family model job beside perturb and cap (rule head_ablation, config section ``head_ablation``).

Ablation
--------
Head h of layer l is ablated by zeroing its slice ``[h * head_dim, (h + 1) * head_dim)`` of the input of the
attention's output projection ``o_proj`` (a forward pre-hook; the model's source is not touched). This is
exactly the model with the matching ``o_proj`` weight columns set to zero. One head is ablated at a time.

Probes (``PROBES``)
-------------------
* ``windows``: the first ``n_samples`` corpus windows of ``windows.h5``, cut to ``seq_len`` tokens; the loss is
  the mean next-token NLL over all targets 1..T-1.
* ``repeat``: ``probe_samples`` sequences of ``period`` distinct token ids drawn uniformly (seeded) from the
  ordinary (non-special) vocabulary, written twice in a row (after BOS when the tokenizer prepends one). Every
  token occurs once per copy, so a token of the second copy is predictable only by looking back exactly
  ``period`` positions. The loss is the mean NLL over the targets of the second copy except its first token
  (which follows the end of the first copy and cannot be predicted): ``period - 1`` targets per sequence.

``loss_increase = ablated_loss - base_loss`` (nats): how much the loss grows when the head is removed.

Per layer: ``deposit_index = max_h loss_increase / sum_h max(loss_increase, 0)`` (1 when one head carries all
the layer's positive effect, 1/H when all heads matter equally; NaN when no head increases the loss) and
``top_gap`` = largest minus second largest increase (``posgen.stats``, docs/method.md section 8.4).

Beside each head's increase the job puts the head's Method A numbers from ``decomposition.nc`` (sink
"without", mean over samples): ``method_a_r``, ``r2_f``, ``r2_g`` and ``f_share = r2_f / (r2_f + r2_g)``, the
share of the explained variance that is positional. The Spearman rank correlation over heads between the
increase and ``f_share`` (and ``method_a_r``) answers "is the head that carries position mostly f?" (attrs
``spearman_f_share_<probe>``, ``spearman_method_a_r_<probe>``).

Fast path
---------
Layers below the ablated one see no change, so one clean forward records the input (and the call's other
arguments: mask, rotary tables) of every decoder layer; the ablations of layer l then start from that cached
input, run as one batch of H copies (copy h has head h zeroed), through layers l..L-1, the final norm and the
LM head at the scored positions only. ``ablate_naive`` runs the full model once per head (the reference).

Cost per sequence of T tokens: ``H * sum_l (L - l) = H * L (L + 1) / 2`` decoder-layer passes of T tokens plus
``H * L`` LM-head passes at the scored positions, against ``H * L`` full forwards for the naive loop (about
3.5x less for SmolLM2-135M, L = 30, H = 9, whose LM head costs about 8 decoder layers). Measured for SmolLM2
on the default sizes (4 sequences of 32 tokens): about 150 CPU-seconds per sequence.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from posgen.llm.options import HeadAblationOptions
from posgen.llm.run import ModelRun
from posgen.stats import deposit_index, spearman, top_gap

PROBES = ("windows", "repeat")
SINK = "without"  # decomposition reading joined to the ablation (docs/data-model.md: sink-free)


# --------------------------------------------------------------------------------------------------------
# Probe


def repeat_probe(
    vocab_ids: np.ndarray,
    n_samples: int,
    period: int,
    seed: int,
    bos_id: int | None = None,
) -> np.ndarray:
    """(n_samples, [1 +] 2 * period) int64: ``period`` distinct ids from ``vocab_ids``, twice, after ``bos_id``."""
    vocab_ids = np.asarray(vocab_ids, dtype=np.int64)
    if period > len(vocab_ids):
        raise ValueError(f"head_ablation.probe_period: {period} exceeds the {len(vocab_ids)} ordinary token ids")
    rows = []
    for sample in range(n_samples):
        rng = np.random.default_rng([seed, sample])
        copy = rng.choice(vocab_ids, size=period, replace=False)  # (period,)
        row = np.concatenate([copy, copy])  # (2 * period,)
        if bos_id is not None:
            row = np.concatenate([[bos_id], row])
        rows.append(row)
    return np.stack(rows).astype(np.int64)


def repeat_targets(period: int, bos: bool) -> np.ndarray:
    """Positions t scored in a repeat probe (the token at t is predicted from tokens < t)."""
    offset = int(bos)
    return np.arange(offset + period + 1, offset + 2 * period)  # second copy without its first token


def ordinary_ids(tokenizer) -> np.ndarray:
    """Token ids that are not special tokens."""
    special = set(tokenizer.all_special_ids)
    return np.array([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)


# --------------------------------------------------------------------------------------------------------
# Per-layer summaries


def per_layer(statistic, increase: xr.DataArray) -> xr.DataArray:
    """A per-layer statistic of posgen.stats (``deposit_index``, ``top_gap``) over the ``head`` dim."""
    return xr.apply_ufunc(statistic, increase, input_core_dims=[["head"]])


# --------------------------------------------------------------------------------------------------------
# Model plumbing


def _parts(model):
    """(decoder layers, attention modules, final norm, LM head, final logit soft-cap or None)."""
    decoder = model.get_decoder()
    layers = list(decoder.layers)
    attentions = [layer.self_attn for layer in layers]
    if not all(hasattr(a, "o_proj") for a in attentions):
        raise NotImplementedError(f"{type(model).__name__}: attention without o_proj is not supported")
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return layers, attentions, decoder.norm, model.get_output_embeddings(), softcap


def head_shape(model, attention) -> tuple[int, int]:
    """(heads, head size) of one attention layer's o_proj input (the head size varies by layer in Gemma 4)."""
    text = model.config.get_text_config()
    n_heads = text.num_attention_heads
    return n_heads, attention.o_proj.in_features // n_heads


def head_masks(heads: list[int], n_heads: int, head_dim: int, dtype, device) -> torch.Tensor:
    """(len(heads), 1, n_heads * head_dim): copy c zeroes the o_proj input slice of head ``heads[c]``."""
    mask = torch.ones(len(heads), n_heads, head_dim, dtype=dtype, device=device)  # (copy, head, dim)
    for copy, head in enumerate(heads):
        mask[copy, head] = 0
    return mask.reshape(len(heads), 1, n_heads * head_dim)


@contextlib.contextmanager
def ablated(attention, mask: torch.Tensor):
    """Multiply the o_proj input of ``attention`` by ``mask`` (broadcast over batch and tokens)."""

    def pre_hook(_module, args):
        x = args[0]  # (batch, tokens, n_heads * head_dim)
        # device too: with device_map="auto" the layer may sit on another GPU than the inputs
        return (x * mask.to(device=x.device, dtype=x.dtype),) + tuple(args[1:])

    handle = attention.o_proj.register_forward_pre_hook(pre_hook)
    try:
        yield
    finally:
        handle.remove()


def _nll(logits: torch.Tensor, token_ids: torch.Tensor, targets: torch.Tensor, softcap) -> torch.Tensor:
    """(batch,) mean NLL of ``token_ids[targets]`` from ``logits`` (batch, len(targets), vocab) at targets - 1."""
    logits = logits.float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    log_probs = torch.log_softmax(logits, dim=-1)  # (batch, target, vocab)
    index = token_ids[targets].to(logits.device).expand(logits.shape[0], -1).unsqueeze(-1)  # (batch, target, 1)
    return -log_probs.gather(-1, index).squeeze(-1).mean(-1)  # (batch,)


def _head_logits(model, normed: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """LM-head logits at the positions predicting ``targets``: (batch, len(targets), vocab).

    ``normed``: the decoder's output, final norm included (``last_hidden_state``).
    """
    return model.get_output_embeddings()(normed[:, (targets - 1).to(normed.device)])


@torch.no_grad()
def sequence_loss(model, token_ids: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean NLL over ``targets`` of one sequence (full forward)."""
    *_, softcap = _parts(model)
    hidden = model.get_decoder()(input_ids=token_ids[None], use_cache=False).last_hidden_state  # (1, T, d)
    return float(_nll(_head_logits(model, hidden, targets), token_ids, targets, softcap)[0])


@torch.no_grad()
def ablate_naive(model, token_ids: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """(layer, head) ablated loss, one full forward per head: the reference for :func:`ablate_sequence`."""
    _, attentions, *_ = _parts(model)
    dtype = next(model.parameters()).dtype
    out = np.zeros((len(attentions), model.config.get_text_config().num_attention_heads))
    for layer, attention in enumerate(attentions):
        n_heads, head_dim = head_shape(model, attention)
        for head in range(n_heads):
            mask = head_masks([head], n_heads, head_dim, dtype, token_ids.device)
            with ablated(attention, mask):
                out[layer, head] = sequence_loss(model, token_ids, targets)
    return out


def _record_layer_inputs(model, token_ids: torch.Tensor):
    """Clean forward; the (args, kwargs) every decoder layer was called with, and the normed final hidden."""
    layers, *_ = _parts(model)
    calls = [None] * len(layers)
    handles = []
    for index, layer in enumerate(layers):

        def pre_hook(_module, args, kwargs, index=index):
            calls[index] = (args, dict(kwargs))

        handles.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
    try:
        hidden = model.get_decoder()(input_ids=token_ids[None], use_cache=False).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()
    return calls, hidden


def _layer_input(call):
    args, kwargs = call
    if args:
        return args[0], args[1:], kwargs
    kwargs = dict(kwargs)
    return kwargs.pop("hidden_states"), (), kwargs


@torch.no_grad()
def ablate_sequence(model, token_ids: torch.Tensor, targets: torch.Tensor, head_batch: int = 0):
    """(base loss, (layer, head) ablated loss) of one sequence with the cached-prefix fast path.

    ``head_batch``: heads ablated together in one batch (0 = all heads of a layer at once).
    """
    layers, attentions, norm, lm_head, softcap = _parts(model)
    n_heads = model.config.get_text_config().num_attention_heads
    dtype = next(model.parameters()).dtype
    calls, hidden = _record_layer_inputs(model, token_ids)
    base = float(_nll(_head_logits(model, hidden, targets), token_ids, targets, softcap)[0])
    step = head_batch or n_heads
    out = np.zeros((len(layers), n_heads))
    for start_layer, attention in enumerate(attentions):
        _, head_dim = head_shape(model, attention)
        clean_input, extra_args, kwargs = _layer_input(calls[start_layer])  # (1, T, d)
        for first in range(0, n_heads, step):
            heads = list(range(first, min(first + step, n_heads)))
            mask = head_masks(heads, n_heads, head_dim, dtype, token_ids.device)  # (copy, 1, H * hd)
            x = clean_input.expand(len(heads), -1, -1)  # (copy, T, d)
            with ablated(attention, mask):
                x = layers[start_layer](x, *extra_args, **kwargs)
            x = x[0] if isinstance(x, tuple) else x
            for later in range(start_layer + 1, len(layers)):
                _, later_args, later_kwargs = _layer_input(calls[later])
                x = layers[later](x, *later_args, **later_kwargs)
                x = x[0] if isinstance(x, tuple) else x
            logits = lm_head(norm(x[:, (targets - 1).to(x.device)]))  # (copy, target, vocab)
            out[start_layer, first : first + len(heads)] = _nll(logits, token_ids, targets, softcap).cpu().numpy()
    return base, out


def ablate(model, sequences: np.ndarray, targets: np.ndarray, *, desc: str = "", head_batch: int = 0):
    """(sample,) base loss and (sample, layer, head) ablated loss over the rows of ``sequences``."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    target_t = torch.as_tensor(targets, device=device)
    bases, ablations = [], []
    for row in tqdm(sequences, desc=desc, unit="seq", disable=not desc):
        base, out = ablate_sequence(model, torch.as_tensor(row, device=device), target_t, head_batch)
        bases.append(base)
        ablations.append(out)
    return np.array(bases), np.stack(ablations)


# --------------------------------------------------------------------------------------------------------
# Dataset


def head_ablation(model, tokenizer, windows: np.ndarray, options: HeadAblationOptions, desc: str = "") -> xr.Dataset:
    """Ablation of every head on ``windows`` and on the repeat probe, each of ``options.probes`` (``PROBES``, in
    that order); dims ``probe, sample, layer, head`` (see the module doc). The windows are the caller's:
    ``options.n_samples`` and ``options.seq_len`` are the job's (:func:`head_ablation_job`)."""
    from posgen.corpus import prepends_bos

    unknown = sorted(set(options.probes) - set(PROBES))
    if unknown or not options.probes:
        raise ValueError(f"head_ablation.probes: {unknown or 'none'} (choose from {', '.join(PROBES)})")
    probes = [name for name in PROBES if name in options.probes]
    bos = prepends_bos(tokenizer)
    probe_period, seed = options.probe_period, options.seed
    probe = repeat_probe(
        ordinary_ids(tokenizer), options.probe_samples, probe_period, seed, tokenizer.bos_token_id if bos else None
    )
    jobs = {
        "windows": (windows, np.arange(1, windows.shape[1])),
        "repeat": (probe, repeat_targets(probe_period, bos)),
    }
    base, ablated_loss = {}, {}
    for name in probes:
        sequences, targets = jobs[name]
        base[name], ablated_loss[name] = ablate(model, sequences, targets, desc=f"{desc} {name}".strip())
    n_layers, n_heads = ablated_loss[probes[0]].shape[1:]
    # samples differ in number between probes: pad to the longer with NaN
    n_samples = max(len(b) for b in base.values())
    base_arr = np.full((len(probes), n_samples), np.nan)
    ablated_arr = np.full((len(probes), n_samples, n_layers, n_heads), np.nan)
    for p, name in enumerate(probes):
        base_arr[p, : len(base[name])] = base[name]
        ablated_arr[p, : len(base[name])] = ablated_loss[name]
    coords = {
        "probe": probes,
        "sample": np.arange(n_samples),
        "layer": np.arange(n_layers),
        "head": np.arange(n_heads),
    }
    ds = xr.Dataset(
        {
            "sample_base_loss": (("probe", "sample"), base_arr),
            "sample_ablated_loss": (("probe", "sample", "layer", "head"), ablated_arr),
            "probe_token_id": (("probe_sample", "probe_token"), probe),
        },
        coords=coords,
    )
    ds["base_loss"] = ds["sample_base_loss"].mean("sample")  # NaN padding skipped
    ds["ablated_loss"] = ds["sample_ablated_loss"].mean("sample")
    ds["loss_increase"] = ds["ablated_loss"] - ds["base_loss"]
    ds["deposit_index"] = per_layer(deposit_index, ds["loss_increase"])
    ds["top_gap"] = per_layer(top_gap, ds["loss_increase"])
    ds["n_samples"] = ("probe", [len(jobs[name][0]) for name in probes])
    ds["n_targets"] = ("probe", [len(jobs[name][1]) for name in probes])
    ds.attrs.update(probe_period=int(probe_period), probe_seed=int(seed), bos_prepended=int(bos))
    return ds


def per_head_split(decomposition: xr.Dataset) -> xr.Dataset:
    """Each head's Method A r, variance explained by f alone and by g alone (sink "without", mean over samples),
    and its f share ``r2_f / (r2_f + r2_g)``: (layer, head) each."""
    # a dict: sel(method=...) would be the lookup method
    per_head = decomposition.sel({"sink": SINK, "method": "A"}).mean("sample")
    out = xr.Dataset({"method_a_r": per_head["r"], "r2_f": per_head["r2_f"], "r2_g": per_head["r2_g"]})
    out["f_share"] = out["r2_f"] / (out["r2_f"] + out["r2_g"])
    return out.transpose("layer", "head").reset_coords(drop=True)


def join_decomposition(ds: xr.Dataset, decomposition: xr.Dataset) -> xr.Dataset:
    """Add each head's Method A r and variance split (sink "without", mean over samples) and the correlations."""
    for name in ("r", "r2_f", "r2_g"):
        if name not in decomposition:
            raise KeyError(f"decomposition.nc: no variable {name!r}")
    sizes = (decomposition.sizes["layer"], decomposition.sizes["head"])
    if sizes != (ds.sizes["layer"], ds.sizes["head"]):
        raise ValueError(
            f"decomposition.nc: layer x head {sizes} differs from the model's {(ds.sizes['layer'], ds.sizes['head'])}"
        )
    out = ds.copy()
    for name, value in per_head_split(decomposition).items():
        out[name] = (("layer", "head"), value.values)
    for probe in out["probe"].values.tolist():
        increase = out["loss_increase"].sel(probe=probe).values
        out.attrs[f"spearman_f_share_{probe}"] = spearman(increase, out["f_share"].values)
        out.attrs[f"spearman_method_a_r_{probe}"] = spearman(increase, out["method_a_r"].values)
    out.attrs["decomposition_sink"] = SINK
    return out


def head_ablation_job(run: ModelRun, decomposition_path: str | Path, options: HeadAblationOptions) -> xr.Dataset:
    """Write ``head_ablation.nc`` (``run.out``) of one model variant, beside the heads' numbers of its gathered
    ``decomposition.nc``. One job over all its windows: ``run.samples`` must be None (not sharded)."""
    from posgen.store import open_dataset

    if run.samples is not None:
        raise ValueError(f"head_ablation: one job over every window, not a shard ({run.samples})")
    start = time.perf_counter()
    windows, _ = run.token_windows(options.n_samples, options.seq_len, section="head_ablation")
    model, tokenizer, manifest = run.load(capturing=False)
    ds = head_ablation(model, tokenizer, windows, options, desc=f"heads {run.label}")
    with open_dataset(decomposition_path, lazy=False) as decomposition:
        ds = join_decomposition(ds, decomposition)
    sizes = dict(windows_n_samples=int(options.n_samples), windows_seq_len=int(options.seq_len))
    return run.write(ds, model, manifest, start, **sizes)


def head_ablation_step(job) -> xr.Dataset:
    """Rule head_ablation's job (a :class:`posgen.workflow.job.StepJob`)."""
    return head_ablation_job(ModelRun.of_job(job), job.input["decomposition"], HeadAblationOptions.of(job.params))
