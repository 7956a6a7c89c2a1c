"""`gpucluster render SPEC -o DIR`: argument parsing and printing (the work is in gpucluster.render)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpucluster.commands._flags import SPEC_HELP, flag_blamed, gate, print_json, report_flags, suppress_arg
from gpucluster.errors import SpecError

# What render writes, family by family, each with the pattern of its files' names. render's one-liner is made
# from the families, and tests/test_cli_help.py renders the examples and holds every file to one of them, so the
# one-liner stays true when render learns a file.
RENDER_FAMILIES = (
    # oci.conf, plugstack.conf and the pyxis line are Slurm's; enroot.conf configures the runtime its pyxis runs
    ("Slurm", r"slurm\.conf|gres\.conf|cgroup\.conf|topology\.(conf|yaml)|slurmdbd\.conf|oci\.conf|plugstack\.conf"
              r"|pyxis\.[a-z0-9]+\.conf|enroot\.conf"),
    ("NCCL", r"nccl\.conf|nccl-env\.sh"),
    ("host and switch RoCE QoS", r"roce-qos\.conf|[a-z]+-(sonic|eos)-qos\.(json|cfg)"),
    ("storage daemons and mounts", r"mfs[a-z]*\.cfg|ganesha\.conf|[a-z0-9-]+\.mount"),
    ("driver and library apt sources and pins",
     r"apt-[a-z_]+-[a-z0-9_-]+\.(sources|pref)|nvidia-peermem-[a-z0-9_-]+\.conf|slurmd-nvidia-[a-z0-9_-]+\.conf"),
    ("IMEX domain node lists", r"imex-domain\.[A-Za-z0-9_.-]+\.hosts"),
    ("health checks and the NVLink domain guard",
     r"gpucluster-health(-[a-z]+)?(\.service|\.timer)?|health-config\.[a-z0-9_-]+\.json"
     r"|gpucluster-domain-guard\.(service|timer)|domains\.json"),
    ("Prometheus config, rules, alerts and targets, and its exporters' settings",
     r"prometheus(-rules|-alerts)?\.yml|prometheus-targets\.[a-z0-9-]+\.json|prometheus(-node-exporter)?\.default"
     r"|prometheus-dcgm-exporter(\.[a-z0-9_-]+\.pref|\.conf)|prometheus-exporters\.json"),
    ("Grafana dashboards", r"grafana-(fleet|group|unit|node)\.json"
     r"|grafana-(datasource|dashboards)\.yaml|grafana-server\.conf|grafana-apt\.(pref|sources)"),
    ("the Slurm exporter's topology units and timer", r"slurm-metrics\.json|gpucluster-slurm-metrics\.(service|timer)"),
    ("cabling.csv", r"cabling\.csv"),
    ("fabric.topo", r"fabric\.topo"),
    ("bom.csv", r"bom\.csv"),
    ("plan.json", r"plan\.json"),
)
RENDER_HELP = "write every file of a spec into a folder: " + ", ".join(name for name, _ in RENDER_FAMILIES)


def cmd_render(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.cabling import cabling_chunks
    from gpucluster.progress import progress
    from gpucluster.render import render_all, write_outputs
    from gpucluster.report.terminal import Screen, print_render

    t0 = time.perf_counter()
    field = ("slurm", "version")
    try:
        cluster = load_cluster(args.spec, slurm_version=args.slurm_version)
    except SpecError as exc:
        if args.slurm_version is None:
            raise
        raise SpecError(flag_blamed(exc.findings, "--slurm-version", field)) from None
    warnings = list(cluster.warnings)
    if args.slurm_version is not None:
        warnings = flag_blamed(warnings, "--slurm-version", field)
    warnings = gate(warnings, args)  # before any file is written: --fail-on warning writes nothing
    rich = False if args.no_color else None
    err = Screen(sys.stderr, rich=rich)
    for f in warnings:
        err.finding(f)
    files = render_all(cluster, cabling=not args.no_cabling)
    with progress("cabling.csv", cabling_chunks(cluster.plan), unit="units and spines") as advance:
        rows = files.get("cabling.csv")
        if callable(rows):
            def counted(rows=rows):
                for chunk in rows():
                    yield chunk
                    advance()
            files["cabling.csv"] = counted
        sizes = write_outputs(files, Path(args.output))
    if args.json:
        print_json({"output": args.output, "cluster": cluster.name, "slurm_version": cluster.spec.slurm.version,
                    "files": sizes, "seconds": round(time.perf_counter() - t0, 3)})
        return 0
    print_render(Screen(rich=rich), args.output,
                 f"{cluster.name} (Slurm {cluster.spec.slurm.version})", sizes,
                 time.perf_counter() - t0)
    return 0


def register(sub) -> None:
    p = sub.add_parser("render", help=RENDER_HELP,
                       description="Render every file of a spec into a folder: Slurm and NCCL configs from "
                                   "templates/, the RoCE and storage settings, the health checks, Prometheus's "
                                   "config, rules, alerts and targets and a Grafana dashboard by topology unit "
                                   "(docs/metrics.md), the cabling map, the bill of materials and plan.json. All "
                                   "files are written or none.",
                       epilog="examples:\n"
                              "  gpucluster render examples/staging.yaml -o out/staging\n"
                              "  gpucluster render examples/colossus-200k.yaml -o out/colossus --no-cabling",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{SPEC_HELP}, e.g. examples/staging.yaml")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="output folder, replaced as a whole set: readers see the old files or the new ones; "
                        "files an earlier render wrote and this one does not are removed, yours are kept")
    p.add_argument("--no-cabling", action="store_true", help="skip the per-port cabling map")
    report_flags(p, "what was written as JSON: output, cluster, slurm_version, files (name: bytes), seconds")
    suppress_arg(p)
    p.add_argument("--slurm-version", metavar="V", help="render for this Slurm release instead of the spec's "
                                                         "slurm.version (22.05 .. 26.05), e.g. to diff an upgrade")
    p.set_defaults(func=cmd_render)
