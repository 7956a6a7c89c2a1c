"""`gpucluster plan SPEC`: argument parsing and printing (the work is in gpucluster.cluster and gpucluster.fabric)."""

from __future__ import annotations

import argparse
import sys

from gpucluster.commands._flags import SPEC_HELP, gate, no_color_flag, print_json, suppress_arg
from gpucluster.errors import SpecError, UsageError, findings_report


def cmd_plan(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.summary import plan_summary

    if args.pod is not None and not (args.svg or args.html):
        raise UsageError("--pod chooses what the diagram expands: give --svg FILE or --html FILE with it")
    try:
        cluster = load_cluster(args.spec)
        warnings = gate(list(cluster.warnings), args)
    except SpecError as exc:
        if not args.json:
            raise
        print_json(findings_report(exc.findings, args.spec, args.fail_on))
        return 2
    if args.svg or args.html:
        from gpucluster.report.export import write_report

        for path in write_report(cluster, svg=args.svg, html=args.html, pod=args.pod):
            print(f"wrote {path}", file=sys.stderr)
        if not args.json:
            return 0
    summary = plan_summary(cluster.plan)
    if args.json:
        print_json(summary)
        return 0
    from gpucluster.report.terminal import Screen, print_plan

    print_plan(Screen(rich=False if args.no_color else None), cluster.plan, summary, warnings)
    return 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="physical design: switches per tier, oversubscription, bisection bandwidth",
                       description="Plan the fabric of a spec: switches per tier, links, oversubscription, "
                                   "bisection bandwidth, racks and storage, with a line for every count that "
                                   "rounding raised above its arithmetic minimum (docs/plan.md).",
                       epilog="examples:\n"
                              "  gpucluster plan examples/colossus-200k.yaml\n"
                              "  gpucluster plan examples/colossus-200k.yaml --html plan.html --svg pod49.svg --pod 49",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{SPEC_HELP}, e.g. examples/colossus-200k.yaml")
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys: docs/spec.md); "
                                                       "on a bad spec, the findings as check --json prints them")
    suppress_arg(p)
    p.add_argument("--svg", metavar="FILE", help="write the fabric diagram (SVG) to FILE")
    p.add_argument("--html", metavar="FILE", help="write the plan as one self-contained HTML page to FILE")
    p.add_argument("--pod", type=int, metavar="N",
                   help="in the diagram, draw pod N unit by unit (with 2 tiers: unit N rack by rack)")
    no_color_flag(p)
    p.set_defaults(func=cmd_plan)
