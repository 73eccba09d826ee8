"""A tiny RoPE model trained by the workflow, saved as a checkpoint series (rule train_trajectory).

transformers' own LlamaForCausalLM from a LlamaConfig, initialised exactly like a ``random-seed<S>`` variant
(``posgen.models.init_weights``, the code path of ``random-seed<S>``), trained with AdamW under a
linear warm-up + cosine schedule on the corpus, tokenised by a byte-level BPE trained on the same text. The
tail of the token stream is held out (tokenizer included) and scored at every checkpoint.

Layout of ``resources/models/<name>/`` (the same as an acquired model, one folder per checkpoint):
``config.json`` + tokenizer files (read by the windows rule and the random-init control), ``step<N>/`` with
safetensors, config, tokenizer and its own ``manifest.json``, and ``manifest.json`` listing the steps, written
last.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from tqdm import tqdm

from posgen.config import TRAIN_SOURCE
from posgen.models import staged_folder, write_manifest
from posgen.schedule import warmup_cosine

ARCHITECTURE = "LlamaForCausalLM"


class TrainingDataError(ValueError):
    """A corpus too small for the requested training, phrased as one line."""


def train_tokenizer(text: str, vocab_size: int):
    """A byte-level BPE of ``vocab_size`` tokens (two of them <bos>, <eos>) trained on ``text``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # chunks keep the trainer's word counting linear; their order (and so the merges) is fixed by the text
    tok.train_from_iterator([text[i : i + 10_000] for i in range(0, len(text), 10_000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")


def llama_config(train: dict, tokenizer):
    """The LlamaConfig of the ``train`` settings (a ``trajectory.models[].train`` section)."""
    from transformers import LlamaConfig

    if train["n_heads"] % train["n_kv_heads"]:
        raise ValueError(f"train.n_kv_heads: {train['n_kv_heads']} does not divide n_heads {train['n_heads']}")
    if train["head_dim"] % 2:
        raise ValueError(f"train.head_dim: {train['head_dim']} is odd; RoPE rotates pairs of dimensions")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=train["hidden_size"],
        intermediate_size=train["intermediate_size"],
        num_hidden_layers=train["n_layers"],
        num_attention_heads=train["n_heads"],
        num_key_value_heads=train["n_kv_heads"],
        head_dim=train["head_dim"],
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": float(train["rope_theta"])},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        architectures=[ARCHITECTURE],
    )


def split_text(text: str, heldout_fraction: float) -> tuple[str, str]:
    """(training text, held-out tail); the cut is moved to the next paragraph break so no word is split."""
    cut = int(len(text) * (1 - heldout_fraction))
    brk = text.find("\n\n", cut)
    cut = brk if brk >= 0 else cut
    return text[:cut], text[cut:]


def heldout_windows(ids: np.ndarray, n: int, seq_len: int) -> torch.Tensor:
    """The first ``n`` non-overlapping windows of ``seq_len`` tokens of the held-out stream, (sample, token)."""
    if len(ids) < n * seq_len:
        raise TrainingDataError(
            f"train.heldout_windows: {n} windows of {seq_len} tokens need {n * seq_len} held-out tokens, "
            f"the corpus tail has {len(ids)} (raise heldout_fraction or lower heldout_windows)"
        )
    return torch.as_tensor(ids[: n * seq_len].reshape(n, seq_len))


@torch.no_grad()
def mean_nll(model, windows: torch.Tensor) -> float:
    """Mean next-token negative log-likelihood (nats) over every predicted token of ``windows``."""
    was_training = model.training
    model.eval()
    loss = model(input_ids=windows, labels=windows).loss  # mean over sample x (token - 1)
    model.train(was_training)
    return float(loss)


def save_checkpoint(model, tokenizer, dest: Path, step: int, seed: int) -> dict:
    """``dest/step<N>/``: safetensors + config + tokenizer + manifest, appearing under its name only when complete
    (staged like an acquired model: :func:`posgen.models.staged_folder`)."""
    with staged_folder(dest / f"step{step}") as work:
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        manifest = write_manifest(
            work,
            {
                "source": TRAIN_SOURCE,
                "revision": f"step{step}",
                "trust_remote_code": False,
                "architecture": ARCHITECTURE,
                "train_seed": seed,
                "step": step,
            },
        )
    return manifest


def train_trajectory(text: str, dest: str | Path, train: dict, *, progress: bool = True) -> xr.Dataset:
    """Train the ``train`` model on ``text`` and save its checkpoints into ``dest``; returns the training log
    (held-out perplexity per checkpoint ``step``, training loss and learning rate per ``train_step``).

    Runs under ``torch.use_deterministic_algorithms(True)``; the caller's setting is restored afterwards.
    """
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _train(text, dest, train, progress)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


def tokenised(text: str, train: dict):
    """The BPE trained on the text before the held-out tail, and the two token streams: (tokenizer, training ids,
    held-out windows (sample, token)); a corpus too small for the settings fails in one line."""
    seq_len = train["seq_len"]
    train_text, heldout_text = split_text(text, train["heldout_fraction"])
    tokenizer = train_tokenizer(train_text, train["vocab_size"])
    train_ids = np.asarray(tokenizer(train_text, add_special_tokens=False).input_ids, dtype=np.int64)
    heldout_ids = np.asarray(tokenizer(heldout_text, add_special_tokens=False).input_ids, dtype=np.int64)
    heldout = heldout_windows(heldout_ids, train["heldout_windows"], seq_len)  # (sample, token)
    if len(train_ids) < 2 * seq_len:
        raise TrainingDataError(f"train.seq_len: {seq_len} is more than half the {len(train_ids)} training tokens")
    return tokenizer, train_ids, heldout


def initial_model(dest: Path, train: dict, tokenizer):
    """The model at step 0, in training mode, exactly the ``random-seed<seed>`` variant of the series.

    The random-init control reads config.json and the tokenizer from the top folder: save them first and
    initialise from the saved config, exactly as posgen.models.load_model does for random-seed<seed>."""
    from transformers import AutoConfig

    from posgen.models import init_weights

    llama_config(train, tokenizer).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    config = AutoConfig.from_pretrained(dest)
    model = init_weights(config, train["seed"], dtype=torch.float32, trust_remote_code=False)
    model.train()
    return model


def adamw(model, train: dict) -> torch.optim.AdamW:
    """AdamW of the ``train`` settings: weight decay on the matrices only; norms' gains do not decay."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": train["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=train["lr"],
        betas=tuple(train["betas"]),
    )


def draw_batch(data: torch.Tensor, seq_len: int, batch_size: int, batches: torch.Generator) -> torch.Tensor:
    """``batch_size`` windows of ``seq_len`` tokens of the training stream at seeded random starts, (batch, token)."""
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=batches)  # (batch,)
    offsets = torch.arange(seq_len)  # (token,)
    return data[starts[:, None] + offsets[None, :]]  # (batch, token)


def _train(text: str, dest: str | Path, train: dict, progress: bool) -> xr.Dataset:
    """:func:`train_trajectory`'s work: the tokenizer, the model at step 0, the training steps with a checkpoint at
    each of ``train["checkpoints"]``, the series' manifest; returns the training log."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    seed, seq_len, batch_size = train["seed"], train["seq_len"], train["batch_size"]
    checkpoints = sorted(train["checkpoints"])
    total = checkpoints[-1]
    tokenizer, train_ids, heldout = tokenised(text, train)
    model = initial_model(dest, train, tokenizer)
    optimizer = adamw(model, train)
    batches = torch.Generator().manual_seed(seed)  # batch positions, independent of the init's global RNG
    data = torch.as_tensor(train_ids)
    losses = np.full(total, np.nan)
    rates = np.full(total, np.nan)
    heldout_nll = {}
    manifests = {}
    started = time.perf_counter()
    bar = tqdm(total=total, desc=f"train seed {seed}", unit="step", disable=not progress)
    for step in range(total + 1):
        if step in checkpoints:
            heldout_nll[step] = mean_nll(model, heldout)
            manifests[f"step{step}"] = save_checkpoint(model, tokenizer, dest, step, seed)
            print(f"step {step}: held-out perplexity {math.exp(heldout_nll[step]):.2f}", flush=True)
        if step == total:
            break
        batch = draw_batch(data, seq_len, batch_size, batches)  # (batch, token)
        lr = train["lr"] * warmup_cosine(step, total, train["warmup_steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses[step], rates[step] = float(loss.detach()), lr
        bar.update(1)
        bar.set_postfix(loss=f"{losses[step]:.3f}")
    bar.close()
    seconds = time.perf_counter() - started
    write_series_manifest(dest, manifests)
    nll = np.array([heldout_nll[s] for s in checkpoints])
    return xr.Dataset(
        {
            "heldout_nll": ("step", nll),
            "heldout_ppl": ("step", np.exp(nll)),
            "train_loss": ("train_step", losses),
            "lr": ("train_step", rates),
        },
        coords={"step": checkpoints, "train_step": np.arange(total)},
        attrs={
            "train_seed": seed,
            "train_tokens": len(train_ids),
            "heldout_tokens": int(heldout.numel()),
            "vocab_size": len(tokenizer),
            "n_parameters": sum(p.numel() for p in model.parameters()),
            "train_seconds": round(seconds, 3),
            "train_settings": json.dumps(train, sort_keys=True),
        },
    )


def write_series_manifest(dest: Path, manifests: dict) -> None:
    """``dest/manifest.json``, the series: every checkpoint's revision and files (``manifests``: each step's own),
    written last, so that a series with a manifest is complete."""
    series = {
        "source": TRAIN_SOURCE,
        "revision": "series",
        "trust_remote_code": False,
        "architecture": ARCHITECTURE,
        "revisions": {variant: variant for variant in manifests},
        "steps": {variant: m["files"] for variant, m in manifests.items()},
    }
    write_manifest(dest, series)


def train_job(source: str, dest: str | Path, log_path: str | Path, *, train: dict, model: str, config_hash: str = ""):
    """Rule train_trajectory: the corpus ``source`` -> checkpoints in ``dest`` and ``training.nc``."""
    from posgen.corpus import load_text
    from posgen.store import provenance, write_netcdf

    log = train_trajectory(load_text(source), dest, train)
    log.attrs.update(provenance(config_hash=config_hash, model=model, corpus_source=source))
    write_netcdf(log, log_path)
    return log


def train_step(job) -> xr.Dataset:
    """Rule train_trajectory's job (a :class:`posgen.workflow.job.StepJob`)."""
    p = job.params
    return train_job(
        p["source"],
        Path(job.output["manifest"]).parent,
        job.output["training"],
        train=p["train"],
        model=job.wildcards["model"],
        config_hash=p["config_hash"],
    )
