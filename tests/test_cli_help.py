"""The CLI teaches: every command and subcommand of the parser tree has a description, and every argument,
positional or not, has help. The walk covers every command registered, so a command added
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


LEAVES = [(path, parser) for path, parser in TREE if parser.get_default("func") is not None]


def examples_of(parser: argparse.ArgumentParser) -> list[str]:
    """The command lines under the epilog's 'example(s):' heading."""
    lines = (parser.epilog or "").splitlines()
    if not any(line in ("example:", "examples:") for line in lines):
        return []
    start = next(i for i, line in enumerate(lines) if line in ("example:", "examples:"))
    out = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        if not line.startswith("      "):  # a continued line is part of the one above
            out.append(line.strip())
    return out


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_has_one_or_two_examples_of_its_own(path, parser):
    """No command repeats its group's examples (every fabric subcommand once repeated an 11-line block): each
    command shows one or two lines, each of which runs that command."""
    mine = examples_of(parser)
    assert 1 <= len(mine) <= 2, f"{' '.join(path)}: {len(mine)} examples"
    for line in mine:
        assert line.startswith(" ".join(path) + " ") or line == " ".join(path), f"{' '.join(path)}: {line}"


def test_no_two_commands_share_an_example():
    seen: dict[str, str] = {}
    for path, parser in LEAVES:
        for line in examples_of(parser):
            assert line not in seen, f"{' '.join(path)} repeats {seen[line]}'s example {line!r}"
            seen[line] = " ".join(path)


RENDERED = ("staging", "meta-24k-ib", "meta-24k-roce", "gb200-superpod")


@pytest.fixture(scope="module")
def rendered_names() -> dict[str, set[str]]:
    from conftest import example_path

    from gpucluster.cluster import load_cluster
    from gpucluster.render import render_all

    return {name: set(render_all(load_cluster(example_path(name)))) for name in RENDERED}


def test_renders_one_liner_names_every_file_it_writes(rendered_names):
    """render's one-liner is made from commands.render.RENDER_FAMILIES: every file render writes on these examples
    belongs to a family, and every family is written by one of them (a family no example writes would be a false
    claim)."""
    import re

    from gpucluster.commands.render import RENDER_FAMILIES, RENDER_HELP

    used = set()
    for example, names in rendered_names.items():
        for name in names:
            family = [f for f, pattern in RENDER_FAMILIES if re.fullmatch(pattern, name)]
            assert len(family) == 1, f"{example}: render writes {name}, which is in {family or 'no family'}"
            used.add(family[0])
    assert used == {f for f, _ in RENDER_FAMILIES}
    assert all(f in RENDER_HELP for f in used)
