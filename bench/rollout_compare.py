"""Topology-aware against topology-blind rollouts of a reboot-class change, at scale, on emulated Slurm
(docs/operations.md shows the table and the plot).

One emulated cluster (a real slurmctld, Debian 12's Slurm 22.05, and one `slurmd -N` per node) rendered from a
seed's spec (meta-24k-ib: rail-optimised, scalable units of --unit nodes, one logical leaf each), a seeded
stream of jobs (a quarter of them one whole leaf with --switches=1, the rest 1-4 nodes) and the same reboot
rolled out to every node twice with the same ceiling:

    aware  waves of whole leaves (gpucluster rollout --by leaf)
    blind  random batches of the same size (what the anchors do)

The reboot is real in the emulator: `scontrol reboot ASAP nextstate=RESUME reason="gpc:rollout ID"`; Slurm
drains each node, lets its jobs finish, and runs RebootProgram, which stops that node's slurmd and starts it
again with -b after --reboot-delay seconds (gpucluster/emulate/harness.py, REBOOT_SCRIPT); slurmctld resumes
the node when it registers with its new boot time. Figures: bench/rollout_compare_lib.py.

    .venv/bin/python bench/rollout_compare.py                                   # 512 nodes, 16 leaves of 32
    .venv/bin/python bench/rollout_compare.py --nodes 64 --unit 16 --plot ''    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import rollout_compare_lib as compare  # bench/ is sys.path[0]: the comparison's library beside this script

from gpucluster.emulate.emulator import emulate
from gpucluster.emulate.specs import scaled_spec, write_and_render
from gpucluster.rollout.waves import plan_waves, topology_units

ROOT = Path(__file__).resolve().parent.parent


def plot(results: list[compare.Result], path: Path, title: str) -> str:
    """Largest in-service and free leaf-aligned block against time, one line per run; '' when written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[dev]'): no plot"
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for res, colour in zip(results, ("tab:blue", "tab:red"), strict=False):
        t = [s[0] for s in res.samples]
        name = "whole leaves (topology-aware)" if res.run == "aware" else "random batches (topology-blind)"
        axes[0].step(t, [s[1] for s in res.samples], where="post", color=colour, label=name)
        axes[1].step(t, [s[2] for s in res.samples], where="post", color=colour, label=name)
    axes[0].set_ylabel("in service (nodes)")
    axes[1].set_ylabel("in service and idle (nodes)")
    axes[1].set_xlabel("seconds since the rollout started")
    axes[0].set_title("\n".join(textwrap.wrap(title, 100)), fontsize=9)
    axes[0].legend(loc="lower right", fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.text(0.01, 0.5, "largest leaf-aligned block", rotation=90, va="center")
    fig.tight_layout(rect=(0.03, 0, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--unit", type=int, default=32, help="nodes per scalable unit (one logical leaf)")
    ap.add_argument("--max-unavailable", type=int, default=0, help="default: two leaves")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--load", type=float, default=0.8, help="share of the nodes the job stream asks for")
    ap.add_argument("--job-seconds", type=int, nargs=2, default=(10, 40), metavar=("MIN", "MAX"))
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds of jobs before the rollout starts")
    ap.add_argument("--reboot-delay", type=float, default=5.0, help="seconds an emulated node stays down")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "rollout-compare.png"), help="PNG to write ('' none)")
    ap.add_argument("--json", default="", help="write every figure and sample here")
    ap.add_argument("--max-load", type=float, default=12.0, help="refuse to start above this 1-minute load")
    ap.add_argument("--replot", metavar="JSON", help="only draw --plot again from a --json file of an earlier run")
    args = ap.parse_args(argv)
    if args.replot:
        doc = json.loads(Path(args.replot).read_text())
        runs = [compare.Result(r["run"], r["waves"], r["wave_nodes"], samples=[tuple(x) for x in r["samples"]])
                for r in doc["runs"]]
        why = plot(runs, Path(args.plot), doc["setup"])
        print(why or f"plot: {args.plot}")
        return 1 if why else 0
    if os.getloadavg()[0] > args.max_load:
        print(f"load {os.getloadavg()[0]:.1f} > {args.max_load}: not starting {args.nodes} slurmd", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="gpc-rollout-compare-"))
    text = scaled_spec("meta-24k-ib", {"h100": args.nodes}, name="rollcmp", fabric={"scalable_unit_nodes": args.unit})
    r = write_and_render(text, work, "rollcmp")
    hosts = [h for g in r.spec.groups_with_role("compute") for h in g.hosts]
    units = topology_units(r.plan, "leaf", hosts)
    leaves = [n for _, n in units]
    leaf = max(len(lf) for lf in leaves)
    cap = args.max_unavailable or 2 * leaf
    waves = {"aware": plan_waves(units, cap, by="leaf"), "blind": compare.blind_waves(hosts, cap, args.seed)}
    mix = compare.job_mix(args.seed, total=len(hosts), leaf=leaf, length=3600, seconds=tuple(args.job_seconds),
                          load=args.load)
    results = []
    t0 = time.monotonic()
    with emulate(r.conf_dir, overrides={"MinJobAge": "7200"}, reboot_delay=args.reboot_delay,
                 start_timeout=900) as c:
        up = time.monotonic() - t0
        print(f"{len(hosts)} emulated nodes up in {up:.0f} s", flush=True)
        for label in ("aware", "blind"):
            before = len(c.reboots)
            res = compare.run_once(c.run, label, waves[label], leaves, mix, work, warmup=args.warmup)
            compare.wait_quiet(c.run, hosts, timeout=900)
            rebooted = len({n for n, *_ in c.reboots[before:]})
            results.append(res)
            print(f"{label}: {res.rollout_s:.0f} s, {rebooted} nodes rebooted, {res.killed} jobs killed", flush=True)
    head = (f"{len(hosts)} emulated nodes (Slurm 22.05, meta-24k-ib's shape), {len(leaves)} leaves of {leaf}, "
            f"--max-unavailable {cap}, reboot {args.reboot_delay:g} s, seed {args.seed}, load {args.load:g}, "
            f"jobs {args.job_seconds[0]}-{args.job_seconds[1]} s, a quarter one whole leaf")
    print(f"\n{head}\n")
    print("| run | waves x nodes | jobs | killed | rollout s | large jobs | mean wait, large jobs s "
          "| largest leaf-aligned block in service, mean nodes | in service and idle, mean nodes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for res in results:
        name = "whole leaves" if res.run == "aware" else "random batches"
        print(f"| {name} | {res.waves} x {res.wave_nodes} | {res.jobs} | {res.killed} | {res.rollout_s:.0f} | "
              f"{res.large_jobs} | {res.large_wait_s:.1f} | {res.mean(1):.1f} | {res.mean(2):.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": head, "runs": [x.as_json() for x in results]}, indent=1))
    if args.plot:
        why = plot(results, Path(args.plot), head)
        print(why or f"\nplot: {args.plot}")
    return 0 if all(x.killed == 0 for x in results) else 1


if __name__ == "__main__":
    sys.exit(main())
