"""What every command module shares: the report flags (--json, --no-color) and their printing, a deprecated
spelling's warning, and the spec commands' --suppress and --fail-on with the one way they judge findings. Every
option keeps its one meaning in gpucluster.words.FLAGS (tests/test_cli_flags.py)."""

from __future__ import annotations

import argparse
import json
import re
import sys

from gpucluster.errors import Finding, SpecError, failing, in_order, suppressed


def print_json(data: object) -> None:
    """Every --json report goes through here: indented, and never NaN (the spec refuses NaN and infinity, so one
    here is a bug, never invalid JSON on stdout). A dataclass prints as its fields, a path as its text."""
    print(json.dumps(data, indent=2, allow_nan=False, default=_plain_data))


def _plain_data(value: object) -> object:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


# The conventions every command shares. A report command takes both --json and --no-color;
# tests/test_cli_flags.py holds every option to its one meaning in gpucluster.words.FLAGS.
SPEC_HELP = "the cluster spec (YAML), or - to read standard input"
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


def suppress_findings(findings: list, args: argparse.Namespace) -> list:
    """--suppress RULE|FIELD drops the warnings it matches; an error is never dropped (and we say so)."""
    kept, refused = suppressed(findings, args.suppress or ())
    for name in refused:
        print(f"note: --suppress {name} does not apply to errors", file=sys.stderr)
    return in_order(kept)


def gate(findings: list[Finding], args: argparse.Namespace) -> list[Finding]:
    """The one way check, plan and render judge findings: suppressed, in reading order, and refused as a
    whole (SpecError: every finding, then the summary line) when one fails at the --fail-on level."""
    kept = suppress_findings(findings, args)
    if failing(kept, args.fail_on):
        raise SpecError(kept, fail_on=args.fail_on)
    return kept


def flag_blamed(findings: list[Finding], flag: str, field: tuple) -> list[Finding]:
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


def _rule_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}|[A-Za-z0-9_.*\[\]-]{1,200}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a rule name (the word in [brackets] after a finding) "
                                         "nor a field path (node_groups[2].nic)")
    return text


def suppress_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suppress", action="append", metavar="RULE|FIELD", type=_rule_name,
                   help="hide warnings of this rule (the word in [brackets]) or at this field path and beneath it "
                        "(node_groups[2].nic, node_groups[*]); repeatable; errors are never suppressed")
    p.add_argument("--fail-on", choices=("error", "warning"), default="error",
                   help="the least severe finding that fails the run with exit 2 (default: error; CI: warning)")
