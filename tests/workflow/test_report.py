"""The Snakemake report of the tiny end-to-end run holds every figure and renders in headless Chromium."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from posgen.config import variants as config_variants
from posgen.workflow.figures import of_group

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WINDOW = (1400, 1000)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")


def expected_figures(config: dict, name: str | None = None) -> list[str]:
    """The PNGs of every figure of the table (or of figure ``name``) for ``config``'s models and variants."""
    values = {"model": [m["name"] for m in config["models"]], "variant": config_variants(config)}
    return [path for row in of_group("all") if name in (None, row.name) for path in row.paths(values)]


def report_json(html: str, var: str) -> dict:
    """A JSON object the report embeds as ``var <var> = {...};``."""
    match = re.search(rf"var {var} = (\{{.*?\}});\n", html)
    assert match, f"report has no '{var}' table"
    return json.loads(match.group(1))


def chromium(page: Path, profile: Path, *args: str) -> str:
    """Run headless Chromium on ``page`` (scripts get a few seconds of virtual time); its stdout."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--virtual-time-budget=10000",
        *args,
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"chromium failed: {proc.stderr[-2000:]}"
    return proc.stdout


def screenshot(page: Path, png: Path, profile: Path) -> np.ndarray:
    """Grey pixels of a screenshot of ``page``."""
    chromium(page, profile, f"--screenshot={png}")
    return np.asarray(Image.open(png).convert("L"), dtype=float)


def inject(html: str, script: str) -> str:
    cut = html.rfind("</body>")
    return html[:cut] + f"<script>{script}</script>" + html[cut:]


def show(path_js: str) -> str:
    """JS that opens the result named by the JS expression ``path_js`` the way the report's eye button does."""
    return f"app.setView({{content: 'img', contentPath: results[{path_js}].data_uri, resultPath: {path_js}}});"


# Opens every figure in turn and records the <img> the report app rendered for it: natural size once decoded.
CHECK_ALL = """
window.addEventListener('load', async () => {
  const sleep = ms => new Promise(done => setTimeout(done, ms));
  for (let i = 0; i < 100 && typeof app === 'undefined'; i++) { await sleep(50); }  // the app mounts after load
  const seen = {};
  for (const path of PATHS) {
    SHOW
    let img;
    for (let i = 0; i < 40 && !(img && img.complete && img.naturalWidth); i++) {
      await sleep(50);
      img = [...document.querySelectorAll('img')].find(i => i.getAttribute('src') === results[path].data_uri);
    }
    seen[path] = img ? [img.naturalWidth, img.naturalHeight] : null;
  }
  const pre = document.createElement('pre');
  pre.id = 'posgen-check';
  pre.textContent = JSON.stringify(seen);
  document.body.appendChild(pre);
});
"""


def is_blank(pixels: np.ndarray) -> bool:
    """Nearly one colour: under 1 % of pixels differ from the most common grey level by more than 8."""
    values, counts = np.unique(pixels.round(), return_counts=True)
    background = values[counts.argmax()]
    return (np.abs(pixels - background) > 8).mean() < 0.01


@pytest.fixture(scope="module")
def report(tiny_workflow, tmp_path_factory):
    """(report.html, the run's config, a scratch dir, the run's working dir)."""
    out = tmp_path_factory.mktemp("report")
    html = out / "report.html"
    tiny_workflow.snakemake("--report", str(html))
    config = yaml.safe_load(tiny_workflow.configfile.read_text())
    return html, config, out, tiny_workflow.workdir


def test_report_lists_every_figure_with_caption(report):
    html, config, _, workdir = report
    text = html.read_text()
    results = report_json(text, "results")
    categories = report_json(text, "categories")
    expected = expected_figures(config)
    # the Snakefile's global `report: "report/workflow.rst"` is the landing page, rendered with the config
    desc = re.search(r'workflow_desc = (".*?");\n', text)
    assert desc and "Position Generalization" in json.loads(desc.group(1)), "workflow overview missing"
    assert all(m["name"] in json.loads(desc.group(1)) for m in config["models"])
    missing = [p for p in expected if p not in results]
    assert not missing, f"figures missing from the report: {missing}"
    assert "results/reproduction.csv" in results
    filed = {p for sub in categories.values() for paths in sub.values() for p in paths}
    assert set(expected) <= filed  # each figure sits in a category of the menu
    for row in of_group("all"):  # the one its table row names
        in_category = {p for paths in categories[row.category].values() for p in paths}
        assert set(expected_figures(config, row.name)) <= in_category, row.name
    for path in expected:
        entry = results[path]
        assert entry["mime_type"] == "image/png", path
        caption = re.sub(r"<[^>]+>", "", entry["caption"]).strip()
        assert len(caption) > 80, f"{path}: caption too short: {caption!r}"
        assert "{{" not in caption, f"{path}: unrendered template"
        png = base64.b64decode(entry["data_uri"].split("base64,", 1)[1])
        pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)
        assert not is_blank(pixels), f"{path}: blank figure"
        # the embedded figure is the file the workflow wrote
        assert png == (workdir / path).read_bytes(), f"{path}: report holds a different file"


def test_report_embeds_the_atlas_with_its_caption(report):
    html, _, _, workdir = report
    entry = report_json(html.read_text(), "results")["results/atlas.html"]
    assert entry["mime_type"] == "text/html"
    assert re.sub(r"<[^>]+>", "", entry["caption"]).startswith("Head atlas.")
    page = base64.b64decode(entry["data_uri"].split("base64,", 1)[1])
    assert page == (workdir / "results" / "atlas.html").read_bytes()  # the page the workflow wrote, whole


def test_report_renders_in_chromium(report):
    html, config, out, workdir = report
    text = html.read_text()
    profile = out / "chromium-profile"
    expected = expected_figures(config)

    landing = screenshot(html, out / "landing.png", profile)
    assert not is_blank(landing), "the report's landing page renders blank"

    # the report app itself displays every figure, decoded at the size the workflow drew it
    page = out / "check.html"
    page.write_text(inject(text, CHECK_ALL.replace("PATHS", json.dumps(expected)).replace("SHOW", show("path"))))
    dom = chromium(page, profile, "--dump-dom")
    match = re.search(r'<pre id="posgen-check">(.*?)</pre>', dom, re.S)
    assert match, "the report's scripts did not run to the end"
    seen = json.loads(match.group(1).replace("&quot;", '"'))
    for path in expected:
        size = Image.open(workdir / path).size
        assert seen.get(path) == list(size), f"{path}: shown as {seen.get(path)}, file is {size}"

    # and what it shows is not blank: the content pane right of the navigation bar, one figure at a time
    navbar = int(WINDOW[0] * 0.3)
    for i, path in enumerate(expected):
        page = out / f"view-{i}.html"
        opener = f"window.addEventListener('load', () => setTimeout(() => {{ {show(json.dumps(path))} }}, 50));"
        page.write_text(inject(text, opener))
        content = screenshot(page, out / f"view-{i}.png", profile)[:, navbar:]
        assert not is_blank(content), f"{path}: the report shows a blank pane"
        changed = (np.abs(content - landing[:, navbar:]) > 8).mean()
        assert changed > 0.05, f"{path}: the pane still shows the landing page"
