"""`gpucluster COMMAND` imports only what COMMAND uses: the parser registers the one subcommand module that
owns the command, so the table naming them must match what each module registers. Each subcommand module is
gpucluster/commands/<command>.py, named for the one command it registers. Import lists are checked here, never
timings (bench/cli_speed.py measures those)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from conftest import example_path

from gpucluster import cli


def registered(module) -> set[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    module.register(sub)
    return set(sub.choices)


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_a_command_comes_from_the_module_that_registers_it(command):
    assert command in registered(cli.subcommand_module(command))


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_a_command_module_is_named_for_a_command_it_registers(command):
    module = cli.subcommand_module(command)
    assert module.__name__.startswith("gpucluster.commands.")
    assert module.__name__.rsplit(".", 1)[1] in registered(module)


def test_the_modules_register_exactly_the_listed_commands():
    modules = {cli.subcommand_module(c) for c in cli.COMMANDS}
    assert set().union(*map(registered, modules)) == set(cli.COMMANDS)
    assert len(modules) == len(cli.COMMANDS), "one module per command"


@pytest.mark.parametrize("argv", [
    ["render", "s.yaml", "-o", "out", "--no-cabling", "--slurm-version", "24.11"],
    ["check", "s.yaml", "--json", "--suppress", "radix"],
    ["plan", "s.yaml", "--svg", "f.svg", "--pod", "3"],
    ["fabric", "discover", "--ibnetdiscover", "dump.txt", "--json"],
    ["secrets", "--generate"],
    ["inventory", "s.yaml", "-o", "inv"],
])
def test_a_command_parses_alike_with_only_its_module(argv):
    assert cli.build_parser(argv[0]).parse_args(argv) == cli.build_parser().parse_args(argv)


def imported_by(*argv: str) -> set[str]:
    """Modules a real `gpucluster ARGV` process has loaded when the command returns."""
    code = ("import json, sys; from gpucluster.cli import main; rc = main(sys.argv[1:]); "
            "print(json.dumps(sorted(sys.modules)), file=sys.__stderr__); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return set(json.loads(res.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("command", ["check", "plan", "render", "expand"])
def test_check_plan_render_import_no_other_command(command, tmp_path):
    extra = ["-o", str(tmp_path / "out"), "--no-cabling"] if command == "render" else []
    modules = imported_by(command, str(example_path("staging")), *extra)
    assert {m for m in modules if m.startswith("gpucluster.commands.")} == {f"gpucluster.commands.{command}",
                                                                             "gpucluster.commands._flags"}
    if command != "render":  # templates are render's: check and plan load no Jinja
        assert not {m for m in modules if m == "jinja2" or m.startswith("gpucluster.render")}
