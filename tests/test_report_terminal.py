"""What check, plan and render print, through a pipe and on a terminal: every value whole, words agreed.

Expected values come from `plan --json` (the same plan), never from a copy of the output.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, dump_spec, example_data, example_path

from gpucluster.cli import build_parser
from gpucluster.cluster import load_cluster
from gpucluster.fabric.summary import plan_summary
from gpucluster.progress import progress
from gpucluster.report.terminal import Screen, colour_wanted, print_plan
from gpucluster.words import number, plural

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def shell(command: str, **env: str) -> str:
    """A command line as a person types it, pipes included, with this checkout's gpucluster first."""
    full = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env)
    full.pop("NO_COLOR", None)
    gpucluster = f"{sys.executable} -m gpucluster.cli"
    return subprocess.run(["bash", "-o", "pipefail", "-c", command.replace("gpucluster", gpucluster, 1)],
                          capture_output=True, text=True, env=full, cwd=ROOT, timeout=120, check=True).stdout


def values(summary: dict) -> list[str]:
    """Every figure `plan` shows, as it must appear: whole, with thousands separators."""
    out = [f"{summary['nodes']:,} nodes", f"{summary['gpus']:,} GPUs"]
    out += [f"{k} {v:,}" for k, v in summary["links"].items()]
    out += [f"{number(summary['bisection_tbps'])} Tb/s", f"racks: {summary['racks']:,}"]
    for e in summary["explanations"]:
        out += [f"{e['count']:,}, {e['excess']:,} above the {e['minimum']:,}", e["why"], e["fix"]]
    return out


def tier_rows(summary: dict) -> list[list[str]]:
    ratio, ports = summary["oversubscription"], summary["ports_used"]
    return [[tier, summary["switch_models"][tier], f"{n:,}", f"{ports[tier]['down']}/{ports[tier]['up']}",
             str(ports[tier]["radix"]), ratio.get(tier, "-")] for tier, n in summary["switches"].items()]


@pytest.fixture(scope="module")
def colossus() -> tuple[dict, str]:
    summary = json.loads(shell("gpucluster plan examples/colossus-200k.yaml --json"))
    return summary, shell("gpucluster plan examples/colossus-200k.yaml | cat")


def test_piped_plan_has_every_value_and_no_truncated_cell(colossus):
    summary, out = colossus
    assert not ANSI.search(out), "colour codes in a pipe"
    assert "…" not in out and "..." not in out
    for v in values(summary):
        assert v in out, v
    lines = out.splitlines()
    for row in tier_rows(summary):
        line = next(x for x in lines if x.split()[:1] == [row[0]])
        assert line.split() == row, line
    header = next(x for x in lines if x.startswith("tier"))
    assert header.split("  ")[0] == "tier" and "oversubscription" in header


def test_columns_60_changes_nothing_in_a_pipe(colossus):
    _summary, out = colossus
    assert shell("gpucluster plan examples/colossus-200k.yaml | cat", COLUMNS="60") == out


def rich_plan(name: str, width: int) -> str:
    cluster = load_cluster(example_path(name))
    buf = io.StringIO()
    print_plan(Screen(buf, rich=True, width=width), cluster.plan, plan_summary(cluster.plan), cluster.warnings)
    return buf.getvalue()


@pytest.mark.parametrize("width", [60, 200])
def test_a_terminal_of_any_width_gets_every_value_whole(colossus, width):
    """60 columns cannot hold the tier table: it becomes one record per tier, and long lines wrap between
    words, so no figure is cut or ellipsised."""
    summary, _out = colossus
    raw = rich_plan("colossus-200k", width)
    text = ANSI.sub("", raw)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    flat = " ".join(text.split())  # wrapped lines joined back
    for v in values(summary):
        assert " ".join(v.split()) in flat, v
    for row in tier_rows(summary):
        for cell in row:
            assert re.search(rf"(^|[\s:│]){re.escape(cell)}($|[\s│])", text, re.M), (row[0], cell)


def test_no_highlighting_inside_numbers(colossus):
    """Rich's highlighter would colour '24' and '576' apart; every number reaches the terminal in one piece."""
    summary, plain = colossus
    raw = rich_plan("colossus-200k", 250)
    assert ANSI.search(raw), "a terminal gets some style"
    numbers = set(re.findall(r"\d[\d,.]*\d", plain))
    assert {f"{summary['gpus']:,}", f"{summary['links']['spine-core']:,}"} <= numbers
    for n in numbers:
        assert n in raw, f"{n} is split by escape codes"
    assert not re.search(r"\d\x1b\[[0-9;]*m[\d,]", raw)


def test_plurals_where_there_is_one(tmp_path):
    out = shell("gpucluster plan examples/staging.yaml | cat")
    summary = json.loads(shell("gpucluster plan examples/staging.yaml --json"))
    assert summary["fabric"]["rails"] == 1 and summary["storage"]["flash"]["chunk_servers"] == 1
    assert ", 1 rail;" in out and "1 chunk server," in out and "(1 server," not in out
    assert re.search(r"nfs tier '\w+': 1 server, 1 export \(", out)
    for wrong in ("1 rails", "1 chunk servers", "1 servers", "1 exports", "1 warnings"):
        assert wrong not in out
    data = example_data("staging")
    data["fabric"]["switches"]["core"] = data["fabric"]["switches"]["spine"]  # unused on 2 tiers: one warning
    spec = tmp_path / "one-warning.yaml"
    spec.write_text(dump_spec(data))
    checked = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(spec)], capture_output=True,
                             text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), check=True)
    assert checked.stdout.rstrip().endswith(", 1 warning)"), checked.stdout
    assert checked.stderr.count("warning: ") == 1


def test_plural_words():
    assert [plural(1, "warning"), plural(2, "warning"), plural(1, "chunk server"), plural(3, "chunk server"),
            plural(2, "leaf"), plural(24_576, "GPU"), plural(2, "policy")] == [
        "1 warning", "2 warnings", "1 chunk server", "3 chunk servers", "2 leaves", "24,576 GPUs", "2 policies"]
    assert [number(40_000.0), number(251_658.24), number(0.02), number(24_576)] == [
        "40,000", "251,658.24", "0.02", "24,576"]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_for_a_person_at_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert colour_wanted(Tty()) and not colour_wanted(io.StringIO())
    assert not colour_wanted(Tty(), no_color=True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_wanted(Tty())


def test_no_color_flag_gives_plain_output_on_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    tty = Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    from gpucluster.cli import main

    assert main(["plan", str(example_path("staging"))]) == 0
    assert ANSI.search(tty.getvalue())
    tty.seek(0)
    tty.truncate()
    assert main(["plan", str(example_path("staging")), "--no-color"]) == 0
    assert not ANSI.search(tty.getvalue()) and "leaf00001" not in tty.getvalue()
    assert "tier   model" in tty.getvalue()


# ---- help ---------------------------------------------------------------------------------------------

def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.parametrize("command", ["check", "plan", "render"])
def test_every_argument_has_help_and_the_epilog_an_example(command):
    p = subparsers()[command]
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 10, f"{command} {action.dest} has no help"
    assert p.description and f"gpucluster {command} examples/" in (p.epilog or "")
    text = p.format_help()
    assert "example" in text and p.epilog.splitlines()[1].strip() in text  # kept as written, not reflowed


# ---- progress -----------------------------------------------------------------------------------------

def test_progress_shows_a_bar_on_a_terminal_only_after_the_delay():
    tty = Tty()
    with progress("cabling.csv", 10, unit="units", stream=tty, delay=0, enabled=True) as advance:
        for _ in range(10):
            advance()
    assert "cabling.csv" in ANSI.sub("", tty.getvalue())
    quiet = Tty()
    with progress("cabling.csv", 10, stream=quiet, delay=60, enabled=True) as advance:
        advance(10)
    assert quiet.getvalue() == ""
    pipe = io.StringIO()
    with progress("cabling.csv", 10, stream=pipe, delay=0) as advance:
        advance(10)
    assert pipe.getvalue() == ""
