"""Render at fleet scale and have slurmctld load it.

Builds a 43,750-node / 350,000-GPU spec (the colossus-200k shape: rail-optimised Spectrum-X,
scalable units of 64 nodes, 3 tiers, H100 + H200 groups), renders it with the project's renderer,
and starts a private slurmctld on the rendered files with every node in a state that needs no
slurmd (FUTURE and/or CLOUD). Prints render time, config sizes, the controller's load time
(spawn -> first answered ping), its memory, and checks that the topology it read back equals
topology.conf.

    .venv/bin/python bench/fleet_render.py                  # FUTURE and CLOUD
    .venv/bin/python bench/fleet_render.py --states FUTURE --h100 3125 --h200 1250   # smaller

Slurm 22.05 builds node records with a rehash per node (quadratic in the node count): that, not the
emulation, is where most of the load time goes (perf: create_node_record -> slurm_rehash_node).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from gpucluster.emulate import SlurmCluster
from gpucluster.emulate.specs import scaled_spec, write_and_render
from gpucluster.emulate.switchtree import parse_topology_conf

SLURM_FILES = ("slurm.conf", "topology.conf", "gres.conf", "cgroup.conf")


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwind through SlurmCluster, which stops its daemons by PID


def load(conf_dir: Path, state: str, timeout: float) -> dict:
    with SlurmCluster(conf_dir, absent_state=state, start_timeout=timeout) as c:
        row: dict = {
            "state": state,
            "load_s": round(c.ready_s or 0, 1),
            "rss_at_ready_mib": round((c.ctld_peak_rss_kib() or 0) / 1024, 1),
        }
        t0 = time.monotonic()
        topo = c.topology()
        row["show_topology_s"] = round(time.monotonic() - t0, 2)
        row["topology_matches"] = topo == parse_topology_conf((conf_dir / "topology.conf").read_text())
        row["switches"] = len(topo)
        t0 = time.monotonic()
        nodes = c.nodes(future=True)
        row["show_node_s"] = round(time.monotonic() - t0, 2)
        row["nodes_listed"] = len(nodes)
        sinfo = c.run(["sinfo", "-h", "-o", "%D"]).stdout.split()
        row["nodes_in_partitions"] = sum(int(x) for x in sinfo) if sinfo else 0
        time.sleep(5)
        row["peak_rss_mib"] = round((c.ctld_peak_rss_kib() or 0) / 1024, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--h100", type=int, default=31250, help="H100 nodes (8 GPUs each)")
    ap.add_argument("--h200", type=int, default=12500, help="H200 nodes (8 GPUs each)")
    ap.add_argument("--states", default="FUTURE,CLOUD", help="node states to load with, comma-separated")
    ap.add_argument("--timeout", type=float, default=900, help="seconds slurmctld may take to answer")
    ap.add_argument("--keep-render", type=Path, help="also copy the rendered files here")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    nodes = args.h100 + args.h200
    text = scaled_spec(
        "colossus-200k",
        {"h100": args.h100, "h200": args.h200},
        name=f"fleet-{nodes}",
        slurm={"version": "22.05"},  # the slurmctld on this machine; the renderer refuses what it lacks
    )
    with tempfile.TemporaryDirectory(prefix="gpucluster-fleet-") as tmp:
        r = write_and_render(text, Path(args.keep_render or tmp), "fleet")
        gpus = r.plan.gpus
        print(
            f"spec: {nodes:,} nodes ({args.h100:,} H100 + {args.h200:,} H200), {gpus:,} GPUs, "
            f"{r.plan.tiers}-tier {r.plan.design}, {len(r.plan.units)} scalable units"
        )
        print(f"render (spec load + plan + all outputs but cabling): {r.render_s:.2f} s")
        for name in SLURM_FILES:
            text_ = (r.conf_dir / name).read_text()
            print(f"  {name:14s} {r.sizes[name]:>9,} bytes  {len(text_.splitlines()):>6,} lines")
        rows = []
        for state in [s.strip().upper() for s in args.states.split(",") if s.strip()]:
            print(f"loading into slurmctld with State={state} ...", flush=True)
            rows.append(load(r.conf_dir, state, args.timeout))
            print(f"  {rows[-1]}", flush=True)
    heads = [
        "state",
        "load_s",
        "rss_at_ready_mib",
        "peak_rss_mib",
        "switches",
        "topology_matches",
        "show_topology_s",
        "nodes_listed",
        "show_node_s",
        "nodes_in_partitions",
    ]
    widths = [max(len(h), *(len(str(row[h])) for row in rows)) for h in heads]
    print("\n" + "  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row[h]).rjust(w) for h, w in zip(heads, widths, strict=True)))
    return 0 if all(row["topology_matches"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
