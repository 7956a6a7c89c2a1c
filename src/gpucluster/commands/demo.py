"""`gpucluster demo [SPEC]` (argument parsing; the chain is gpucluster.demo.run)."""

from __future__ import annotations

import argparse

from gpucluster.commands._flags import no_color_flag


def cmd_demo(args: argparse.Namespace) -> int:
    from gpucluster.demo.run import demo

    return demo(args.spec)


def register(sub) -> None:
    p = sub.add_parser("demo", help="stage up -> configure -> validate -> a Slurm job, with a summary",
                       description="The whole chain on this machine: stage the spec's hosts as containers, converge "
                                   "them with the roles, run the validation suite, submit a multi-node Slurm job "
                                   "that asks for one leaf switch, and print a summary with each step's time. The "
                                   "staged cluster stays up afterwards.",
                       epilog="examples:\n  gpucluster demo\n  gpucluster demo examples/staging-trixie.yaml",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", default="examples/staging.yaml",
                   help="the spec to stage (default examples/staging.yaml: Slurm 22.05 on Debian 12 nodes)")
    no_color_flag(p)
    p.set_defaults(func=cmd_demo)
