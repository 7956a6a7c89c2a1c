"""plan.html for Colossus 200k in a real browser: Debian's Chromium, headless, offline.

Chromium loads the page from a file with every network feature it has switched off, dumps the DOM it
built and takes a screenshot. The DOM must hold the tier table, BOM totals equal to `plan --json`, and
the rack count; the screenshot must not be blank (many colours, not a blank page).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import ROOT, example_path

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"),
    pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (scripts/setup.sh)"),
]
EXAMPLE = "colossus-200k"
WINDOW = (1200, 1000)


def gpucluster(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=True)


def chromium(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with a fresh private profile, no sandbox (root), and nothing that goes online."""
    profile = workdir / "profile"
    profile.mkdir(mode=0o700)
    st = profile.stat()
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    home = workdir / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-extensions", "--disable-default-apps", f"--user-data-dir={profile}", *args]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, check=True)


class Dom(HTMLParser):
    """What the test reads from the DOM Chromium built: tiers, BOM totals, rack count and rack rows."""

    def __init__(self):
        super().__init__()
        self.tiers: dict[str, int] = {}
        self.links: dict[str, int] = {}
        self.total: dict[str, str] = {}
        self.racks = None
        self.rack_rows = 0
        self._tier = None
        self._link = None
        self._in_rack_table = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "tr" and "data-tier" in a:
            self._tier = a["data-tier"]
        if tag == "td" and self._tier and "switches" in cls:
            self.tiers[self._tier] = int(a["data-value"])
        if tag == "tr" and "data-link" in a:
            self._link = a["data-link"]
        if tag == "td" and self._link and "data-value" in a and self._link not in self.links:
            self.links[self._link] = int(a["data-value"])  # the first number in the row: cables
        if tag == "tr" and a.get("id") == "bom-total":
            self.total = {k: v for k, v in a.items() if k.startswith("data-")}
        if a.get("id") == "rack-count":
            self.racks = int(a["data-value"])
        if tag == "table" and a.get("id") == "rack-table":
            self._in_rack_table = True
        if tag == "tr" and self._in_rack_table:
            self.rack_rows += 1

    def handle_endtag(self, tag):
        if tag == "tr":
            self._tier = self._link = None
        if tag == "table":
            self._in_rack_table = False


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("browser")
    html = work / "plan.html"
    gpucluster("plan", str(example_path(EXAMPLE)), "--html", str(html))
    summary = json.loads(gpucluster("plan", str(example_path(EXAMPLE)), "--json").stdout)
    return html, summary


def test_the_dom_holds_the_tiers_the_bom_totals_and_the_racks(page, tmp_path):
    html, summary = page
    dom_text = chromium(tmp_path, "--dump-dom", html.as_uri()).stdout
    dom = Dom()
    dom.feed(dom_text)
    assert "<svg" in dom_text and "Why these counts" in dom_text  # the diagram inline, the explanations
    assert dom.tiers == summary["switches"]
    assert dom.links == summary["links"]
    switch_links = sum(n for link, n in summary["links"].items() if link != "node-leaf")
    assert {k: int(v) for k, v in dom.total.items()} == {
        "data-switches": sum(summary["switches"].values()),
        "data-cables": sum(summary["links"].values()),
        "data-transceivers": 2 * switch_links,
    }
    assert dom.racks == summary["racks"]
    assert dom.rack_rows == summary["racks"] + 1  # and a header row


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB(A) PNG as Chromium writes it: (width, height, unfiltered rows)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i:i + 3]) for r in rows for i in range(0, stride, bpp)]


def test_a_screenshot_shows_the_page(page, tmp_path):
    html, _summary = page
    shot = tmp_path / "plan.png"
    chromium(tmp_path, f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", html.as_uri())
    width, height, pixels = png_pixels(shot)
    assert (width, height) == WINDOW
    colours = set(pixels[::7])
    ink = sum(1 for p in pixels[::7] if p != b"\xff\xff\xff") / len(pixels[::7])
    assert len(colours) > 50, f"{len(colours)} colours: a blank or flat page"
    assert ink > 0.03, f"only {ink:.1%} of the page is not white"
