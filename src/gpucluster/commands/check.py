"""`gpucluster check SPEC`: argument parsing and printing (the work is in gpucluster.cluster.check_file)."""

from __future__ import annotations

import argparse
import sys

from gpucluster.commands._flags import SPEC_HELP, no_color_flag, print_json, suppress_arg, suppress_findings
from gpucluster.errors import SpecError, failing, findings_report


def cmd_check(args: argparse.Namespace) -> int:
    from gpucluster.cluster import check_file
    from gpucluster.report.terminal import Screen, print_check

    try:
        loaded, findings = check_file(args.spec)
    except SpecError as exc:
        loaded, findings = None, exc.findings
    findings = suppress_findings(findings, args)
    failed = bool(failing(findings, args.fail_on))
    if args.json:
        extra = {}
        if loaded is not None and not failed:
            spec = loaded.spec
            extra = {"node_groups": len(spec.node_groups), "nodes": sum(g.count for g in spec.node_groups)}
        print_json(findings_report(findings, args.spec, args.fail_on, **extra))
        return 2 if failed else 0
    if failed or loaded is None:
        raise SpecError(findings, fail_on=args.fail_on)
    spec = loaded.spec
    rich = False if args.no_color else None
    print_check(Screen(rich=rich), Screen(sys.stderr, rich=rich), args.spec, len(spec.node_groups),
                sum(g.count for g in spec.node_groups), findings)
    return 0


def register(sub) -> None:
    p = sub.add_parser("check", help="validate a cluster spec and report every problem",
                       description="Check a cluster spec: its syntax, then its meaning (radix, rails, Slurm "
                                   "limits, storage). Every problem is reported at once with its file, line, "
                                   "field, rule and fix; exit 2 when there is an error.",
                       epilog="example:\n  gpucluster check examples/staging.yaml",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{SPEC_HELP}, e.g. examples/meta-24k-roce.yaml")
    p.add_argument("--json", action="store_true",
                   help="findings as JSON (file, line, column, field, rule, level, message, fix) on stdout")
    suppress_arg(p)
    no_color_flag(p)
    p.set_defaults(func=cmd_check)
