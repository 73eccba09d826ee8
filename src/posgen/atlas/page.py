"""results/atlas.html: one self-contained page per run (plotly.js inlined once, no server, no network) built from
the run's per-head tables (posgen.atlas.tables) and NetCDF files.

* per model, a layers x heads grid of every variant side by side, or trained minus each random-init seed, coloured
  by the statistic chosen in a menu (sink "without", as the block swap and the head ablation read); hover gives
  the head's number and its 95 % interval over windows;
* clicking a head shows its numbers with their intervals and its rank on every statistic, its D sweep, the band
  profile of its queries and keys, and, for the example heads of examples.nc, the example window's W, f, g and
  W - f - g over the first MAP_TOKENS tokens;
* per classifier of the second paper (grouped by experiment and PE), its layer x head ablation drops beside its
  learning curves;
* both papers' verdict tables (from results/verdicts.csv), each row linked to the heads or classifiers it was decided on.

Size: plotly.js (about 4.7 MB) once, then per model variant the numbers of every head and statistic, band profile
and D sweep (about 1.2 kB per head), 2 example heads' maps per variant (4 x MAP_TOKENS^2 float32 values each) and
one small figure per classifier: the page grows with heads x variants, never with windows or tokens
(docs/data-model.md, "The head atlas").
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from string import Template

import numpy as np
import pandas as pd

from posgen.atlas.tables import CLASSIFIER_KEYS, HEAD_KEYS
from posgen.atlas.verdicts import verdict_rows
from posgen.claims import VERDICT_COLUMNS
from posgen.parquet import read_table
from posgen.paths import owner
from posgen.store import atomic_path, open_dataset, provenance, require
from posgen.workflow.job import listed
from posgen.workflow.steps import STEPS

SINK = "without"  # the grid's sink (heads.parquet has both)
MAP_TOKENS = 96  # the example maps' token range: bounds their size whatever figures.map_tokens is
DIGITS = 4  # decimals kept of every number on the page (the tables keep full precision)
HEIGHT = 420  # pixels of a grid figure


def statistics(heads: pd.DataFrame) -> dict[str, tuple[str, str, str]]:
    """{key: (menu label, heads.parquet column, the method whose rows hold it)} of the grid's menu: every step's
    per-head columns (posgen.workflow.steps: ``head_columns``) in the steps' order, those ``heads`` has."""
    stats = {}
    for step in STEPS.values():
        for declared in step.head_columns:
            prefix = declared.column.removesuffix("*")
            columns = (
                sorted(c for c in heads.columns if c.startswith(prefix)) if prefix != declared.column else [prefix]
            )
            for column in columns:
                label = declared.label.format(suffix=column.removeprefix(prefix))
                stats[declared.key or column] = (label, column, declared.method)
    methods = set(heads["method"])
    return {k: v for k, v in stats.items() if v[1] in heads.columns and v[2] in methods}


def _rounded(values) -> list:
    """A list with NaN as None (JSON null) and DIGITS decimals."""
    values = np.asarray(values, dtype=np.float64)
    return [None if not np.isfinite(v) else round(float(v), DIGITS) for v in values.ravel()]


def _grid(frame: pd.DataFrame, column: str, shape) -> np.ndarray:
    values = np.full(shape, np.nan)
    if column in frame:
        values[frame["layer"].to_numpy(), frame["head"].to_numpy()] = frame[column].to_numpy(np.float64)
    return values


def _with_spread(heads: pd.DataFrame) -> pd.DataFrame:
    sweep = [c for c in heads.columns if c.startswith("r_sweep_d")]
    if sweep:
        heads = heads.assign(r_sweep_spread=heads[sweep].max(axis=1) - heads[sweep].min(axis=1))
    return heads


def head_numbers(heads: pd.DataFrame, stats: dict) -> dict:
    """{model: {variant: {stat: [[value, lo, hi, rank], ...] per head, row-major (layer, head)}}}; rank 1 = the
    highest value among the variant's heads."""
    out = {}
    for (model, variant), frame in heads[heads["sink"] == SINK].groupby(["model", "variant"], sort=False):
        per_stat = {}
        for key, (_, column, method) in stats.items():
            rows = frame[frame["method"] == method].sort_values(["layer", "head"])
            value = rows[column].to_numpy(np.float64) if column in rows else np.full(len(rows), np.nan)
            lo = rows.get(column + "_lo", pd.Series(np.nan, index=rows.index)).to_numpy(np.float64)
            hi = rows.get(column + "_hi", pd.Series(np.nan, index=rows.index)).to_numpy(np.float64)
            order = pd.Series(value).rank(ascending=False, method="min").to_numpy()
            per_stat[key] = [_rounded(row) for row in np.stack([value, lo, hi, order], axis=1)]
        out.setdefault(model, {})[variant] = per_stat
    return out


def _heatmap(z, lo, hi, name):
    import plotly.graph_objects as go

    return go.Heatmap(
        z=z,
        customdata=np.stack([lo, hi], axis=-1),
        name=name,
        coloraxis="coloraxis",
        hovertemplate=f"{name}<br>layer %{{y}}, head %{{x}}<br>%{{z:.4f}} [%{{customdata[0]:.4f}}, "
        "%{customdata[1]:.4f}]<extra></extra>",
    )


def grid_figures(heads: pd.DataFrame, model: str, variants: list[str], stats: dict) -> dict:
    """The model's two grid figures, 'side' (every variant) and 'diff' (trained minus each random-init seed), at
    the first statistic; the page recolours them from its per-head numbers (``head_numbers``) when another is
    chosen, so that each number is on the page once."""
    from plotly.subplots import make_subplots

    mine = heads[(heads["model"] == model) & (heads["sink"] == SINK)]
    shape = (int(mine["layer"].max()) + 1, int(mine["head"].max()) + 1)
    controls = [v for v in variants if v != "trained"] if "trained" in variants else []
    label, column, method = next(iter(stats.values()))
    rows = mine[mine["method"] == method]
    grids = {
        v: [_grid(rows[rows["variant"] == v], c, shape) for c in (column, column + "_lo", column + "_hi")]
        for v in variants
    }
    traces = {
        "side": [_heatmap(*grids[v], f"{model} {v}: {label}") for v in variants],
        "diff": [
            _heatmap(grids["trained"][0] - grids[v][0], grids["trained"][0], grids[v][0], f"{model} trained - {v}")
            for v in controls
        ],
    }
    figures = {}
    for view, trace_list in traces.items():
        if not trace_list:
            continue
        titles = variants if view == "side" else [f"trained - {v}" for v in controls]
        fig = make_subplots(rows=1, cols=len(trace_list), subplot_titles=titles, shared_yaxes=True)
        for i, trace in enumerate(trace_list):
            fig.add_trace(trace, row=1, col=i + 1)
            fig.update_xaxes(title_text="head", row=1, col=i + 1)
        fig.update_layout(
            height=HEIGHT,
            margin={"t": 40, "b": 40, "l": 50, "r": 20},
            coloraxis={"colorscale": "RdBu" if view == "diff" else "Viridis", "colorbar": {"title": {"text": label}}},
            yaxis={"title": "layer"},
        )
        if view == "diff":
            fig.update_layout(coloraxis_cmid=0)
        figures[view] = fig
    return {"figures": figures, "controls": controls}


def _bare(fig) -> dict:
    """A figure's JSON without its layout template: the page holds plotly's default template once (``template``),
    not once per figure (about 9 kB each)."""
    out = fig.to_plotly_json()
    out["layout"].pop("template", None)
    return out


def map_figure(examples, index: int, title: str):
    """The example head's W, f, g and W - f - g over the first MAP_TOKENS queries and keys (NaN: not scored)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    n = min(MAP_TOKENS, examples.sizes["query"])
    parts = {name: examples[name].isel(example=index, query=slice(0, n), key=slice(0, n)).values for name in "Wfg"}
    parts["W - f - g"] = parts["W"] - parts["f"] - parts["g"]
    fig = make_subplots(rows=1, cols=4, subplot_titles=list(parts), shared_yaxes=True)
    for i, (name, values) in enumerate(parts.items()):
        z = values.astype(np.float32)  # sent as binary float32 (plotly's bdata): half of float64's bytes
        fig.add_trace(
            go.Heatmap(
                z=z,
                coloraxis="coloraxis",
                name=name,
                hovertemplate=f"{name}<br>query %{{y}}, key %{{x}}: %{{z:.3f}}<extra></extra>",
            ),
            row=1,
            col=i + 1,
        )
        fig.update_xaxes(title_text="key j", row=1, col=i + 1)
    fig.update_layout(
        title={"text": title, "font": {"size": 13}},
        height=330,
        margin={"t": 60, "b": 40, "l": 50, "r": 20},
        yaxis={"title": "query i", "autorange": "reversed"},
        coloraxis={"colorscale": "RdBu", "cmid": 0, "reversescale": True},
    )
    return fig


def example_maps(paths) -> dict:
    """{"model|variant|layer|head": figure} of every example head of every examples.nc."""
    out = {}
    for path in paths:
        model, variant = owner(path)
        examples = open_dataset(path, lazy=False)
        require(examples, ["W", "f", "g", "example_layer", "example_head"], str(path))
        for i, which in enumerate(examples["example"].values.tolist()):
            layer, head = int(examples["example_layer"].values[i]), int(examples["example_head"].values[i])
            key = f"{model}|{variant}|{layer}|{head}"
            title = (
                f"{model} {variant}, layer {layer} head {head} ({which} example head): "
                f"window {examples.attrs.get('sample', 0)}, first {min(MAP_TOKENS, examples.sizes['query'])} tokens, "
                f"sink {examples.attrs.get('sink', '')}"
            )
            out[key] = _bare(map_figure(examples, i, title))
    return out


def band_profiles(paths) -> dict:
    """{model: {variant: {"theta": per layer, "q": per (layer, head), "k": per (layer, kv_head), "group": query heads
    per KV head}}}: each band's share of the token variance of a head's queries and of a KV head's keys."""
    out = {}
    for path in paths:
        model, variant = owner(path)
        bands = open_dataset(path, lazy=False)
        require(bands, ["q_var", "k_var", "theta"], str(path))
        q = bands["q_var"].transpose("layer", "head", "band").values
        k = bands["k_var"].transpose("layer", "kv_head", "band").values
        with np.errstate(invalid="ignore", divide="ignore"):
            q_share, k_share = (v / v.sum(-1, keepdims=True) for v in (q, k))
        out.setdefault(model, {})[variant] = {
            "theta": [_rounded(t) for t in bands["theta"].transpose("layer", "band").values],
            "q": [_rounded(row) for row in q_share.reshape(-1, q.shape[-1])],
            "k": [_rounded(row) for row in k_share.reshape(-1, k.shape[-1])],
            "group": q.shape[1] // k.shape[1],  # query head h reads KV head h // group
        }
    return out


def detail_templates(sweep_d: list[int]) -> dict:
    """The empty band-profile and D-sweep figures the page fills for a clicked head."""
    import plotly.graph_objects as go

    bands = go.Figure(
        [go.Scatter(name="queries", mode="lines+markers"), go.Scatter(name="keys", mode="lines+markers")],
        layout={
            "title": {"text": "band profile: share of the token variance per band", "font": {"size": 13}},
            "xaxis": {"title": {"text": "RoPE frequency theta (rad / token)"}, "type": "log"},
            "yaxis": {"title": {"text": "share of variance"}},
            "height": 300,
            "margin": {"t": 40, "b": 50, "l": 60, "r": 20},
        },
    )
    sweep = go.Figure(
        [go.Scatter(x=sweep_d, name="Method A r", mode="lines+markers")],
        layout={
            "title": {"text": "D sweep: Method A r at each dummy distance D", "font": {"size": 13}},
            "xaxis": {"title": {"text": "D"}},
            "yaxis": {"title": {"text": "r"}},
            "height": 300,
            "margin": {"t": 40, "b": 50, "l": 60, "r": 20},
        },
    )
    return {"bands": _bare(bands), "sweep": _bare(sweep)}


def sweeps(heads: pd.DataFrame) -> tuple[list[int], dict]:
    """(the D values, {model: {variant: per head, layer-major, Method A's r at each D}})."""
    columns = sorted((c for c in heads.columns if c.startswith("r_sweep_d")), key=lambda c: int(c[9:]))
    rows = heads[(heads["sink"] == SINK) & (heads["method"] == "A")].sort_values(["layer", "head"])
    out = {}
    for (model, variant), frame in rows.groupby(["model", "variant"], sort=False):
        out.setdefault(model, {})[variant] = [_rounded(r) for r in frame[columns].to_numpy(np.float64)]
    return [int(c[9:]) for c in columns], out


def classifier_figures(classifiers: pd.DataFrame, training_path) -> tuple[list[dict], dict]:
    """(one dict per classifier: experiment, task, pe, seed, key; {key: figure}): its layer x head ablation drop
    (accuracy points) beside its learning curves."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    training = open_dataset(training_path, lazy=False) if training_path else None
    keys, figures = [], {}
    for (experiment, task, pe, seed), frame in classifiers.groupby(["experiment", "task", "pe", "seed"]):
        key = f"{experiment}|{task}|{pe}|{seed}"
        keys.append({"experiment": experiment, "task": task, "pe": pe, "seed": int(seed), "key": key})
        shape = (int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1)
        drop = _grid(frame, "drop", shape) * 100
        fig = make_subplots(rows=1, cols=2, subplot_titles=["ablation drop (accuracy points)", "learning curves"])
        fig.add_trace(
            go.Heatmap(
                z=np.round(drop, 2),
                colorscale="Viridis",
                colorbar={"x": 0.45, "title": {"text": "points"}},
                hovertemplate="layer %{y}, head %{x}: drop %{z:.2f} points<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.update_xaxes(title_text="head", row=1, col=1)
        fig.update_yaxes(title_text="layer", row=1, col=1)
        if training is not None:
            one = training.sel(experiment=experiment, task=task, pe=pe, seed=seed)
            for name in ("train_accuracy", "test_accuracy"):
                if name in one:
                    fig.add_trace(
                        go.Scatter(x=one["step"].values, y=np.round(one[name].values, 4), name=name, mode="lines"),
                        row=1,
                        col=2,
                    )
            fig.update_xaxes(title_text="epoch", row=1, col=2)
            fig.update_yaxes(title_text="accuracy", row=1, col=2)
        fig.update_layout(
            title={"text": f"{experiment} / {task} / {pe} / seed {seed}", "font": {"size": 13}},
            height=360,
            margin={"t": 60, "b": 40, "l": 50, "r": 20},
        )
        figures[key] = _bare(fig)
    return keys, figures


def verdict_tables(verdicts, models: list[str], classifiers: list[dict], stats: dict) -> tuple[str, dict]:
    """(both papers' verdict tables as HTML from results/verdicts.parquet, each row's last cell linking to the heads or
    classifiers it was decided on; {classifier key: [(row id, claim)]}, the rows each classifier decided)."""
    if not verdicts:
        return "<p>No verdicts table in this run.</p>", {}
    out, decided = [], {}
    for paper in verdict_rows(read_table(verdicts, columns=list(VERDICT_COLUMNS)), models, classifiers, stats):
        body = []
        for row in paper["rows"]:
            links = []  # followed by atlas.js: data-heads="model|statistic", data-classifier="key"
            for kind, target, text in row["links"]:
                if kind == "classifier":
                    decided.setdefault(target, []).append((row["id"], row["claim"]))
                section = "heads" if kind == "heads" else "classifiers"
                links.append(f"<a href='#{section}' class='{kind}-link' data-{kind}='{target}'>{text}</a>")
            cells = "".join(f"<td>{cell}</td>" for cell in row["cells"])
            body.append(f"<tr id='{row['id']}'>{cells}<td>{'<br>'.join(links)}</td></tr>")
        head = "".join(f"<th>{h}</th>" for h in ("claim", "test", "verdict", "evidence", "decided on"))
        out.append(f"<h3>{paper['title']}</h3><table class='verdicts'><tr>{head}</tr>{''.join(body)}</table>")
    return "\n".join(out), decided


def asset(name: str) -> str:
    """The text of one of the page's package files (posgen/atlas/assets): atlas.html, the page's skeleton with
    ``$name`` placeholders (string.Template); atlas.css, its style; atlas.js, its script."""
    return (resources.files("posgen.atlas") / "assets" / name).read_text(encoding="utf-8")


def _options(pairs, selected=None) -> str:
    return "".join(f"<option value='{v}'{' selected' if v == selected else ''}>{label}</option>" for v, label in pairs)


def _classifier_options(keys: list[dict]) -> str:
    """The classifier menu: one group per experiment and PE, one option per task and seed."""
    groups = {}
    for c in keys:
        groups.setdefault(f"{c['experiment']} / {c['pe']}", []).append(c)
    return "".join(
        f"<optgroup label='{label}'>"
        + _options((c["key"], f"{c['task']}, seed {c['seed']}") for c in members)
        + "</optgroup>"
        for label, members in groups.items()
    )


def _grid_divs(heads: pd.DataFrame, variants: dict, stats: dict) -> str:
    """Every model's grid figures (``grid_figures``) as HTML divs ``grid-{model}-{view}``."""
    import plotly.io as pio

    divs = []
    for model, names in variants.items():
        for view, fig in grid_figures(heads, model, names, stats)["figures"].items():
            divs.append(pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"grid-{model}-{view}"))
    return "".join(divs)


def _classifiers(classifier_path, training) -> tuple[list[dict], dict]:
    """``classifier_figures`` of the classifiers' table (none without one)."""
    classifiers = (
        read_table(classifier_path, columns=CLASSIFIER_KEYS)
        if classifier_path
        else pd.DataFrame(columns=["experiment"])
    )
    return classifier_figures(classifiers, training) if len(classifiers) else ([], {})


def page_data(heads: pd.DataFrame, stats: dict, variants: dict, classifiers, examples=(), bands=()) -> dict:
    """The numbers and figures the page's script reads (embedded as JSON, ``atlas-data``); ``classifiers``:
    (keys, figures, {key: verdict rows}) of ``classifier_figures`` and ``verdict_tables``."""
    import plotly.io as pio

    keys, figures, decided = classifiers
    models = list(variants)
    sweep_d, sweep = sweeps(heads)
    maps = example_maps(examples)
    return {
        "models": models,
        "variants": variants,
        "n_heads": {m: int(heads.loc[heads["model"] == m, "head"].max()) + 1 for m in models},
        "stat_keys": list(stats),
        "stat_labels": {k: v[0] for k, v in stats.items()},
        "heads": head_numbers(heads, stats),
        "sweep": sweep,
        "bands": band_profiles(bands),
        "maps": maps,
        "example_heads": sorted(maps),
        "templates": detail_templates(sweep_d),
        "classifiers": keys,
        "classifier_figures": figures,
        "classifier_verdicts": decided,
        "template": pio.templates["plotly"].to_plotly_json(),
    }


def build_page(heads_path, classifier_path=None, examples=(), bands=(), training=None, verdicts=None) -> str:
    """The atlas page's HTML: assets/atlas.html filled with the run's menus, grids, verdict tables and data, its
    style and script and plotly.js inlined (one offline file)."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    heads = _with_spread(read_table(heads_path, columns=HEAD_KEYS))
    stats = statistics(heads)
    models = list(dict.fromkeys(heads["model"]))
    variants = {m: list(dict.fromkeys(heads.loc[heads["model"] == m, "variant"])) for m in models}
    keys, figures = _classifiers(classifier_path, training)
    verdict_html, decided = verdict_tables(verdicts, models, keys, stats)
    data = page_data(heads, stats, variants, (keys, figures, decided), examples, bands)
    prov = provenance()
    return Template(asset("atlas.html")).substitute(
        posgen_version=prov["posgen_version"],
        config_hash=str(heads["config_hash"].iloc[0]) if "config_hash" in heads else "",
        created=prov["created"],
        sink=SINK,
        style=asset("atlas.css"),
        plotly_js=get_plotlyjs(),
        model_options=_options((m, m) for m in models),
        stat_options=_options((k, v[0]) for k, v in stats.items()),
        view_options=_options([("side", "variants side by side"), ("diff", "trained minus random init")]),
        grids=_grid_divs(heads, variants, stats),
        classifier_options=_classifier_options(keys),
        verdicts=verdict_html,
        data=pio.json.to_json_plotly(data).replace("</", "<\\/"),
        script=asset("atlas.js"),
    )


def write_page(out, **inputs) -> int:
    """Write the atlas page to ``out`` (atomically); its size in bytes."""
    page = build_page(**inputs)
    with atomic_path(out) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return len(page.encode())


def atlas_step(job) -> int:
    """Rule atlas' job: results/atlas.html from the run's tables."""
    i = job.input
    return write_page(
        job.output["atlas"],
        heads_path=i["heads"],
        classifier_path=i.get("classifier_heads"),
        examples=listed(i.get("examples", ())),
        bands=listed(i.get("bands", ())),
        training=i.get("training"),
        verdicts=i.get("verdicts"),
    )
