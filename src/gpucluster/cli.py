"""`gpucluster`: infrastructure as code for GPU training clusters. One cluster spec (YAML) gives the fabric plan,
the rendered Slurm and NCCL files, the Ansible inventory, a converged cluster and its validation. Bad input exits
2 with located findings and no traceback."""

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
from gpucluster.errors import (
    Finding,
    OperationError,
    SpecError,
    UsageError,
    failing,
    findings_report,
    in_order,
    summary,
    suppressed,
)
from gpucluster.words import plain

BUILTIN = ("check", "plan", "render", "expand")
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


def print_json(data: object) -> None:
    """Every --json report goes through here: indented, and never NaN (the spec refuses NaN and infinity, so one
    here is a bug, never invalid JSON on stdout). A dataclass prints as its fields, a path as its text."""
    print(json.dumps(data, indent=2, allow_nan=False, default=_plain_data))


def _plain_data(value: object) -> object:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


_print_json = print_json

# The conventions every command shares (issue 23). A report command takes both --json and --no-color;
# tests/test_cli_flags.py holds every option to its one meaning in gpucluster.words.FLAGS.
NO_COLOR_HELP = "plain text, no color, even on a terminal (so does a non-empty NO_COLOR environment variable)"


def json_flag(p: argparse.ArgumentParser, help: str) -> None:
    """--json: the report as JSON on stdout; `help` names what the document holds."""
    p.add_argument("--json", action="store_true", help=help)


def no_color_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-color", action="store_true", help=NO_COLOR_HELP)


def report_flags(p: argparse.ArgumentParser, json_help: str) -> None:
    """--json and --no-color, for a command that prints a report."""
    json_flag(p, json_help)
    no_color_flag(p)


class DeprecatedAlias(argparse.Action):
    """An old spelling kept for one release: it stores into its new flag's dest, is hidden from --help, and
    says on stderr, in one line, which flag replaces it."""

    def __init__(self, option_strings: list[str], dest: str, replaced_by: str = "", **kwargs: object) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.replaced_by = replaced_by

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"warning: {option_string} is deprecated in `{parser.prog}`: use {self.replaced_by} "
              "(the old spelling is removed in the next release)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def deprecated_alias(p: argparse.ArgumentParser, old: str, new: str) -> None:
    """Accept `old` as a spelling of the option `new` already added to `p`, with a warning, for one release."""
    action = next(a for a in p._actions if new in a.option_strings)
    p.add_argument(old, action=DeprecatedAlias, replaced_by=new, dest=action.dest, type=action.type,
                   metavar=action.metavar, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _suppress(findings: list, args: argparse.Namespace) -> list:
    """--suppress RULE|FIELD drops the warnings it matches; an error is never dropped (and we say so)."""
    kept, refused = suppressed(findings, args.suppress or ())
    for name in refused:
        print(f"note: --suppress {name} does not apply to errors", file=sys.stderr)
    return in_order(kept)


def _gate(findings: list[Finding], args: argparse.Namespace) -> list[Finding]:
    """The one way check, plan and render judge findings: suppressed, in reading order, and refused as a
    whole (SpecError: every finding, then the summary line) when one fails at the --fail-on level."""
    kept = _suppress(findings, args)
    if failing(kept, args.fail_on):
        raise SpecError(kept, fail_on=args.fail_on)
    return kept


def _flag_blamed(findings: list[Finding], flag: str, field: tuple) -> list[Finding]:
    """A value given by a flag replaces a field of the spec: what is wrong with it is the flag's, not the
    line of the file that the flag overrode (`--slurm-version 99.1` is not slurm.version's "22.05")."""
    out = []
    for f in findings:
        said = f"{'.'.join(field)} is"
        msg, fix = f.message.replace(said, f"{flag} is"), f.fix.replace(f"set {'.'.join(field)}", f"set {flag}")
        if f.path == field:
            out.append(Finding((flag,), msg, fix, f.rule, f.level))
        else:
            out.append(Finding(f.path, msg, fix, f.rule, f.level, f.file, f.line, f.column))
    return out


def cmd_check(args: argparse.Namespace) -> int:
    from gpucluster.cluster import check_file
    from gpucluster.report.terminal import Screen, print_check

    try:
        loaded, findings = check_file(args.spec)
    except SpecError as exc:
        loaded, findings = None, exc.findings
    findings = _suppress(findings, args)
    failed = bool(failing(findings, args.fail_on))
    if args.json:
        extra = {}
        if loaded is not None and not failed:
            spec = loaded.spec
            extra = {"node_groups": len(spec.node_groups), "nodes": sum(g.count for g in spec.node_groups)}
        _print_json(findings_report(findings, args.spec, args.fail_on, **extra))
        return 2 if failed else 0
    if failed or loaded is None:
        raise SpecError(findings, fail_on=args.fail_on)
    spec = loaded.spec
    rich = False if args.no_color else None
    print_check(Screen(rich=rich), Screen(sys.stderr, rich=rich), args.spec, len(spec.node_groups),
                sum(g.count for g in spec.node_groups), findings)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.summary import plan_summary

    if args.pod is not None and not (args.svg or args.html):
        raise UsageError("--pod chooses what the diagram expands: give --svg FILE or --html FILE with it")
    try:
        cluster = load_cluster(args.spec)
        warnings = _gate(list(cluster.warnings), args)
    except SpecError as exc:
        if not args.json:
            raise
        _print_json(findings_report(exc.findings, args.spec, args.fail_on))
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

    print_plan(Screen(rich=False if args.no_color else None), cluster.plan, summary, warnings)
    return 0


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
        raise SpecError(_flag_blamed(exc.findings, "--slurm-version", field)) from None
    warnings = list(cluster.warnings)
    if args.slurm_version is not None:
        warnings = _flag_blamed(warnings, "--slurm-version", field)
    warnings = _gate(warnings, args)  # before any file is written: --fail-on warning writes nothing
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


def cmd_expand(args: argparse.Namespace) -> int:
    from gpucluster.spec.expand import expand_file, expand_json

    if args.json:
        _print_json(expand_json(args.spec))
        return 0
    sys.stdout.write(expand_file(args.spec))
    return 0


def _rule_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}|[A-Za-z0-9_.*\[\]-]{1,200}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a rule name (the word in [brackets] after a finding) "
                                         "nor a field path (node_groups[2].nic)")
    return text


def _suppress_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suppress", action="append", metavar="RULE|FIELD", type=_rule_name,
                   help="hide warnings of this rule (the word in [brackets]) or at this field path and beneath it "
                        "(node_groups[2].nic, node_groups[*]); repeatable; errors are never suppressed")
    p.add_argument("--fail-on", choices=("error", "warning"), default="error",
                   help="the least severe finding that fails the run with exit 2 (default: error; CI: warning)")


# What render writes, family by family, each with the pattern of its files' names. render's one-liner is made
# from the families, and tests/test_cli_help.py renders the examples and holds every file to one of them, so the
# one-liner stays true when render learns a file.
RENDER_FAMILIES = (
    ("Slurm", r"slurm\.conf|gres\.conf|cgroup\.conf|topology\.(conf|yaml)|slurmdbd\.conf"),
    ("NCCL", r"nccl\.conf|nccl-env\.sh"),
    ("host and switch RoCE QoS", r"roce-qos\.conf|[a-z]+-(sonic|eos)-qos\.(json|cfg)"),
    ("storage daemons and mounts", r"mfs[a-z]*\.cfg|ganesha\.conf|[a-z0-9-]+\.mount"),
    ("driver and library apt sources and pins",
     r"apt-[a-z_]+-[a-z0-9_-]+\.(sources|pref)|nvidia-peermem-[a-z0-9_-]+\.conf|slurmd-nvidia-[a-z0-9_-]+\.conf"),
    ("IMEX domain node lists", r"imex-domain\.[A-Za-z0-9_.-]+\.hosts"),
    ("health checks", r"gpucluster-health(-[a-z]+)?(\.service|\.timer)?|health-config\.[a-z0-9_-]+\.json"),
    ("cabling.csv", r"cabling\.csv"),
    ("fabric.topo", r"fabric\.topo"),
    ("bom.csv", r"bom\.csv"),
    ("plan.json", r"plan\.json"),
)
RENDER_HELP = "write every file of a spec into a folder: " + ", ".join(name for name, _ in RENDER_FAMILIES)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for `gpucluster COMMAND ...`; without a command, the whole tree (every subcommand)."""
    parser = argparse.ArgumentParser(prog="gpucluster", description=plain(__doc__),
                                     epilog="Each command's own help: gpucluster COMMAND --help. Every command and "
                                            "flag: docs/cli.md.")
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
    no_color_flag(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("plan", help="physical design: switches per tier, oversubscription, bisection bandwidth",
                       description="Plan the fabric of a spec: switches per tier, links, oversubscription, "
                                   "bisection bandwidth, racks and storage, with a line for every count that "
                                   "rounding raised above its arithmetic minimum (docs/plan.md).",
                       epilog="examples:\n"
                              "  gpucluster plan examples/colossus-200k.yaml\n"
                              "  gpucluster plan examples/colossus-200k.yaml --html plan.html --svg pod49.svg --pod 49",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{spec_help}, e.g. examples/colossus-200k.yaml")
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys: docs/spec.md); "
                                                       "on a bad spec, the findings as check --json prints them")
    _suppress_arg(p)
    p.add_argument("--svg", metavar="FILE", help="write the fabric diagram (SVG) to FILE")
    p.add_argument("--html", metavar="FILE", help="write the plan as one self-contained HTML page to FILE")
    p.add_argument("--pod", type=int, metavar="N",
                   help="in the diagram, draw pod N unit by unit (with 2 tiers: unit N rack by rack)")
    no_color_flag(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("render", help=RENDER_HELP,
                       description="Render every file of a spec into a folder: Slurm and NCCL configs from "
                                   "templates/, the RoCE and storage settings, the health checks, the cabling map, "
                                   "the bill of materials and plan.json. All files are written or none.",
                       epilog="examples:\n"
                              "  gpucluster render examples/staging.yaml -o out/staging\n"
                              "  gpucluster render examples/colossus-200k.yaml -o out/colossus --no-cabling",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{spec_help}, e.g. examples/staging.yaml")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="output folder, replaced as a whole set: readers see the old files or the new ones; "
                        "files an earlier render wrote and this one does not are removed, yours are kept")
    p.add_argument("--no-cabling", action="store_true", help="skip the per-port cabling map")
    report_flags(p, "what was written as JSON: output, cluster, slurm_version, files (name: bytes), seconds")
    _suppress_arg(p)
    p.add_argument("--slurm-version", metavar="V", help="render for this Slurm release instead of the spec's "
                                                         "slurm.version (22.05 .. 26.05), e.g. to diff an upgrade")
    p.set_defaults(func=cmd_render)
    p = sub.add_parser("expand", help="print the spec with every default filled in and marked '# default'",
                       description="Print the spec as YAML with every field the model knows: the values you wrote, "
                                   "and every default, each marked with a trailing '# default'. The output is a "
                                   "spec that check accepts as it is.",
                       epilog="examples:\n"
                              "  gpucluster expand examples/staging.yaml\n"
                              "  gpucluster expand examples/staging.yaml | grep -v '# default$'",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help=f"{spec_help}, e.g. examples/staging.yaml")
    report_flags(p, "every value, and the field paths that took their default")
    p.set_defaults(func=cmd_expand)
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


def _print_refused(exc: SpecError, args: argparse.Namespace) -> None:
    """Every command that reads a spec or a flag ends a refused run alike: each finding as
    `level: file:line: field: message; fix [rule]`, in reading order, then the summary line."""
    findings = in_order(exc.findings)
    if not findings:
        return
    from gpucluster.report.terminal import Screen

    err = Screen(sys.stderr, rich=False if getattr(args, "no_color", False) else None)
    for f in findings:
        err.finding(f)
    err.line(summary(findings, exc.fail_on))


def main(argv: list[str] | None = None) -> int:
    # The CLI loads no pydantic plugins: their discovery scans every installed distribution's entry
    # points (~40 ms per command). Set only for this process, never by `import gpucluster`.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    if getattr(args, "no_color", False):
        os.environ["NO_COLOR"] = "1"  # one switch for every printer of this process and what it runs
    try:
        rc = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return rc
    except BrokenPipeError:
        return closed_pipe()
    except SpecError as exc:
        _print_refused(exc, args)
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
