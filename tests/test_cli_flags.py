"""One meaning per flag name across the whole CLI, and --json and --no-color on every command that prints a report.
The table is gpucluster.words.FLAGS; the walk is tests/test_cli_help.py's, so a command added later is
held to the table too.

"Meaning", concretely: each option name has one line in FLAGS with the kind of value it takes (switch, int, float,
text, choice) and the name --help gives that value (its metavar); every use of the name must take that kind of
value under that name, into the same dest, and a short option means what its long one means. `--limit` taking a
host pattern in one command and a count in another fails here, as `--hosts` taking a CSV of addresses in one and a
MAP.csv of site names in another did."""

from __future__ import annotations

import argparse
import json

import pytest
from conftest import example_path
from test_cli_help import TREE

from gpucluster.cli import build_parser, main
from gpucluster.commands._flags import DeprecatedAlias
from gpucluster.words import FLAGS

# Commands that print something but no report a script would read, each with the reason.
NOT_REPORTS = {
    "gpucluster demo": "a walkthrough for a person: it prints each step as it runs; every step's own command "
                       "takes --json",
}


def kind_of(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices:
        return "choice"
    return {int: "int", float: "float"}.get(action.type, "text")


def shown_as(action: argparse.Action) -> str:
    """The value's name as --help prints it ("" for a switch or a choice)."""
    if action.nargs == 0 or action.choices:
        return ""
    return action.metavar or action.dest.upper()


USES = [(" ".join(path), option, action) for path, parser in TREE for action in parser._actions
        if not isinstance(action, DeprecatedAlias) for option in action.option_strings]
LEAVES = [(" ".join(path), parser) for path, parser in TREE if parser.get_default("func") is not None]
ALIASES = [(" ".join(path), parser, action) for path, parser in TREE for action in parser._actions
           if isinstance(action, DeprecatedAlias)]


@pytest.mark.parametrize(("command", "option", "action"), USES, ids=[f"{c} {o}" for c, o, _ in USES])
def test_every_use_of_a_flag_has_its_one_meaning(command, option, action):
    assert option in FLAGS, f"{command} {option}: not in gpucluster.words.FLAGS; add its one meaning there"
    flag = FLAGS[option]
    got = kind_of(action)
    assert got == flag.kind, f"{command} {option} takes {got}, but {option} means {flag.meaning!r} ({flag.kind})"
    if flag.kind not in ("switch", "choice"):
        shown = shown_as(action)
        assert shown in flag.shown, (f"{command} {option} {shown}: {option} takes {' or '.join(flag.shown)} "
                                     f"everywhere ({flag.meaning})")
    for other in action.option_strings:
        assert FLAGS.get(other) == flag, f"{command}: {'/'.join(action.option_strings)} mean different things"


def test_one_name_lands_in_one_dest():
    dests: dict[str, set[str]] = {}
    for _command, option, action in USES:
        dests.setdefault(option, set()).add(action.dest)
    assert {o: d for o, d in dests.items() if len(d) > 1} == {}


def test_every_line_of_the_table_is_used():
    used = {option for _, option, _ in USES}
    assert set(FLAGS) - used == set(), "FLAGS lines with no use: remove them (or the flag was renamed)"


@pytest.mark.parametrize(("command", "parser"), LEAVES, ids=[c for c, _ in LEAVES])
def test_every_report_command_takes_json_and_no_color(command, parser):
    options = {o for a in parser._actions for o in a.option_strings}
    if command in NOT_REPORTS:
        assert "--json" not in options, f"{command} has --json: take it out of NOT_REPORTS"
        return
    assert {"--json", "--no-color"} <= options, f"{command}: a report command takes --json and --no-color"


def test_the_aliases_are_the_ones_issue_23_renamed():
    """The old spellings kept for one release, and only those: remove a line here when its alias goes."""
    assert {(c, a.option_strings[0], a.replaced_by) for c, _, a in ALIASES} == {
        ("gpucluster fabric discover", "--limit", "--max-findings"),
        ("gpucluster fabric verify", "--limit", "--max-findings"),
        ("gpucluster fabric verify", "--hosts", "--sites"),
        ("gpucluster fabric test", "--limit", "--slowest"),
    }


@pytest.mark.parametrize(("command", "parser", "alias"), ALIASES,
                         ids=[f"{c} {a.option_strings[0]}" for c, _, a in ALIASES])
def test_an_old_spelling_still_works_and_names_the_new_one(command, parser, alias, capsys):
    new = next(a for a in parser._actions if alias.replaced_by in a.option_strings and a is not alias)
    assert new.dest == alias.dest and alias.help == argparse.SUPPRESS
    words = command.split()[1:]
    need = {"discover": ["--ibnetdiscover", "d.txt"], "verify": ["s.yaml", "--lldp", "l/"], "test": ["inv/"]}
    value = "7" if new.type is int else "m.csv"
    base = [*words, *need[words[-1]]]
    parse = build_parser().parse_args
    assert parse([*base, alias.option_strings[0], value]) == parse([*base, alias.replaced_by, value])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and alias.replaced_by in err[0] and err[0].startswith("warning:"), err


def test_no_color_sets_no_color_for_the_whole_process(tmp_path, monkeypatch, capsys):
    import os

    monkeypatch.delenv("NO_COLOR", raising=False)
    spec = str(example_path("staging"))
    assert main(["diff", spec, spec, "--no-color"]) == 0
    assert os.environ.get("NO_COLOR") == "1"


@pytest.mark.parametrize(("value", "colour"), [(None, True), ("", True), ("1", False), ("no", False)])
def test_no_color_means_present_and_not_empty(value, colour, monkeypatch):
    """https://no-color.org: NO_COLOR present and not empty turns color off, whatever its value."""
    from gpucluster.report.terminal import colour_wanted

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm")
    if value is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", value)
    assert colour_wanted(Tty()) is colour


def _json_runs(tmp):
    staging, ib, roce = (str(example_path(n)) for n in ("staging", "meta-24k-ib", "meta-24k-roce"))
    return {
        "render": ["render", staging, "-o", f"{tmp}/r", "--no-cabling"],
        "health render": ["health", "render", staging, "-o", f"{tmp}/h"],
        "fabric topofile": ["fabric", "topofile", ib, "-o", f"{tmp}/f.topo"],
        "fabric switch-config": ["fabric", "switch-config", roce, "-o", f"{tmp}/sw"],
        "rollout --dry-run": ["rollout", staging, "--dry-run", "--by", "node"],
        "secrets": ["secrets", "--generate", "-o", f"{tmp}/s.json"],
        "diff": ["diff", staging, staging],
    }


@pytest.mark.parametrize("name", list(_json_runs("T")))
def test_a_json_form_is_one_json_document(name, tmp_path, capsys):
    argv = _json_runs(tmp_path)[name]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict) and doc
    if name == "secrets":
        assert set(doc) == {"written", "mode"}  # the path, never the secrets


def test_rollout_status_json_is_the_state_file(tmp_path, capsys):
    """rollout --status --json prints the state the rollout keeps (and where), the same the text form reads."""
    from gpucluster.cluster import load_cluster
    from gpucluster.rollout import engine, state
    from gpucluster.rollout.waves import plan_waves, topology_units

    spec = example_path("staging")
    cluster = load_cluster(spec)
    units = topology_units(cluster.plan, "node", cluster.contract_groups["slurm_compute"])
    s = engine.new_state("r1", cluster=cluster.name, source=str(spec), change="reboot", by="node", max_unavailable=1,
                         waves=plan_waves(units, 1, by="node"), skipped=[], halt_share=0.1)
    path = state.state_path(tmp_path / "s")
    state.save(path, s)
    assert main(["rollout", str(spec), "--status", "--json", "--state-dir", str(tmp_path / "s")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc.pop("state_file") == str(path) and doc == json.loads(path.read_text())
