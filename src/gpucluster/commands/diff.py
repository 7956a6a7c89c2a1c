"""`gpucluster diff OLD NEW [--inventory INVENTORY] [--json]`: what changes between two specs, where, and what
it disrupts. With --inventory, run where the Slurm clients reach the cluster (a controller or login node):
each change also names the running jobs on the hosts it touches (one squeue).

Exit 0 when the two specs could be compared (with or without changes, and whether or not the controller
answered), 2 when either spec or the inventory is bad.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpucluster.commands._flags import json_flag, no_color_flag
from gpucluster.words import plain

EXAMPLES = """examples:
  gpucluster diff examples/staging.yaml my-staging.yaml
  gpucluster diff examples/staging.yaml examples/staging.yaml --rotate munge
"""


def cmd_diff(args: argparse.Namespace) -> int:
    from gpucluster.diff import diff_specs

    result = diff_specs(args.old, args.new, rotate=args.rotate)
    jobs, why = None, None
    if args.inventory:
        from gpucluster.diff.running import running_jobs
        from gpucluster.inventory.reader import load_inventory

        load_inventory(args.inventory)  # a bad inventory is bad input (exit 2), before Slurm is asked
        jobs, why = running_jobs()
    if args.json:
        doc = result.as_json()
        _add_jobs(doc, result, args.inventory, jobs, why)
        print(json.dumps(doc, indent=2, allow_nan=False))
        return 0
    out = sys.stdout
    versions = (result.old_version if result.old_version == result.new_version
                else f"{result.old_version} -> {result.new_version}")
    print(f"{args.old} -> {args.new} (Slurm {versions})", file=out)
    if not result.changes:
        print("no change: nothing to apply", file=out)
        return 0
    width = max(len(c.cls) for c in result.changes)
    for c in result.changes:
        values = (f" ({c.old or 'unset'} -> {c.new or 'unset'})"
                  if (c.old or c.new) and len(f"{c.old}{c.new}") < 160 else "")
        where = ", ".join(c.hosts) if c.hosts else "no host"
        print(f"  {c.cls:<{width}}  {c.what}{values}", file=out)
        print(f"  {'':<{width}}    on {where}: {c.action}", file=out)
        if jobs:
            from gpucluster.diff.running import hit

            on = hit(c.hosts, jobs)
            if on:
                verb = "waits for" if c.cls in ("drain", "reboot") else "runs beside"
                shown = ", ".join(f"{j.id} ({j.user}, {j.nodelist})" for j in on[:8])
                print(f"  {'':<{width}}    {verb} {len(on)} running job{'' if len(on) == 1 else 's'}: {shown}"
                      f"{' ...' if len(on) > 8 else ''}", file=out)
    if args.inventory and jobs is None:
        print(f"running jobs not known: the controller did not answer ({why})", file=out)
    n = len(result.changes)
    print(f"{n} change{'' if n == 1 else 's'}; the least disruptive way to apply them all: {result.cls}", file=out)
    return 0


def _add_jobs(doc: dict, result, inventory: str | None, jobs, why: str | None) -> None:
    """Contract 1, fields added: "running" at the top; "jobs" on every change (null when not asked or not
    known, else the running jobs on the hosts the change touches)."""
    from gpucluster.diff.running import hit

    doc["running"] = {"asked": bool(inventory), "reached": jobs is not None, "error": why,
                      "jobs": None if jobs is None else len(jobs)}
    for c, out in zip(result.changes, doc["changes"], strict=True):
        out["jobs"] = None if jobs is None else [j.as_json() for j in hit(c.hosts, jobs)]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changes between two specs, on which hosts, and what it disrupts "
                                    "(none, reconfigure, restart, drain, reboot)",
                       description=plain(__doc__), epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", metavar="OLD.yaml", help="the spec the cluster runs")
    p.add_argument("new", metavar="NEW.yaml", help="the spec to apply")
    p.add_argument("--inventory", metavar="DIR",
                   help="the running cluster's inventory: also name the running jobs each change would hit "
                        "(squeue through this host's Slurm clients)")
    p.add_argument("--rotate", metavar="SECRET", help="also plan replacing these secrets (munge, slurmdbd, signing; "
                   "comma separated), as `configure --rotate` does: what each disrupts, and where")
    json_flag(p, "the change set as JSON (docs/operations.md: the contract)")
    no_color_flag(p)
    p.set_defaults(func=cmd_diff)
