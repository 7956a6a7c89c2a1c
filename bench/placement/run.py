"""Topology-aware placement on an emulated cluster: rendered topology.conf vs. flat.

For each design (a rail-optimised and a fat-tree spec, 512 compute nodes by default) the bench
renders the spec, starts slurmctld + one ``slurmd -N`` per node twice (with the rendered
TopologyPlugin, and with topology/none, what a provisioner without topology support gives) and
submits the same seeded workload in four variants: plain; with ``--switches`` (as few leaves as the
job could use); fragmented (8% of nodes drained, 17% held by long single-node jobs, scattered over
all leaves); fragmented with ``--switches``. Leaf membership for scoring comes from the rendered
topology.conf, checked against the plan.

    .venv/bin/python bench/placement/run.py                     # both designs, 512 nodes
    .venv/bin/python bench/placement/run.py --design rail --nodes 256 --jobs 80
    .venv/bin/python bench/placement/run.py --quick             # 64 nodes, 24 jobs, a smoke run

Tables go to stdout and, with --out, to DIR/<design>.md and DIR/<design>.json.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import hostlist

from gpucluster.emulate import placement as P
from gpucluster.emulate.emulator import emulate
from gpucluster.emulate.specs import scaled_spec, write_and_render
from gpucluster.emulate.switchtree import Fabric, parse_topology_conf
from gpucluster.render.topology import slurm_switches

# design -> (example, compute group, fabric fields, what it is)
DESIGNS = {
    "rail": (
        "meta-24k-ib",
        "h100",
        {},
        "rail-optimised InfiniBand (meta-24k-ib shape): 8 rails, scalable units of 32 nodes, each SU one logical leaf",
    ),
    "fat": (
        "meta-24k-roce",
        "h100",
        {"nodes_per_pod": 128},
        "fat-tree RoCE (meta-24k-roce shape): a leaf (rack switch) per 2 nodes, pods of 128 nodes "
        "(AI zones scaled down to the cluster)",
    ),
}
VARIANTS = ("plain", "switches", "fragmented", "fragmented+switches")
MODES = ("topology", "flat")


def check_against_plan(fabric: Fabric, plan) -> None:
    """The leaves read back from topology.conf are the plan's leaves (one source of truth)."""
    planned = {
        sw.name: {n for spec in sw.nodes for n in hostlist.expand_hostlist(spec)}
        for sw in slurm_switches(plan)
        if sw.nodes
    }
    got = {leaf: set(nodes) for leaf, nodes in fabric.leaf_nodes.items()}
    if planned != got:
        raise SystemExit("topology.conf leaves differ from the plan's Slurm switches")


def run_design(design: str, args: argparse.Namespace, workdir: Path) -> dict:
    example, group, fabric_fields, what = DESIGNS[design]
    text = scaled_spec(example, {group: args.nodes}, name=f"bench-{design}-{args.nodes}", fabric=fabric_fields)
    rendered = write_and_render(text, workdir, f"{design}{args.nodes}")
    conf = rendered.conf_dir
    fabric = Fabric.from_topology(parse_topology_conf((conf / "topology.conf").read_text()))
    check_against_plan(fabric, rendered.plan)
    max_nodes = min(64, args.nodes // 2)
    jobs = P.make_workload(
        args.jobs, seed=args.seed, max_nodes=max_nodes, min_seconds=args.min_s, max_seconds=args.max_s
    )
    leaf_sizes = sorted({len(v) for v in fabric.leaf_nodes.values()})
    print(f"\n## {design}: {what}", flush=True)
    print(
        f"{args.nodes} nodes, {len(fabric.leaf_nodes)} leaves of {leaf_sizes} nodes, "
        f"{rendered.plan.tiers} tiers; {len(jobs)} jobs, sizes 1-{max_nodes} "
        f"(mean {sum(j.nodes for j in jobs) / len(jobs):.1f}), {args.min_s}-{args.max_s} s, seed {args.seed}",
        flush=True,
    )
    scores: dict[str, dict[str, P.Scores]] = {v: {} for v in VARIANTS}
    infra: dict[str, dict] = {}
    for mode in MODES:
        overrides = {"TopologyPlugin": "topology/none"} if mode == "flat" else None
        t0 = time.monotonic()
        with emulate(conf, overrides=overrides, start_timeout=180) as cluster:
            rss = cluster.slurmd_rss_kib()
            pss = cluster.slurmd_pss_kib()
            infra[mode] = {
                "slurmctld_ready_s": round(cluster.ready_s or 0, 2),
                "slurmd_registered_s": round(cluster.slurmd_ready_s or 0, 1),
                "slurmd_rss_mib_mean": round(sum(rss) / len(rss) / 1024, 2),
                "slurmd_pss_mib_mean": round(sum(pss) / len(pss) / 1024, 2) if pss else None,
                "slurmd_pss_mib_total": round(sum(pss) / 1024, 1) if pss else None,
            }
            print(
                f"[{mode}] {len(cluster.slurmd)} slurmd up in {infra[mode]['slurmd_registered_s']} s, "
                f"PSS {infra[mode]['slurmd_pss_mib_total']} MiB total",
                flush=True,
            )
            for variant in VARIANTS:
                frag = P.fragment(cluster, seed=args.seed) if variant.startswith("fragmented") else None
                run = P.run_batch(
                    cluster,
                    jobs,
                    fabric,
                    label=f"{design}/{mode}/{variant}",
                    switches=variant.endswith("switches"),
                    switch_wait=args.switch_wait,
                    blocked=frag.busy if frag else (),
                )
                if frag:
                    P.unfragment(cluster, frag)
                scores[variant][mode] = P.score(run, fabric)
                skipped = f", {len(run.skipped)} jobs larger than the usable nodes left out" if run.skipped else ""
                print(f"[{mode}] {variant}: placed in {run.place_s:.1f} s{skipped}", flush=True)
        infra[mode]["wall_s"] = round(time.monotonic() - t0, 1)
    out = [f"## {design}: {what}", ""]
    for variant in VARIANTS:
        cols = [(m, scores[variant][m]) for m in MODES]
        out += [f"### {variant}", "```", P.table(cols), "```", ""]
    report = "\n".join(out)
    print("\n" + report, flush=True)
    return {
        "design": design,
        "what": what,
        "nodes": args.nodes,
        "leaves": len(fabric.leaf_nodes),
        "leaf_sizes": leaf_sizes,
        "tiers": rendered.plan.tiers,
        "jobs": [asdict(j) for j in jobs],
        "infra": infra,
        "scores": {v: {m: asdict(s) for m, s in ms.items()} for v, ms in scores.items()},
        "report": report,
    }


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwind through emulate(), which stops every daemon by PID


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--design", choices=[*DESIGNS, "all"], default="all")
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--jobs", type=int, default=120)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--min-s", type=int, default=5)
    ap.add_argument("--max-s", type=int, default=25)
    ap.add_argument("--switch-wait", default="1:00", help="--switches=N@WAIT (Slurm caps it at max_switch_wait)")
    ap.add_argument("--quick", action="store_true", help="64 nodes, 24 jobs: a smoke run")
    ap.add_argument("--out", type=Path, help="write <design>.md and <design>.json here")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.jobs, args.max_s = 64, 24, 12
    signal.signal(signal.SIGTERM, _sigterm)
    designs = list(DESIGNS) if args.design == "all" else [args.design]
    with tempfile.TemporaryDirectory(prefix="gpucluster-bench-") as tmp:
        for design in designs:
            result = run_design(design, args, Path(tmp))
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                stem = f"{design}-{args.nodes}"
                (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
                (args.out / f"{stem}.md").write_text(result["report"] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
