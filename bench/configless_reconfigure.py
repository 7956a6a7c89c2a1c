"""How long a served-config change takes to reach every slurmd of a configless fleet: in the
emulator, a reconfigure with a new key reaches every slurmd of at least 1,024 emulated nodes; this measures how soon.

Per size, in a process of its own: one emulated cluster (a real slurmctld with SlurmctldParameters=
enable_configless, Debian 12's Slurm 22.05, and one `slurmd -N NAME --conf-server 127.0.0.1:PORT` per node,
none with a slurm.conf of its own), rendered from meta-24k-ib scaled to N nodes. SlurmdDebug is changed in
the controller's slurm.conf only, `scontrol reconfigure` is run, and two moments are taken per node
(gpucluster/emulate/reconfigure.py):

    cache  the served slurm.conf with the new value is in the node's conf-cache (the file's mtime: when slurmd
           wrote it)
    live   the node's slurmd reports the new level itself (`scontrol show slurmd`, SLURMD_NODENAME=node)

"live" includes asking 4 at a time; it is an upper bound. Printed, never asserted; the slope is fitted on
"cache, all nodes" and "live, all nodes" and projected to 3,072 and 25,000 nodes.

    .venv/bin/python bench/configless_reconfigure.py                       # 256, 512 and 1,024 nodes
    .venv/bin/python bench/configless_reconfigure.py --sizes 32 64          # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpucluster.emulate.emulator import MIB_PER_NODE, emulate, mem_available_mib
from gpucluster.emulate.reconfigure import own_conf, reconfigure_debug
from gpucluster.emulate.specs import scaled_spec, write_and_render

PROJECT_TO = (3072, 25000)


def one_size(n: int) -> dict:
    """Bring up n configless nodes, change SlurmdDebug, reconfigure, time; one JSON-able record."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="configless-bench-") as tmp:
        rendered = write_and_render(scaled_spec("meta-24k-ib", {"h100": n}, name=f"cl{n}"), Path(tmp), f"cl{n}")
        t0 = time.monotonic()
        with emulate(rendered.conf_dir, configless=True, start_timeout=600) as c:
            start_s = time.monotonic() - t0
            nodes = list(c.slurmd)
            with_own = [x for x in nodes if own_conf(c, x)]
            rss = c.slurmd_rss_kib()
            load = os.getloadavg()[0]
            got = reconfigure_debug(c, nodes, timeout=900)
    cache, live = sorted(got.cache_s.values()), sorted(got.live_s.values())
    return {
        "nodes": len(nodes),
        "own_slurm_conf": len(with_own),
        "start_s": round(start_s, 1),
        "reconfigure_call_s": round(got.reconfigure_s, 2),
        "cache_all_s": round(cache[-1], 2) if len(cache) == len(nodes) else None,
        "cache_median_s": round(statistics.median(cache), 2) if cache else None,
        "live_all_s": round(live[-1], 2) if not got.missing else None,
        "missing": len(got.missing),
        "key": f"{got.key}={got.value}",
        "slurmd_rss_mib_median": round(statistics.median(rss) / 1024, 1) if rss else None,
        "load_1min": [round(load_before, 1), round(load, 1)],
        "mem_available_mib_after": mem_available_mib(),
    }


def fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024], help="emulated node counts, one run each")
    ap.add_argument("--one", type=int, help="internal: run one size in this process and print its JSON record")
    ap.add_argument("--json", type=Path, help="also write the records to this file")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_size(args.one)), flush=True)
        return 0
    records = []
    for n in args.sizes:
        need, have = MIB_PER_NODE * n + 512, mem_available_mib()
        print(f"# {n} nodes: MemAvailable {have} MiB (guard wants {need}), load {os.getloadavg()[0]:.1f}", flush=True)
        res = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True)
        if res.returncode != 0:
            print(f"# {n} nodes failed ({res.returncode}):\n{res.stderr[-3000:]}", flush=True)
            continue
        rec = json.loads(res.stdout.strip().splitlines()[-1])
        records.append(rec)
        print(json.dumps(rec), flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    print(f"\n{'nodes':>6} {'start s':>8} {'reconf call s':>13} {'cache all s':>11} {'live all s':>10} {'load':>11}")
    for r in records:
        print(f"{r['nodes']:>6} {r['start_s']:>8} {r['reconfigure_call_s']:>13} {r['cache_all_s']!s:>11} "
              f"{r['live_all_s']!s:>10} {r['load_1min']!s:>11}")
    for col in ("cache_all_s", "live_all_s"):
        pts = [(r["nodes"], r[col]) for r in records if r[col] is not None]
        if len(pts) < 2:
            continue
        a, b = fit([p[0] for p in pts], [p[1] for p in pts])
        proj = ", ".join(f"{n:,} nodes {a + b * n:.1f} s" for n in PROJECT_TO)
        print(f"{col}: {a:.2f} s + {b * 1000:.2f} ms per node; projected: {proj}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
