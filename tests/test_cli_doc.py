"""docs/cli.md and the README's command table come from the parser, so they cannot drift from it:
README's command table and docs/cli.md agree, and this test keeps them in step.

The page is regenerated here in memory and compared; after a change to the CLI, rewrite both with

    GPUCLUSTER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_cli_doc.py      (or: .venv/bin/python tests/test_cli_doc.py)

and review the diff. Usage lines are formatted at a fixed width, so the page does not depend on the terminal."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
BEGIN = "<!-- commands: generated from the parser (tests/test_cli_doc.py); edit the help text, not this table -->"
END = "<!-- end of commands -->"
WIDTH = 100


def _tree():
    from gpucluster.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...], one_liner: str):
        yield path, parser, one_liner
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help or "" for a in action._choices_actions}
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name), helps.get(name, ""))

    return list(walk(build_parser(None), ("gpucluster",), ""))


def _cell(text: str) -> str:
    """One line of Markdown text: `|` escaped for the table, and <x> outside code spans shown, not read as HTML."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _option(a: argparse.Action) -> str:
    return a.option_strings[0] + ("" if a.nargs == 0 else f" {a.metavar or a.dest.upper()}")


def _synopsis(path: tuple[str, ...], parser: argparse.ArgumentParser) -> str:
    """The command, its positionals, and what it requires: one option, or one of a required group."""
    words = []
    for a in parser._actions:
        if a.option_strings or isinstance(a, argparse._SubParsersAction):
            continue
        name = a.metavar or a.dest.upper()
        words.append(f"[{name}]" if a.nargs == "?" else name)
    words += [_option(a) for a in parser._actions if a.option_strings and a.required]
    words += [" / ".join(_option(a) for a in g._group_actions) for g in parser._mutually_exclusive_groups
              if g.required]
    return " ".join([*path, *words])


def _leaves():
    return [(path, parser, one) for path, parser, one in _tree() if parser.get_default("func") is not None]


def command_table() -> str:
    """The README's table, and docs/cli.md's first: every command one can run, with its one-liner."""
    rows = ["| command | what it does |", "|---|---|"]
    rows += [f"| `{_cell(_synopsis(path, parser))}` | {_cell(one)} |" for path, parser, one in _leaves()]
    return "\n".join(rows) + "\n"


def _usage(parser: argparse.ArgumentParser) -> str:
    fmt = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    from gpucluster.commands._flags import DeprecatedAlias

    fmt = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    rows = []
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, (argparse._SubParsersAction, DeprecatedAlias)):
            continue
        if a.option_strings:
            value = "" if a.nargs == 0 else " {" + ",".join(map(str, a.choices)) + "}" if a.choices else \
                f" {a.metavar or a.dest.upper()}"
            name = ", ".join(a.option_strings) + value
        else:
            name = a.metavar or a.dest.upper()
        rows.append(f"| `{_cell(name)}` | {_cell(fmt._expand_help(a))} |")
    return ["| argument | what it means |", "|---|---|", *rows] if rows else []


def cli_markdown() -> str:
    from gpucluster.commands._flags import DeprecatedAlias
    from gpucluster.words import FLAGS

    out = ["# Command line reference", "",
           "Generated from the parser by tests/test_cli_doc.py, which fails when this page and the CLI differ; "
           "edit the help text in the code, then rewrite the page with "
           "`GPUCLUSTER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_cli_doc.py`.", "",
           "Every command that prints a report takes `--json` (one JSON document on stdout) and `--no-color` "
           "(so does a non-empty `NO_COLOR` environment variable, as https://no-color.org asks). A flag means "
           "the same on every command that has it: see [Flags](#flags).", "",
           "## Commands", "", command_table().rstrip()]
    for path, parser, _one in _tree()[1:]:
        out += ["", f"## {' '.join(path)}", "", _cell(parser.description or ""), "",
                "```", _usage(parser), "```"]
        args = _arguments(parser)
        if args:
            out += ["", *args]
        if parser.epilog:
            out += ["", "```", parser.epilog.strip(), "```"]
    out += ["", "## Flags", "",
            "Each flag name has one meaning across the CLI (`gpucluster.words.FLAGS`; tests/test_cli_flags.py holds "
            "every command to it).", "", "| flag | value | meaning |", "|---|---|---|"]
    for name, flag in sorted(FLAGS.items(), key=lambda kv: kv[0].lstrip("-").lower()):
        value = " or ".join(flag.shown) if flag.shown else ("one of a list" if flag.kind == "choice" else "")
        out.append(f"| `{name}` | {_cell(value)} | {_cell(flag.meaning)} |")
    aliases = [(" ".join(path), a) for path, parser, _ in _tree() for a in parser._actions
               if isinstance(a, DeprecatedAlias)]
    if aliases:
        out += ["", "## Deprecated spellings", "",
                "Still accepted for one release, with a warning on stderr that names the new flag.", "",
                "| command | old | new |", "|---|---|---|"]
        out += [f"| `{cmd}` | `{a.option_strings[0]}` | `{a.replaced_by}` |" for cmd, a in aliases]
    return "\n".join(out) + "\n"


def readme_table(text: str) -> str:
    """The README's generated table, between its two marker lines."""
    assert BEGIN in text and END in text, f"README.md: the command table's markers are missing ({BEGIN})"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write_docs() -> None:
    DOC.write_text(cli_markdown())
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    README.write_text(head + BEGIN + "\n" + command_table() + rest[rest.index(END):])


def test_docs_cli_md_is_the_parser():
    if os.environ.get("GPUCLUSTER_UPDATE_GOLDEN") == "1":
        write_docs()
    assert DOC.read_text() == cli_markdown(), "docs/cli.md differs from the parser: GPUCLUSTER_UPDATE_GOLDEN=1"


def test_the_readme_lists_the_same_commands_with_the_same_one_liners():
    if os.environ.get("GPUCLUSTER_UPDATE_GOLDEN") == "1":
        write_docs()
    got, want = readme_table(README.read_text()), command_table()
    rows = re.compile(r"^\| `([^`]+)` \| (.*) \|$", re.MULTILINE)
    assert dict(rows.findall(got)) == dict(rows.findall(want)), "README.md's command table differs from the parser"
    assert got == want


def test_the_table_is_in_the_page_too():
    assert command_table() in DOC.read_text()


def test_every_command_has_its_section():
    page = DOC.read_text()
    for path, _parser, _one in _tree()[1:]:
        assert f"\n## {' '.join(path)}\n" in page


if __name__ == "__main__":
    write_docs()
