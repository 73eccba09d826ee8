"""Corpus loading and deterministic token windows."""

from __future__ import annotations

import glob
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import xarray as xr

from posgen.integrity import shown


class CorpusError(ValueError):
    """A corpus that cannot serve the request, phrased as one line naming the source."""


JOIN = "\n\n"  # between the documents of a corpus


def load_text(source: str) -> str:
    """The corpus text of ``source`` (see the config schema for the accepted forms): its documents joined."""
    return JOIN.join(load_documents(source))


def load_documents(source: str) -> list[str]:
    """The documents of ``source``: the embedded corpus's topics, a ``text:`` glob's files, a JSON-lines file's or a
    Hub dataset's records (see the config schema for the accepted forms)."""
    kind, _, spec = source.partition(":")
    if source == "embedded":
        # Python's own bundled documentation: English prose present on every CPython.
        from pydoc_data.topics import topics

        return [topics[key] for key in sorted(topics)]
    if kind == "text":
        matches = sorted(glob.glob(spec, recursive=True))
        if not matches:
            raise CorpusError(f"corpus {source}: no file matches {spec!r}")
        # a recursive glob also yields folders; a pattern that yields only folders is a mistake
        paths = [Path(p) for p in matches if not Path(p).is_dir()]
        if not paths:
            raise CorpusError(f"corpus {source}: {matches[0]} is a directory (match files, e.g. {spec}/*.txt)")
        return [_read_utf8(p, source) for p in paths]
    if kind == "jsonl":
        path, _, field = spec.rpartition(":")
        if not Path(path).exists():
            raise CorpusError(f"corpus {source}: {path}: no such file")
        if Path(path).is_dir():
            raise CorpusError(f"corpus {source}: {path} is a directory, not a JSON-lines file")
        texts = []
        for n, line in enumerate(_read_utf8(Path(path), source).splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise CorpusError(f"corpus {source}: {path} line {n} is not JSON") from None
            if not isinstance(record, dict) or field not in record:
                raise CorpusError(f"corpus {source}: {path} line {n} has no field {field!r}")
            if not isinstance(record[field], str):
                # str(None) would put the word "None" into the corpus
                kind_found = "null" if record[field] is None else type(record[field]).__name__
                raise CorpusError(f"corpus {source}: {path} line {n}: field {field!r} is {kind_found}, not text")
            texts.append(record[field])
        return texts
    if kind == "hf":
        dataset, split, field = spec.rsplit(":", 2)
        # "<org>/<name>[/<config>]": hub dataset ids carry an org, so a third part is the config.
        parts = dataset.split("/")
        repo, subset = "/".join(parts[:2]), "/".join(parts[2:]) or None
        try:
            import datasets
        except ImportError:
            raise CorpusError(f"corpus {source}: needs the 'datasets' package (pip install datasets)") from None
        try:
            ds = datasets.load_dataset(repo, subset, split=split)
        except Exception as err:  # noqa: BLE001 - any hub/dataset failure becomes one line
            raise CorpusError(
                f"corpus {source}: cannot load ({type(err).__name__}: {str(err).splitlines()[0]})"
            ) from None
        if field not in ds.column_names:
            raise CorpusError(f"corpus {source}: no field {field!r} (have {', '.join(ds.column_names)})")
        return [str(text) for text in ds[field]]
    raise CorpusError(f"corpus {source}: unknown source kind")


def _read_utf8(path: Path, source: str) -> str:
    """The text of ``path``; a binary or non-UTF-8 (e.g. Latin-1) file is one line naming it and the byte."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise CorpusError(
            f"corpus {source}: {path} line {line} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset "
            f"{err.start}); convert it, e.g. iconv -f latin1 -t utf-8"
        ) from None


def check_context(seq_len: int, model_dir: str | Path) -> None:
    """Refuse windows longer than the model's context (``max_position_embeddings`` of its config.json)."""
    config_path = Path(model_dir) / "config.json"
    config = json.loads(config_path.read_text())
    # multimodal checkpoints (Gemma 3) nest the language model's settings
    context = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    if context and seq_len > context:
        raise CorpusError(
            f"config.seq_len: {seq_len} exceeds the model's context of {context} tokens "
            f"(max_position_embeddings in {config_path})"
        )


def prepends_bos(tokenizer) -> bool:
    """Whether the tokenizer starts every text with BOS (Gemma does; the model expects it)."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("a").input_ids[:1] == [bos]


def cut_windows(
    text: str,
    tokenizer,
    n_samples: int,
    seq_len: int,
    seed: int,
    source: str = "corpus",
    n_heldout: int = 0,
    exclude=(),
    doc_starts=None,
    disjoint: str = "documents",
) -> xr.Dataset:
    """``n_samples`` non-overlapping windows of ``seq_len`` tokens, placed by ``seed``, and ``n_heldout`` more
    (``heldout_token_id``, never analysed: Method A-shared's held-out windows, docs/method.md section 3C),
    drawn after them from the slots left, so that the analysed windows do not depend on ``n_heldout``.

    ``exclude``: window sets ``(seed, n_samples, n_heldout)`` cut the same way from the same text (another run's
    windows); the windows are then drawn only from slots that share no document with any of theirs (documents
    start at the characters ``doc_starts``), or with ``disjoint="windows"`` only from slots none of theirs took
    (no token in common), so that they are data no earlier run has seen (a confirmatory replication,
    docs/method.md section 6.2). Windows start with BOS when the tokenizer adds one, so the model sees
    text the way it was trained.
    """
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64)
    bos = prepends_bos(tokenizer)
    body = seq_len - int(bos)
    n_fit = len(ids) // body
    if n_fit < n_samples + n_heldout:
        raise CorpusError(
            f"corpus {source}: {len(ids)} tokens fit only {n_fit} windows of {seq_len} tokens, "
            f"{n_samples} requested" + (f" plus {n_heldout} held-out" if n_heldout else "") + " (lower "
            "n_samples, heldout_windows or seq_len, or use a larger corpus)"
        )
    pool, fresh = np.arange(n_fit), {}
    if exclude:
        pool, fresh = _fresh_slots(offsets, body, n_fit, exclude, doc_starts, source, disjoint)
        if len(pool) < n_samples + n_heldout:
            unit = "document" if disjoint == "documents" else "token"
            raise CorpusError(
                f"corpus {source}: only {len(pool)} windows of {seq_len} tokens share no {unit} with the excluded "
                f"window sets, {n_samples + n_heldout} requested (lower n_samples or heldout_windows"
                + (", or fresh_windows.disjoint: windows)" if disjoint == "documents" else ")")
            )
    slots, heldout = _draw(pool, seed, n_samples, n_heldout)

    def rows_at(chosen):  # (n, seq_len) token ids of the windows at slots ``chosen``
        rows = np.array([ids[s * body : s * body + body] for s in chosen], dtype=np.int64).reshape(-1, body)
        if bos:
            rows = np.concatenate([np.full((len(chosen), 1), tokenizer.bos_token_id), rows], axis=1)
        return rows

    starts = slots * body
    return xr.Dataset(
        {
            "token_id": (("sample", "token"), rows_at(slots)),
            "heldout_token_id": (("heldout", "token"), rows_at(heldout)),
            "window_start": ("sample", starts),
            "char_start": ("sample", offsets[starts, 0]),
            "char_end": ("sample", offsets[starts + body - 1, 1]),
            "heldout_char_start": ("heldout", offsets[heldout * body, 0]),
            "heldout_char_end": ("heldout", offsets[heldout * body + body - 1, 1]),
        },
        coords={"sample": np.arange(n_samples), "token": np.arange(seq_len)},
        attrs={
            "corpus_source": source,
            "corpus_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "corpus_tokens": len(ids),
            "window_seed": seed,
            "n_samples": n_samples,
            "heldout_windows": n_heldout,
            "seq_len": seq_len,
            "bos_prepended": int(bos),
            "tokenizer": type(tokenizer).__name__,
            **fresh,
        },
    )


def _draw(pool: np.ndarray, seed: int, n_samples: int, n_heldout: int) -> tuple[np.ndarray, np.ndarray]:
    """The slots of ``n_samples`` analysed and ``n_heldout`` held-out windows drawn from ``pool`` by ``seed``."""
    rng = np.random.default_rng(seed)
    slots = np.sort(rng.choice(pool, size=n_samples, replace=False))
    left = np.setdiff1d(pool, slots)
    return slots, np.sort(rng.choice(left, size=n_heldout, replace=False))


def _fresh_slots(offsets: np.ndarray, body: int, n_fit: int, exclude, doc_starts, source: str, disjoint: str):
    """The slots that share no document (``disjoint="documents"``) or no slot (``"windows"``) with the windows of
    the ``exclude`` sets, and the attrs that record it."""
    taken = set()
    for seed, n, n_held in exclude:
        taken.update(int(slot) for slot in np.concatenate(_draw(np.arange(n_fit), int(seed), int(n), int(n_held))))
    if disjoint == "windows":
        free = np.array([s for s in range(n_fit) if s not in taken], dtype=np.int64)
        excluded = {"excluded_windows": len(taken)}
    else:
        if doc_starts is None:
            raise CorpusError(f"corpus {source}: excluding documents needs the corpus's document boundaries")
        starts = np.asarray(doc_starts)
        first = np.searchsorted(starts, offsets[np.arange(n_fit) * body, 0], side="right") - 1  # (slot,)
        last = np.searchsorted(starts, offsets[np.arange(n_fit) * body + body - 1, 1] - 1, side="right") - 1
        docs = set().union(*(range(first[s], last[s] + 1) for s in taken))
        free = np.array([s for s in range(n_fit) if not docs & set(range(first[s], last[s] + 1))], dtype=np.int64)
        excluded = {"excluded_documents": len(docs)}
    return free, {
        "excluded_window_sets": json.dumps([[int(v) for v in ws] for ws in exclude]),
        "disjoint": disjoint,
        **excluded,
        "fresh_slots": len(free),
    }


# ---------------------------------------------------------------------------------------------- window sets

# A models entry's `window_set` (docs/method.md section 3E): the windows as cut (corpus), each window's tokens in a
# random order (shuffled), or every window starting with the same first N tokens (prefix<N>)
WINDOW_SET = re.compile(r"corpus|shuffled|prefix([1-9][0-9]*)")


def prefix_length(window_set: str) -> int:
    """N of ``prefix<N>``; 0 for the other window sets."""
    match = WINDOW_SET.fullmatch(window_set)
    if match is None:
        raise CorpusError(f"window_set {window_set!r}: expected corpus, shuffled or prefix<N>")
    return int(match[1] or 0)


def apply_window_set(windows: xr.Dataset, window_set: str, seed: int) -> xr.Dataset:
    """The windows (analysed and held-out) of ``window_set``: ``corpus`` as cut; ``shuffled``: each window's tokens
    permuted at random inside it (a BOS the tokenizer puts first stays first), seeded by (seed, analysed or
    held-out, window); ``prefix<N>``: every window starts with the first N tokens of analysed window 0, then its own
    tokens from N on. Recorded in the attrs."""
    n_prefix = prefix_length(window_set)
    out = windows.copy(deep=True)
    first = int(windows.attrs.get("bos_prepended", 0))
    for group, name in enumerate(("token_id", "heldout_token_id")):
        ids = out[name].values  # (n, T)
        if window_set == "shuffled":
            for row in range(len(ids)):
                order = np.random.default_rng([seed, group, row]).permutation(ids.shape[1] - first)
                ids[row, first:] = ids[row, first:][order]
        elif n_prefix:
            if n_prefix >= ids.shape[1]:
                raise CorpusError(f"window_set {window_set}: the prefix is not shorter than the {ids.shape[1]} tokens")
            ids[:, :n_prefix] = windows["token_id"].values[0, :n_prefix]
        out[name] = (out[name].dims, ids)
    out.attrs["window_set"] = window_set
    return out


# ----------------------------------------------------------------------------------------- windows.h5


def write_windows(windows: xr.Dataset, path: str | Path, **attrs) -> None:
    """Write the :func:`cut_windows` dataset as ``windows.h5``, with provenance and the caller's ``attrs``."""
    from posgen.store import provenance, write_netcdf

    windows.attrs.update(provenance(**attrs))
    write_netcdf(windows, path)


def read_windows(
    path: str | Path, n_samples: int | None = None, seq_len: int | None = None, section: str = "perturb"
) -> xr.Dataset:
    """``windows.h5``: its first ``n_samples`` windows cut to their first ``seq_len`` tokens (None: all).

    ``section`` is the config section whose ``n_samples`` / ``seq_len`` asked for more than the file holds,
    named in the error.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{shown(path)}: no such windows file")
    from posgen.store import open_dataset

    with open_dataset(path, lazy=False) as opened:
        windows = opened.load()
    if "token_id" not in windows:
        raise ValueError(f"{shown(path)}: no variable token_id")
    have_samples, have_tokens = windows.sizes["sample"], windows.sizes["token"]
    if n_samples is not None and n_samples > have_samples:
        raise ValueError(f"{section}.n_samples: {n_samples} exceeds the {have_samples} windows of {path}")
    if seq_len is not None and seq_len > have_tokens:
        raise ValueError(f"{section}.seq_len: {seq_len} exceeds the {have_tokens} tokens per window of {path}")
    return windows.isel(sample=slice(n_samples), token=slice(seq_len))


def windows_job(
    model_dir: str | Path,
    out_path: str | Path,
    *,
    source: str,
    n_samples: int,
    seq_len: int,
    seed: int,
    model_name: str,
    heldout: int = 0,
    window_set: str = "corpus",
    fresh: dict | None = None,
    config_hash: str = "",
) -> xr.Dataset:
    """Write ``windows.h5`` of one model: ``source`` cut into windows with the model's tokenizer (its files
    checked against the model's manifest first: a damaged tokenizer would fail deep inside transformers), as
    ``window_set`` (:func:`apply_window_set`); ``fresh``: a models entry's ``fresh_windows`` (its own window seed,
    and the window sets whose documents it must not share: :func:`cut_windows`)."""
    fresh = fresh or {}
    from transformers import AutoTokenizer

    from posgen.models import verify_checkpoint

    verify_checkpoint(model_dir, weights=False)
    check_context(seq_len, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(Path(model_dir))
    documents = load_documents(source)
    doc_starts = np.cumsum([0] + [len(d) + len(JOIN) for d in documents[:-1]])  # each document's first character
    exclude = [(w["window_seed"], w["n_samples"], w.get("heldout_windows", 0)) for w in fresh.get("exclude", [])]
    seed = int(fresh.get("window_seed", seed))
    disjoint = fresh.get("disjoint", "documents")
    windows = cut_windows(
        JOIN.join(documents), tokenizer, n_samples, seq_len, seed, source, heldout, exclude, doc_starts, disjoint
    )
    if window_set != "corpus":
        windows = apply_window_set(windows, window_set, seed)
    write_windows(windows, out_path, config_hash=config_hash, model=model_name)
    return windows


def windows_step(job) -> xr.Dataset:
    """Rule windows' job (a :class:`posgen.workflow.job.StepJob`)."""
    p = job.params
    return windows_job(
        Path(job.input["manifest"]).parent,
        job.output["windows"],
        source=p["source"],
        n_samples=p["n_samples"],
        seq_len=p["seq_len"],
        seed=p["seed"],
        heldout=p["heldout"],
        model_name=job.wildcards["model"],
        window_set=p.get("window_set", "corpus"),
        fresh=p.get("fresh_windows") or {},
        config_hash=p["config_hash"],
    )
