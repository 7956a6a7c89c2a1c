"""`gpucluster diff OLD NEW [--json]`: what changes between two specs, where, and what it disrupts.

Exit 0 when the two specs could be compared (with or without changes), 2 when either spec is bad.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpucluster.words import plain


def cmd_diff(args: argparse.Namespace) -> int:
    from gpucluster.diff import diff_specs

    result = diff_specs(args.old, args.new)
    if args.json:
        print(json.dumps(result.as_json(), indent=2, allow_nan=False))
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
    n = len(result.changes)
    print(f"{n} change{'' if n == 1 else 's'}; the least disruptive way to apply them all: {result.cls}", file=out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changes between two specs, on which hosts, and what it disrupts "
                                    "(none, reconfigure, restart, drain, reboot)",
                       description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", metavar="OLD.yaml", help="the spec the cluster runs")
    p.add_argument("new", metavar="NEW.yaml", help="the spec to apply")
    p.add_argument("--json", action="store_true", help="the change set as JSON (docs/operations.md: the contract)")
    p.set_defaults(func=cmd_diff)
