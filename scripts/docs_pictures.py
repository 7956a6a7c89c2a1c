"""Regenerate the pictures docs/ and the README show: the full and the summary fabric diagrams of Colossus
200k, and a screenshot of the top of its HTML plan taken by headless Chromium (Debian's, offline).

    .venv/bin/python scripts/docs_pictures.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "colossus-200k.yaml"
DOCS = ROOT / "docs"
SHOT = (1000, 1300)  # the top of the page: header, cards, tiers, explanations


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from gpucluster.cluster import load_cluster
    from gpucluster.report.diagram import fabric_svg, summary_svg
    from gpucluster.report.html import plan_html

    cluster = load_cluster(SPEC)
    (DOCS / "fabric-colossus-200k.svg").write_text(fabric_svg(cluster.plan), encoding="utf-8")
    (DOCS / "fabric-colossus-200k-summary.svg").write_text(summary_svg(cluster.plan), encoding="utf-8")
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium is not installed (scripts/setup.sh installs it): the PNG was not regenerated")
    with tempfile.TemporaryDirectory(prefix="gpc-pictures-") as tmp:
        page = Path(tmp) / "plan.html"
        page.write_text(plan_html(cluster), encoding="utf-8")
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-extensions",
                        f"--user-data-dir={tmp}/profile", f"--window-size={SHOT[0]},{SHOT[1]}",
                        f"--screenshot={DOCS / 'plan-colossus-200k.png'}", page.as_uri()],
                       check=True, capture_output=True, timeout=180)
    print("wrote docs/fabric-colossus-200k.svg, docs/fabric-colossus-200k-summary.svg, docs/plan-colossus-200k.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
