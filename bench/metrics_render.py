"""What the fleet metrics files cost to render, at three sizes: time and bytes. Prints and writes, never asserts.

    .venv/bin/python bench/metrics_render.py    # staging, meta-24k-ib, colossus-200k -> bench/metrics-render.json
    .venv/bin/python bench/metrics_render.py --runs 9 --json /tmp/x.json

Two figures per spec:
- in process: `render.metrics.render_metrics(cluster)` on a cluster loaded once (the spec parsed and planned),
  RUNS times after a warm-up; the files' sizes (prometheus.yml, the rules, the alerts, the dashboard, and the target
  files, one per node group), the target groups written (runs of hosts sharing their labels) and the hosts;
- whole process: `gpucluster render SPEC -o DIR --no-cabling` as a user runs it, against the same spec with
  `metrics: {enabled: false}` appended, the two interleaved run by run (A B A B ...): wall from a monotonic clock,
  CPU and peak RSS from the kernel's accounting of the reaped child (os.wait4). Their difference is what the metrics
  files add to a render. Quote medians; a wide min-max spread says the machine was busy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPUCLUSTER = Path(sys.executable).with_name("gpucluster")
SPECS = ("staging", "meta-24k-ib", "colossus-200k")


def spread(values: list[float], digits: int = 3) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def in_process(spec: Path, runs: int) -> dict:
    from gpucluster.cluster import load_cluster
    from gpucluster.render.metrics import render_metrics

    cluster = load_cluster(spec)
    files = render_metrics(cluster)  # warm-up: templates compiled, caches filled
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        files = render_metrics(cluster)
        times.append(time.perf_counter() - t0)
    targets = {name: text for name, text in files.items() if name.startswith("prometheus-targets.")}
    return {"nodes": cluster.plan.nodes, "units": len(cluster.plan.units), "racks": cluster.plan.rack_count,
            "seconds": spread(times, 4),
            "bytes": {name: len(text.encode()) for name, text in sorted(files.items())},
            "bytes_total": sum(len(text.encode()) for text in files.values()),
            "target_files": len(targets),
            "target_groups": sum(len(json.loads(text)) for text in targets.values()),
            "bytes_per_node_in_targets": round(sum(len(t.encode()) for t in targets.values()) / cluster.plan.nodes, 1)}


def one_render(spec: Path, out: Path) -> tuple[float, float, float]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(GPUCLUSTER), "render", str(spec), "-o", str(out), "--no-cabling", "--no-color"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"gpucluster render {spec} failed: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def whole_process(spec: Path, runs: int, work: Path) -> dict:
    without = work / f"{spec.stem}-no-metrics.yaml"
    without.write_text(spec.read_text() + "\nmetrics:\n  enabled: false\n")
    one_render(spec, work / "a")  # warm-up of both: page cache, .pyc, Jinja's bytecode cache
    one_render(without, work / "b")
    a, b = [], []
    for _ in range(runs):
        a.append(one_render(spec, work / "a"))
        b.append(one_render(without, work / "b"))
    out = {}
    for key, rows in (("with_metrics", a), ("without_metrics", b)):
        walls, cpus, peaks = zip(*rows, strict=True)
        out[key] = {"wall_s": spread(list(walls)), "cpu_s": spread(list(cpus)), "peak_mb": spread(list(peaks), 1)}
    out["added_cpu_s_median_of_pairs"] = round(statistics.median(x[1] - y[1] for x, y in zip(a, b, strict=True)), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*", default=[str(ROOT / "examples" / f"{s}.yaml") for s in SPECS])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", default=str(ROOT / "bench" / "metrics-render.json"))
    args = ap.parse_args(argv)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=False).stdout.strip()
    figures: dict = {"runs": args.runs, "revision": rev,
                     "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                     "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "load_before": [round(x, 2) for x in os.getloadavg()]},
                     "specs": {}}
    with tempfile.TemporaryDirectory(prefix="gpc-bench-") as tmp:  # mkdtemp: 0700, this user's
        for spec in map(Path, args.specs):
            entry = {"in_process": in_process(spec, args.runs), "whole_process": whole_process(spec, args.runs,
                                                                                             Path(tmp))}
            figures["specs"][spec.stem] = entry
            ip, wp = entry["in_process"], entry["whole_process"]
            print(f"{spec.stem}: {ip['nodes']} nodes, {ip['target_groups']} target groups in {ip['target_files']} "
                  f"files, {ip['bytes_total'] / 1e3:.0f} kB; render_metrics {ip['seconds']['median'] * 1e3:.1f} ms "
                  f"(min {ip['seconds']['min'] * 1e3:.1f}, max {ip['seconds']['max'] * 1e3:.1f}); "
                  f"gpucluster render --no-cabling {wp['with_metrics']['wall_s']['median']:.3f} s wall, "
                  f"{wp['without_metrics']['wall_s']['median']:.3f} s without metrics "
                  f"(CPU added {wp['added_cpu_s_median_of_pairs']:.3f} s)")
    figures["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
