"""`gpucluster` command line. Bad input exits 2 with located findings and no traceback."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from types import ModuleType

from gpucluster import __version__
from gpucluster.errors import OperationError, SpecError, UsageError, findings_report, suppressed
from gpucluster.words import plain

BUILTIN = ("check", "plan", "render")
# Subcommands in --help order, each registered by its module in gpucluster/commands/ (named for the command):
# each parses its arguments and prints, and imports the library code only when the command runs. The parser
# imports only the module of the command given (none for check, plan, render; all of them for --help), through
# subcommand_module.
COMMANDS = ("stage", "inventory", "configure", "secrets", "validate", "emulate", "fabric", "health", "demo", "diff",
            "rollout")


def subcommand_module(command: str) -> ModuleType:
    """The CLI module that registers `command`, imported now (a plain import: tests/test_architecture.py
    reads it, and a missing module fails loudly)."""
    if command == "stage":
        from gpucluster.commands import stage as module
    elif command == "inventory":
        from gpucluster.commands import inventory as module
    elif command in ("configure", "secrets"):
        from gpucluster.commands import configure as module
    elif command == "validate":
        from gpucluster.commands import validate as module
    elif command == "emulate":
        from gpucluster.commands import emulate as module
    elif command == "fabric":
        from gpucluster.commands import fabric as module
    elif command == "health":
        from gpucluster.commands import health as module
    elif command == "demo":
        from gpucluster.commands import demo as module
    elif command == "diff":
        from gpucluster.commands import diff as module
    elif command == "rollout":
        from gpucluster.commands import rollout as module
    else:
        raise KeyError(command)
    return module


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
    from gpucluster.report.terminal import Screen, print_check

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
    nodes = sum(g.count for g in spec.node_groups)
    if args.json:
        extra = {} if failed else {"node_groups": len(spec.node_groups), "nodes": nodes}
        _print_json(findings_report(findings, args.spec, **extra))
        return 2 if failed else 0
    rich = False if args.no_color else None
    err = Screen(sys.stderr, rich=rich)
    if failed:
        for f in findings:
            err.finding(f)
        raise SpecError([])  # already printed
    print_check(Screen(rich=rich), err, args.spec, len(spec.node_groups), nodes, findings)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.summary import plan_summary

    if args.pod is not None and not (args.svg or args.html):
        raise UsageError("--pod chooses what the diagram expands: give --svg FILE or --html FILE with it")
    try:
        cluster = load_cluster(args.spec)
    except SpecError as exc:
        if not args.json:
            raise
        _print_json(findings_report(exc.findings, args.spec))
        return 2
    if args.svg or args.html:
        from gpucluster.report.export import write_report

        for path in write_report(cluster, svg=args.svg, html=args.html, pod=args.pod):
            print(f"wrote {path}", file=sys.stderr)
        if not args.json:
            return 0
    summary = plan_summary(cluster.plan)
    if args.json:
        _print_json(summary)
        return 0
    from gpucluster.report.terminal import Screen, print_plan

    print_plan(Screen(rich=False if args.no_color else None), cluster.plan, summary,
               _suppress(cluster.warnings, args))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.cabling import cabling_chunks
    from gpucluster.progress import progress
    from gpucluster.render import render_all, write_outputs
    from gpucluster.report.terminal import Screen, print_render

    t0 = time.perf_counter()
    cluster = load_cluster(args.spec, slurm_version=args.slurm_version)
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
    print_render(Screen(rich=False if args.no_color else None), args.output,
                 f"{cluster.name} (Slurm {cluster.spec.slurm.version})", sizes,
                 time.perf_counter() - t0)
    return 0


def _rule_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a rule name (the word in [brackets] after a finding)")
    return text


def _suppress_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suppress", action="append", metavar="RULE", type=_rule_name,
                   help="hide warnings of this rule (repeatable); errors are never suppressed")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for `gpucluster COMMAND ...`; without a command, the whole tree (every subcommand)."""
    parser = argparse.ArgumentParser(prog="gpucluster", description=plain(__doc__))
    parser.add_argument("--version", action="version", version=f"gpucluster {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    spec_help = "the cluster spec (YAML), or - to read standard input"
    p = sub.add_parser("check", help="validate a cluster spec and report every problem",
                       description="Check a cluster spec: its syntax, then its meaning (radix, rails, Slurm "
                                   "limits, storage). Every problem is reported at once with its file, line, "
                                   "field, rule and fix; exit 2 when there is an error.",
                       epilog="example:\n  gpucluster check examples/staging.yaml",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{spec_help}, e.g. examples/meta-24k-roce.yaml")
    p.add_argument("--json", action="store_true",
                   help="findings as JSON (file, line, column, field, rule, level, message, fix) on stdout")
    _suppress_arg(p)
    p.add_argument("--no-color", action="store_true", help="plain output even on a terminal (also: NO_COLOR=1)")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("plan", help="physical design: switches per tier, oversubscription, bisection bandwidth",
                       description="Plan the fabric of a spec: switches per tier, links, oversubscription, "
                                   "bisection bandwidth, racks and storage, with a line for every count that "
                                   "rounding raised above its arithmetic minimum (docs/plan.md).",
                       epilog="examples:\n"
                              "  gpucluster plan examples/colossus-200k.yaml\n"
                              "  gpucluster plan examples/colossus-200k.yaml --json | jq .switches\n"
                              "  gpucluster plan examples/meta-24k-roce.yaml --html plan.html --svg fabric.svg\n"
                              "  gpucluster plan examples/colossus-200k.yaml --svg pod49.svg --pod 49",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{spec_help}, e.g. examples/colossus-200k.yaml")
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys: docs/spec.md); "
                                                       "on a bad spec, the findings as check --json prints them")
    _suppress_arg(p)
    p.add_argument("--svg", metavar="FILE", help="write the fabric diagram (SVG) to FILE")
    p.add_argument("--html", metavar="FILE", help="write the plan as one self-contained HTML page to FILE")
    p.add_argument("--pod", type=int, metavar="N",
                   help="in the diagram, draw pod N unit by unit (with 2 tiers: unit N rack by rack)")
    p.add_argument("--no-color", action="store_true", help="plain output even on a terminal (also: NO_COLOR=1)")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("render", help="write slurm.conf, topology.conf, gres.conf, cgroup.conf, nccl.conf, "
                                      "cabling.csv, bom.csv",
                       description="Render every file of a spec into a folder: Slurm and NCCL configs from "
                                   "templates/, the cabling map, the bill of materials and plan.json. All files "
                                   "are written or none.",
                       epilog="examples:\n"
                              "  gpucluster render examples/staging.yaml -o out/staging\n"
                              "  gpucluster render examples/colossus-200k.yaml -o out/colossus --no-cabling",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{spec_help}, e.g. examples/staging.yaml")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="output folder, replaced as a whole set: readers see the old files or the new ones; "
                        "files an earlier render wrote and this one does not are removed, yours are kept")
    p.add_argument("--no-cabling", action="store_true", help="skip the per-port cabling map")
    p.add_argument("--no-color", action="store_true", help="plain output even on a terminal (also: NO_COLOR=1)")
    p.add_argument("--slurm-version", metavar="V", help="render for this Slurm release instead of the spec's "
                                                         "slurm.version (22.05 .. 26.05), e.g. to diff an upgrade")
    p.set_defaults(func=cmd_render)
    if command not in BUILTIN:
        wanted = (command,) if command in COMMANDS else COMMANDS  # --help, --version, a typo: every command
        for module in dict.fromkeys(subcommand_module(name) for name in wanted):
            module.register(sub)
    return parser


def closed_pipe() -> int:
    """The reader of stdout went away (`gpucluster plan X | head -1`): end quietly with the status a shell
    gives a process SIGPIPE killed (128 + 13), as cat or grep would. Stdout is pointed at /dev/null so the
    interpreter's last flush of what is still buffered does not fail again."""
    import signal

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    # The CLI loads no pydantic plugins: their discovery scans every installed distribution's entry
    # points (~40 ms per command). Set only for this process, never by `import gpucluster`.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return rc
    except BrokenPipeError:
        return closed_pipe()
    except SpecError as exc:
        for f in exc.findings:
            print(f"error: {f.render()}", file=sys.stderr)
        if exc.findings:
            n = len(exc.findings)
            print(f"{n} problem{'' if n == 1 else 's'}; nothing was written", file=sys.stderr)
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
