"""`gpucluster expand SPEC`: argument parsing and printing (the work is in gpucluster.spec.expand)."""

from __future__ import annotations

import argparse
import sys

from gpucluster.commands._flags import SPEC_HELP, print_json, report_flags


def cmd_expand(args: argparse.Namespace) -> int:
    from gpucluster.spec.expand import expand_file, expand_json

    if args.json:
        print_json(expand_json(args.spec))
        return 0
    sys.stdout.write(expand_file(args.spec))
    return 0


def register(sub) -> None:
    p = sub.add_parser("expand", help="print the spec with every default filled in and marked '# default'",
                       description="Print the spec as YAML with every field the model knows: the values you wrote, "
                                   "and every default, each marked with a trailing '# default'. The output is a "
                                   "spec that check accepts as it is.",
                       epilog="examples:\n"
                              "  gpucluster expand examples/staging.yaml\n"
                              "  gpucluster expand examples/staging.yaml | grep -v '# default$'",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{SPEC_HELP}, e.g. examples/staging.yaml")
    report_flags(p, "every value, and the field paths that took their default")
    p.set_defaults(func=cmd_expand)
