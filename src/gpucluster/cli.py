"""`gpucluster` command line. Bad input exits 2 with located findings and no traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time
from pathlib import Path

from gpucluster import __version__
from gpucluster.errors import OperationError, SpecError, UsageError, findings_report, suppressed

# Subcommands that live with their concern; each module has register(subparsers).
PLUGINS = ("gpucluster.stage.cli", "gpucluster.inventory.cli", "gpucluster.configure.cli", "gpucluster.validate.cli",
           "gpucluster.emulate.cli", "gpucluster.deploy.cli", "gpucluster.demo.cli")


def _print_json(data: dict) -> None:
    # allow_nan=False: the spec refuses NaN and infinity, so one here is a bug, never invalid JSON on stdout
    print(json.dumps(data, indent=2, allow_nan=False))


def _suppress(findings: list, args: argparse.Namespace) -> list:
    """--suppress RULE drops warnings of that rule; an error is never dropped (and we say so)."""
    kept, refused = suppressed(findings, args.suppress or ())
    for rule in refused:
        print(f"note: --suppress {rule} does not apply to errors", file=sys.stderr)
    return kept


def cmd_check(args: argparse.Namespace) -> int:
    from gpucluster.cluster import check_file

    try:
        loaded, findings = check_file(args.spec)
    except SpecError as exc:
        if not args.json:
            raise
        _print_json(findings_report(exc.findings, args.spec))
        return 2
    findings = _suppress(findings, args)
    failed = any(f.level == "error" for f in findings)
    spec = loaded.spec
    if args.json:
        nodes = sum(g.count for g in spec.node_groups)
        extra = {} if failed else {"node_groups": len(spec.node_groups), "nodes": nodes}
        _print_json(findings_report(findings, args.spec, **extra))
        return 2 if failed else 0
    for f in findings:
        print(f"{f.level}: {f.render()}", file=sys.stderr)
    if failed:
        raise SpecError([])  # already printed
    print(f"{args.spec}: ok ({len(spec.node_groups)} node groups, "
          f"{sum(g.count for g in spec.node_groups)} nodes, {len(findings)} warnings)")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.summary import plan_summary

    try:
        cluster = load_cluster(args.spec)
    except SpecError as exc:
        if not args.json:
            raise
        _print_json(findings_report(exc.findings, args.spec))
        return 2
    plan = cluster.plan
    summary = plan_summary(plan)
    if args.json:
        _print_json(summary)
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
    for w in _suppress(plan.warnings, args):
        console.print(f"[yellow]warning[/]: {w.field}: {w.message}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.render import render_all, write_outputs

    t0 = time.perf_counter()
    cluster = load_cluster(args.spec)
    sizes = write_outputs(render_all(cluster, cabling=not args.no_cabling), Path(args.output))
    took = time.perf_counter() - t0
    for name, size in sizes.items():
        print(f"  {args.output.rstrip('/')}/{name}  {size:,} bytes")
    print(f"rendered {len(sizes)} files for {cluster.name} in {took:.2f} s")
    return 0


def _rule_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a rule name (the word in [brackets] after a finding)")
    return text


def _suppress_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suppress", action="append", metavar="RULE", type=_rule_name,
                   help="hide warnings of this rule (repeatable); errors are never suppressed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucluster", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpucluster {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    spec_help = "cluster spec: a YAML file, or - to read standard input"
    p = sub.add_parser("check", help="validate a cluster spec and report every problem")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--json", action="store_true",
                   help="findings as JSON (file, line, column, field, rule, level, message, fix) on stdout")
    _suppress_arg(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("plan", help="physical design: switches per tier, oversubscription, bisection bandwidth")
    p.add_argument("spec", help=spec_help)
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys: docs/spec.md); "
                                                       "on a bad spec, the findings as check --json prints them")
    _suppress_arg(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("render", help="write slurm.conf, topology.conf, gres.conf, cgroup.conf, nccl.conf, "
                                      "cabling.csv, bom.csv")
    p.add_argument("spec", help=spec_help)
    p.add_argument("-o", "--output", required=True,
                   help="output folder, replaced as a whole set: readers see the old files or the new ones; "
                        "files an earlier render wrote and this one does not are removed, yours are kept")
    p.add_argument("--no-cabling", action="store_true", help="skip the per-port cabling map")
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
