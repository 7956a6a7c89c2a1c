"""How long a staged cluster takes to converge: stage up, first configure, second configure, per role;
then what a no-op converge costs by push and by pull, in the same run (--compare).

    .venv/bin/python bench/converge.py [SPEC] [--keep] [--json FILE]
    .venv/bin/python bench/converge.py --compare [--inventory INV] [--secrets FILE] [--repeat N] [--json FILE]
                                             [--modes pull,push,pull-full]

--compare measures, on a converged cluster, the controller's CPU-seconds (this process and every process it
started, bench/converge_cost.py) per host and the wall time of: a push of every host, a push of the fleet
(the hosts that pull), a pull of the fleet (the fast no-op where a node's manifest of the bundle verifies: no
Ansible there), and a pull with --full (every node runs its roles); and the nodes' CPU (their containers'
cgroups) beside it, and the load average after each run (the machine may be shared). Without --inventory it
stages its own cluster, converges it by push and pulls once (so each node records its manifest) before it
measures. The quiet-machine figure of docs/roles.md is one command:

    .venv/bin/python bench/converge.py --compare --modes pull,push,pull-full --json bench/converge-fast.json

With --inventory it uses that staged cluster (already converged, with the pull runner) and leaves it up.

Prints the times (targets for examples/staging.yaml on a 2-core development machine: stage up plus
first configure under 10 min, second configure under 2 min) and the per-role wall times of both
runs. Nothing is asserted: the numbers depend on the machine and on what else it runs, so the
load average is printed beside them. The cluster gets its own state folder and is removed at the
end unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"stage up + first configure": 600.0, "second configure": 120.0}


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="?", default=str(ROOT / "examples" / "staging.yaml"))
    parser.add_argument("--keep", action="store_true", help="leave the staged cluster up")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--compare", action="store_true", help="no-op converge: push versus pull, controller and "
                        "nodes' CPU apart")
    parser.add_argument("--inventory", help="with --compare: a staged, converged cluster's inventory (left up)")
    parser.add_argument("--secrets", help="with --compare --inventory: its secrets file")
    parser.add_argument("--repeat", type=int, default=1, help="with --compare: measure each mode N times")
    parser.add_argument("--modes", default="pull,push,pull-full", help="with --compare: of push-all (every host by "
                        "push), push (the fleet by push), pull (the fleet by pull: the fast no-op where the manifest "
                        "verifies), pull-full (the fleet by pull --full), comma separated")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args)

    from gpucluster.cluster import load_cluster
    from gpucluster.configure import configure
    from gpucluster.stage.lifecycle import stage_up
    from gpucluster.stage.podman import StageConfig, down

    spec = load_cluster(args.spec).spec
    base = Path(tempfile.mkdtemp(prefix="gpucluster-bench-"))
    state, inv = base / "state", base / "inventory"
    numbers: dict = {"spec": args.spec, "cpus": os.cpu_count(), "load_before": _load(), "runs": {}}
    quiet = lambda _line: None  # noqa: E731
    try:
        t0 = time.monotonic()
        _staged, inventory = stage_up(args.spec, state=str(state), inventory=str(inv), log=quiet)
        numbers["stage_up_s"] = round(time.monotonic() - t0, 1)
        print(f"stage up             {numbers['stage_up_s']:7.1f} s   (load {_load()})", flush=True)
        for label in ("first configure", "second configure"):
            result = configure(inventory, log=quiet)
            numbers["runs"][label] = {"seconds": round(result.elapsed, 1), "ok": result.ok,
                                      "changed": result.changed, "roles": {k: round(v, 1) for k, v in
                                                                           result.role_times.items()},
                                      "failed_hosts": result.failed_hosts, "load_after": _load()}
            verdict = "ok" if result.ok else f"FAILED on {', '.join(result.failed_hosts)}"
            print(f"{label:20s} {result.elapsed:7.1f} s   ({verdict}, {result.changed} changes, load {_load()})",
                  flush=True)
        total = numbers["stage_up_s"] + numbers["runs"]["first configure"]["seconds"]
        second = numbers["runs"]["second configure"]["seconds"]
        print(f"\nstage up + first configure {total:7.1f} s   target < {TARGETS['stage up + first configure']:.0f} s")
        print(f"second configure           {second:7.1f} s   target < {TARGETS['second configure']:.0f} s")
        roles = sorted({r for run in numbers["runs"].values() for r in run["roles"]},
                       key=lambda r: -numbers["runs"]["first configure"]["roles"].get(r, 0))
        width = max([len(r) for r in roles] + [4])
        print(f"\n{'role':{width}s}  {'first':>8s}  {'second':>8s}")
        for role in roles:
            first = numbers["runs"]["first configure"]["roles"].get(role, 0.0)
            again = numbers["runs"]["second configure"]["roles"].get(role, 0.0)
            print(f"{role:{width}s}  {first:7.1f}s  {again:7.1f}s")
        if args.json:
            Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n")
    finally:
        if args.keep:
            print(f"\nkept: inventory {inv / 'hosts.yml'}; remove with `gpucluster stage down {args.spec} "
                  f"--state-dir {state} --inventory {inv}`")
        else:
            down(StageConfig(cluster=spec.name, state_dir=state), log=quiet)
            shutil.rmtree(base, ignore_errors=True)
    return 0


def _staged_containers(inventory: Path) -> dict[str, str]:
    """node -> podman container of a staged inventory (named by its cluster and state folder)."""
    from gpucluster.inventory.reader import load_inventory
    from gpucluster.inventory.statedir import literal
    from gpucluster.stage.podman import StageConfig, container_name

    inv = load_inventory(inventory)
    cfg = StageConfig(cluster=str(literal(inv.vars["gpucluster_cluster"])),
                      state_dir=Path(str(literal(inv.vars["gpucluster_state_dir"]))))
    return {h: container_name(cfg, h) for h in inv.hosts}


def compare(args) -> int:
    """Push versus pull on one converged cluster, each measured in this process (bench/converge_cost.py)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from converge_cost import become_subreaper, container_cgroups, measure

    from gpucluster.configure import configure
    from gpucluster.configure.pull import fleet, pull
    from gpucluster.inventory.reader import inventory_file, load_inventory

    subreaper = become_subreaper()
    base = None
    if args.inventory:
        inventory = inventory_file(args.inventory)
    else:
        from gpucluster.stage.lifecycle import stage_up

        base = Path(tempfile.mkdtemp(prefix="gpucluster-bench-"))
        _staged, inventory = stage_up(args.spec, state=str(base / "state"), inventory=str(base / "inventory"),
                                      log=lambda _l: None)
        first = configure(inventory, log=lambda _l: None)
        print(f"first configure {first.elapsed:.1f} s ({'ok' if first.ok else 'FAILED'})", flush=True)
        primed = pull(inventory, log=lambda _l: None)  # a full run on every node: each records its manifest
        print(f"first pull (full, records the manifests) {primed.elapsed:.1f} s "
              f"({'ok' if primed.ok else 'FAILED'}, {primed.changed} changes)", flush=True)
    inv = load_inventory(inventory)
    pull_hosts, push_hosts = fleet(inv)
    names = _staged_containers(inventory)
    cgroups = container_cgroups(names)
    quiet = lambda _line: None  # noqa: E731
    numbers: dict = {"inventory": str(inventory), "cpus": os.cpu_count(), "load_before": _load(),
                     "hosts": len(inv.hosts), "fleet": pull_hosts, "push_only": push_hosts,
                     "subreaper": subreaper, "node_cgroups": len(cgroups), "runs": []}

    secret_values = None
    if args.secrets:
        from gpucluster.configure.secrets import checked_secrets

        secret_values, _raw = checked_secrets(args.secrets)

    def push_all():
        r = configure(inventory, secrets=args.secrets, log=quiet)
        return r.changed, r.ok

    def push_fleet():
        r = configure(inventory, secrets=args.secrets, limit=",".join(pull_hosts), log=quiet)
        return r.changed, r.ok

    def pull_fleet():
        r = pull(inventory, secrets=secret_values, log=quiet)
        skipped = len(r.unchanged)
        if skipped != len(r.hosts):
            print(f"  note: {len(r.hosts) - skipped} of {len(r.hosts)} hosts ran Ansible (no verified manifest)",
                  flush=True)
        return r.changed, r.ok

    def pull_full():
        r = pull(inventory, secrets=secret_values, full=True, log=quiet)
        return r.changed, r.ok

    known = {"push-all": ("push, every host", len(inv.hosts), push_all),
             "push": ("push, the fleet", len(pull_hosts), push_fleet),
             "pull": ("pull, fast no-op", len(pull_hosts), pull_fleet),
             "pull-full": ("pull --full", len(pull_hosts), pull_full)}
    modes = [known[m.strip()] for m in args.modes.split(",") if m.strip() in known]
    print(f"{'mode':18s} {'hosts':>5s} {'wall s':>7s} {'ctl CPU s':>9s} {'ctl s/host':>10s} {'nodes CPU s':>11s} "
          f"{'changes':>7s}  load after", flush=True)
    for _ in range(max(1, args.repeat)):
        for label, hosts, run in modes:
            cost = measure(label, hosts, run, cgroups)
            numbers["runs"].append({**cost.row(), "load_after": _load()})
            print(f"{label:18s} {hosts:5d} {cost.wall_s:7.1f} {cost.controller_cpu_s:9.2f} "
                  f"{cost.controller_per_host:10.3f} {cost.nodes_cpu_s:11.1f} {cost.changed:7d}  {_load()}"
                  f"{'' if cost.ok else '  FAILED'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n")
    if base is not None and not args.keep:
        from gpucluster.cluster import load_cluster
        from gpucluster.stage.podman import StageConfig, down

        down(StageConfig(cluster=load_cluster(args.spec).spec.name, state_dir=base / "state"), log=quiet)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
