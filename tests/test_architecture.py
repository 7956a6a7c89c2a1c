"""The house's shape, so it cannot silently erode (docs/architecture.md):

    errors, paths, trace, slurmtext, slurmkeys, catalog -> spec -> fabric -> cluster -> {render, inventory} -> compiled
      -> {stage, validate, configure, deploy, emulate, report, ...} -> demo -> cli, commands (the CLI modules)

A module imports its own package and the floors below it, never one above (function-level imports
included: a lazy import is still a dependency). Two packages of one floor import each other only where
listed. Library code never imports a CLI module. Only gpucluster.cluster reads a spec or runs the planner.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "gpucluster"
PLUGINS = Path(__file__).resolve().parent.parent / "plugins"

FLOORS = {
    "gpucluster": 0, "_lazy": 0, "errors": 0, "paths": 0, "trace": 0, "slurmtext": 0, "slurmkeys": 0, "catalog": 0,
    "aptsources": 0, "words": 0, "progress": 0, "fields": 0, "outputs": 0, "slurmclient": 0,
    "node": 0,
    "spec": 1,
    "fabric": 2,
    "cluster": 3,
    "render": 4, "inventory": 4,
    "compiled": 5,
    "stage": 6, "validate": 6, "configure": 6, "deploy": 6, "emulate": 6, "report": 6, "fabric.asbuilt": 6,
    "health": 6,
    "diff": 6, "rollout": 6,
    "demo": 7,
    "cli": 8, "commands": 8,
}
# Same-floor imports that are part of the design (the arrow's direction is the only one allowed).
SAME_FLOOR = {
    ("deploy", "stage"),  # a Pulumi stack may target a staged cluster: it reads the stage's ports and keys
    ("deploy", "configure"),  # the stack's secrets are written with configure's secrets file writer
    ("rollout", "configure"),  # a live wave converges its held nodes with configure's run
    ("rollout", "validate"),  # a live wave's check reads validate's JUnit report for the nodes it holds
    ("diff", "configure"),  # diff plans a secret rotation: the secrets configure --rotate may replace are configure's
}


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "validate/checks" not in str(p) and "templates" not in p.parts)


def _name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    """The FLOORS key of a module: its top-level package, or a sub-package FLOORS names on its own floor
    (fabric.asbuilt sits in the fabric package, a floor above the planner it checks against)."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in FLOORS:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "gpucluster"


def _is_cli(module: str) -> bool:
    """The entry point and the subcommands' modules (gpucluster.commands.*): floor 8."""
    return module == "gpucluster.cli" or module == "gpucluster.commands" or module.startswith("gpucluster.commands.")


@cache
def _imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gpucluster"):
            out += [(node.module, node.lineno)] + [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = _name(path).split(".")
            base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
            out.append((".".join(base + ([node.module] if node.module else [])), node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("gpucluster")]
    return out


def _floor(module: str) -> int:
    if _is_cli(module):
        return FLOORS["cli"]
    package = _package(module)
    assert package in FLOORS, f"{module}: package '{package}' has no floor: add it to FLOORS (and the doc)"
    return FLOORS[package]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_only_run_down_the_floors(path):
    me = _name(path)
    mine, my_floor = _package(me), _floor(me)
    bad = []
    for target, line in _imports(path):
        if not (SRC.parent / Path(*target.split("."))).with_suffix(".py").exists() and \
                not (SRC.parent / Path(*target.split("."))).is_dir():
            continue  # `from gpucluster.x import name`: the name, not a module (its module is checked)
        theirs = _package(target)
        if theirs == mine and not (_is_cli(target) and not _is_cli(me)):
            continue
        if _is_cli(target) and not _is_cli(me):
            bad.append(f"line {line}: {target} is a CLI module; library code never imports one")
        elif _floor(target) > my_floor:
            bad.append(f"line {line}: {target} is above {me} (floor {_floor(target)} > {my_floor})")
        elif _floor(target) == my_floor and my_floor > 0 and not _is_cli(me) and (mine, theirs) not in SAME_FLOOR:
            bad.append(f"line {line}: {me} -> {target}: two packages of floor {my_floor} (not in SAME_FLOOR)")
    assert not bad, f"{path.relative_to(SRC)}:\n  " + "\n  ".join(bad)


def test_every_package_and_top_module_has_a_floor():
    """A package or top-level module added to src/gpucluster without a floor (and a line in the doc) fails here,
    not only when something imports it."""
    tree = {p.parent.name for p in SRC.glob("*/__init__.py")} | {p.stem for p in SRC.glob("*.py")} - {"__init__"}
    assert tree == {name for name in FLOORS if "." not in name} - {"gpucluster"}
    for name in (name for name in FLOORS if "." in name):
        assert (SRC / name.replace(".", "/") / "__init__.py").is_file(), f"FLOORS names {name}: no such package"


def test_the_cli_modules_are_the_entry_point_and_commands():
    """Floor 8 is gpucluster/cli.py and gpucluster/commands/*: a package's own cli.py hides a CLI module in a
    library package (the lazy-import and floor rules would have to guess it by name)."""
    assert [p.relative_to(SRC) for p in SRC.rglob("cli.py")] == [Path("cli.py")]


# The packages beyond python3 a node script may import, the scripts that may, and the Debian package the metrics
# role installs for it. Imported inside the function that writes the metrics, never at the top: a node without it
# still runs its checks and drains.
NODE_PACKAGES = {"prometheus_client": ({"promtext.py", "slurmmetrics.py"}, "python3-prometheus-client")}


def test_the_node_scripts_import_only_the_standard_library_and_each_other():
    """gpucluster/node is copied as it is onto nodes that have only python3 (floor 0 for that reason), and the
    packages of NODE_PACKAGES, imported late, where the metrics role installs them."""
    import sys

    node = SRC / "node"
    ours = {p.stem for p in node.glob("*.py")}
    for path in sorted(node.glob("*.py")):
        tree = ast.parse(path.read_text())
        for imp in ast.walk(tree):
            if isinstance(imp, ast.Import):
                names = [a.name for a in imp.names]
            elif isinstance(imp, ast.ImportFrom):
                names = [a.name for a in imp.names] if imp.level else [imp.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                where = f"{path.relative_to(SRC)}:{imp.lineno}: imports {name}"
                if top in NODE_PACKAGES and path.name in NODE_PACKAGES[top][0]:
                    assert imp not in tree.body, f"{where} at the top: a node without it would not run at all"
                    continue
                assert top in sys.stdlib_module_names or top in ours or top == "__future__", \
                    f"{where}, which a node does not have"


def test_the_node_packages_are_installed_by_the_metrics_role():
    debian = (SRC.parent.parent / "roles" / "metrics" / "vars" / "Debian.yml").read_text()
    assert all(package in debian for _scripts, package in NODE_PACKAGES.values())


def test_same_floor_imports_have_no_cycle():
    assert not {(b, a) for a, b in SAME_FLOOR} & SAME_FLOOR


def _calls(path: Path, names: set[str]) -> list[tuple[str, int]]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in names:
                hits.append((name, node.lineno))
    return hits


@pytest.mark.parametrize("path", [*_modules(), *sorted(PLUGINS.rglob("*.py"))],
                         ids=lambda p: str(p.relative_to(SRC.parent.parent)))
def test_only_the_cluster_floor_reads_a_spec_or_plans(path):
    """One compiled load: load_spec (the YAML parser) and plan_cluster run inside gpucluster.cluster only."""
    if path.is_relative_to(SRC / "cluster") or path.is_relative_to(SRC / "spec") or \
            (path.is_relative_to(SRC / "fabric") and not path.is_relative_to(SRC / "fabric" / "asbuilt")):
        return
    assert not _calls(path, {"load_spec", "plan_cluster", "parse_yaml", "validate_data"}), path


@pytest.mark.parametrize("path", [*_modules(), *sorted(PLUGINS.rglob("*.py"))],
                         ids=lambda p: str(p.relative_to(SRC.parent.parent)))
def test_no_module_finds_the_checkout_by_counting_parents_or_patches_sys_path(path):
    """The package works outside a checkout: gpucluster.paths is the one place that looks for one."""
    if path == SRC / "paths.py":
        return
    text = path.read_text()
    assert ".parents[" not in text, f"{path}: find the checkout through gpucluster.paths"
    assert "sys.path.insert" not in text and "sys.path.append" not in text, path


def test_the_cli_imports_its_subcommands_plainly():
    text = (SRC / "cli.py").read_text()
    assert "importlib" not in text and "import_module" not in text


def test_the_floor_table_in_the_docs_is_floors():
    """docs/architecture.md's floor block names exactly the packages of FLOORS, each on its floor, and every one
    exists in the tree: a package added, moved or renamed without the doc fails here."""
    import re

    doc = (SRC.parent.parent / "docs" / "architecture.md").read_text()
    block = doc.split("```", 2)[1]
    floor, named = None, {}
    for line in block.splitlines():
        m = re.match(r"^(\d)\s+(.*)$", line)
        if m:
            floor, line = int(m.group(1)), m.group(2)
        elif not line.startswith("   "):
            continue
        for name in re.findall(r"[a-z_][a-z_.]*[a-z_]", line[:46]):
            named[name] = floor
    expected = {k: v for k, v in FLOORS.items() if k not in ("gpucluster", "_lazy")}
    assert named == expected
    for name in expected:
        path = SRC / name.replace(".", "/")
        assert path.is_dir() or path.with_suffix(".py").is_file(), f"docs name {name}, not in src/gpucluster"


def _package_table() -> dict[str, str]:
    """docs/architecture.md's "What each package owns": {first cell's name: the whole row}."""
    import re

    doc = (SRC.parent.parent / "docs" / "architecture.md").read_text()
    section = doc.split("## What each package owns", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): line for line in section.splitlines() if (m := re.match(r"^\| `([a-z_.]+)` \|", line))}


def test_the_package_table_names_every_package_and_only_real_ones():
    """Every package under src/gpucluster (sub-packages too, e.g. render/health) is named in the package table,
    and every name there is a package or module of the tree: a package added, moved or renamed fails here."""
    table = _package_table()
    text = "\n".join(table.values())
    for name in table:
        path = SRC / name.replace(".", "/")
        assert path.is_dir() or path.with_suffix(".py").is_file(), f"the package table names {name}: not in the tree"
    for init in sorted(SRC.rglob("__init__.py")):
        package = init.parent.relative_to(SRC)
        if package == Path("."):
            continue
        if len(package.parts) == 1:
            assert package.name in table, f"docs/architecture.md's package table has no row for {package}"
        else:
            assert f"`{package}`" in text or f"`{'.'.join(package.parts)}`" in text, \
                f"docs/architecture.md's package table never names {package}"


@pytest.mark.parametrize("path", sorted((SRC / "commands").glob("*.py")), ids=lambda p: p.name)
def test_a_command_module_imports_only_floor_0_until_its_command_runs(path):
    """`gpucluster --help` imports every command module: at module level they import floor 0 only; the rest is
    imported inside the function that runs the command (docs/architecture.md, the package table). The commands'
    shared flag helpers (gpucluster.commands._flags: report_flags, print_json) are allowed: they import floor 0
    only themselves. No command module imports the entry point (gpucluster.cli), which imports them."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpucluster"):
            assert node.module == "gpucluster.commands._flags" or _floor(node.module) == 0, \
                f"{path.name}:{node.lineno}: {node.module} at module level"
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("gpucluster") and _floor(a.name) for a in node.names), \
                f"{path.name}:{node.lineno}"



# The library modules each command module may import (inside its functions): the entry points of its action.
# A command parses, calls, prints; a decision it needs lives in the library, behind one of these. A new import in
# a command module fails here until the table (and docs/architecture.md, "One entry point per action") says why.
# Floor 0 (errors, words, progress, outputs, paths...) and the commands' own _flags are open to every command.
COMMAND_ENTRY_POINTS: dict[str, set[str]] = {
    "__init__": set(),
    "_flags": set(),
    "check": {"gpucluster.cluster", "gpucluster.report.terminal"},
    "configure": {"gpucluster.configure.converge"},
    "demo": {"gpucluster.demo.run"},
    "diff": {"gpucluster.diff", "gpucluster.diff.running", "gpucluster.inventory.reader"},
    "emulate": {"gpucluster.emulate.emulator", "gpucluster.emulate.harness", "gpucluster.emulate.specs"},
    "expand": {"gpucluster.spec.expand"},
    "fabric": {"gpucluster.fabric.asbuilt.discover", "gpucluster.fabric.asbuilt.fabrictest",
               "gpucluster.fabric.asbuilt.findings", "gpucluster.fabric.asbuilt.ibnetdiscover",
               "gpucluster.fabric.asbuilt.lldp", "gpucluster.fabric.asbuilt.names", "gpucluster.fabric.asbuilt.nvlink",
               "gpucluster.fabric.asbuilt.planned", "gpucluster.fabric.asbuilt.slurmrun",
               "gpucluster.fabric.asbuilt.slurmview", "gpucluster.fabric.asbuilt.verify", "gpucluster.cluster",
               "gpucluster.inventory.reader", "gpucluster.render", "gpucluster.render.ibtopo",
               "gpucluster.render.switch"},
    "health": {"gpucluster.cluster", "gpucluster.configure.playbook", "gpucluster.health.remote",
               "gpucluster.health.status", "gpucluster.health.ticket", "gpucluster.render",
               "gpucluster.render.health.rolefiles"},
    "inventory": {"gpucluster.cluster", "gpucluster.compiled", "gpucluster.deploy.stackoutputs",
                  "gpucluster.inventory.build"},
    "plan": {"gpucluster.cluster", "gpucluster.fabric.summary", "gpucluster.report.export",
             "gpucluster.report.terminal"},
    "render": {"gpucluster.cluster", "gpucluster.fabric.cabling", "gpucluster.render", "gpucluster.report.terminal"},
    "rollout": {"gpucluster.rollout.actions"},
    "secrets": {"gpucluster.configure.secrets", "gpucluster.deploy.stackoutputs"},
    "stage": {"gpucluster.stage.lifecycle"},
    "validate": {"gpucluster.validate.validation"},
}
# Functions of commands/ longer than COMMAND_FUNCTION_LINES, each with the reason it may be.
LONG_COMMAND_FUNCTIONS: dict[tuple[str, str], str] = {}
COMMAND_FUNCTION_LINES = 80


def _library_imports(path: Path) -> dict[str, int]:
    """{library module a command module imports: first line}: `from X import Y` names module X.Y where Y is one;
    floor 0 and the commands' own modules left out."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpucluster"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found = (SRC.parent / Path(*sub.split(".")))
                names.append(sub if found.with_suffix(".py").is_file() or found.is_dir() else node.module)
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("gpucluster")]
        for name in names:
            if not _is_cli(name) and _floor(name) > 0:
                out.setdefault(name, node.lineno)
    return out


def test_the_entry_point_table_names_every_command_module_and_real_modules():
    assert set(COMMAND_ENTRY_POINTS) == {p.stem for p in (SRC / "commands").glob("*.py")}
    for modules in COMMAND_ENTRY_POINTS.values():
        for name in modules:
            found = SRC.parent / Path(*name.split("."))
            assert found.with_suffix(".py").is_file() or found.is_dir(), f"{name}: no such module"


@pytest.mark.parametrize("path", sorted((SRC / "commands").glob("*.py")), ids=lambda p: p.name)
def test_a_command_module_imports_only_its_entry_points(path):
    """A command parses its arguments, calls its action's entry point and prints: it imports the library modules
    COMMAND_ENTRY_POINTS lists for it and no other (a decision added to a command module brings an import of what
    it decides with, and fails here; move it behind the entry point instead)."""
    allowed = COMMAND_ENTRY_POINTS[path.stem]
    extra = {m: line for m, line in _library_imports(path).items() if m not in allowed}
    assert not extra, (f"commands/{path.name} imports {', '.join(f'{m} (line {n})' for m, n in extra.items())}, not "
                       f"an entry point of its command ({', '.join(sorted(allowed)) or 'none'}): put the decision "
                       "in the library, behind that entry point")
    unused = allowed - set(_library_imports(path))
    assert not unused, f"COMMAND_ENTRY_POINTS['{path.stem}'] lists {sorted(unused)}, which it no longer imports"


def _command_functions():
    for path in sorted((SRC / "commands").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.name, node.name, node.end_lineno - node.lineno + 1


def test_no_command_function_is_long():
    """A command function that parses, calls and prints fits in COMMAND_FUNCTION_LINES; a longer one is deciding
    something the library should."""
    long = {(f, name): n for f, name, n in _command_functions() if n > COMMAND_FUNCTION_LINES}
    assert set(long) <= set(LONG_COMMAND_FUNCTIONS), \
        f"functions in commands/ over {COMMAND_FUNCTION_LINES} lines: {long}; move their decisions to the library"
    assert set(LONG_COMMAND_FUNCTIONS) <= set(long), "LONG_COMMAND_FUNCTIONS lists functions that are short now"
