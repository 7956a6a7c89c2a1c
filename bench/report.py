"""Speed of what a person looks at: `plan --html` and `plan --svg`. Prints, never asserts.

    .venv/bin/python bench/report.py               # colossus-200k, meta-24k-roce, staging; best of 3
    .venv/bin/python bench/report.py --repeat 5 colossus-200k

Target: `gpucluster plan SPEC --html plan.html` for Colossus 200k under 2 s wall. The CLI is
timed as a person runs it (a fresh interpreter, imports included); the stages (load, diagram with
Graphviz's dot, page) are timed in this process, after a warm-up, to show where the time goes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ["colossus-200k", "meta-24k-roce", "staging"]


def cli_seconds(spec: str, out: Path, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpucluster.cli", "plan", str(ROOT / "examples" / f"{spec}.yaml"), *args],
                   check=True, env=env, capture_output=True)
    return time.perf_counter() - t


def stages(spec: str) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "src"))
    from gpucluster.cluster import load_cluster
    from gpucluster.report.diagram import fabric_svg
    from gpucluster.report.html import plan_html

    out = {}
    t = time.perf_counter()
    cluster = load_cluster(ROOT / "examples" / f"{spec}.yaml")
    out["load + check + plan"] = time.perf_counter() - t
    t = time.perf_counter()
    svg = fabric_svg(cluster.plan)
    out["diagram (dot)"] = time.perf_counter() - t
    t = time.perf_counter()
    page = plan_html(cluster)
    out["page (diagram included)"] = time.perf_counter() - t
    out["svg KB"] = len(svg.encode()) / 1024
    out["html KB"] = len(page.encode()) / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="*", default=SPECS)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpucluster-bench-") as tmp:
        folder = Path(tmp)
        print(f"{'spec':16s} {'plan --html':>12s} {'plan --svg':>11s} {'plan':>7s}   (CLI wall, best of "
              f"{args.repeat}; target for colossus-200k --html: 2 s)")
        for spec in args.specs:
            html = min(cli_seconds(spec, folder, "--html", str(folder / "plan.html")) for _ in range(args.repeat))
            svg = min(cli_seconds(spec, folder, "--svg", str(folder / "f.svg")) for _ in range(args.repeat))
            plain = min(cli_seconds(spec, folder) for _ in range(args.repeat))
            print(f"{spec:16s} {html:11.2f}s {svg:10.2f}s {plain:6.2f}s")
        print()
        for spec in args.specs:
            stages(spec)  # warm-up: imports, template compilation
            best: dict[str, float] = {}
            for _ in range(args.repeat):
                for k, v in stages(spec).items():
                    best[k] = min(best.get(k, v), v)
            print(f"{spec}: " + ", ".join(f"{k} {v:.0f}" if k.endswith("KB") else f"{k} {v * 1000:.0f} ms"
                                          for k, v in best.items()))


if __name__ == "__main__":
    main()
