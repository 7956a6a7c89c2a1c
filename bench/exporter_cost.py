"""What the metrics cost on a running staged cluster: node_exporter per scrape on a compute node and on the
controller, the health runner's textfile and Prometheus itself. Prints and writes, never asserts.

    .venv/bin/python bench/exporter_cost.py --state ed559496            # -> bench/exporter-cost.json
    .venv/bin/python bench/exporter_cost.py --state ed559496 --scrapes 40 --json /tmp/x.json

STATE is the staged cluster's state label (`podman ps --format '{{.Labels}}'`: gpucluster.state), a cluster that
`gpucluster configure` has converged with the metrics role. Everything is read inside the nodes with `podman exec`
(no network beyond the staged nodes' own loopback):

- node_exporter: SCRAPES scrapes of its loopback /metrics, one after another, by a python3 inside the node; the
  exporter's CPU is the change of its utime + stime (/proc/PID/stat) over them, divided by SCRAPES, so the client's
  own CPU is not counted; its resident memory (VmRSS, VmHWM) after; the body's bytes and series. Prometheus scrapes
  it during the run too (every scrape_interval), which adds at most one scrape in SCRAPES x its length.
- the textfile collector's files (the health runner's, and the Slurm exporter's on the controller): their bytes.
- Prometheus on the controller: resident memory, its head series (its own /metrics), and its CPU over WINDOW
  seconds of idle cluster (every target scraped, the rules evaluated), per scrape interval.
The dcgm-exporter is not run: no GPU here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Run inside a node: SCRAPES sequential GETs of the loopback exporter, then the last body's bytes and series.
SCRAPER = """
import sys, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
for _ in range(n):
    body = urllib.request.urlopen(url, timeout=30).read()
lines = [x for x in body.decode().splitlines() if x and not x.startswith("#")]
print(len(body), len(lines))
"""


def exec_in(container: str, *argv: str) -> str:
    res = subprocess.run(["podman", "exec", container, *argv], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        sys.exit(f"exporter_cost: {container}: {' '.join(argv)}: {res.stderr.strip()[:300]}")
    return res.stdout


def containers(state: str) -> dict[str, str]:
    out = subprocess.run(["podman", "ps", "--filter", f"label=gpucluster.state={state}", "--format",
                          "{{.Names}} {{index .Labels \"gpucluster.node\"}}"], capture_output=True, text=True,
                         check=True).stdout
    return {node: name for name, node in (line.split() for line in out.splitlines() if line.strip())}


def pid_of(container: str, name: str) -> str:
    return exec_in(container, "pgrep", "-o", "-x", name).strip()


def cpu_seconds(container: str, pid: str) -> float:
    fields = exec_in(container, "cat", f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15 of stat(5)


def memory_kib(container: str, pid: str) -> dict[str, int]:
    status = exec_in(container, "cat", f"/proc/{pid}/status")
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in status.splitlines())
            if k in ("VmRSS", "VmHWM")}


def node_exporter(container: str, scrapes: int, port: int) -> dict:
    pid = pid_of(container, "prometheus-node")  # comm is cut at 15 characters
    before, t0 = cpu_seconds(container, pid), time.monotonic()
    body_bytes, series = map(int, exec_in(container, "python3", "-c", SCRAPER, f"http://127.0.0.1:{port}/metrics",
                                          str(scrapes)).split())
    wall, cpu = time.monotonic() - t0, cpu_seconds(container, pid) - before
    textfiles = exec_in(container, "sh", "-c", "wc -c /var/lib/prometheus/node-exporter/*.prom || true")
    return {"scrapes": scrapes, "cpu_ms_per_scrape": round(1000 * cpu / scrapes, 2),
            "wall_ms_per_scrape": round(1000 * wall / scrapes, 1), "body_bytes": body_bytes, "series": series,
            "memory_kib": memory_kib(container, pid), "textfiles": textfiles.strip().splitlines()}


def prometheus(container: str, window: float, interval: float, port: int) -> dict:
    pid = pid_of(container, "prometheus")
    before = cpu_seconds(container, pid)
    time.sleep(window)
    cpu = cpu_seconds(container, pid) - before
    own = ("import urllib.request; print(next(x.split()[1] for x in urllib.request.urlopen("
           f"'http://127.0.0.1:{port}/metrics').read().decode().splitlines() "
           "if x.startswith('prometheus_tsdb_head_series ')))")
    return {"window_s": window, "cpu_ms_per_interval": round(1000 * cpu * interval / window, 1),
            "head_series": int(float(exec_in(container, "python3", "-c", own).strip())),
            "memory_kib": memory_kib(container, pid)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state", required=True, help="the staged cluster's gpucluster.state label")
    p.add_argument("--scrapes", type=int, default=60)
    p.add_argument("--window", type=float, default=120.0, help="seconds Prometheus's CPU is read over")
    p.add_argument("--interval", type=float, default=30.0, help="the spec's metrics.scrape_interval")
    p.add_argument("--node-port", type=int, default=9100)
    p.add_argument("--prometheus-port", type=int, default=9090)
    p.add_argument("--json", default=str(ROOT / "bench" / "exporter-cost.json"))
    args = p.parse_args()
    nodes = containers(args.state)
    if "ctl01" not in nodes or "gpu01" not in nodes:
        sys.exit(f"exporter_cost: no staged cluster with state {args.state} (ctl01 and gpu01)")
    out = {"when": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
           "compute": node_exporter(nodes["gpu01"], args.scrapes, args.node_port),
           "controller": node_exporter(nodes["ctl01"], args.scrapes, args.node_port),
           "prometheus": prometheus(nodes["ctl01"], args.window, args.interval, args.prometheus_port)}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
