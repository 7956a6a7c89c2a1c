"""Build and write the Ansible inventory of a compiled cluster: one writer for staged and real clusters.

An inventory carries two things only (docs/architecture.md, "Where a fact comes from"): how to reach each
host, and which groups it is in. Every fact derived from the spec (the Slurm release, the fabric, the HCAs)
reaches roles through `<state>/compiled/facts.json`, never through here, so an inventory written before a
spec edit cannot contradict the compiled facts. `INVENTORY_VARS` is that contract, and
tests/test_fact_channel.py holds this writer and every role to it.

Group names are a contract (docs/inventory.md); roles, playbooks, the validation suite and the Pulumi
stack outputs rely on them. A group's label (`gpucluster_node_group`, `gpucluster_leaf`, ...) is written
once per group, never per host: `group_vars/nodegroup_<name>.yml` for a node group, and a node's leaf,
rack and pod are small groups of host ranges (`gpu[0001:0032]`). So the size of hosts.yml grows with node
groups, leaves and racks, not with nodes (Colossus 200k: 12 MB before, ~0.3 MB now). Connection details
(address, port, user, key) are the only per-host data, and only where given.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpucluster.cluster import CONTRACT_GROUPS, Cluster
from gpucluster.errors import UsageError
from gpucluster.inventory.values import Data, inventory_value
from gpucluster.outputs import write_set
from gpucluster.spec.model import NodeGroup

GROUPS = CONTRACT_GROUPS
# Each operator's own private state folder, evaluated by Ansible on the machine that runs it (the same
# default as gpucluster.paths.state_dir): an inventory kept in a shared repository names no one's home.
# `gpucluster configure` passes the folder it checked (0700, owned by the user) as an extra var anyway.
DEFAULT_DIRS = {
    "gpucluster_state_dir": "{{ lookup('ansible.builtin.env', 'XDG_STATE_HOME', default=lookup('ansible.builtin.env', "
                            "'HOME') ~ '/.local/state') }}/gpucluster/{{ gpucluster_cluster }}",
    "gpucluster_secrets_dir": "{{ gpucluster_state_dir }}/secrets",
}
# The contract: every variable an inventory gpucluster writes may hold, and so every inventory variable a
# role, playbook or filter may read (tests/test_fact_channel.py). Nothing here is derived from the spec
# beyond a name: where the spec is, where its compiled state is, and which group a host is in.
CONNECTION_VARS = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
                   "ansible_ssh_common_args", "ansible_connection", "ansible_python_interpreter")
POINTER_VARS = ("gpucluster_cluster", "gpucluster_spec", "gpucluster_state_dir", "gpucluster_secrets_dir")
MEMBERSHIP_VARS = ("gpucluster_node_group", "gpucluster_leaf", "gpucluster_pod", "gpucluster_rack")
INVENTORY_VARS = CONNECTION_VARS + POINTER_VARS + MEMBERSHIP_VARS
HEADER = "# written by gpucluster (docs/inventory.md); `gpucluster inventory` rewrites it.\n"


def nodegroup_name(group: str) -> str:
    return f"nodegroup_{group.replace('-', '_')}"


def host_range(group: NodeGroup, first: int, count: int) -> str:
    """Ansible's host pattern for `count` consecutive nodes of a group from index `first` (0-based)."""
    if count == 1:
        return group.host(first)
    head, _, tail = group.hostname.partition("#" * group.digits)
    lo = group.first_index + first
    return f"{head}[{lo:0{group.digits}d}:{lo + count - 1:0{group.digits}d}]{tail}"


def _group_label(group: NodeGroup) -> dict:
    """A node group's one variable: its name, the key of its entry in facts.json (node_groups, files, ...)."""
    return {"gpucluster_node_group": group.name}


def inventory_data(cluster: Cluster, connection: dict[str, dict] | None = None,
                   extra_vars: dict | None = None) -> dict:
    """The inventory as one document (a valid YAML/JSON Ansible inventory): group vars inline.
    `write_inventory_data` splits it into hosts.yml and group_vars/."""
    spec, plan = cluster.spec, cluster.plan
    connection = connection or {}
    children: dict[str, dict] = {}
    contract: dict[str, dict] = {name: {} for name in GROUPS}
    for group in spec.node_groups:
        name = nodegroup_name(group.name)
        if any(h in connection for h in group.hosts):
            hosts = {h: (dict(connection[h]) if connection.get(h) else None) for h in group.hosts}
        else:
            hosts = {host_range(group, 0, group.count): None}
        children[name] = {"hosts": hosts, "vars": _group_label(group)}
        for c in cluster.memberships(group):
            contract[c].setdefault("children", {})[name] = None
    if cluster.dbd_host:
        contract["slurm_dbd"]["hosts"] = {cluster.dbd_host: None}
    locations: dict[str, dict] = {}
    for unit in plan.units:
        group = spec.group(unit.group)
        locations[f"leaf_{unit.name}"] = {"hosts": {host_range(group, unit.first, unit.count): None},
                                          "vars": {"gpucluster_leaf": unit.name}}
    if plan.tiers == 3:
        for pod in sorted({u.pod for u in plan.units}):
            name = f"pod{pod + 1:03d}"
            locations[f"pod_{name}"] = {"children": {f"leaf_{u.name}": None for u in plan.units if u.pod == pod},
                                        "vars": {"gpucluster_pod": name}}
    for group in spec.node_groups:
        for rack, first in plan.racks[group.name]:
            count = min(group.nodes_per_rack, group.count - first)
            name = f"rack{rack:04d}"
            locations[f"rack_{name}"] = {"hosts": {host_range(group, first, count): None},
                                         "vars": {"gpucluster_rack": name}}
    # The cluster's name keys the per-operator state folder (DEFAULT_DIRS); the Slurm release, the fabric and
    # every other derived fact are facts.json's alone.
    all_vars = {"gpucluster_cluster": spec.name, **DEFAULT_DIRS, **(extra_vars or {})}
    return {"all": {"vars": all_vars, "children": {**children, **contract, **locations}}}


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml: 20x faster on 25k hosts
    pass


_Dumper.add_representer(type(None), lambda d, _: d.represent_scalar("tag:yaml.org,2002:null", ""))
# An outside value is written as Ansible's `!unsafe` (values.inventory_value): data, never a template.
_Dumper.add_representer(Data, lambda d, v: d.represent_scalar("!unsafe", str(v)))


def as_data(data: dict) -> dict:
    """The inventory document with every string value marked as data (`inventory_value`), whoever built it
    (the CLI, or a Pulumi stack's export read back as JSON): all values are, except the two per-operator
    defaults this module owns (DEFAULT_DIRS), which Ansible must evaluate. Host and group names are keys,
    which Ansible never templates, and pass the spec's name rules."""
    top = data["all"]
    out_vars = {k: (v if DEFAULT_DIRS.get(k) == v and not isinstance(v, Data) else inventory_value(v))
                for k, v in (top.get("vars") or {}).items()}
    children = {}
    for group, body in (top.get("children") or {}).items():
        if not isinstance(body, dict):
            children[group] = body
            continue
        body = dict(body)
        if body.get("vars"):
            body["vars"] = inventory_value(body["vars"])
        if body.get("hosts"):
            body["hosts"] = {h: inventory_value(v) for h, v in body["hosts"].items()}
        children[group] = body
    return {"all": {**top, "vars": out_vars, "children": children}}


def _dump(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=200)


def inventory_files(data: dict) -> dict[str, str]:
    """{relative path: text}: hosts.yml, group_vars/all.yml and one group_vars file per node group."""
    try:
        name = data["all"]["vars"]["gpucluster_cluster"]
        children = data["all"]["children"]
        children["slurm_compute"]
    except (KeyError, TypeError):
        raise UsageError("not a gpucluster inventory (no all.vars.gpucluster_cluster or contract groups)") from None
    data = as_data(data)
    children = data["all"]["children"]
    files = {"group_vars/all.yml": HEADER + _dump(data["all"]["vars"])}
    structure: dict[str, dict] = {}
    for group, body in children.items():
        body = dict(body or {})
        if group.startswith("nodegroup_") and body.get("vars"):
            files[f"group_vars/{group}.yml"] = HEADER + _dump(body.pop("vars"))
        structure[group] = body
    files["hosts.yml"] = (f"# Ansible inventory for {name}: written by gpucluster (docs/inventory.md). Group facts "
                          "are in group_vars/.\n" + _dump({"all": {"children": structure}}))
    return files


def write_inventory_data(outdir: Path, data: dict) -> Path:
    """Write the inventory folder (ours, or a Pulumi stack's export): hosts.yml and group_vars/ as one set
    (`gpucluster.outputs`: Ansible reads the old inventory or the new one, never a mix). Files a previous
    run wrote and this one does not are removed; files an operator added are kept."""
    write_set(outdir, inventory_files(data), file_mode=0o644)
    return Path(outdir) / "hosts.yml"


def write_inventory(outdir: Path, cluster: Cluster, connection: dict[str, dict] | None = None,
                    extra_vars: dict | None = None) -> Path:
    """Write the inventory folder of a cluster; returns the path of its hosts.yml."""
    return write_inventory_data(outdir, inventory_data(cluster, connection, extra_vars))
