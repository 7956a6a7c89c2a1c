"""Plot a rendered Grafana dashboard's panels from a running Prometheus: every panel's queries over the last
minutes, laid out on the dashboard's own grid. Grafana is not in Debian; this draws what its panels would show,
from the same queries, so docs can show a dashboard without one.

    .venv/bin/python scripts/dashboard_picture.py DASHBOARD.json --url http://CONTROLLER:9090 -o docs/x.png
        [--minutes 20] [--var group=gpu --var unit=leaf00001 --var instance=gpu01] [--title TEXT]

DASHBOARD.json is one `gpucluster render` writes (grafana-*.json). Template variables are replaced by the values
given with --var (Grafana's own `$__rate_interval` by 2m). A stat panel shows its last value, a time series its
lines, labelled by the panel's legend format; a panel whose queries return no series says so, in red.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

GRID = 24  # Grafana's grid is 24 columns wide
BUILTIN = {"__rate_interval": "2m", "__interval": "30s", "__range": "20m"}


def panels(dashboard: dict) -> list[dict]:
    """Every panel with queries, rows opened (a collapsed row keeps its panels inside it)."""
    out = []
    for p in dashboard.get("panels", []):
        out += panels(p) if p.get("type") == "row" else [p]
    return [p for p in out if p.get("targets")]


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)


def query_range(url: str, expr: str, start: float, end: float, step: int) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=60) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        raise RuntimeError(f"{expr}: {doc.get('error')}")
    return doc["data"]["result"]


def legend(fmt: str, metric: dict) -> str:
    if not fmt or fmt == "__auto":
        return ",".join(f"{k}={v}" for k, v in metric.items() if k != "__name__") or metric.get("__name__", "")
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def draw(ax, panel: dict, series: list[tuple[str, list]], t0: float) -> None:
    ax.set_title(panel.get("title", ""), fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    if not series:
        ax.text(0.5, 0.5, "no series", color="red", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if panel.get("type") == "stat":
        ax.axis("off")
        text = "\n".join(f"{name}: {float(values[-1][1]):g}" if name else f"{float(values[-1][1]):g}"
                         for name, values in series[:6])
        ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=16 if len(series) == 1 else 9,
                transform=ax.transAxes)
        return
    for name, values in series[:12]:
        ax.plot([(float(t) - t0) / 60 for t, _ in values], [float(v) for _, v in values], label=name, lw=1.2)
    ax.set_xlabel("minutes", fontsize=7)
    ax.legend(fontsize=6, loc="upper left", frameon=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dashboard", type=Path)
    p.add_argument("--url", required=True, help="Prometheus's base URL")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--var", action="append", default=[], help="NAME=VALUE for a template variable")
    p.add_argument("--title", default=None)
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    dashboard = json.loads(args.dashboard.read_text())
    values = {**BUILTIN, **dict(v.split("=", 1) for v in args.var)}
    end = time.time()
    start = end - 60 * args.minutes
    chosen = panels(dashboard)
    if not chosen:
        sys.exit(f"{args.dashboard}: no panel with a query")
    top = min(q["gridPos"]["y"] for q in chosen)  # no blank band where a row's title would be
    rows = max(q["gridPos"]["y"] + q["gridPos"]["h"] for q in chosen) - top
    fig = plt.figure(figsize=(16, rows * 0.42))
    grid = GridSpec(rows, GRID, figure=fig, hspace=3.0, wspace=2.0, top=0.96, bottom=0.03)
    for panel in chosen:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"] - top:g["y"] - top + g["h"], g["x"]:g["x"] + g["w"]])
        series = []
        for target in panel["targets"]:
            expr = substitute(target.get("expr", ""), values)
            for r in query_range(args.url, expr, start, end, 15):
                series.append((legend(target.get("legendFormat", ""), r["metric"]), r["values"]))
        draw(ax, panel, series, start)
    fig.suptitle(args.title or dashboard.get("title", ""), fontsize=12, x=0.01, ha="left")
    fig.savefig(args.output, dpi=80, bbox_inches="tight")
    print(f"wrote {args.output}: {len(chosen)} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
