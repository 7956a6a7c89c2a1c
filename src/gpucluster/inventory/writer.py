"""Build the Ansible inventory from the spec and the plan.

Group names are a contract (docs/inventory.md); roles, playbooks, the validation suite and the
Pulumi stack outputs all rely on them. Connection details (address, port, user, key) are the only
thing that differs between a staged and a real cluster, and come in as `connection`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from gpucluster.cluster import CONTRACT_GROUPS, Cluster
from gpucluster.errors import UsageError

GROUPS = CONTRACT_GROUPS


def inventory_data(cluster: Cluster, connection: dict[str, dict] | None = None,
                   extra_vars: dict | None = None) -> dict:
    """YAML inventory as data: {all: {vars, children: {group: {hosts: {host: vars}}}}}."""
    spec = cluster.spec
    connection = connection or {}
    children: dict[str, dict] = {name: {"hosts": {}} for name in GROUPS}
    node_groups: dict[str, dict] = {}
    for group in spec.node_groups:
        member_of = cluster.memberships(group)
        hosts = {}
        for i in range(group.count):
            name = group.host(i)
            hv = cluster.host_vars(group, i)
            hv.update(connection.get(name, {}))
            hosts[name] = hv
            for contract in member_of:
                children[contract]["hosts"][name] = None
        node_groups[f"nodegroup_{group.name.replace('-', '_')}"] = {"hosts": hosts}
    if cluster.dbd_host:
        children["slurm_dbd"]["hosts"][cluster.dbd_host] = None
    all_vars = {"gpucluster_cluster": spec.name, "gpucluster_slurm_version": spec.slurm.version,
                "gpucluster_fabric": spec.fabric.type, **(extra_vars or {})}
    return {"all": {"vars": all_vars, "children": {**node_groups, **children}}}


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml: 20x faster on 25k hosts
    pass


_Dumper.add_representer(type(None), lambda d, _: d.represent_scalar("tag:yaml.org,2002:null", ""))


def write_inventory_data(outdir: Path, data: dict) -> Path:
    """Write outdir/hosts.yml atomically from inventory data (ours, or a Pulumi stack's export)."""
    try:
        name = data["all"]["vars"]["gpucluster_cluster"]
        data["all"]["children"]["slurm_compute"]
    except (KeyError, TypeError):
        raise UsageError("not a gpucluster inventory (no all.vars.gpucluster_cluster or contract groups)") from None
    outdir = Path(outdir)
    text = ("# Ansible inventory for " + name + ": written by gpucluster (docs/inventory.md).\n"
            + yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=200))
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".hosts-", dir=outdir)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, outdir / "hosts.yml")
    except OSError as exc:
        raise UsageError(f"{outdir}: cannot write the inventory ({exc.strerror or exc})") from None
    return outdir / "hosts.yml"


def write_inventory(outdir: Path, cluster: Cluster, connection: dict[str, dict] | None = None,
                    extra_vars: dict | None = None) -> Path:
    """Write outdir/hosts.yml for a cluster; returns its path."""
    return write_inventory_data(outdir, inventory_data(cluster, connection, extra_vars))
