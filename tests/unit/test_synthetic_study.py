"""The second family as an experiment: faithful mode (the authors' classifier), experiments, baselines, the
honest deposit statistics, leave-one-in, the Toeplitz null and the distance x content split, position probes,
training dynamics and the verdicts."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from posgen.config import ConfigError
from posgen.experiments import ExperimentError, classifiers, parse_pe, pe_labels, resolve
from posgen.stats import deposit_statistics
from posgen.synthetic.ablation import leave_one_in_accuracy, single_head_accuracy
from posgen.synthetic.baselines import baselines, lookup_rule
from posgen.synthetic.model import Classifier
from posgen.synthetic.pe import Dims, make_pe
from posgen.synthetic.probe import held_out_r2, position_probes, stream_probes
from posgen.synthetic.tasks import TEST, TRAIN, make_task
from posgen.synthetic.toeplitz import distance_content_shares, toeplitz_view
from posgen.synthetic.train import init_gradients, load_split, snapshot_steps, train

OPTIONS = {
    "vocab_size": 16,
    "test_fraction": 0.3,
    "distance": {"n_samples": 200, "max_side": 4, "max_middle": 6},
    "count": {"n_samples": 200, "seq_len": 12, "n_triggers": 3, "max_count": 8},
}


def model(pe="nope", faithful=False, **kw) -> Classifier:
    torch.manual_seed(0)
    sizes = dict(vocab_size=16, n_classes=9, max_len=16, n_layers=2, n_heads=4, d_model=16, d_ff=32, dropout=0.0)
    return Classifier(pe=pe, faithful=faithful, **{**sizes, **kw}).eval()


# ------------------------------------------------------------------------------- faithful mode


def test_faithful_mode_uses_one_pad_width_for_every_split_and_pass():
    data = make_task("distance", OPTIONS, 0)
    width = data.sizes["token"]
    lengths = np.asarray(data["length"].values)
    split = np.asarray(data["split"].values)
    for which in (TRAIN, TEST):
        tokens, labels = load_split(data, which, "cpu", faithful=True)
        assert tokens.shape[1] == width and len(labels) == (split == which).sum()
        assert load_split(data, which, "cpu", faithful=False)[0].shape[1] == lengths[split == which].max()
    # the analysis passes read the same width (a prefix of the split, never trimmed)
    assert load_split(data, TEST, "cpu", faithful=True, limit=5)[0].shape == (5, width)
    m = model("rope", faithful=True, max_len=width)
    tokens = load_split(data, TEST, "cpu", faithful=True, limit=4)[0]
    trimmed = tokens[:, : int(lengths[split == TEST][:4].max())]
    # pads are attended and pooled in faithful mode: a narrower tensor is another input
    assert not torch.allclose(m(tokens), m(trimmed), atol=1e-5)


def test_faithful_mode_has_no_final_norm_and_pools_pads():
    m = model("nope", faithful=True)
    assert isinstance(m.norm, torch.nn.Identity)
    assert isinstance(model("nope").norm, torch.nn.LayerNorm)
    tokens = torch.randint(1, 16, (3, 7))
    tokens[0, 5:] = 0
    last = m.hidden_states(tokens)[-1]  # (B, T, D)
    torch.testing.assert_close(m(tokens), m.head(last.mean(1)))


@pytest.mark.parametrize("n_heads", [4, 16])
def test_faithful_alibi_slopes_are_exp_minus_h_over_heads(n_heads):
    bias = make_pe("alibi", Dims(1, n_heads, 4 * n_heads, 6, faithful=True)).bias(0, 6)
    h = torch.arange(n_heads, dtype=torch.float32)
    torch.testing.assert_close(bias[:, 2, 0], -2 * torch.exp(-h / n_heads))


def test_faithful_learned_positions_start_at_the_token_scale():
    torch.manual_seed(0)
    faithful = make_pe("learned", Dims(1, 4, 64, 128, faithful=True)).table
    clean = make_pe("learned", Dims(1, 4, 64, 128)).table
    tokens = torch.nn.Embedding(16, 64).weight
    assert float(faithful.detach().std()) == pytest.approx(float(tokens.detach().std()), rel=0.1)
    assert float(clean.detach().std()) == pytest.approx(0.02, rel=0.1)


def test_faithful_embeddings_see_no_dropout_clean_ones_do():
    tokens = torch.randint(1, 16, (2, 9))
    faithful = model("sinusoidal", faithful=True, dropout=0.5).train()
    h, x0, key_bias, _ = faithful._inputs(tokens)
    exact = faithful.pe.embed(faithful.embedding(tokens))
    torch.testing.assert_close(x0, exact)  # K/V source: no dropout
    torch.testing.assert_close(h, exact)  # nor on the residual stream's input: the authors' classifier has none
    assert key_bias is None
    clean = model("sinusoidal", dropout=0.5).train()
    h, _, _, _ = clean._inputs(tokens)
    assert not torch.allclose(h, clean.pe.embed(clean.embedding(tokens)))  # clean mode drops the input out


def test_ignore_index_leaves_that_label_out_of_the_loss():
    data = make_task("count", OPTIONS, 0)
    train_set, test_set = load_split(data, TRAIN, "cpu"), load_split(data, TEST, "cpu")
    only_zero = (train_set[0][train_set[1] == 0], train_set[1][train_set[1] == 0])
    m = model("nope")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    train(
        m,
        only_zero,
        test_set,
        epochs=1,
        batch_size=8,
        lr=1e-2,
        weight_decay=0.0,
        warmup_fraction=0.0,
        betas=(0.9, 0.98),
        seed=0,
        ignore_index=0,
    )
    # every sample's label is ignored: zero loss, zero gradients, AdamW without weight decay moves nothing
    for key, value in m.state_dict().items():
        torch.testing.assert_close(value, before[key])


# --------------------------------------------------------------------------------- experiments


SYNTHETIC = {
    "tasks": ["distance", "count"],
    "pes": ["nope", "partial-rope"],
    "seeds": [0],
    "rope_heads": [1],
    "faithful": False,
    "model": {"n_layers": 2, "n_heads": 4, "d_model": 32, "d_ff": 64, "dropout": 0.0},
    "train": {"epochs": 10, "lr": 0.006},
    "experiments": {
        "clean": {},
        "wide": {
            "model": {"n_heads": 16, "d_model": 128},
            "rope_heads": [1, 2, "all"],
            "seeds": [0, 1],
            "tasks": ["distance"],
        },
    },
    "run": ["clean"],
    "deposit_study": ["wide"],
}


def test_experiments_override_the_base_settings():
    wide = resolve(SYNTHETIC, "wide")
    assert wide["model"] == {"n_layers": 2, "n_heads": 16, "d_model": 128, "d_ff": 64, "dropout": 0.0}
    assert wide["train"] == SYNTHETIC["train"] and "experiments" not in wide and "run" not in wide
    assert pe_labels(wide) == ["nope", "partial-rope-1", "partial-rope-2", "partial-rope-all"]
    assert classifiers(resolve(SYNTHETIC, "clean")) == [
        ("distance", "nope", 0),
        ("distance", "partial-rope-1", 0),
        ("count", "nope", 0),
        ("count", "partial-rope-1", 0),
    ]
    assert len(classifiers(wide)) == 8
    assert parse_pe("partial-rope-2", 16) == ("partial-rope", 2)
    assert parse_pe("partial-rope-all", 16) == ("partial-rope", 16)
    assert parse_pe("rope", 16) == ("rope", 16)
    bad = copy.deepcopy(SYNTHETIC)
    bad["experiments"]["wide"]["lr"] = 1
    with pytest.raises(ExperimentError, match=r"experiments\.wide\.lr: not an experiment setting"):
        resolve(bad, "wide")


def _validated(tmp_path, synthetic: dict):
    from posgen.config import validate

    config = {
        "models": [{"name": "m", "source": "embedded:smollm2-135m"}],
        "corpus": {"source": "embedded"},
        "n_samples": 8,
        "seq_len": 512,
        "synthetic": synthetic,
    }
    return validate(config, check_paths=False)


def test_experiment_errors_name_the_key(tmp_path):
    config = _validated(tmp_path, {"experiments": {"clean": {}, "f": {"faithful": True}}, "run": ["clean", "f"]})
    assert config["synthetic"]["experiments"]["f"] == {"faithful": True}
    cases = [
        ({"run": ["nothere"]}, r"config\.synthetic\.run: 'nothere' is not in synthetic\.experiments"),
        (
            {"experiments": {"x": {"model": {"n_heads": 3}}}, "run": ["x"]},
            r"config\.synthetic\.experiments\.x\.model\.d_model: 32 is not a multiple of n_heads 3",
        ),
        (
            {"experiments": {"x": {"model": {"n_layers": 0}}}, "run": ["x"]},
            r"config\.synthetic\.experiments\.x\.model\.n_layers: 0 is less than the minimum of 1",
        ),
        (
            {"experiments": {"x": {"rope_heads": [9]}}, "run": ["x"]},
            r"config\.synthetic\.experiments\.x\.rope_heads: 9 not in 0\.\.4",
        ),
        ({"rope_heads": 1}, r"synthetic.*rope_heads"),
    ]
    for synthetic, message in cases:
        with pytest.raises(ConfigError, match=message):
            _validated(tmp_path, synthetic)


# ---------------------------------------------------------------------------------- baselines


def test_lookup_rule_and_baselines_known_answers():
    # key 0 -> label 3 twice, label 1 once; key 1 -> label 2; key 7 unseen -> the majority label 3
    predicted = lookup_rule(np.array([0, 0, 0, 1]), np.array([3, 3, 1, 2]), np.array([0, 1, 7]))
    assert predicted.tolist() == [3, 2, 3]
    count = baselines(make_task("count", OPTIONS, 0), TRAIN, TEST)
    assert count["bag"] == 1.0  # the trigger count is the label
    assert count["length"] == count["majority"]  # every count sequence has the same length
    distance = baselines(make_task("distance", OPTIONS, 0), TRAIN, TEST)
    assert distance["bag"] == distance["majority"]  # two triggers in every sample
    assert distance["length"] > distance["majority"]  # the length leaks the distance


# --------------------------------------------------------------------------------------- deposit


def test_deposit_statistics_gate_the_index_and_apply_the_criterion():
    drop = np.array(
        [
            [0.60, 0.02, 0.00, -0.01],  # the paper's deposit
            [0.003, -0.001, 0.0, 0.0],  # nothing matters: index NaN, not 1
            [0.40, 0.30, 0.10, 0.10],  # large but shared
            [0.25, 0.01, 0.0, 0.0],  # concentrated but under 30 points
        ]
    )
    stats = deposit_statistics(drop)
    np.testing.assert_allclose(stats["top_drop"], [0.60, 0.003, 0.40, 0.25])
    np.testing.assert_allclose(stats["second_drop"], [0.02, 0.0, 0.30, 0.01])
    assert stats["top_head"].tolist() == [0, 0, 0, 0]
    np.testing.assert_allclose(stats["deposit_index"][[0, 2, 3]], [0.60 / 0.62, 0.4 / 0.9, 0.25 / 0.26])
    assert np.isnan(stats["deposit_index"][1])
    assert stats["deposit"].tolist() == [True, False, False, False]


def test_resumed_ablation_equals_a_full_gated_pass():
    m = model("rope", n_layers=3)
    tokens = torch.randint(1, 16, (5, 10))
    states = m.hidden_states(tokens)
    for layer in range(3):
        gate = torch.ones(4)
        gate[layer % 4] = 0
        full = torch.ones(3, 4)
        full[layer] = gate
        torch.testing.assert_close(m.resume(tokens, layer, states[layer], gate), m(tokens, full))


def test_leave_one_in_of_a_silent_head_equals_the_whole_layer_ablated():
    m = model("nope", n_layers=1)
    d = m.dims.head_dim
    with torch.no_grad():  # head 3 writes nothing
        m.layers[0].value.weight[3 * d :] = 0
        m.layers[0].value.bias[3 * d :] = 0
    tokens = torch.randint(1, 16, (30, 8))
    labels = torch.randint(0, 9, (30,))
    kept, layer_ablated = leave_one_in_accuracy(m, tokens, labels, [0])
    assert kept.shape == (1, 4) and kept[0, 3] == layer_ablated[0]
    gate = torch.zeros(1, 4)
    gate[0, 1] = 1
    assert kept[0, 1] == pytest.approx(float((m(tokens, gate).argmax(-1) == labels).double().mean()))
    base, ablated = single_head_accuracy(m, tokens, labels, [0])
    assert ablated[0, 3] == base  # ablating the silent head changes nothing


def test_snapshot_steps_and_init_gradients():
    assert snapshot_steps([0, 0.1, 0.3], 100) == [0, 10, 30, 100]
    assert snapshot_steps([0, 1.0], 7) == [0, 7]
    data = make_task("distance", OPTIONS, 0)
    m = model("rope", max_len=data.sizes["token"])
    tokens, labels = load_split(data, TRAIN, "cpu")
    norms = init_gradients(m, tokens, labels, 64, -100)
    assert norms.shape == (2, 4, 2) and (norms > 0).all()
    # the per-head norms split the projection's whole gradient
    m.zero_grad()
    loss = torch.nn.functional.cross_entropy(m(tokens), labels)
    loss.backward()
    whole = torch.cat([m.layers[0].query.weight.grad, m.layers[0].query.bias.grad[:, None]], 1).norm()
    assert float(np.sqrt((norms[0, :, 0] ** 2).sum())) == pytest.approx(float(whole), rel=1e-4)


# ------------------------------------------------------------------------ Toeplitz null, interaction


def test_distance_content_split_known_answers():
    rng = np.random.default_rng(0)
    n = 4000
    d, c = rng.integers(0, 15, n), rng.integers(0, 4, n)
    a, b = rng.standard_normal(15), rng.standard_normal(4)
    additive = distance_content_shares(a[d] + b[c], d, c)
    assert additive["distance_content_share"] == pytest.approx(1.0, abs=1e-9)
    assert abs(additive["interaction_share"]) < 1e-6
    a, b = a - a[d].mean(), b - b[c].mean()  # centred factors: their product has no additive part
    product = distance_content_shares(a[d] * b[c], d, c)
    assert product["cell_share"] == pytest.approx(1.0, abs=1e-9)
    assert product["interaction_share"] > 0.8
    noise = distance_content_shares(rng.standard_normal(n), d, c)
    assert abs(noise["cell_share"]) < 0.02 and abs(noise["distance_share"]) < 0.02  # adjusted: no free lunch


def test_toeplitz_view_nulls_and_alibi_additivity():
    data = make_task("distance", OPTIONS, 0)
    tokens = load_split(data, TEST, "cpu", limit=6)[0]
    lengths = np.asarray(data["length"].values)[np.asarray(data["split"].values) == TEST][:6]
    view = toeplitz_view(model("alibi", max_len=data.sizes["token"]), tokens, lengths, 2)
    assert set(view) >= {"toeplitz_null", "interaction_share"} and view["toeplitz_share"].shape == (2, 4)
    # a permuted matrix keeps about 2/(T+1) for the a(i-j) fit: far under the real share
    T = float(np.mean(lengths))
    assert float(np.mean(view["toeplitz_null"])) == pytest.approx(2 / (T + 1), rel=0.6)
    assert (view["toeplitz_null"] <= view["additive_null"] + 1e-9).all()


# ------------------------------------------------------------------------------------- probes


def test_position_probe_known_answers():
    rng = np.random.default_rng(0)
    position = np.tile(np.arange(20), 10).astype(float)
    fit = np.repeat(np.arange(10) % 2 == 0, 20)
    linear = np.stack([position, rng.standard_normal(200)], 1)
    assert held_out_r2(linear, position, fit) == pytest.approx(1.0, abs=1e-4)
    assert held_out_r2(rng.standard_normal((200, 3)), position, fit) < 0.1
    m = model("sinusoidal", max_len=12)
    r2 = position_probes(m, torch.randint(1, 16, (40, 12)))["position_r2"]
    assert r2.shape == (3,) and r2[0] > 0.9  # the input carries the sinusoidal table
    assert position_probes(model("nope", max_len=12), torch.randint(1, 16, (40, 12)))["position_r2"][0] < 0.2


def test_fixed_probe_follows_the_input_directions_a_fresh_probe_any_direction():
    # streams whose positional direction is known: the input writes position along u; stream 1 keeps u (scaled
    # content added), stream 2 moved position to an orthogonal v, stream 3 holds no position at all
    rng = np.random.default_rng(1)
    n, D = 400, 8
    position = np.tile(np.arange(20), n // 20).astype(float)
    fit = np.repeat(np.arange(n // 20) % 2 == 0, 20)
    u, v = np.eye(D)[0], np.eye(D)[1]
    content = rng.standard_normal((n, D)) * 0.1
    content[:, :2] = 0  # content lives off u and v
    centred = (position - position.mean())[:, None]
    streams = [centred * u + content, centred * u + 3 * content, centred * v + content, content]
    out = stream_probes(streams, position, fit)
    assert out["position_r2"][:3] == pytest.approx([1, 1, 1], abs=1e-3)  # decodable in the first three
    assert out["position_r2"][3] < 0.1
    assert out["transfer_r2"][:2] == pytest.approx([1, 1], abs=1e-3)  # the input's direction survives
    assert abs(out["transfer_r2"][2]) < 0.01  # moved: the fixed probe reads nothing (it predicts the mean)
    assert abs(out["transfer_r2"][3]) < 0.01
