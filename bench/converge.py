"""How long a staged cluster takes to converge: stage up, first configure, second configure, per role.

    .venv/bin/python bench/converge.py [SPEC] [--keep] [--json FILE]

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
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
