import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from posgen.corpus import CorpusError, cut_windows, load_text, prepends_bos


@pytest.fixture(scope="module")
def tokenizer(tiny_source):
    return AutoTokenizer.from_pretrained(tiny_source("llama"))


def test_embedded_corpus_is_the_bundled_python_docs():
    text = load_text("embedded")
    assert len(text) > 400_000 and "for" in text


def test_windows_are_deterministic_disjoint_and_match_the_text(tokenizer):
    text = load_text("embedded")
    a = cut_windows(text, tokenizer, 5, 50, seed=7)
    b = cut_windows(text, tokenizer, 5, 50, seed=7)
    c = cut_windows(text, tokenizer, 5, 50, seed=8)
    np.testing.assert_array_equal(a["token_id"].values, b["token_id"].values)
    assert not np.array_equal(a["window_start"].values, c["window_start"].values)
    starts = a["window_start"].values
    assert np.all(np.diff(starts) >= 50)  # sorted and non-overlapping
    assert a["token_id"].dims == ("sample", "token") and a.sizes["token"] == 50
    # the stored character span decodes to the same tokens
    span = text[int(a["char_start"][1]) : int(a["char_end"][1])]
    assert tokenizer(span, add_special_tokens=False).input_ids == a["token_id"].values[1].tolist()


def test_held_out_windows_leave_the_analysed_ones_unchanged_and_overlap_none(tokenizer):
    """Method A-shared's held-out windows are drawn after the analysed ones, from the slots left."""
    text = load_text("embedded")
    plain = cut_windows(text, tokenizer, 5, 50, seed=7)
    both = cut_windows(text, tokenizer, 5, 50, seed=7, n_heldout=6)
    np.testing.assert_array_equal(plain["token_id"].values, both["token_id"].values)
    held = both["heldout_token_id"].values
    assert held.shape == (6, 50) and plain["heldout_token_id"].shape == (0, 50)
    analysed = {tuple(row) for row in both["token_id"].values.tolist()}
    assert not analysed & {tuple(row) for row in held.tolist()} and len({tuple(r) for r in held.tolist()}) == 6
    assert both.attrs["heldout_windows"] == 6
    fit = len(tokenizer("one two three " * 100, add_special_tokens=False).input_ids) // 50
    with pytest.raises(CorpusError, match=f"fit only {fit} windows of 50 tokens, 2 requested plus {fit - 1} held-out"):
        cut_windows("one two three " * 100, tokenizer, 2, 50, seed=0, n_heldout=fit - 1)


def test_bos_is_prepended_when_the_tokenizer_adds_one(tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tokenizer.add_bos_token = True
    from tokenizers import processors

    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tokenizer.bos_token_id)]
    )
    assert prepends_bos(tokenizer)
    w = cut_windows("hello world " * 500, tokenizer, 2, 20, seed=0)
    assert (w["token_id"].values[:, 0] == tokenizer.bos_token_id).all()
    assert w.attrs["bos_prepended"] == 1


def test_too_little_text_says_how_many_windows_fit(tokenizer):
    text = "one two three four five six seven eight nine ten " * 20
    n_tokens = len(tokenizer(text, add_special_tokens=False).input_ids)
    fit = n_tokens // 64
    with pytest.raises(CorpusError, match=rf"fit only {fit} windows of 64 tokens, 50 requested"):
        cut_windows(text, tokenizer, 50, 64, seed=0, source="text:small.txt")


def test_text_and_jsonl_sources(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b.txt").write_text("beta")
    assert load_text(f"text:{tmp_path}/*.txt") == "alpha\n\nbeta"
    with pytest.raises(CorpusError, match="no file matches"):
        load_text(f"text:{tmp_path}/*.md")
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"body": "x"}) + "\n" + json.dumps({"body": "y"}) + "\n")
    assert load_text(f"jsonl:{path}:body") == "x\n\ny"
    with pytest.raises(CorpusError, match=r"line 1 has no field 'text'"):
        load_text(f"jsonl:{path}:text")
    with pytest.raises(CorpusError, match="no such file"):
        load_text(f"jsonl:{tmp_path}/missing.jsonl:body")


def test_fresh_windows_share_no_document_with_the_excluded_window_sets(tokenizer):
    """A confirmatory replication's windows: drawn only from slots that touch no document (an embedded topic) of
    the excluded runs' windows, analysed and held-out; checked here from each window's character span."""
    from posgen.corpus import JOIN, load_documents

    docs = load_documents("embedded")
    text = JOIN.join(docs)
    assert text == load_text("embedded")
    starts = np.cumsum([0] + [len(d) + len(JOIN) for d in docs[:-1]])
    exclude = [(0, 30, 30), (0, 8, 8)]
    fresh = cut_windows(text, tokenizer, 12, 300, seed=1, n_heldout=12, exclude=exclude, doc_starts=starts)
    old = [cut_windows(text, tokenizer, n, 300, seed=s, n_heldout=h) for s, n, h in exclude]

    def touched(ds) -> set:  # the documents the characters of every window (analysed and held-out) touch
        spans = [(ds[f"{k}char_start"].values, ds[f"{k}char_end"].values) for k in ("", "heldout_")]
        first = [np.searchsorted(starts, a, "right") - 1 for a, _ in spans]
        last = [np.searchsorted(starts, b - 1, "right") - 1 for _, b in spans]
        return {d for f, la in zip(first, last) for lo, hi in zip(f, la) for d in range(lo, hi + 1)}

    seen = set().union(*(touched(o) for o in old))
    assert fresh.attrs["excluded_documents"] == len(seen) and fresh.attrs["fresh_slots"] >= 24
    assert touched(fresh) and not touched(fresh) & seen
    with pytest.raises(CorpusError, match="share no document with the excluded window sets, 699 requested"):
        cut_windows(text, tokenizer, 600, 300, seed=1, n_heldout=99, exclude=exclude, doc_starts=starts)
    # windows that share no token: none of the excluded slots, so no character span in common
    apart = cut_windows(text, tokenizer, 12, 300, seed=1, n_heldout=12, exclude=exclude, disjoint="windows")

    def spans(ds) -> list:
        return [
            (a, b) for k in ("", "heldout_") for a, b in zip(ds[f"{k}char_start"].values, ds[f"{k}char_end"].values)
        ]

    assert apart.attrs["excluded_windows"] > 0
    assert not any(a < d and c < b for a, b in spans(apart) for o in old for c, d in spans(o))
