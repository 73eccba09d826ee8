"""Position-generalisation experiments: perturbation draws, perplexity, f/g change, capped-RoPE attention."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from posgen import rope
from posgen.corpus import cut_windows, load_text
from posgen.gather import gather
from posgen.llm.capture import BACKEND, CAPPED_BACKEND, Capture, capped_distances, capped_logits, forward_pass
from posgen.llm.draws import JITTER, KINDS, draw_perturbation, rng_for, word_starts
from posgen.llm.method_a import Terms, matched_pairs, method_a_terms
from posgen.llm.options import CapOptions, PerturbOptions
from posgen.llm.perturb import cap_job, perturb_job, run_caps, run_perturbations
from posgen.models import acquire, load_model
from posgen.store import open_dataset, write_netcdf
from posgen.testing.tiny import tiny_job

T = 40


def half_up(x):
    return int(np.floor(x + 0.5))


def fake_tokens(n, seed=0):
    """Token strings with word starts ('Ġ') at random places, as a byte-level BPE writes them."""
    rng = np.random.default_rng(seed)
    return [("Ġ" if rng.random() < 0.6 else "") + "w" for _ in range(n)]


# ---------------------------------------------------------------------------------------------- draws


def test_word_starts_read_space_markers():
    tokens = ["The", "Ġcat", "s", "▁sat", "Ċ", "on", " the", "\tmat", "ĉx", "."]
    assert word_starts(tokens).tolist() == [True, True, False, True, True, False, True, True, True, False]


@pytest.mark.parametrize("rate", [0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0])
def test_token_and_posid_draws_move_the_expected_number_of_positions(rate):
    n = 257
    u = n - 1
    pairs = min(half_up(rate * u / 2), u // 2)
    k = min(half_up(rate * u), u)
    k = 2 if k == 1 else k
    expected = {"token-swap": 2 * pairs, "token-permute": k, "posid-swap": 2 * pairs, "posid-jitter": half_up(rate * u)}
    for kind, count in expected.items():
        for sample in range(3):
            d = draw_perturbation(kind, rate, n, rng_for(0, kind, rate, sample))
            assert d.order[0] == 0 and d.position_ids[0] == 0  # the first token never moves
            assert sorted(d.order.tolist()) == list(range(n))
            changed = (d.order != np.arange(n)) | (d.position_ids != np.arange(n))
            assert changed.sum() == count, (kind, rate)
            assert d.moved == pytest.approx(count / u) and d.moved_units == pytest.approx(count / u)
            if kind == "token-swap":
                assert np.abs(d.order - np.arange(n)).max() <= 1  # local: adjacent swaps only
                assert (d.position_ids == np.arange(n)).all()
            elif kind.startswith("posid"):
                assert (d.order == np.arange(n)).all()  # token order kept
                assert np.abs(d.position_ids - np.arange(n)).max() <= (1 if kind == "posid-swap" else JITTER)
            assert d.is_identity == (count == 0)


@pytest.mark.parametrize("kind", ["word-swap", "word-permute"])
@pytest.mark.parametrize("rate", [0.0, 0.05, 0.2, 0.5])
def test_word_draws_move_whole_words(kind, rate):
    tokens = fake_tokens(200, seed=3)
    starts = word_starts(tokens)
    bounds = np.append(np.flatnonzero(starts), len(tokens))
    words = [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]
    u = len(words) - 1
    d = draw_perturbation(kind, rate, len(tokens), rng_for(0, kind, rate, 0), starts)
    # Rebuild the word sequence from the token order: every word must come out whole.
    seq, t = [], 0
    while t < len(tokens):
        w = next(i for i, word in enumerate(words) if word[0] == d.order[t])
        assert d.order[t : t + len(words[w])].tolist() == words[w]
        seq.append(w)
        t += len(words[w])
    assert seq[0] == 0 and sorted(seq) == list(range(len(words)))
    moved_words = sum(1 for i, w in enumerate(seq) if w != i)
    if kind == "word-swap":
        assert moved_words == 2 * min(half_up(rate * u / 2), u // 2)
        assert all(abs(w - i) <= 1 for i, w in enumerate(seq))
    else:
        k = min(half_up(rate * u), u)
        assert moved_words == (2 if k == 1 else k)
    assert d.moved_units == pytest.approx(moved_words / u)
    assert d.moved == pytest.approx(((d.order != np.arange(len(tokens)))[1:]).mean())


def test_draws_are_seeded():
    a = draw_perturbation("token-permute", 0.2, 100, rng_for(7, "token-permute", 0.2, 1))
    b = draw_perturbation("token-permute", 0.2, 100, rng_for(7, "token-permute", 0.2, 1))
    c = draw_perturbation("token-permute", 0.2, 100, rng_for(7, "token-permute", 0.2, 2))
    assert (a.order == b.order).all() and not (a.order == c.order).all()


def test_bad_kind_and_rate_are_refused():
    with pytest.raises(ValueError, match="kind 'shuffle'"):
        draw_perturbation("shuffle", 0.1, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rate 1.5"):
        draw_perturbation("token-swap", 1.5, 10, np.random.default_rng(0))


def test_matched_pairs_follow_the_permutation():
    order = torch.tensor([0, 2, 1, 4, 3, 5])
    n = len(order)
    new_idx, ref_idx = matched_pairs(order)
    i, j = new_idx // n, new_idx % n
    assert (ref_idx == order[i] * n + order[j]).all()
    assert (j >= 1).all() and (j <= i).all() and (order[j] <= order[i]).all()
    # (i', j') = (2, 1) holds original (1, 2): causal in the perturbed order only, so it is left out
    assert not ((i == 2) & (j == 1)).any()
    assert ((i == 3) & (j == 1)).any()


# ---------------------------------------------------------------------------------------------- RoPE math


def synthetic_qk(h=3, n=24, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(h, n, d, generator=g)
    k = torch.randn(h, n, d, generator=g) + 2.0  # a shared key component, as in real models
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    return q, k, inv_freq


def test_method_a_terms_are_the_mean_key_split():
    q, k, inv_freq = synthetic_qk()
    n = q.shape[-2]
    pos = torch.arange(n)
    s, D = 0.35, 50
    f, g = method_a_terms(q, k, pos, inv_freq, s, dummy_distance=D)
    kbar = k[:, 1:].mean(1, keepdim=True)
    w = rope.logits(q, k, inv_freq, s)
    # exact identity: W = f + s (R_i q_i).(R_j (k_j - kbar))
    torch.testing.assert_close(w, f + rope.logits(q, k - kbar, inv_freq, s), rtol=1e-5, atol=1e-5)
    # g at one entry, written out
    i, j, h = 17, 5, 1
    g_ij = s * rope.rotate(q[h, i : i + 1], torch.tensor([D]), inv_freq)[0] @ (k[h, j] - kbar[h, 0])
    assert g[h, i, j].item() == pytest.approx(g_ij.item(), rel=1e-5)


def test_capping_changes_f_and_leaves_g_unchanged_on_synthetic_qk():
    q, k, inv_freq = synthetic_qk()
    n = q.shape[-2]
    pos = torch.arange(n)
    s, C = 0.35, 6
    f, g = method_a_terms(q, k, pos, inv_freq, s, dummy_distance=100)
    fc, gc = method_a_terms(q, k, pos, inv_freq, s, dummy_distance=100, distance_cap=C)
    dist = pos[:, None] - pos[None, :]
    assert torch.equal(g, gc)
    assert torch.equal(f[:, dist <= C], fc[:, dist <= C])
    assert (f[:, dist > C] - fc[:, dist > C]).abs().min() > 0
    # beyond C, f is constant along each row: the mean key seen at distance C
    far_rows = fc[:, :, 0][:, C + 1 :]
    assert torch.allclose(fc[:, C + 1 :, :1], far_rows[..., None])
    for i in range(C + 1, n):
        assert torch.allclose(fc[:, i, : i - C], fc[:, i, :1].expand(-1, i - C))
    # and f_capped is exactly the mean-key part of the capped logits
    kbar = k[:, 1:].mean(1, keepdim=True)
    w_cap = capped_logits(q, k, pos, inv_freq, s, distance_cap=C)
    w_mean_key = capped_logits(q, k - kbar, pos, inv_freq, s, distance_cap=C)
    torch.testing.assert_close(w_cap, fc + w_mean_key, rtol=1e-5, atol=1e-5)
    # a cap at or beyond the longest distance is no cap at all
    assert torch.equal(capped_logits(q, k, pos, inv_freq, s, distance_cap=n - 1), rope.logits(q, k, inv_freq, s))


# ---------------------------------------------------------------------------------------------- tiny models


@pytest.fixture(scope="module")
def tiny(tiny_source):
    path = tiny_source("llama")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = np.asarray(tokenizer(load_text("embedded")[:20000]).input_ids[: 3 * T]).reshape(3, T)
    strings = [tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]
    return path, ids, strings


def load_tiny(path, attn):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.float32).eval()


def plain_token_nll(model, ids):
    with torch.inference_mode():
        logits = model(input_ids=torch.as_tensor(ids)).logits
    lp = torch.log_softmax(logits[:, :-1].double(), -1)
    return -lp.gather(-1, torch.as_tensor(ids)[:, 1:, None])[..., 0].numpy()


def plain_nll(model, ids):
    return plain_token_nll(model, ids).mean(-1)


def test_rate_zero_reproduces_the_unperturbed_perplexity_exactly(tiny):
    path, ids, strings = tiny
    model = load_tiny(path, BACKEND)
    with Capture(model) as recorder:
        plain = forward_pass(model, recorder, ids)
        d = [draw_perturbation(kind, 0.0, T, rng_for(0, kind, 0.0, 0), word_starts(strings[0])) for kind in KINDS]
        for draw in d:
            assert draw.is_identity
            again = forward_pass(
                model,
                recorder,
                np.take_along_axis(ids, np.tile(draw.order, (3, 1)), 1),
                np.tile(draw.position_ids, (3, 1)),
            )
            assert np.array_equal(again.nll, plain.nll)
    np.testing.assert_allclose(plain.nll, plain_nll(model, ids), rtol=1e-6)
    options = PerturbOptions.defaults(rates=(0.0, 0.1), seed=0, dummy_distance=100, jitter=JITTER)
    ds = run_perturbations(model, ids, strings, options, progress=False)
    assert (ds.ppl_ratio.sel(rate=0.0) == 1.0).all()
    assert np.array_equal(ds.nll.sel(rate=0.0).values, np.tile(plain.nll, (len(KINDS), 1)))


def test_perturbed_nll_scores_the_perturbed_text(tiny):
    path, ids, strings = tiny
    model = load_tiny(path, BACKEND)
    options = PerturbOptions.defaults(rates=(0.0, 0.2), seed=3, dummy_distance=100, jitter=JITTER)
    ds = run_perturbations(model, ids, strings, options, progress=False)
    for kind in ["token-permute", "word-swap"]:
        order = ds.order.sel(kind=kind, rate=0.2).values
        np.testing.assert_allclose(
            ds.nll.sel(kind=kind, rate=0.2).values, plain_nll(model, np.take_along_axis(ids, order, 1)), rtol=1e-5
        )
        assert (ds.ppl_ratio.sel(kind=kind, rate=0.2) != 1.0).all()
        # context-only reading: the same kept targets (token and position unchanged) in both texts
        kept = (order == np.arange(T))[:, 1:]
        assert 0 < kept.sum() < kept.size
        new, old = plain_token_nll(model, np.take_along_axis(ids, order, 1)), plain_token_nll(model, ids)
        expected = np.exp([(n[k].mean() - o[k].mean()) for n, o, k in zip(new, old, kept)])
        np.testing.assert_allclose(ds.ppl_ratio_kept.sel(kind=kind, rate=0.2), expected, rtol=1e-5)
    assert (ds.ppl_ratio_kept.sel(rate=0.0) == 1.0).all()
    ratio = np.exp(ds.nll - ds.nll_unperturbed)
    np.testing.assert_allclose(ds.ppl_ratio, ratio, rtol=1e-12)
    # layer 0 q/k depend only on the token, so matched g is unchanged there while f moves with position
    for kind in ["token-permute", "posid-swap", "posid-jitter"]:
        sel = ds.sel(kind=kind, rate=0.2, layer=0)
        np.testing.assert_allclose(sel.g_corr, 1.0, atol=1e-5)
        assert (sel.f_corr < 0.9999).all()
    assert (ds.f_corr.sel(layer=1, rate=0.2) < 1).all()


def test_jittered_position_ids_keep_the_causal_mask(tiny):
    """Non-monotonic position ids must not be read as packed sequences (which cuts the mask into blocks)."""
    path, ids, _ = tiny
    model = load_tiny(path, BACKEND)
    pos = draw_perturbation("posid-jitter", 0.5, T, np.random.default_rng(1)).position_ids
    assert (np.diff(pos) != 1).any()
    changed = ids.copy()
    changed[:, -1] = (changed[:, -1] + 1) % 100
    with torch.inference_mode():
        kw = dict(position_ids=torch.as_tensor(np.tile(pos, (3, 1))), attention_mask=torch.ones(3, T, dtype=torch.long))
        a = model(input_ids=torch.as_tensor(ids), **kw).logits
        b = model(input_ids=torch.as_tensor(changed), **kw).logits
        plain = model(input_ids=torch.as_tensor(ids)).logits
    assert torch.equal(a[:, :-1], b[:, :-1])  # the future never leaks into the past
    assert not torch.allclose(a[:, 1:], plain[:, 1:])  # and the position ids did reach RoPE


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_cap_at_window_length_reproduces_uncapped_model_exactly(tiny_source, arch):
    path = tiny_source(arch)
    ids = torch.randint(3, 200, (2, T), generator=torch.Generator().manual_seed(0))
    eager = load_tiny(path, "eager")
    capped = load_tiny(path, CAPPED_BACKEND)
    with Capture(capped) as recorder:
        forward_pass(capped, recorder, ids.numpy())
        inv_freq = recorder.rope().inv_freq
    with torch.inference_mode():
        ref = eager(input_ids=ids).logits
        assert torch.equal(capped(input_ids=ids).logits, ref)  # uncapped backend == eager attention
        for c in [T - 1, T, 10 * T]:
            with capped_distances(capped, c, inv_freq):
                assert torch.equal(capped(input_ids=ids).logits, ref)
        with capped_distances(capped, 4, inv_freq):
            assert not torch.allclose(capped(input_ids=ids).logits, ref, atol=1e-4)
        assert torch.equal(capped(input_ids=ids).logits, ref)  # the cap is lifted on exit


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_capped_backend_attends_with_capped_logits(tiny_source, arch):
    """Inside the model: attention weights == softmax of s (R_min(i-j,C) q_i).k_j on the captured q/k."""
    path = tiny_source(arch)
    ids = torch.randint(3, 200, (2, T), generator=torch.Generator().manual_seed(1))
    model = load_tiny(path, CAPPED_BACKEND)
    C = 5
    with Capture(model) as recorder:
        forward_pass(model, recorder, ids.numpy())
        params = recorder.rope()
        with capped_distances(model, C, params.inv_freq), torch.inference_mode():
            recorder.reset(T)
            out = model(input_ids=ids, output_attentions=True)
        assert len(out.attentions) == recorder.n_layers
        pos = torch.arange(T)
        for layer, weights in enumerate(out.attentions):
            q = recorder.q[layer]
            k = recorder.k[layer][:, params.kv_group]
            w = capped_logits(
                q,
                k,
                pos,
                torch.as_tensor(params.inv_freq[layer]),
                float(params.scaling[layer]),
                float(params.attention_scaling[layer]),
                distance_cap=C,
            )
            mask = rope.causal_mask(T, int(params.sliding_window[layer]))
            expected = torch.softmax(w.masked_fill(~mask, float("-inf")), -1)
            torch.testing.assert_close(weights, expected, rtol=1e-4, atol=1e-6)


def test_capped_backend_refuses_a_model_loaded_without_it(tiny):
    path, _, _ = tiny
    with pytest.raises(RuntimeError, match=CAPPED_BACKEND):
        with capped_distances(load_tiny(path, BACKEND), 4, np.ones((2, 8))):
            pass


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_run_caps_changes_f_and_keeps_layer0_g(tiny, tiny_source, arch):
    _, ids, _ = tiny  # both tiny checkpoints share one tokenizer
    model = load_tiny(tiny_source(arch), CAPPED_BACKEND)
    ds = run_caps(model, ids, distance_caps=[4, T - 1, 2 * T], dummy_distance=100, progress=False)
    full = ds.sel(cap=[T - 1, 2 * T])
    assert (full.ppl_ratio == 1.0).all() and (full.f_corr == 1.0).all() and (full.g_corr == 1.0).all()
    small = ds.sel(cap=4)
    assert (small.ppl_ratio != 1.0).all()
    assert (small.f_corr.sel(layer=0) < 0.999).all()
    np.testing.assert_allclose(small.g_corr.sel(layer=0), 1.0, atol=1e-6)  # same layer-0 q/k, same g


def test_terms_use_each_layers_own_rope_table(tiny, tiny_source):
    """Gemma 3 mixes two RoPE bases: the batched f/g must match a per-layer computation."""
    _, ids, _ = tiny
    model = load_tiny(tiny_source("gemma3"), BACKEND)
    with Capture(model) as recorder:
        p = forward_pass(model, recorder, ids)
        info = recorder.rope()
    assert len({row.tobytes() for row in info.inv_freq}) == 2
    terms = Terms(p, info, 100)
    f, g = terms(1)
    # the sliding-window layers (window 16) are scored inside their window, the global layer at D = 100
    assert terms.dummy_distance_used.tolist() == [15, 15, 100]
    for layer in range(recorder.n_layers):
        for table, same in [(layer, True), (2 if layer < 2 else 0, False)]:  # layers 0, 1 local; 2 global
            fl, gl = method_a_terms(
                p.q[layer][1],
                p.k[layer][1],
                torch.arange(T),
                torch.as_tensor(info.inv_freq[table]),
                float(info.scaling[layer]),
                float(info.attention_scaling[layer]),
                int(terms.dummy_distance_used[layer]),
            )
            assert torch.allclose(f[layer], fl, rtol=1e-5, atol=1e-5) == same
            assert torch.allclose(g[layer], gl, rtol=1e-5, atol=1e-5) == same


# ---------------------------------------------------------------------------------------------- jobs


def test_jobs_write_documented_files(tiny_source, tmp_path):
    model_dir = tmp_path / "model"
    acquire(f"local:{tiny_source('llama')}", model_dir)
    _, tokenizer, _ = load_model(model_dir)
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 3, 48, 0, "embedded"), tmp_path / "windows.h5")
    common = dict(n_samples=2, seq_len=32, dummy_distance=100)

    def job(out, samples=None):
        windows = tmp_path / "windows.h5"
        return tiny_job(
            model_dir,
            windows,
            out,
            model="tiny",
            variant="random-seed0",
            samples=samples,
            config_hash="abc",
        )

    perturbation = PerturbOptions(rates=[0, 0.1, 0.5], seed=5, jitter=JITTER, **common)
    caps = CapOptions(distance_caps=[4, 64], **common)
    perturb_job(job(tmp_path / "perturb.nc"), perturbation)
    cap_job(job(tmp_path / "cap.nc"), caps)
    p = open_dataset(tmp_path / "perturb.nc", lazy=False)
    assert dict(p.sizes) == {"kind": 6, "rate": 3, "sample": 2, "layer": 2, "token": 32}
    assert p["kind"].values.tolist() == list(KINDS) and p["rate"].values.tolist() == [0, 0.1, 0.5]
    for var, dims in {
        "nll": ("kind", "rate", "sample"),
        "ppl_ratio": ("kind", "rate", "sample"),
        "moved": ("kind", "rate", "sample"),
        "f_corr": ("kind", "rate", "sample", "layer"),
        "g_corr": ("kind", "rate", "sample", "layer"),
    }.items():
        assert p[var].dims == dims and np.isfinite(p[var]).all()
    assert p.attrs["perturb_seed"] == 5 and p.attrs["init_seed"] == 0 and p.attrs["config_hash"] == "abc"
    assert (p.moved.sel(rate=0.5) > 0.3).all() and (p.moved.sel(rate=0) == 0).all()
    c = open_dataset(tmp_path / "cap.nc", lazy=False)
    assert dict(c.sizes) == {"cap": 2, "sample": 2, "layer": 2}
    assert c["f_corr"].dims == ("cap", "sample", "layer") and c["nll"].dims == ("cap", "sample")
    assert (c.ppl_ratio.sel(cap=64) == 1.0).all()
    for key in ["model_source", "weights_sha256", "torch_version", "variant", "dtype", "created"]:
        assert key in p.attrs and key in c.attrs
    with pytest.raises(ValueError, match="perturb.seq_len: 64 exceeds"):
        cap_job(job(tmp_path / "x.nc"), CapOptions(distance_caps=[4], **{**common, "seq_len": 64}))
    # one job per shard, gathered along sample: the unsharded files (the draws are seeded by global window index)
    for name, run, options in (("perturb.nc", perturb_job, perturbation), ("cap.nc", cap_job, caps)):
        parts = [tmp_path / f"shard{start}" / name for start in (0, 1)]
        for start, part in enumerate(parts):
            run(job(part, samples=(start, start + 1)), options)
        got = gather(parts, tmp_path / "gathered" / name)
        want = open_dataset(tmp_path / name, lazy=False)
        assert got["sample"].values.tolist() == [0, 1]
        for var in want.data_vars:
            np.testing.assert_allclose(got[var].values, want[var].values, rtol=1e-5, atol=1e-6, err_msg=var)
