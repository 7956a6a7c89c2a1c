"""`gpucluster emulate SPEC`: run the rendered Slurm configs for real, with emulated slurmd nodes.

The subcommand renders SPEC (or takes an already rendered folder), starts a private munged,
slurmctld and one ``slurmd -N`` per node on this machine, prints what slurmctld understood, and
then either runs a command against it (``--run``), stays up until interrupted (``--hold``), or stops.
Every process it started is stopped by PID on the way out, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from gpucluster.commands._flags import print_json, report_flags
from gpucluster.words import plain, plural

EXAMPLES = """examples:
  gpucluster emulate examples/meta-24k-roce.yaml --nodes 64
  gpucluster emulate examples/staging.yaml --run 'srun -N2 hostname' --json
"""


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the context managers, which stop the daemons


def cmd_emulate(args: argparse.Namespace) -> int:
    from gpucluster.emulate.emulator import emulate
    from gpucluster.emulate.harness import SlurmStartError
    from gpucluster.emulate.specs import render_spec
    from gpucluster.errors import UsageError

    signal.signal(signal.SIGTERM, _sigterm)
    src = Path(args.spec)
    with tempfile.TemporaryDirectory(prefix="gpucluster-render-") as tmp:
        conf_dir = src if src.is_dir() else render_spec(src, Path(tmp)).conf_dir
        if not (conf_dir / "slurm.conf").is_file():
            raise UsageError(f"{conf_dir}: no slurm.conf; give a spec YAML or a `gpucluster render` folder")
        overrides = {"TopologyPlugin": "topology/none"} if args.flat else None
        try:
            with emulate(conf_dir, args.nodes, overrides=overrides, keep=args.keep) as cluster:
                if args.json:
                    print_json(_summary_doc(cluster))
                    sys.stdout.flush()
                else:
                    _summary(cluster)
                if args.run:
                    env = dict(cluster.env)
                    # with --json, stdout holds the one JSON document: the command's output goes to stderr
                    return subprocess.run(args.run, shell=True, env=env, check=False,
                                          stdout=sys.stderr if args.json else None).returncode
                if args.hold:
                    print(f"\nexport SLURM_CONF={cluster.conf_path}   # Ctrl-C stops everything", flush=True)
                    signal.pause()
        except SlurmStartError as exc:
            raise UsageError(str(exc)) from None
        except KeyboardInterrupt:
            print("stopping emulated cluster", file=sys.stderr)
            return 130
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return 0


def _summary_doc(cluster) -> dict:
    """What _summary prints, as JSON: the emulated cluster as slurmctld understood it."""
    nodes = cluster.nodes()
    topo = cluster.topology()
    states: dict[str, int] = {}
    for rec in nodes.values():
        states[rec["state"]] = states.get(rec["state"], 0) + 1
    rss = cluster.slurmd_rss_kib()
    return {"slurmctld_pid": cluster.ctld_pid, "slurmctld_ready_s": round(cluster.ready_s or 0, 3),
            "slurmd": len(cluster.slurmd), "slurmd_ready_s": round(cluster.slurmd_ready_s or 0, 3),
            "node_states": dict(sorted(states.items())), "switches": len(topo),
            "leaves": sum(1 for s in topo.values() if s["level"] == 0),
            "slurmd_rss_mib_mean": round(sum(rss) / len(rss) / 1024, 1) if rss else None,
            "slurmctld_rss_mib": round((cluster.ctld_rss_kib() or 0) / 1024, 1),
            "slurm_conf": str(cluster.conf_path), "adaptations": list(cluster.adaptations)}


def _summary(cluster) -> None:
    nodes = cluster.nodes()
    topo = cluster.topology()
    leaves = [n for n, s in topo.items() if s["level"] == 0]
    rss = cluster.slurmd_rss_kib()
    print(
        f"slurmctld up in {cluster.ready_s:.2f} s (pid {cluster.ctld_pid}); {len(cluster.slurmd)} slurmd "
        f"registered in {cluster.slurmd_ready_s or 0:.1f} s"
    )
    states: dict[str, int] = {}
    for rec in nodes.values():
        states[rec["state"]] = states.get(rec["state"], 0) + 1
    print("nodes: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
    print(f"topology: {plural(len(topo), 'switch')}, {plural(len(leaves), 'leaf')}")
    if rss:
        print(
            f"slurmd RSS: mean {sum(rss) / len(rss) / 1024:.1f} MiB; slurmctld "
            f"{(cluster.ctld_rss_kib() or 0) / 1024:.1f} MiB"
        )
    print(f"adapted for this machine ({len(cluster.adaptations)}; full list in {cluster.workdir / 'ADAPTATIONS.txt'}):")
    for a in cluster.adaptations:
        print(f"  {a}")
    sys.stdout.flush()


def register(sub) -> None:
    p = sub.add_parser(
        "emulate",
        help="run slurmctld and N emulated slurmd (slurmd -N) on this machine from the rendered configs",
        description=plain(__doc__),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("spec", help="cluster spec YAML, or a folder `gpucluster render` wrote")
    p.add_argument("--nodes", type=int, metavar="N", help="emulate only the first N nodes of the config (default: all)")
    p.add_argument("--flat", action="store_true", help="TopologyPlugin=topology/none (the no-topology baseline)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--run", metavar="CMD", help="run a shell command with SLURM_CONF set, then stop")
    what.add_argument("--hold", action="store_true", help="stay up until Ctrl-C / SIGTERM")
    p.add_argument("--keep", action="store_true", help="keep the private folder (configs, logs) afterwards")
    report_flags(p, "what slurmctld understood, as JSON: node_states, switches, leaves, RSS, adaptations (with "
                    "--run, the command's output goes to stderr)")
    p.set_defaults(func=cmd_emulate)
