"""The CLI teaches: every command and subcommand of the parser tree has a description, and every argument,
positional or not, has help (issue 23). The walk covers every command registered, so a command added
without help fails here."""

from __future__ import annotations

import argparse

import pytest

from gpucluster.cli import build_parser


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


TREE = list(_walk(build_parser(None), ("gpucluster",)))


def test_the_walk_sees_every_command():
    names = {" ".join(path) for path, _ in TREE}
    assert {"gpucluster check", "gpucluster stage up", "gpucluster fabric test-plan", "gpucluster health status",
            "gpucluster diff", "gpucluster rollout"} <= names


@pytest.mark.parametrize(("path", "parser"), TREE, ids=[" ".join(p) for p, _ in TREE])
def test_every_command_has_a_description(path, parser):
    assert parser.description and len(parser.description.split()) >= 5, f"{' '.join(path)}: no description"


ARGS = [(path, action) for path, parser in TREE for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction))]


@pytest.mark.parametrize(("path", "action"), ARGS,
                         ids=[f"{' '.join(p)} {'/'.join(a.option_strings) or a.dest}" for p, a in ARGS])
def test_every_argument_has_help(path, action):
    name = "/".join(action.option_strings) or action.dest
    assert action.help and action.help.strip(), f"{' '.join(path)}: {name} has no help"


@pytest.mark.parametrize(("path", "parser"), TREE, ids=[" ".join(p) for p, _ in TREE])
def test_no_markup_leaks_into_help(path, parser):
    """Module docstrings become descriptions: their reST/Markdown code marks must not reach the terminal."""
    texts = [parser.description or "", parser.epilog or ""] + [a.help or "" for a in parser._actions]
    for text in texts:
        assert "``" not in text and ":ref:" not in text and "**" not in text, f"{' '.join(path)}: {text[:80]}"
    assert not (parser.description or "").startswith("`"), f"{' '.join(path)}: description starts with markup"
