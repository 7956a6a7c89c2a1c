"""`gpucluster` command line. Bad input exits 2 with located findings and no traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from gpucluster import __version__
from gpucluster.errors import OperationError, SpecError, UsageError

# Subcommands that live with their concern; each module has register(subparsers).
PLUGINS = ("gpucluster.stage.cli", "gpucluster.inventory.cli", "gpucluster.configure.cli", "gpucluster.validate.cli",
           "gpucluster.emulate.cli", "gpucluster.deploy.cli", "gpucluster.demo.cli")


def cmd_check(args: argparse.Namespace) -> int:
    from gpucluster.cluster import check_meaning
    from gpucluster.spec.loader import load_spec

    loaded = load_spec(args.spec)
    findings = check_meaning(loaded)
    for f in findings:
        print(f"{f.level}: {f.render()}", file=sys.stderr)
    if any(f.level == "error" for f in findings):
        raise SpecError([])  # already printed
    spec = loaded.spec
    print(f"{args.spec}: ok ({len(spec.node_groups)} node groups, "
          f"{sum(g.count for g in spec.node_groups)} nodes, {len(findings)} warnings)")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.summary import plan_summary

    plan = load_cluster(args.spec).plan
    summary = plan_summary(plan)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{plan.spec.name}[/]: {summary['nodes']} nodes, {summary['gpus']:,} GPUs "
                  f"({', '.join(f'{n:,} {k}' for k, n in summary['gpus_by_type'].items())})")
    fab = summary["fabric"]
    units = summary["units"]
    kind = "scalable units" if units["kind"] == "scalable unit" else "leaves"
    pods = f", {summary['pods']} pods" if summary["pods"] else ""
    console.print(f"fabric: {fab['type']} {fab['design']}, {plan.tiers} tiers, {fab['endpoints']:,} endpoints at "
                  f"{fab['link_gbps']} Gb/s, {fab['rails']} rails; {units['count']} {kind} of "
                  f"{units['nodes_per_unit']} nodes{pods}")
    table = Table("tier", "model", "switches", "down/up per switch", "radix", "oversubscription")
    for t in plan.tier_plans:
        table.add_row(t.tier, t.model, f"{t.count:,}", f"{t.down}/{t.up}", str(t.radix), t.ratio)
    console.print(table)
    console.print("links: " + ", ".join(f"{k} {v:,}" for k, v in summary["links"].items()))
    console.print(f"bisection bandwidth: {summary['bisection_tbps']:,} Tb/s; racks: {summary['racks']:,}")
    if "flash" in summary["storage"]:
        fl = summary["storage"]["flash"]
        console.print(f"flash tier '{fl['name']}': {fl['chunk_servers']} chunk servers, {fl['usable_tb']:,} TB usable, "
                      f"{fl['write_gbps']:,} GB/s write, mounted at {fl['mount']}")
    for n in summary["storage"]["nfs"]:
        console.print(f"nfs tier '{n['name']}': {n['servers']} servers, exports {', '.join(n['exports'])}")
    for w in plan.warnings:
        console.print(f"[yellow]warning[/]: {w.field}: {w.message}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.render import render_all, write_outputs

    t0 = time.perf_counter()
    cluster = load_cluster(args.spec, slurm_version=args.slurm_version)
    sizes = write_outputs(render_all(cluster, cabling=not args.no_cabling), Path(args.output))
    took = time.perf_counter() - t0
    for name, size in sizes.items():
        print(f"  {args.output.rstrip('/')}/{name}  {size:,} bytes")
    print(f"rendered {len(sizes)} files for {cluster.name} (Slurm {cluster.spec.slurm.version}) in {took:.2f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucluster", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpucluster {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("check", help="validate a cluster spec and report every problem")
    p.add_argument("spec")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("plan", help="physical design: switches per tier, oversubscription, bisection bandwidth")
    p.add_argument("spec")
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys: docs/spec.md)")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("render", help="write slurm.conf, topology.conf, gres.conf, cgroup.conf, nccl.conf, "
                                      "cabling.csv, bom.csv")
    p.add_argument("spec")
    p.add_argument("-o", "--output", required=True, help="output folder (files are replaced atomically)")
    p.add_argument("--no-cabling", action="store_true", help="skip the per-port cabling map")
    p.add_argument("--slurm-version", metavar="V", help="render for this Slurm release instead of the spec's "
                                                         "slurm.version (22.05 .. 26.05), e.g. to diff an upgrade")
    p.set_defaults(func=cmd_render)
    for name in PLUGINS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that concern is not installed in this build
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # The CLI loads no pydantic plugins: their discovery scans every installed distribution's entry
    # points (~40 ms per command). Set only for this process, never by `import gpucluster`.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except SpecError as exc:
        for f in exc.findings:
            print(f"error: {f.render()}", file=sys.stderr)
        if exc.findings:
            print(f"{len(exc.findings)} problem(s); nothing was written", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OperationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
