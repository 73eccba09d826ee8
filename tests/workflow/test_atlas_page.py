"""The head atlas of the tiny end-to-end run (results/atlas.html) in headless Chromium, driven by Playwright: it
loads from the file with no console error and no network request, the statistic menu recolours the grid with the
numbers of heads.parquet, and a clicked head shows the numbers of decomposition.nc. Also: which settings rerun it."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from posgen.atlas import browser
from posgen.atlas.page import SINK
from posgen.testing.runs import WorkflowRun

pytestmark = pytest.mark.skipif(bool(browser.missing()), reason=browser.missing() or "browser present")


@pytest.fixture(scope="module")
def atlas(tiny_workflow):
    results = tiny_workflow.workdir / "results"
    config = yaml.safe_load(tiny_workflow.configfile.read_text())
    return results, config["models"][0]["name"]


def test_the_page_loads_offline_recolours_and_shows_a_clicked_heads_numbers(atlas):
    results, model = atlas
    page_path = results / "atlas.html"
    assert page_path.stat().st_size < 15e6
    heads = pd.read_parquet(results / "heads.parquet")
    with browser.opened(page_path) as s:
        page = s.page
        assert s.console_errors == []
        assert s.requests == [page_path.resolve().as_uri()]  # plotly.js and the data are inlined: nothing fetched
        # the statistic menu: the grid's first heatmap (trained) shows the chosen statistic of heads.parquet
        page.select_option("#stat", "f_share")
        shown = np.array(browser.grid_z(page, model)[0], dtype=float)
        want = heads.query("variant == 'trained' and method == 'A' and sink == @SINK").pivot(
            index="layer", columns="head", values="f_share"
        )
        np.testing.assert_allclose(shown, want.to_numpy(), atol=5e-5, equal_nan=True)  # 4 decimals on the page
        page.select_option("#stat", "r_B")
        recoloured = np.array(browser.grid_z(page, model)[0], dtype=float)
        assert not np.allclose(recoloured, shown, equal_nan=True)
        # trained minus random init
        page.select_option("#view", "diff")
        assert page.is_visible(f"#grid-{model}-diff") and not page.is_visible(f"#grid-{model}-side")
        r_b = heads.query("method == 'B' and sink == @SINK").pivot_table(
            index=["variant", "layer"], columns="head", values="r"
        )
        diff = np.array(browser.grid_z(page, model, "diff")[0], dtype=float)
        np.testing.assert_allclose(diff, (r_b.loc["trained"] - r_b.loc["random-seed0"]).to_numpy(), atol=1e-4)
        page.select_option("#view", "side")
        # a click on (layer 1, head 2) of the random-init grid shows that head's numbers
        layer, head = 1, 2
        browser.click_head(page, model, 1, layer, head)
        assert page.inner_text("#detail-title") == f"{model} random-seed0, layer {layer}, head {head}"
        numbers = browser.detail_numbers(page)
        assert s.console_errors == []
    dec = xr.open_dataset(results / model / "random-seed0" / "decomposition.nc", engine="h5netcdf")
    for stat, method in (("r_A", "A"), ("r_B", "B")):
        r = float(dec["r"].sel({"layer": layer, "head": head, "method": method, "sink": SINK}).mean("sample"))
        assert numbers[stat][0] == f"{r:.4f}", stat
    r2_f, r2_g = (
        float(dec[v].sel({"layer": layer, "head": head, "method": "A", "sink": SINK}).mean("sample"))
        for v in ("r2_f", "r2_g")
    )
    assert numbers["f_share"][0] == f"{r2_f / (r2_f + r2_g):.4f}"
    # its rank among the variant's heads on Method A r
    every = dec["r"].sel({"method": "A", "sink": SINK}).mean("sample").values
    rank = int((every > every[layer, head]).sum()) + 1
    assert numbers["r_A"][1] == f"{rank} of {every.size}"


def test_the_verdict_rows_link_to_heads_and_classifiers(atlas):
    results, model = atlas
    with browser.opened(results / "atlas.html") as s:
        links = s.page.query_selector_all("a.heads-link")
        assert links and all(model in link.inner_text() for link in links)
        classifier_links = s.page.query_selector_all("a.classifier-link")
        assert classifier_links
        first = classifier_links[0]
        key = first.get_attribute("data-classifier")
        first.click()
        assert s.page.input_value("#classifier") == key
        model_link = links[-1]
        shown_model, stat = model_link.get_attribute("data-heads").split("|")
        model_link.click()
        assert (s.page.input_value("#model"), s.page.input_value("#stat")) == (shown_model, stat)
        assert s.console_errors == []


def test_a_setting_reruns_the_atlas_only_through_what_it_reads(tiny_workflow, tmp_path):
    """figures.map_tokens (read through examples.nc) reruns the page but not the tables; trajectory settings (read
    by nothing of `make run`) rerun nothing."""

    def planned(change: dict) -> set[str]:
        config = yaml.safe_load(tiny_workflow.configfile.read_text())
        for dotted, value in change.items():
            section, key = dotted.split(".")
            config.setdefault(section, {})[key] = value
        configfile = tmp_path / f"{'-'.join(change)}.yaml"
        configfile.write_text(yaml.safe_dump(config))
        run = WorkflowRun(tiny_workflow.workdir, configfile)
        out = run.snakemake("-n", "--quiet", "rules", "--cores", "1").stdout
        return set(re.findall(r"^(\w+)\s+\d+$", out, flags=re.M))

    changed = planned({"figures.map_tokens": 24})
    assert {"examples", "atlas"} <= changed and not {"heads", "classifier_heads"} & changed
    assert not {"examples", "atlas", "heads"} & planned({"trajectory.sensitivity_rates": [0.1]})
