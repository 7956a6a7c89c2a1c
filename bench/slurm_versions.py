"""slurmctld start-to-ready per Slurm line, for the big examples, and what a coarser tree costs in placement.

Part 1 (always): Meta 24k RoCE (1,545 topology/tree switches) and Colossus 200k (25,000 compute nodes),
rendered for each release gpucluster verifies (22.05 on the host's slurmctld, 24.11 on trixie's, 25.05,
25.11 and 26.05 on sid's), started `--repeat` times each; the figure is SlurmCluster.ready_s (slurmctld
spawned -> first `scontrol ping` UP), median and min. Three shapes per release:
- tree: the rendered logical tree (a leaf per rack switch or scalable unit);
- merged: the same with slurm.tree_merge_leaves = --merge (k consecutive leaves of one non-blocking pod
  as one logical leaf);
- none: topology: none, the floor set by the node count alone.

Part 2 (--placement): the placement that merging gives up, measured with the emulator: a fat-tree cluster
of --nodes emulated slurmd (meta-24k-roce's shape, pods of 128 nodes), the same seeded workload on the
physical tree and on the merged tree, scored against the physical rack leaves (gpucluster.emulate
.placement). Slow (minutes); Slurm 22.05 only (slurmd runs on the host).

Figures are printed, never asserted.

    .venv/bin/python bench/slurm_versions.py                    # part 1, 3 starts each
    .venv/bin/python bench/slurm_versions.py --placement        # + part 2, 256 nodes, 60 jobs
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpucluster.cluster import cluster_of
from gpucluster.emulate import SlurmCluster
from gpucluster.emulate.roots import verifier_line
from gpucluster.render import render_all, write_outputs
from gpucluster.render.topology import slurm_switches
from gpucluster.spec.loader import load_spec

EXAMPLES = ("meta-24k-roce", "colossus-200k")
RENDERS = ("22.05", "24.11", "25.05", "25.11", "26.05")
ROOT = Path(__file__).resolve().parent.parent


def compile_variant(example: str, version: str, shape: str, merge: int):
    loaded = load_spec(ROOT / "examples" / f"{example}.yaml")
    slurm = {"version": version}
    if shape == "merged":
        slurm["tree_merge_leaves"] = merge
    elif shape == "none":
        slurm["topology"] = "none"
    spec = loaded.spec.model_copy(update={"slurm": loaded.spec.slurm.model_copy(update=slurm)})
    return cluster_of(loaded.model_copy(update={"spec": spec}))


def ready_times(conf: Path, line: str, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        with SlurmCluster(conf, line=line, start_timeout=600) as c:
            out.append(c.ready_s or 0.0)
    return out


def part1(args: argparse.Namespace, tmp: Path) -> None:
    print(f"## slurmctld start-to-ready (s), median / min of {args.repeat} starts\n")
    print("| example | render | slurmctld | shape | switches | median | min |")
    print("|---|---|---|---|---|---|---|")
    for example in args.examples:
        for version in args.renders:
            line = verifier_line(version)
            for shape in ("tree", "merged", "none"):
                cluster = compile_variant(example, version, shape, args.merge)
                switches = len(slurm_switches(cluster.plan)) if shape != "none" else 0
                conf = tmp / f"{example}-{version}-{shape}"
                write_outputs(render_all(cluster, cabling=False), conf)
                times = ready_times(conf, line, args.repeat)
                label = f"merged x{args.merge}" if shape == "merged" else shape
                print(f"| {example} | {version} | {line} | {label} | {switches:,} | {statistics.median(times):.2f} | "
                      f"{min(times):.2f} |", flush=True)


def part2(args: argparse.Namespace, tmp: Path) -> None:
    from gpucluster.emulate import placement as P
    from gpucluster.emulate.emulator import emulate
    from gpucluster.emulate.specs import scaled_spec, write_and_render
    from gpucluster.emulate.switchtree import Fabric, parse_topology_conf

    print(f"\n## placement: physical tree vs. {args.merge} rack leaves merged per logical leaf "
          f"(fat tree, {args.nodes} emulated nodes, Slurm 22.05)\n")
    runs = {}
    physical = None
    for mode, merge in (("physical", 1), (f"merged x{args.merge}", args.merge)):
        text = scaled_spec("meta-24k-roce", {"h100": args.nodes}, name=f"bench-merge{merge}",
                           fabric={"nodes_per_pod": 128}, slurm={"tree_merge_leaves": merge})
        rendered = write_and_render(text, tmp, f"merge{merge}")
        topology = parse_topology_conf((rendered.conf_dir / "topology.conf").read_text())
        fabric = Fabric.from_topology(topology)
        if physical is None:
            physical = fabric  # every run is scored against the rack switches
            jobs = P.make_workload(args.jobs, seed=args.seed, max_nodes=min(64, args.nodes // 2),
                                   min_seconds=5, max_seconds=20)
        print(f"[{mode}] {len(fabric.leaf_nodes)} logical leaves, {len(topology)} switches", flush=True)
        with emulate(rendered.conf_dir, start_timeout=300) as cluster:
            print(f"[{mode}] slurmctld ready in {cluster.ready_s:.2f} s, {len(cluster.slurmd)} slurmd in "
                  f"{cluster.slurmd_ready_s:.0f} s", flush=True)
            for variant in ("plain", "fragmented"):
                frag = P.fragment(cluster, seed=args.seed) if variant == "fragmented" else None
                run = P.run_batch(cluster, jobs, physical, label=f"{mode}/{variant}",
                                  blocked=frag.busy if frag else ())
                if frag:
                    P.unfragment(cluster, frag)
                runs[(variant, mode)] = P.score(run, physical)
                print(f"[{mode}] {variant}: placed in {run.place_s:.1f} s", flush=True)
    modes = [m for (v, m) in runs if v == "plain"]
    for variant in ("plain", "fragmented"):
        print(f"\n### {variant} (scored against the {len(physical.leaf_nodes)} rack leaves)\n```")
        print(P.table([(m, runs[(variant, m)]) for m in modes]))
        print("```")


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwind through the context managers, which stop every daemon by PID


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", nargs="+", default=list(EXAMPLES))
    ap.add_argument("--renders", nargs="+", default=list(RENDERS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--merge", type=int, default=4, help="slurm.tree_merge_leaves for the merged shape")
    ap.add_argument("--placement", action="store_true", help="also measure placement with emulated slurmd")
    ap.add_argument("--no-ready", action="store_true", help="skip part 1 (start-to-ready)")
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpucluster-bench-") as tmp:
        if not args.no_ready:
            part1(args, Path(tmp))
        if args.placement:
            part2(args, Path(tmp))
    print(f"\n(bench wall time {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
