"""facts.json is the only way a derived fact reaches a role (docs/architecture.md, "Where a fact comes from").

The inventory carries how to reach hosts and which groups they are in, nothing derived from the spec beyond a
name (`gpucluster.inventory.writer.INVENTORY_VARS`, the contract). These tests hold both sides to it:

- the writer: every variable of every example's inventory is in the contract;
- the readers: every `gpucluster_*` name in roles/, playbooks/ and plugins/ is a filter, a module, a module
  util, a variable a play registers, a variable of the contract, or one the operator adds (OPERATOR_VARS).
  Anything else is a fact read from somewhere other than facts.json (an inventory copy, a role default that
  duplicates the spec) or a name that does not exist (a module the docs promise);
- filters are never named like variables (`gpucluster_fabric` was both), and a filter reads the compiled
  state, never the spec or the plan (no import of the floors that load or derive them).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from gpucluster.inventory.writer import INVENTORY_VARS, inventory_data

ROOT = Path(__file__).resolve().parent.parent
READERS = ("roles", "playbooks", "plugins")
DOCS = ("docs/roles.md", "docs/inventory.md")
# Variables an operator may add to an inventory by hand (docs/inventory.md, "Host variables"): a site's own
# choice, not a fact gpucluster derives.
OPERATOR_VARS = {"gpucluster_address"}
# How a run goes, never what the cluster is: extra vars `gpucluster configure` passes (configure/playbook.py).
RUN_VARS = {"gpucluster_batch", "gpucluster_rotate_secrets"}
# What a filter may not import: the floors that parse, plan or derive (a filter reads facts.json instead).
DERIVING = ("gpucluster.spec", "gpucluster.cluster", "gpucluster.fabric", "gpucluster.render",
            "gpucluster.inventory", "gpucluster.compiled", "gpucluster.catalog")
NAME = re.compile(r"(?<![\w.$/-])gpucluster_[a-z0-9_]*[a-z0-9]")
# A line that names an old name to say it is gone.
RETIRED = re.compile(r"#.*\bNot `gpucluster_")


@cache
def filter_names() -> frozenset[str]:
    names: set[str] = set()
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"_fact_channel_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        names |= set(module.FilterModule().filters())
    return frozenset(names)


def plugin_names() -> set[str]:
    """Modules, module utils, filter, callback and strategy files and the callbacks a role ships (the pull runner's
    manifest callback): names a role may write, none of them a variable."""
    ours = {p.stem for kind in ("modules", "module_utils", "filter", "callback", "strategy")
            for p in (ROOT / "plugins" / kind).glob("*.py")}
    return ours | {p.stem for p in (ROOT / "roles").glob("*/files/callback_plugins/*.py")}


def registered() -> set[str]:
    """Variables a play or role makes itself (`register:`, `set_fact:`), not read from the inventory."""
    out: set[str] = set()
    for path in _files(("roles", "playbooks"), (".yml", ".yaml")):
        text = path.read_text()
        out |= set(re.findall(r"^\s*register:\s*(gpucluster_\w+)", text, re.MULTILINE))
    return out


def _files(tops: tuple[str, ...], suffixes: tuple[str, ...] = (".yml", ".yaml", ".j2", ".py")) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in suffixes)


def allowed() -> set[str]:
    return set(INVENTORY_VARS) | OPERATOR_VARS | RUN_VARS | filter_names() | plugin_names() | registered()


def unknown_names(paths: list[Path]) -> list[str]:
    ok = allowed()
    return [f"{p.relative_to(ROOT)}:{n}: {name}" for p in paths for n, line in enumerate(p.read_text().splitlines(), 1)
            for name in NAME.findall(line) if name not in ok and not RETIRED.search(line)]


def test_roles_playbooks_and_filters_read_only_the_contract_or_facts_json():
    """A `gpucluster_*` name that is neither a plugin nor a contract variable is a fact read from elsewhere."""
    bad = unknown_names(_files(READERS))
    assert not bad, ("these read a variable the inventory contract (inventory.writer.INVENTORY_VARS) does not "
                     "hold, or name a plugin that does not exist; read the fact from facts.json through "
                     "gpucluster_facts (docs/architecture.md):\n" + "\n".join(bad))


def test_the_role_docs_name_only_what_exists():
    """docs/roles.md and docs/inventory.md name modules, filters and variables that exist (a `gpucluster_render`
    module once lived only in the docs)."""
    bad = unknown_names([ROOT / d for d in DOCS])
    assert not bad, "named in the docs but not a plugin or a contract variable:\n" + "\n".join(bad)


def test_no_filter_is_named_like_a_variable():
    """`gpucluster_fabric` was an inventory variable and a filter: one name, two meanings."""
    clash = filter_names() & (set(INVENTORY_VARS) | OPERATOR_VARS | RUN_VARS | registered())
    assert not clash, f"filters named like variables: {sorted(clash)}"


@pytest.mark.parametrize("path", sorted((ROOT / "plugins" / "filter").glob("*.py")), ids=lambda p: p.name)
def test_a_filter_derives_nothing_itself(path):
    """A filter reads the compiled state (facts.json, rendered/); it never loads, plans or renders the spec."""
    tree = ast.parse(path.read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    bad = [m for m in imported if m.startswith(DERIVING)]
    assert not bad, f"{path.name} imports {bad}: read facts.json (gpucluster_facts) instead"


def _variables(doc: dict) -> set[str]:
    """Every variable name of an inventory document: all-vars, group vars and host vars."""
    names: set[str] = set(doc["all"].get("vars") or {})
    for body in (doc["all"].get("children") or {}).values():
        body = body or {}
        names |= set(body.get("vars") or {})
        for host_vars in (body.get("hosts") or {}).values():
            names |= set(host_vars or {})
    return names


@pytest.mark.parametrize("name", ["staging", "meta-24k-ib", "frontier-mi250x-roce"])
def test_the_writer_writes_only_the_contract(name):
    from gpucluster.cluster import load_cluster

    cluster = load_cluster(ROOT / "examples" / f"{name}.yaml")
    connection = {h: {"ansible_host": "127.0.0.1", "ansible_port": 2222} for h in cluster.hosts[:2]}
    extra = {"gpucluster_spec": str(cluster.source), "ansible_user": "root"}
    written = _variables(inventory_data(cluster, connection, extra))
    extra_vars = sorted(written - set(INVENTORY_VARS))
    assert not extra_vars, f"the inventory carries derived facts: {extra_vars}"


def test_the_staged_inventory_too(tmp_path):
    """What `stage up` and `inventory` write goes through the same writer; its files hold only the contract."""
    from gpucluster.inventory.build import build_inventory

    build_inventory(ROOT / "examples" / "staging.yaml", tmp_path / "inv")
    names: set[str] = set()
    for path in (tmp_path / "inv" / "group_vars").glob("*.yml"):
        names |= set(yaml.load(path.read_text(), Loader=_Loader) or {})
    assert names and names <= set(INVENTORY_VARS), sorted(names - set(INVENTORY_VARS))


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
