"""The second paper's family: task generators, PE registry, classifier, ablation, Toeplitz view (its workflow run:
tests/workflow/test_synthetic_workflow.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posgen.decomposition import toeplitz_shares
from posgen.decomposition.design import AdditiveDesign
from posgen.stats import deposit_index, top_gap
from posgen.synthetic.ablation import single_head_accuracy
from posgen.synthetic.model import Classifier
from posgen.synthetic.pe import Dims, make_pe
from posgen.synthetic.tasks import PAD, TEST, make_task
from posgen.synthetic.train import load_split, train

OPTIONS = {
    "vocab_size": 16,
    "test_fraction": 0.3,
    "distance": {"n_samples": 300, "max_side": 4, "max_middle": 6},
    "count": {"n_samples": 300, "seq_len": 12, "n_triggers": 3, "max_count": 8},
}


def model(pe="nope", faithful=False, **kw) -> Classifier:
    torch.manual_seed(0)
    sizes = dict(vocab_size=16, n_classes=5, max_len=20, n_layers=2, n_heads=4, d_model=16, d_ff=32, dropout=0.0)
    return Classifier(pe=pe, faithful=faithful, **{**sizes, **kw}).eval()


# ------------------------------------------------------------------------------------------- tasks


def test_distance_labels_are_the_trigger_distance():
    ds = make_task("distance", OPTIONS, seed=3)
    tokens, label, length = ds["tokens"].values, ds["label"].values, ds["length"].values
    for row, y, n in zip(tokens, label, length):
        first, second = int(np.flatnonzero(row == 1)[0]), int(np.flatnonzero(row == 2)[0])
        assert (row == 1).sum() == 1 and (row == 2).sum() == 1
        assert y == second - first and 2 <= y <= OPTIONS["distance"]["max_middle"] + 1
        assert (row[:n] != PAD).all() and (row[n:] == PAD).all()
        assert first >= 1 and n - second >= 2  # at least one filler on each side
    assert ds.sizes["token"] == 2 * 4 + 6 + 2 and ds.attrs["n_classes"] == 8
    assert set(np.unique(label)) == set(range(2, 8))  # every distance occurs in 300 samples


def test_count_labels_are_the_trigger_count():
    ds = make_task("count", OPTIONS, seed=3)
    tokens, label = ds["tokens"].values, ds["label"].values
    counted = ((tokens >= 1) & (tokens <= OPTIONS["count"]["n_triggers"])).sum(1)
    np.testing.assert_array_equal(counted, label)
    assert (tokens != PAD).all() and ds.sizes["token"] == 12
    assert label.min() == 0 and label.max() == 8


def test_same_seed_same_data_and_split():
    for task in ("distance", "count"):
        a, b, c = make_task(task, OPTIONS, 5), make_task(task, OPTIONS, 5), make_task(task, OPTIONS, 6)
        for name in ("tokens", "label", "split"):
            np.testing.assert_array_equal(a[name].values, b[name].values)
        assert not np.array_equal(a["tokens"].values, c["tokens"].values)
        assert int((a["split"].values == TEST).sum()) == 90


def test_bad_sizes_name_the_key():
    with pytest.raises(ValueError, match="synthetic.count.max_count"):
        make_task("count", {**OPTIONS, "count": {**OPTIONS["count"], "max_count": 13}}, 0)
    with pytest.raises(ValueError, match="synthetic.pes: unknown positional encoding 'xpos'"):
        make_pe("xpos", Dims(1, 2, 8, 10))


# ------------------------------------------------------------------------------------ encodings


def _is_toeplitz(m: torch.Tensor) -> bool:
    """Every (i, j) equals (i + 1, j + 1), exactly."""
    return torch.equal(m[..., 1:, 1:], m[..., :-1, :-1])


@pytest.mark.parametrize("name", ["rope", "partial-rope", "decoupled"])
def test_rope_logits_of_constant_content_depend_only_on_distance(name):
    dims = Dims(n_layers=1, n_heads=2, d_model=16, max_len=12, rope_heads=1)
    pe = make_pe(name, dims)
    torch.manual_seed(0)
    T = 12
    q = torch.randn(1, 2, 1, 8).expand(1, 2, T, 8)  # the same content at every position
    k = torch.randn(1, 2, 1, 8).expand(1, 2, T, 8)
    x = torch.randn(1, 1, 16).expand(1, T, 16)
    q_pe, k_pe, bias = pe.attend(0, q, k, x, x)
    logits = (q_pe @ k_pe.transpose(-1, -2))[0].detach()  # (H, T, T)
    a = torch.arange(T)
    # depends only on i - j: each diagonal constant (up to float32 rounding of the rotation)
    for delta in range(-T + 1, T):
        diag = torch.diagonal(logits, -delta, dim1=-2, dim2=-1)
        torch.testing.assert_close(diag, diag[..., :1].expand_as(diag), rtol=0, atol=1e-5)
    assert bias is None
    # and is not constant: the rotation does move it (position information exists)
    assert float((logits[0, a, a] - logits[0, -1, 0]).abs().max()) > 1e-3


def test_t5_and_alibi_biases_are_exactly_toeplitz():
    dims = Dims(n_layers=2, n_heads=4, d_model=16, max_len=10)
    t5 = make_pe("t5", dims)
    with torch.no_grad():
        t5.beta.normal_()
    for layer in range(2):
        bias = t5.bias(layer, 10).detach()
        assert bias.shape == (4, 10, 10) and _is_toeplitz(bias)
        assert torch.equal(bias[:, 7, 2], t5.beta[layer, :, 10 - 1 + 5])
    alibi = make_pe("alibi", dims).bias(0, 10)
    assert _is_toeplitz(alibi) and torch.equal(alibi, alibi.transpose(-1, -2))
    slopes = 2.0 ** (-8 * torch.arange(1, 5) / 4)  # 1/4, 1/16, 1/64, 1/256
    torch.testing.assert_close(alibi[:, 0, 3], -3 * slopes, rtol=0, atol=0)
    faithful = make_pe("alibi", Dims(2, 4, 16, 10, faithful=True)).bias(0, 10)
    torch.testing.assert_close(faithful[:, 0, 1], -torch.exp(-torch.arange(4) / 4.0))  # the authors' exp(-h/H)
    shares = toeplitz_shares(torch.cat([bias, alibi]), causal=False)
    torch.testing.assert_close(shares[0], torch.ones(8, dtype=torch.float64))


def test_nope_bidirectional_model_is_permutation_equivariant():
    m = model("nope")
    tokens = torch.randint(1, 16, (3, 11))
    perm = torch.randperm(11)
    logits, logits_perm = m.attention_logits(tokens), m.attention_logits(tokens[:, perm])
    torch.testing.assert_close(logits_perm, logits[..., perm, :][..., perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m(tokens[:, perm]), m(tokens), rtol=1e-5, atol=1e-5)
    # any positional encoding breaks it
    r = model("rope")
    assert not torch.allclose(r(tokens[:, perm]), r(tokens), atol=1e-4)


def test_clean_mode_ignores_pads_and_faithful_mode_does_not():
    tokens = torch.randint(1, 16, (2, 7))
    padded = torch.cat([tokens, torch.zeros(2, 5, dtype=torch.long)], 1)
    for pe in ("nope", "rope", "t5", "decoupled"):
        torch.testing.assert_close(model(pe)(padded), model(pe)(tokens), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(model("nope", faithful=True)(padded), model("nope", faithful=True)(tokens), atol=1e-4)


def test_faithful_keys_come_from_the_input_embeddings():
    tokens = torch.randint(1, 16, (2, 9))
    m = model("nope", faithful=True)
    before = m.attention_logits(tokens)
    with torch.no_grad():  # changes layer 0's output, hence layer 1's queries, never its keys
        m.layers[0].out.weight.mul_(3.0)
    after = m.attention_logits(tokens)
    torch.testing.assert_close(after[:, 0], before[:, 0])
    assert not torch.allclose(after[:, 1], before[:, 1])
    clean = model("nope")
    before = clean.attention_logits(tokens)
    with torch.no_grad():  # the clean model's layer-1 keys follow the residual stream: both sides move
        clean.layers[0].out.weight.mul_(3.0)
    keys_moved = clean.attention_logits(tokens)[:, 1] - before[:, 1]
    assert float(keys_moved.abs().max()) > 1e-4


# ------------------------------------------------------------------------------------- ablation


def test_ablating_a_head_whose_values_are_zero_changes_nothing():
    m = model("rope")
    d = m.dims.head_dim
    with torch.no_grad():  # layer 1, head 2 writes nothing
        m.layers[1].value.weight[2 * d : 3 * d] = 0
        m.layers[1].value.bias[2 * d : 3 * d] = 0
    tokens = torch.randint(1, 16, (4, 10))
    gate = torch.ones(2, 4)
    gate[1, 2] = 0
    assert torch.equal(m(tokens, gate), m(tokens))
    gate = torch.ones(2, 4)
    gate[1, 1] = 0
    assert not torch.allclose(m(tokens, gate), m(tokens))


def test_ablate_reports_each_heads_accuracy():
    m = model("nope", n_heads=2, n_layers=1, d_model=8)
    tokens = torch.randint(1, 16, (40, 6))
    with torch.no_grad():
        m.layers[0].value.weight[4:] = 0
        m.layers[0].value.bias[4:] = 0
    labels = m(tokens).argmax(-1)  # the model is right on every sample
    base, ablated = single_head_accuracy(m, tokens, labels, [0], batch_size=16)
    assert base == 1.0 and ablated.shape == (1, 2) and ablated[0, 1] == 1.0


def test_deposit_index_of_constructed_drops():
    drop = np.array(
        [
            [0.60, 0.02, 0.00, -0.01],  # one head carries the layer
            [0.10, 0.10, 0.10, 0.10],  # spread evenly
            [0.00, -0.02, 0.00, -0.01],  # nothing matters
        ]
    )
    index = deposit_index(drop)
    np.testing.assert_allclose(index[:2], [0.60 / 0.62, 0.25])
    assert np.isnan(index[2])
    np.testing.assert_allclose(top_gap(drop), [0.58, 0.0, 0.0])


# ----------------------------------------------------------------------------------- Toeplitz view


def _lstsq_shares(w: np.ndarray, causal: bool) -> tuple[float, float]:
    """Reference: explicit design matrices and numpy's least squares."""
    T = w.shape[0]
    i, j = np.nonzero(np.tril(np.ones((T, T))) if causal else np.ones((T, T)))
    y = w[i, j]
    onehot = lambda idx, n: np.eye(n)[idx]
    design_a = onehot(i - j + T - 1, 2 * T - 1)
    full = np.hstack([design_a, onehot(i, T), onehot(j, T)])
    sst = ((y - y.mean()) ** 2).sum()
    out = []
    for design in (design_a, full):
        fit = design @ np.linalg.lstsq(design, y, rcond=None)[0]
        out.append(1 - ((y - fit) ** 2).sum() / sst)
    return tuple(out)


@pytest.mark.parametrize("causal", [False, True])
def test_toeplitz_shares_known_answers(causal):
    T = 9
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal(2 * T - 1), rng.standard_normal(T), rng.standard_normal(T)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    toeplitz = a[i - j + T - 1]
    additive = toeplitz + b[:, None] + c[None, :]
    noise = rng.standard_normal((T, T))
    toe, add = toeplitz_shares(torch.tensor(np.stack([toeplitz, additive, noise])), causal)
    torch.testing.assert_close(toe[0], torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(add[:2], torch.ones(2, dtype=torch.float64))
    assert float(toe[1]) < 0.9  # b(i) + c(j) is not Toeplitz
    ref_toe, ref_add = _lstsq_shares(noise, causal)
    assert float(toe[2]) == pytest.approx(ref_toe, abs=1e-10)
    assert float(add[2]) == pytest.approx(ref_add, abs=1e-10)


def test_bidirectional_design_fits_signed_distances():
    design = AdditiveDesign(5, 0, "with", "cpu", causal=False)
    assert design.n_delta == 9 and design.deltas.tolist() == [0, 1, 2, 3, 4, -4, -3, -2, -1]
    assert design.cnt_a.tolist() == [5, 4, 3, 2, 1, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="bidirectional"):
        AdditiveDesign(5, 3, "with", "cpu", causal=False)


# --------------------------------------------------------------------------------------- training


def test_training_is_deterministic_and_learns():
    data = make_task("count", OPTIONS, 0)
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        m = Classifier(
            vocab_size=16, n_classes=9, max_len=12, pe="nope", n_layers=1, n_heads=2, d_model=16, d_ff=32, dropout=0.1
        )
        curves = train(
            m,
            load_split(data, 0, "cpu"),
            load_split(data, 1, "cpu"),
            epochs=3,
            batch_size=32,
            lr=3e-3,
            weight_decay=0.0,
            warmup_fraction=0.1,
            betas=(0.9, 0.98),
            seed=1,
        )
        runs.append((m.state_dict(), curves))
    for key, value in runs[0][0].items():
        assert torch.equal(value, runs[1][0][key]), key
    assert runs[0][1]["test_accuracy"] == runs[1][1]["test_accuracy"]
    assert runs[0][1]["train_loss"][-1] < runs[0][1]["train_loss"][0]
