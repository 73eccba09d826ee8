"""Figure functions on small synthetic inputs laid out as in docs/data-model.md (no Snakemake)."""

from __future__ import annotations

import hashlib
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from posgen import reproduction
from posgen.figures import llm
from posgen.figures.registry import render
from posgen.figures.style import save_figure
from posgen.llm.examples import example_heads, select_heads
from posgen.rope import causal_mask, logits
from posgen.stats import bootstrap_mean
from posgen.testing.datasets import make_decomposition, make_qk
from posgen.workflow.figures import FIGURES as FIGURE_TABLE
from posgen.workflow.job import resolve

# the first paper's figures: the rows of the figure table that posgen.figures.llm draws
FIRST_PAPER = {
    name for name, row in FIGURE_TABLE.items() if row.group == "all" and row.draw.startswith(llm.__name__ + ":")
}
VARIANTS = ["trained", "random-seed0", "random-seed1"]
KINDS = ["token-swap", "token-permute", "word-swap", "word-permute", "posid-swap", "posid-jitter"]
RATES = [0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5]


# ------------------------------------------------------------------------------------ synthetic inputs


def make_summary(n_layers=4, seed=0):
    rng = np.random.default_rng(seed)
    shape = (len(VARIANTS), 2, 2, n_layers)
    r = rng.uniform(0.5, 0.95, size=shape)
    return xr.Dataset(
        {
            "layer_r": (("variant", "method", "sink", "layer"), r),
            "layer_r_lo": (("variant", "method", "sink", "layer"), r - 0.05),
            "layer_r_hi": (("variant", "method", "sink", "layer"), r + 0.03),
            "layer_position_share": (
                ("variant", "vector", "basis", "sink", "layer"),
                rng.uniform(0, 1, size=(len(VARIANTS), 2, 2, 2, n_layers)),
            ),
        },
        coords={
            "variant": VARIANTS,
            "method": ["A", "B"],
            "sink": ["with", "without"],
            "layer": np.arange(n_layers),
            "vector": ["q", "k"],
            "basis": ["linear", "smooth"],
        },
    )


def make_bands(n_layers=3, n_heads=4, n_kv=2, n_bands=8, seed=0):
    rng = np.random.default_rng(seed)
    theta = np.stack([10000.0 ** (-np.arange(n_bands) / n_bands)] * n_layers)
    theta[:, -1] = 0.0  # a band that never rotates (proportional RoPE) must not break the log axis
    data = {"theta": (("variant", "layer", "band"), np.stack([theta] * len(VARIANTS)))}
    for side, h, hd in (("q", n_heads, "head"), ("k", n_kv, "kv_head")):
        mean_sq = rng.uniform(0.1, 10, size=(len(VARIANTS), n_layers, h, n_bands))
        var = rng.uniform(0.1, 10, size=mean_sq.shape)
        dims = ("variant", "layer", hd, "band")
        data |= {f"{side}_mean_sq": (dims, mean_sq), f"{side}_var": (dims, var), f"{side}_ratio": (dims, var / mean_sq)}
    return xr.Dataset(
        data,
        coords={
            "variant": VARIANTS,
            "layer": np.arange(n_layers),
            "head": np.arange(n_heads),
            "kv_head": np.arange(n_kv),
            "band": np.arange(n_bands),
        },
    )


def make_perturb(n_samples=3, n_layers=2, seed=0):
    rng = np.random.default_rng(seed)
    rates = np.asarray(RATES)
    shape = (len(VARIANTS), len(KINDS), len(rates), n_samples)
    nll_shift = rates[None, None, :, None] * rng.uniform(0.5, 2, size=shape)
    corr = 1 - rates[None, None, :, None, None] * rng.uniform(0, 1, size=shape + (n_layers,))
    return xr.Dataset(
        {
            "nll": (("variant", "kind", "rate", "sample"), 3 + nll_shift),
            "ppl_ratio": (("variant", "kind", "rate", "sample"), np.exp(nll_shift)),
            "f_corr": (("variant", "kind", "rate", "sample", "layer"), corr),
            "g_corr": (("variant", "kind", "rate", "sample", "layer"), np.sqrt(corr)),
        },
        coords={
            "variant": VARIANTS,
            "kind": KINDS,
            "rate": rates,
            "sample": np.arange(n_samples),
            "layer": np.arange(n_layers),
        },
    )


def make_cap(n_samples=3, n_layers=2, seed=0):
    rng = np.random.default_rng(seed)
    caps = np.asarray([8, 32, 128])
    shape = (len(VARIANTS), len(caps), n_samples)
    shift = rng.uniform(0, 1, size=shape) / caps[None, :, None]
    return xr.Dataset(
        {
            "nll": (("variant", "cap", "sample"), 3 + shift),
            "ppl_ratio": (("variant", "cap", "sample"), np.exp(shift)),
            "f_corr": (("variant", "cap", "sample", "layer"), 1 - shift[..., None] * np.ones(n_layers)),
            "g_corr": (("variant", "cap", "sample", "layer"), np.ones(shape + (n_layers,))),
        },
        coords={"variant": VARIANTS, "cap": caps, "sample": np.arange(n_samples), "layer": np.arange(n_layers)},
    )


def make_summary_csv():
    rows = []
    for variant in VARIANTS:
        for method in "AB":
            for sink in ("with", "without"):
                r = 0.9 if variant == "trained" else 0.5
                rows.append(
                    {
                        "model": "tiny",
                        "variant": variant,
                        "method": method,
                        "sink": sink,
                        "mean_r": r,
                        "mean_r_lo": r - 0.02,
                        "mean_r_hi": r + 0.01,
                        "pooled_r": r + 0.01,
                        "pooled_r_lo": r - 0.01,
                        "pooled_r_hi": r + 0.02,
                        "r2_f": 0.3,
                        "r2_g": 0.4,
                        "diff_vs_trained": 0.0,
                        "diff_lo": 0.0,
                        "diff_hi": 0.0,
                        "n_samples": 3,
                        "n_layers": 2,
                        "n_heads": 4,
                    }
                )
    return pd.DataFrame(rows[::-1])  # reversed: the table must sort them itself


@pytest.fixture(scope="module")
def examples():
    return example_heads(make_qk(), make_decomposition(), map_tokens=32, pool_pairs=200)


def all_figures(examples):
    """Every figure function of the first paper on its synthetic input, keyed like FIRST_PAPER."""
    decomp = make_decomposition()
    r = xr.concat(
        [make_decomposition(seed=i)["r"].sel(sink="without").mean("sample") for i in range(len(VARIANTS))],
        dim=pd.Index(VARIANTS, name="variant"),
    )
    sweep = xr.concat(
        [make_decomposition(seed=i)["r_sweep"] for i in range(len(VARIANTS))], dim=pd.Index(VARIANTS, name="variant")
    )
    assert decomp["r"].dims[0] == "sample"
    return {
        "logit_maps": llm.fig_logit_maps(examples),
        "scatter": llm.fig_scatter(examples),
        "r_heatmap": llm.fig_r_heatmap(r),
        "layer_r": llm.fig_layer_r(make_summary()),
        "position_share": llm.fig_position_share(make_summary()),
        "bands": llm.fig_bands(make_bands()),
        "dummy_sweep": llm.fig_dummy_sweep(sweep, n_boot=200),
        "perturb_ppl": llm.fig_perturb_ppl(make_perturb(), n_boot=200),
        "perturb_fg": llm.fig_perturb_fg(make_perturb(), n_boot=200),
        "cap": llm.fig_cap(make_cap(), n_boot=200),
    }


# --------------------------------------------------------------------------------------------- tests

# name -> (number of panels, an x label and a y label that must appear)
EXPECTED = {
    "logit_maps": (8, "key position $j$", "query position $i$"),
    "scatter": (2, "approximation $f + g$", "true logit $W$"),
    "r_heatmap": (6, "head", "layer"),
    "layer_r": (4, "layer", "mean Pearson $r$"),
    "position_share": (4, "layer", "position share"),
    "bands": (6, "RoPE frequency $\\theta_l$", "variance / mean$^2$"),
    "dummy_sweep": (2, "dummy distance $D$", "mean $r$, method A"),
    "perturb_ppl": (6, "perturbed fraction $p$ (%)", "perplexity / unperturbed"),
    "perturb_fg": (6, "perturbed fraction $p$ (%)", "1 - corr(perturbed, clean)"),
    "cap": (2, "cap $C$ (tokens)", "perplexity / uncapped"),
}


def panels(fig):
    """Data axes (colorbars excluded)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_every_figure_has_its_panels_labels_and_content(examples):
    figs = all_figures(examples)
    assert set(figs) == FIRST_PAPER == set(EXPECTED)
    for name, fig in figs.items():
        n_panels, xlabel, ylabel = EXPECTED[name]
        axes = panels(fig)
        assert len(axes) == n_panels, name
        assert any(xlabel in ax.get_xlabel() for ax in axes), name
        assert any(ylabel in ax.get_ylabel() for ax in axes), name
        titled = [ax for ax in axes if ax.get_title()]
        assert len(titled) >= min(len(axes), 2), f"{name}: panels without titles"
        for ax in axes:
            drawn = ax.lines + ax.collections + ax.images
            assert drawn, f"{name}: empty panel {ax.get_title()}"
            for line in ax.lines:
                y = np.asarray(line.get_ydata(), dtype=float)
                assert np.isfinite(y).any(), f"{name}: line with no finite point"
            for im in ax.images:
                assert np.isfinite(np.ma.filled(im.get_array(), np.nan)).any(), f"{name}: empty image"
        plt.close(fig)


def _render(fig, tmp_path, stem):
    png, pdf = tmp_path / f"{stem}.png", tmp_path / f"{stem}.pdf"
    save_figure(fig, png, pdf, provenance={"config_hash": "abc"})
    return png.read_bytes(), pdf.read_bytes()


def test_rendering_twice_gives_identical_bytes(examples, tmp_path):
    first = {n: _render(f, tmp_path, f"{n}-1") for n, f in all_figures(examples).items()}
    second = {n: _render(f, tmp_path, f"{n}-2") for n, f in all_figures(examples).items()}
    for name in first:
        png, pdf = first[name]
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and pdf[:5] == b"%PDF-", name
        assert hashlib.sha256(png).digest() == hashlib.sha256(second[name][0]).digest(), f"{name} PNG differs"
        assert pdf == second[name][1], f"{name} PDF differs"
        assert b"CreationDate" not in pdf and b"Matplotlib" not in png
        assert b"config_hash" in png
    # and the data behind figures 1-2 is seeded
    again = example_heads(make_qk(), make_decomposition(), map_tokens=32, pool_pairs=200)
    xr.testing.assert_identical(examples, again)


def test_rendered_png_is_not_blank(examples, tmp_path):
    from PIL import Image

    png, _ = _render(llm.fig_logit_maps(examples), tmp_path, "maps")
    (tmp_path / "maps.png").write_bytes(png)
    pixels = np.asarray(Image.open(tmp_path / "maps.png").convert("L"), dtype=float)
    assert pixels.std() > 20  # the maps fill most of the page with colour


def test_every_row_of_the_figure_table_names_its_functions_and_caption():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    captions = (root / "report" / "figures.rst").read_text()
    for name, row in FIGURE_TABLE.items():
        assert callable(resolve(row.draw)) and callable(resolve(row.load)), name
        assert row.caption == "report/figures.rst" and f'snakemake.wildcards.figure == "{name}" %}}' in captions, name
    with pytest.raises(LookupError, match="posgen.figures.llm:no_such_figure: no such function"):
        resolve("posgen.figures.llm:no_such_figure")


def test_select_heads_follows_the_documented_rule():
    r = np.array([[0.9, 0.5, 0.95, 0.7], [0.8, 0.85, 0.3, 0.99]])  # sorted: .3 .5 .7 .8 .85 .9 .95 .99
    picks = select_heads(make_decomposition(r_layer_head=r))
    assert picks["worst"][:2] == (1, 2) and picks["worst"][2] == pytest.approx(0.3)
    assert picks["median"][:2] == (1, 0) and picks["median"][2] == pytest.approx(0.8)  # lower median
    r[1, 2] = np.nan  # a dead head is never an example
    picks = select_heads(make_decomposition(r_layer_head=r))
    assert picks["worst"][:2] == (0, 1)


def test_example_maps_are_the_true_logits_and_method_a(examples):
    qk = make_qk()
    for name in examples["example"].values:
        ex = examples.sel(example=name)
        layer, head = int(ex.example_layer), int(ex.example_head)
        q = torch.from_numpy(qk["q"].values[0, layer, head])
        k = torch.from_numpy(qk["k"].values[0, layer, qk["kv_group"].values[head]])
        w_true = logits(q, k, torch.from_numpy(qk["inv_freq"].values[layer]), float(qk["scaling"][layer]))
        keep = causal_mask(32).numpy()
        keep[:, 0] = False
        np.testing.assert_allclose(ex["W"].values[keep], w_true.numpy()[:32, :32][keep], rtol=1e-4, atol=1e-5)
        assert np.isnan(ex["W"].values[~keep]).all()
        # f at the real distance against the mean key: with this kbar, f + exact remainder = W
        kbar = k[1:].mean(0)
        f_true = logits(
            q, kbar.expand_as(k), torch.from_numpy(qk["inv_freq"].values[layer]), float(qk["scaling"][layer])
        )
        np.testing.assert_allclose(ex["f"].values[keep], f_true.numpy()[:32, :32][keep], rtol=1e-4, atol=1e-5)
    assert examples["pool_W"].sizes == {"layer": 2, "head": 4, "pair": 200}
    assert np.isfinite(examples["pool_W"]).all() and np.isfinite(examples["pool_A"]).all()


def test_method_a_is_exact_when_key_deviations_do_not_rotate():
    """Deviations from kbar only in zero-frequency bands: f + g equals W exactly, so r = 1."""
    qk = make_qk(n_samples=1, sliding=(0, 12))
    inv = qk["inv_freq"].values.copy()
    inv[:, 2:] = 0.0  # bands 2, 3 never rotate
    k = qk["k"].values.copy()
    k[..., [0, 1, 4, 5]] = k[..., :1, [0, 1, 4, 5]]  # rotating bands (dims l, l + 4) identical over tokens
    qk = qk.assign(inv_freq=(("layer", "band"), inv), k=(qk["k"].dims, k))
    ex = example_heads(qk, make_decomposition(), map_tokens=40, pool_pairs=300)
    np.testing.assert_allclose(ex["pool_A"], ex["pool_W"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((ex["f"] + ex["g"]).values, ex["W"].values, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ex["example_r_sample"], 1.0, atol=1e-5)
    # drawn entries are scored ones: causal, never the sink, inside layer 1's window of 12
    i, j = ex["pool_query"].values, ex["pool_key"].values
    assert (j >= 1).all() and (j <= i).all()
    assert (i[0] - j[0]).max() > 11 and (i[1] - j[1]).max() <= 11
    assert len({(a, b) for a, b in zip(i[1], j[1])}) == 300  # drawn without replacement


def test_missing_variable_is_named():
    with pytest.raises(KeyError, match="perturb.nc: missing ppl_ratio"):
        llm.fig_perturb_ppl(make_perturb().drop_vars("ppl_ratio"))
    with pytest.raises(KeyError, match="summary.csv: missing column"):
        reproduction.reproduction_table(make_summary_csv().drop(columns="pooled_r_hi"))


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_agreement():
    x = xr.DataArray(np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0], [4.0, 5.0]]), dims=("sample", "k"))
    mean, lo, hi = bootstrap_mean(x, "sample", n_boot=2000, seed=1)
    np.testing.assert_allclose(mean, [2.5, 5.0])
    assert lo[0] < 2.5 < hi[0] and 1.0 <= lo[0] and hi[0] <= 4.0
    assert lo[1] == hi[1] == 5.0  # identical samples: zero-width interval


def test_reproduction_table_puts_paper_value_beside_ours():
    table = reproduction.reproduction_table(make_summary_csv())
    assert len(table) == len(VARIANTS) * 4
    assert list(table["variant"].iloc[::4]) == VARIANTS  # trained first, then seeds in order
    assert (table["paper_r"] == 0.959).all()
    trained = table[(table.variant == "trained") & (table.method == "A") & (table.sink == "without")].iloc[0]
    assert trained["mean_r_minus_paper"] == pytest.approx(0.9 - 0.959)
    md = reproduction.reproduction_markdown(table, provenance={"config_hash": "abc"})
    row = "| tiny | trained | A | without | 0.959 | 0.900 [0.880, 0.910] | 0.910 [0.890, 0.920] | -0.059 | -0.049 |"
    assert row in md
    assert md.count("\n| tiny |") == len(table)
    assert "config_hash=abc" in md


def test_example_r_matches_the_decomposition_of_that_sample(examples):
    """The maps' r (Method A, sink dropped, default D) is the decomposition's r of that (sample, layer, head)."""
    from posgen.decomposition import METHODS, SINKS, Decomposer
    from posgen.store import read_rope

    qk = make_qk()
    decomposer = Decomposer(dummy_distances=[1000], dummy_distance=1000, device="cpu")
    for name in examples["example"].values:
        ex = examples.sel(example=name)
        layer, head = int(ex.example_layer), int(ex.example_head)
        stats = decomposer.unit(
            qk["q"].values[0, layer], qk["k"].values[0, layer], qk["kv_group"].values, read_rope(qk).layer(layer)
        )
        r = stats["r"][head, METHODS.index("A"), SINKS.index("without")]
        assert float(ex.example_r_sample) == pytest.approx(r, abs=1e-5)


def test_render_reads_the_workflow_files(examples, tmp_path):
    """Every figure from files laid out as the rules pass them, and the reproduction table from summary.csv."""
    from PIL import Image

    from posgen.store import write_netcdf

    files = {role: [] for role in ("decomposition", "bands", "perturb", "cap")}
    for i, variant in enumerate(VARIANTS):
        d = tmp_path / variant
        d.mkdir()
        for role, ds in [
            ("decomposition", make_decomposition(seed=i)),
            ("bands", make_bands(seed=i).isel(variant=i, drop=True)),
            ("perturb", make_perturb(seed=i).isel(variant=i, drop=True)),
            ("cap", make_cap(seed=i).isel(variant=i, drop=True)),
        ]:
            write_netcdf(ds, d / f"{role}.nc")
            files[role].append(d / f"{role}.nc")
    write_netcdf(examples, tmp_path / "examples.nc")
    write_netcdf(make_summary(), tmp_path / "summary.nc")
    inputs = {
        "logit_maps": {"examples": tmp_path / "examples.nc"},
        "scatter": {"examples": tmp_path / "examples.nc"},
        "layer_r": {"summary": tmp_path / "summary.nc"},
        "position_share": {"summary": tmp_path / "summary.nc"},
        "bands": {"bands": files["bands"]},
        "r_heatmap": {"decomposition": files["decomposition"]},
        "dummy_sweep": {"decomposition": files["decomposition"]},
        "perturb_ppl": {"perturb": files["perturb"]},
        "perturb_fg": {"perturb": files["perturb"]},
        "cap": {"cap": files["cap"]},
    }
    assert set(inputs) == FIRST_PAPER
    for name, role_paths in inputs.items():
        png, pdf = tmp_path / f"{name}.png", tmp_path / f"{name}.pdf"
        render(name, role_paths, png, pdf, variants=VARIANTS, n_boot=100, config_hash="abc")
        meta = Image.open(png).info
        assert json.loads(meta["Description"])["figure"] == name
        assert json.loads(meta["Description"])["config_hash"] == "abc"
        assert pdf.read_bytes()[:5] == b"%PDF-"
    with pytest.raises(ValueError, match="3 input files for 2 variants"):
        render("cap", inputs["cap"], tmp_path / "x.png", tmp_path / "x.pdf", variants=VARIANTS[:2])

    make_summary_csv().to_csv(tmp_path / "summary.csv", index=False)
    table = reproduction.write_reproduction(
        tmp_path / "summary.csv", tmp_path / "rep.csv", tmp_path / "rep.md", config_hash="abc"
    )
    back = pd.read_csv(tmp_path / "rep.csv")
    pd.testing.assert_frame_equal(
        back.drop(columns=["config_hash", "posgen_version"]), table, check_dtype=False, atol=1e-6
    )
    assert (back["config_hash"] == "abc").all()
    md = (tmp_path / "rep.md").read_text()
    assert md.startswith(
        reproduction.reproduction_markdown(
            table, provenance={"config_hash": "abc", "posgen_version": back["posgen_version"][0]}
        )
    )
    assert "## The random-init control under each construction" in md and "## Verdict per claim (Han & Ji" in md


def test_pooled_entries_equal_the_full_matrices_at_those_pairs():
    """The pair-wise shortcut of the pooled sample gives exactly rope.logits and method_a.method_a_terms."""
    from posgen.llm.method_a import method_a_terms

    qk = make_qk(n_samples=1, sliding=(0, 9))
    qk = qk.assign(attention_scaling=("layer", np.array([1.0, 1.3])))  # amplitude enters like the model's
    ex = example_heads(qk, make_decomposition(), map_tokens=8, pool_pairs=150)
    for layer in range(2):
        q = torch.from_numpy(qk["q"].values[0, layer])
        k = torch.from_numpy(qk["k"].values[0, layer])[torch.from_numpy(qk["kv_group"].values)]
        inv_freq = torch.from_numpy(qk["inv_freq"].values[layer])
        s, a = float(qk["scaling"][layer]), float(qk["attention_scaling"][layer])
        w = logits(q, k, inv_freq, s, a).numpy()
        f, g = (t.numpy() for t in method_a_terms(q, k, torch.arange(40), inv_freq, s, a, dummy_distance=1000))
        i, j = ex["pool_query"].values[layer], ex["pool_key"].values[layer]
        np.testing.assert_allclose(ex["pool_W"].values[layer], w[:, i, j], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ex["pool_A"].values[layer], (f + g)[:, i, j], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------- layer types


def typed_summary_csv():
    """summary.csv rows of a two-type model 'g' (rope, global, sliding) and a one-type model 'tiny' (rope)."""
    base = make_summary_csv()
    rows = []
    for layer_type, r, distance in (("rope", 0.7, "15/100"), ("global", 0.95, "100"), ("sliding", 0.6, "15")):
        part = base[base.variant == "trained"].assign(model="g", layer_type=layer_type, mean_r=r)
        part["dummy_distance"] = np.where(part.method == "A", distance, "")
        rows.append(part)
    tiny = base.assign(layer_type="rope", dummy_distance=np.where(base.method == "A", "100", ""))
    return pd.concat([tiny] + rows[::-1], ignore_index=True)


def test_reproduction_table_has_one_row_per_layer_type_with_its_distance(tmp_path):
    typed_summary_csv().to_csv(tmp_path / "summary.csv", index=False)
    table = reproduction.write_reproduction(tmp_path / "summary.csv", tmp_path / "rep.csv", tmp_path / "rep.md")
    g = table[table.model == "g"]
    assert g["layer_type"].tolist() == ["global"] * 4 + ["sliding"] * 4  # no 'rope' row beside the types
    assert g["dummy_distance"].tolist() == ["100", "100", "", "", "15", "15", "", ""]
    np.testing.assert_allclose(g["mean_r"], [0.95] * 4 + [0.6] * 4)
    tiny = table[table.model == "tiny"]
    assert (tiny["layer_type"] == "rope").all() and len(tiny) == len(VARIANTS) * 4
    md = (tmp_path / "rep.md").read_text()
    assert "| g | trained | A | without | 0.959 | 0.600 [0.880, 0.910] |" in md
    assert md.count("| sliding | 15 |") == 2 and md.count("| global | 100 |") == 2
    assert "min(D, window - 1)" in md
    back = pd.read_csv(tmp_path / "rep.csv", keep_default_na=False, dtype={"dummy_distance": str})
    assert back["dummy_distance"].tolist() == table["dummy_distance"].tolist()


def with_layer_types(x, types, used):
    return x.assign_coords(layer_type=("layer", types), dummy_distance_used=("layer", used))


def test_dummy_sweep_shows_layer_types_apart():
    sweep = xr.concat(
        [
            with_layer_types(make_decomposition(seed=i, n_layers=3), ["sliding", "global", "nope"], [250, 1000, 1000])
            for i in range(2)
        ],
        dim=pd.Index(VARIANTS[:2], name="variant"),
    )["r_sweep"]
    fig = llm.fig_dummy_sweep(sweep, n_boot=50)
    axes = panels(fig)
    assert len(axes) == 3 * 2  # (global, sliding, nope) x sinks
    titles = [ax.get_title() for ax in axes]
    assert titles[:2] == ["global layers, sink with", "global layers, sink without"] and titles[4].startswith("nope")
    # each row averages its own layers only: sliding = layer 0
    want = sweep.isel(layer=0).sel(variant="trained", sink="with").mean(["sample", "head"]).values
    trained = [line for line in axes[2].lines if line.get_label() == "trained"][0]
    np.testing.assert_allclose(trained.get_ydata(), want)

    # the D used: a dotted line at 250 on the sliding row, 1000 on the global row, none for NoPE
    def vlines(ax):
        return [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == ":"]

    assert vlines(axes[2]) == [250] and vlines(axes[0]) == [1000] and vlines(axes[4]) == []
    plt.close(fig)


def test_position_share_draws_each_variant_basis_and_vector():
    summary = make_summary()
    fig = llm.fig_position_share(summary)
    ax = fig.axes[1]  # sink 'with', keys
    lines = {line.get_label(): line for line in ax.get_lines()}
    for variant in VARIANTS:
        for basis in ("smooth", "linear"):
            want = summary["layer_position_share"].sel(variant=variant, vector="k", basis=basis, sink="with")
            np.testing.assert_allclose(lines[f"{variant} ({basis})"].get_ydata(), want)
    plt.close(fig)


def test_heatmap_and_layer_r_mark_sliding_and_nope_layers():
    r = xr.concat(
        [make_decomposition(seed=i, n_layers=3)["r"].sel(sink="without").mean("sample") for i in range(2)],
        dim=pd.Index(VARIANTS[:2], name="variant"),
    )
    fig = llm.fig_r_heatmap(with_layer_types(r, ["sliding", "global", "nope"], [250, 1000, 1000]))
    ax = panels(fig)[0]
    marks = {line.get_label(): line.get_ydata().tolist() for line in ax.lines}
    assert marks == {"sliding-window layer": [0], "NoPE layer": [2]}
    plt.close(fig)
    summary = make_summary(n_layers=4)
    summary = with_layer_types(summary, ["sliding", "sliding", "global", "nope"], [250, 250, 1000, 1000])
    fig = llm.fig_layer_r(summary)
    ax = panels(fig)[0]
    assert len(ax.patches) == 3  # one shaded span per sliding / NoPE layer
    labels = [p.get_label() for p in ax.patches if p.get_label() and not p.get_label().startswith("_")]
    assert sorted(labels) == ["NoPE layer", "sliding-window layer"]  # one legend entry per type
    plt.close(fig)


def test_bands_figure_leaves_unrotated_bands_out():
    """A NoPE layer (theta 0 everywhere) with huge values must not move the medians of the rotated bands."""
    bands = make_bands(n_layers=3)
    theta = bands["theta"].values.copy()
    theta[:, 2] = 0.0  # layer 2: NoPE
    q_var = bands["q_var"].values.copy()
    q_var[:, 2] = 1e6
    bands = bands.assign(theta=(bands["theta"].dims, theta), q_var=(bands["q_var"].dims, q_var))
    fig = llm.fig_bands(bands)
    ax = panels(fig)[1]  # q: token variance
    trained = [line for line in ax.lines if line.get_label() == "trained"][0]
    want = np.median(bands["q_var"].sel(variant="trained").isel(layer=[0, 1]).values, axis=(0, 1))[:-1]
    np.testing.assert_allclose(trained.get_ydata(), want)  # band 7 (theta 0 in every layer) is off the log axis
    np.testing.assert_allclose(trained.get_xdata(), theta[0, 0, :-1])
    plt.close(fig)


def test_example_heads_use_each_layers_dummy_distance():
    """Layer 1 is a sliding layer scored at D = 11: the pooled f + g there is Method A at D = 11, not 1000."""
    from posgen.llm.method_a import method_a_terms

    qk = make_qk(n_samples=1, sliding=(0, 12))
    dec = with_layer_types(make_decomposition(), ["global", "sliding"], [1000, 11])
    ex = example_heads(qk, dec, map_tokens=8, pool_pairs=100)
    assert ex["dummy_distance_used"].values.tolist() == [1000, 11]
    q = torch.from_numpy(qk["q"].values[0, 1])
    k = torch.from_numpy(qk["k"].values[0, 1])[torch.from_numpy(qk["kv_group"].values)]
    inv_freq = torch.from_numpy(qk["inv_freq"].values[1])
    s = float(qk["scaling"][1])
    i, j = ex["pool_query"].values[1], ex["pool_key"].values[1]
    for D, close in ((11, True), (1000, False)):
        f, g = (t.numpy() for t in method_a_terms(q, k, torch.arange(40), inv_freq, s, dummy_distance=D))
        same = np.allclose(ex["pool_A"].values[1], (f + g)[:, i, j], rtol=1e-4, atol=1e-5)
        assert same == close, D


def test_deposit_study_figure_shows_every_point():
    from posgen.figures.synthetic import fig_deposit_study

    rows = [  # one head carrying layer 0, and a layer whose second head matters nearly as much as its top one
        dict(experiment="e", task="distance", pe="rope", seed=0, layer=0, top_drop=0.72, second_drop=0.01),
        dict(experiment="e", task="distance", pe="rope", seed=0, layer=1, top_drop=0.72, second_drop=0.49),
        dict(experiment="e", task="count", pe="nope", seed=0, layer=0, top_drop=-0.01, second_drop=-0.02),
    ]
    fig = fig_deposit_study(pd.DataFrame(rows))
    ax = fig.axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert x0 < -1 and x1 > 72 and y0 < -2 and y1 > 49  # no point on or beyond an edge
    plt.close(fig)


def test_regime_study_figure_draws_both_brackets():
    from posgen.figures.synthetic import fig_regime_study

    rows = []
    for steps, longest, faithful, lr in (
        (330, 17, False, 6e-3),
        (3300, 17, False, 6e-3),
        (990, 17, False, 1e-3),
        (990, 17, False, 6e-3),
        (990, 71, False, 6e-3),
        (990, 71, True, 6e-3),
    ):
        for seed in range(2):
            rows.append(
                dict(
                    task="distance",
                    pe="rope+sinusoidal",
                    seed=seed,
                    train_steps=steps,
                    longest_distance=longest,
                    faithful=faithful,
                    lr=lr,
                    test_accuracy=0.5 + steps / 10000,
                    layer0_top_drop=0.4,
                    layer0_second_drop=0.02,
                    converged=seed == 0,
                )
            )
    fig = fig_regime_study(pd.DataFrame(rows))
    left, right = fig.axes[0], fig.axes[1]
    assert len(left.lines) == 2  # two learning rates at the shortest distance, clean
    assert sorted(left.lines[0].get_xdata()) == [990]  # lr 1e-3 has one budget
    assert list(left.lines[1].get_xdata()) == [330, 990, 3300]
    assert len(right.lines) == 2 and list(right.lines[0].get_xdata()) == [17, 71]  # clean: both distances at 990
    assert list(right.lines[1].get_xdata()) == [71]  # faithful
    plt.close(fig)
