"""`gpucluster demo [SPEC]` (argument parsing; the chain is gpucluster.demo.run)."""

from __future__ import annotations

import argparse


def cmd_demo(args: argparse.Namespace) -> int:
    from gpucluster.demo.run import demo

    return demo(args.spec)


def register(sub) -> None:
    p = sub.add_parser("demo", help="stage up -> configure -> validate -> a Slurm job, with a summary")
    p.add_argument("spec", nargs="?", default="examples/staging.yaml")
    p.set_defaults(func=cmd_demo)
