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
from conftest import cluster_example, example_path
from test_report_browser import chromium, png_pixels

from gpucluster.report.diagram import fabric_svg, inline_svg, summary_svg
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

# Runs in the page: every text's box and every edge's sampled points, in CSS pixels of the page.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const out = {texts: [], hits: [], smallest: 1e9, frames: []};
  for (const svg of document.querySelectorAll('svg')) {
    const texts = [...svg.querySelectorAll('text')].map(t => {
      const r = t.getBoundingClientRect();
      out.smallest = Math.min(out.smallest, r.height);
      return {text: t.textContent, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom};
    });
    out.texts.push(...texts);
    for (const path of svg.querySelectorAll('g.edge path')) {
      const m = path.getScreenCTM(), len = path.getTotalLength(), half = m.a * 0.8;
      for (let l = 0; l <= len; l += 1 / m.a) {
        const p = path.getPointAtLength(l), x = m.a * p.x + m.c * p.y + m.e, y = m.b * p.x + m.d * p.y + m.f;
        for (const t of texts) {
          if (x + half > t.x0 && x - half < t.x1 && y + half > t.y0 && y - half < t.y1) {
            out.hits.push([t.text, path.parentNode.querySelector('title').textContent]);
          }
        }
      }
    }
  }
  for (const frame of document.querySelectorAll('.diagram')) {
    const f = frame.getBoundingClientRect();
    const inner = [...frame.querySelectorAll('svg')].map(s => s.getBoundingClientRect());
    out.frames.push({scroll: frame.scrollWidth - frame.clientWidth, inside: inner.every(r =>
      r.left >= f.left - 0.5 && r.right <= f.right + 0.5 && r.top >= f.top - 0.5 && r.bottom <= f.bottom + 0.5),
      svgs: inner.length, right: Math.max(...inner.map(r => r.right)), page: document.documentElement.clientWidth});
  }
  const pre = document.createElement('pre');
  pre.id = 'measured';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def measure(work: Path, page: str, width: int) -> dict:
    """Load `page` (with the measuring script) at `width` px, screenshot it, and return what the script saw."""
    path = work / "page.html"
    path.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = chromium(work, f"--window-size={width},1000", "--dump-dom", path.as_uri()).stdout
    m = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert m, "the measuring script did not run"
    shot = work / "shot.png"
    shutil.rmtree(work / "profile")
    chromium(work, f"--window-size={width},1000", f"--screenshot={shot}", path.as_uri())
    w, _h, pixels = png_pixels(shot)
    assert w == width and len(set(pixels[::11])) > 20, "the screenshot is blank"
    return json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def readme_page(svg: str) -> str:
    """The SVG as the README shows it: an image scaled to the column's width, its height following."""
    scaled = inline_svg(svg).replace("<svg ", '<svg style="width:100%;height:auto" ', 1)
    return (f'<!DOCTYPE html><html><body style="margin:0"><div style="width:{README_WIDTH}px">{scaled}</div>'
            "</body></html>")


@pytest.fixture(scope="module")
def plan():
    return cluster_example(EXAMPLE).plan


@pytest.mark.parametrize("which", ["summary", "full"])
def test_no_label_touches_an_edge_at_readme_width(plan, which, tmp_path):
    svg = summary_svg(plan) if which == "summary" else fabric_svg(plan)
    seen = measure(tmp_path, readme_page(svg), README_WIDTH)
    assert len(seen["texts"]) > 5
    assert not seen["hits"], sorted({tuple(h) for h in seen["hits"]})
    if which == "summary":
        assert seen["smallest"] >= MIN_TEXT_PX, f"smallest text {seen['smallest']:.1f} px at {README_WIDTH} px"


def test_the_html_page_fits_its_diagrams_and_no_label_touches_an_edge(tmp_path):
    cluster = cluster_example(EXAMPLE)
    seen = measure(tmp_path, plan_html(cluster), PAGE_WIDTH)
    assert not seen["hits"], sorted({tuple(h) for h in seen["hits"]})
    assert seen["frames"], "no diagram frame on the page"
    for frame in seen["frames"]:
        assert frame["svgs"] and frame["inside"] and frame["scroll"] <= 0, frame
        assert frame["right"] <= frame["page"], frame


def test_the_readme_shows_the_summary_diagram():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "docs/fabric-colossus-200k-summary.svg" in readme
    assert example_path(EXAMPLE).exists()
