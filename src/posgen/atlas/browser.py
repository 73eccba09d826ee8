"""The atlas page in headless Chromium, through Playwright driving the system's Chromium (no browser download):
what the browser test checks (console errors, network requests, recolouring, a clicked head's numbers) and the
README's screenshot (``python -m posgen.atlas.browser results/atlas.html docs/atlas.png``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
INSTALL_HINT = "apt-get install chromium; .venv/bin/pip install playwright (it drives the system Chromium)"
WINDOW = {"width": 1400, "height": 1000}
CLIP = 1180  # the screenshot's height (pixels from the top)


def missing() -> str:
    """Why the browser cannot run here ('' where it can)."""
    if not Path(CHROMIUM).exists():
        return f"chromium is not installed ({INSTALL_HINT})"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return f"playwright is not installed ({INSTALL_HINT})"
    return ""


@dataclasses.dataclass
class Session:
    page: object  # playwright.sync_api.Page
    console_errors: list[str]
    requests: list[str]


@contextlib.contextmanager
def opened(html: str | Path, timeout_ms: int = 60_000):
    """A :class:`Session` on the page ``html``, loaded and ready (the page sets ``body[data-ready]``), recording
    console errors, page errors and every request the page makes."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport=WINDOW)
            session = Session(page, [], [])
            page.on("console", lambda m: session.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda err: session.console_errors.append(str(err)))
            page.on("request", lambda request: session.requests.append(request.url))
            page.goto(Path(html).resolve().as_uri(), timeout=timeout_ms)
            page.wait_for_selector("body[data-ready='1']", timeout=timeout_ms)
            yield session
        finally:
            browser.close()


def grid_z(page, model: str, view: str = "side") -> list:
    """The z of every heatmap of a model's grid as the browser holds it."""
    return page.evaluate(f"document.getElementById('grid-{model}-{view}').data.map((t) => t.z)")


def click_head(page, model: str, trace: int, layer: int, head: int, view: str = "side") -> None:
    """Click the cell (layer, head) of heatmap ``trace`` of a model's grid with the mouse, at the pixel plotly draws
    it at."""
    x, y = page.evaluate(
        """([div, trace, layer, head]) => {
          const gd = document.getElementById(div);
          const t = gd._fullData[trace];
          const xa = gd._fullLayout[t.xaxis.replace('x', 'xaxis')], ya = gd._fullLayout[t.yaxis.replace('y', 'yaxis')];
          const box = gd.querySelector('.nsewdrag[data-subplot="' + t.xaxis + t.yaxis + '"]').getBoundingClientRect();
          return [box.left + xa.l2p(head) , box.top + ya.l2p(layer)];
        }""",
        [f"grid-{model}-{view}", trace, layer, head],
    )
    page.mouse.click(x, y)
    page.wait_for_function(
        "(want) => document.getElementById('detail-title').dataset.head === want",
        arg=f"{model}|{page.evaluate(f'atlas.data.variants[{model!r}][{trace}]') if view == 'side' else 'trained'}"
        f"|{layer}|{head}",
    )


def detail_numbers(page) -> dict[str, tuple[str, str]]:
    """{statistic key: (value text, rank text)} of the head detail's table."""
    rows = page.query_selector_all("#detail-numbers tr[data-stat]")
    return {
        row.get_attribute("data-stat"): (
            row.query_selector(".value").inner_text(),
            row.query_selector(".rank").inner_text(),
        )
        for row in rows
    }


def screenshot(html: str | Path, png: str | Path, model: str | None = None, layer: int = 0, head: int = 0) -> None:
    """A PNG of the top of the atlas with head (layer, head) of the model's first variant clicked."""
    with opened(html) as s:
        model = model or s.page.evaluate("atlas.data.models[0]")
        click_head(s.page, model, 0, layer, head)
        s.page.evaluate("window.scrollTo(0, 0)")
        # the grids and the clicked head's numbers, sweep and band profile
        s.page.screenshot(
            path=str(png), full_page=True, clip={"x": 0, "y": 0, "width": WINDOW["width"], "height": CLIP}
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html")
    parser.add_argument("png")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--head", type=int, default=0)
    args = parser.parse_args(argv)
    why = missing()
    if why:
        raise SystemExit(why)
    screenshot(args.html, args.png, layer=args.layer, head=args.head)


if __name__ == "__main__":
    main()
