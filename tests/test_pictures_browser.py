"""The pictures as a reader sees them, in Debian's Chromium (headless, offline): the fabric SVG at the README's
width (800 px) and the HTML plan at 1,400 px, each screenshotted, and measured by a small script run in the page
(`--dump-dom` prints the DOM after it ran): every <text>'s box as the browser laid it out, with the font that
renders it, against points sampled every pixel along every edge. No label may touch a line; the page's
diagram must sit whole inside its frame (nothing cut off, nothing to scroll to); the README's summary diagram
must keep its text at least 9 px tall at 800 px.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import cluster_example
from test_report_browser import chromium, png_pixels

from gpucluster.report.diagram import fabric_svg, summary_svg
from gpucluster.report.html import plan_html

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="not run: Debian's chromium is not installed (scripts/setup.sh "
                       "installs it)"),
    pytest.mark.skipif(shutil.which("dot") is None, reason="not run: Graphviz's dot is not installed"),
]
EXAMPLE = "colossus-200k"
README_WIDTH = 800
PAGE_WIDTH = 1400
MIN_TEXT_PX = 9  # the README's diagram: the smallest text a reader reads without zooming

# Runs in the page: per diagram (keyed by its frame's id), every text's box and the edges' sampled points
# that fall in one, in CSS pixels of the page; and per frame whether its diagram sits whole inside it.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const out = {};
  for (const svg of document.querySelectorAll('svg')) {
    const frame = svg.parentNode, seen = {texts: 0, hits: [], smallest: 1e9};
    out[frame.id] = seen;
    const texts = [...svg.querySelectorAll('text')].map(t => {
      const r = t.getBoundingClientRect();
      seen.smallest = Math.min(seen.smallest, r.height);
      return {text: t.textContent, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom};
    });
    seen.texts = texts.length;
    for (const path of svg.querySelectorAll('g.edge path')) {
      const m = path.getScreenCTM(), len = path.getTotalLength(), half = m.a * 0.8;
      for (let l = 0; l <= len; l += 1 / m.a) {
        const p = path.getPointAtLength(l), x = m.a * p.x + m.c * p.y + m.e, y = m.b * p.x + m.d * p.y + m.f;
        for (const t of texts) {
          if (x + half > t.x0 && x - half < t.x1 && y + half > t.y0 && y - half < t.y1) {
            seen.hits.push([t.text, path.parentNode.querySelector('title').textContent]);
          }
        }
      }
    }
    const f = frame.getBoundingClientRect(), r = svg.getBoundingClientRect();
    seen.frame = {scroll: frame.scrollWidth - frame.clientWidth, page: document.documentElement.clientWidth,
      inside: r.left >= f.left - 0.5 && r.right <= f.right + 0.5 && r.top >= f.top - 0.5 && r.bottom <= f.bottom + 0.5,
      svg: [r.left, r.top, r.right, r.bottom], box: [f.left, f.top, f.right, f.bottom]};
  }
  const pre = document.createElement('pre');
  pre.id = 'measured';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def measure(work: Path, page: str, width: int, shot: Path) -> dict:
    """Load `page` with the measuring script at `width` px in one Chromium run: a screenshot into `shot`, and
    what the script saw (from the DOM it dumped)."""
    path = work / "page.html"
    path.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = chromium(work, f"--window-size={width},1000", f"--screenshot={shot}", "--dump-dom", path.as_uri()).stdout
    m = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert m, "the measuring script did not run"
    w, _h, pixels = png_pixels(shot)
    assert w == width and len(set(pixels[::11])) > 20, "the screenshot is blank"
    return json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def at_readme_width(frame: str, svg: str) -> str:
    """The SVG as GitHub shows a README's image: at its own size (points, as Graphviz wrote it), shrunk to the
    column's width when wider, never enlarged."""
    scaled = svg[svg.find("<svg"):].replace("<svg ", '<svg style="max-width:100%;height:auto" ', 1)
    return f'<div id="{frame}" style="width:{README_WIDTH}px">{scaled}</div>'


@pytest.fixture(scope="module")
def readme(tmp_path_factory) -> dict:
    """Both diagrams of Colossus 200k at the README's width, measured; the screenshot shows the summary."""
    plan = cluster_example(EXAMPLE).plan
    work = tmp_path_factory.mktemp("readme")
    page = ('<!DOCTYPE html><html><body style="margin:0">' + at_readme_width("summary", summary_svg(plan))
            + at_readme_width("full", fabric_svg(plan)) + "</body></html>")
    return measure(work, page, README_WIDTH, work / "readme-800.png")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> dict:
    """The HTML plan of Colossus 200k at 1,400 px, measured and screenshotted."""
    work = tmp_path_factory.mktemp("page")
    return measure(work, plan_html(cluster_example(EXAMPLE)), PAGE_WIDTH, work / "plan-1400.png")


@pytest.mark.parametrize("which", ["summary", "full"])
def test_no_label_touches_an_edge_at_readme_width(readme, which):
    seen = readme[which]
    assert seen["texts"] > 5
    assert not seen["hits"], sorted({tuple(h) for h in seen["hits"]})


def test_the_summary_diagram_is_legible_at_readme_width(readme):
    assert readme["summary"]["smallest"] >= MIN_TEXT_PX, readme["summary"]["smallest"]


@pytest.mark.parametrize("frame", ["diagram-summary", "diagram"])
def test_the_html_page_fits_its_diagrams_and_no_label_touches_an_edge(page, frame):
    seen = page[frame]
    assert seen["texts"] > 5
    assert not seen["hits"], sorted({tuple(h) for h in seen["hits"]})
    assert seen["frame"]["inside"] and seen["frame"]["scroll"] <= 0, seen["frame"]
    assert seen["frame"]["svg"][2] <= seen["frame"]["page"], seen["frame"]
