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

from gpucluster.errors import UsageError
from gpucluster.fabric import Plan
from gpucluster.spec.model import ClusterSpec, NodeGroup

GROUPS = ("slurm_controller", "slurm_dbd", "slurm_compute", "slurm_login", "flash_meta", "flash_chunk",
          "flash_client", "nfs_server", "nfs_client", "gpu_nvidia", "gpu_amd", "fabric_ib", "fabric_roce")


def _client_groups(spec: ClusterSpec, declared) -> set[str]:
    if declared is not None:
        return set(declared)
    return {g.name for g in spec.node_groups if g.role in ("compute", "login")}


def memberships(spec: ClusterSpec, group: NodeGroup) -> list[str]:
    """Contract groups a node group belongs to."""
    out: list[str] = []
    role = {"controller": "slurm_controller", "compute": "slurm_compute", "login": "slurm_login"}.get(group.role)
    if role:
        out.append(role)
    st = spec.storage
    if st.flash:
        if group.name == st.flash.metadata_group:
            out.append("flash_meta")
        if group.name == st.flash.chunk_group:
            out.append("flash_chunk")
        if group.name in _client_groups(spec, st.flash.client_groups):
            out.append("flash_client")
    if any(group.name == n.server_group for n in st.nfs):
        out.append("nfs_server")
    if any(group.name in _client_groups(spec, n.client_groups) for n in st.nfs):
        out.append("nfs_client")
    if group.gpu and group.gpus_per_node:
        out.append(f"gpu_{spec.parts.gpus[group.gpu].vendor}")
    if group in spec.fabric_groups:
        out.append("fabric_ib" if spec.fabric.type == "infiniband" else "fabric_roce")
    return out


def host_vars(spec: ClusterSpec, plan: Plan, group: NodeGroup, index: int) -> dict:
    host = group.host(index)
    out = {"gpucluster_node_group": group.name, "gpucluster_rack": plan.rack_of(group, index)}
    unit = plan.unit_of_host.get(host)
    if unit is not None:
        out["gpucluster_leaf"] = unit.name
        if plan.tiers == 3:
            out["gpucluster_pod"] = f"pod{unit.pod + 1:03d}"
        out["gpucluster_rails"] = group.nics_per_node
        out["gpucluster_hcas"] = plan.hcas(group)
    return out


def inventory_data(spec: ClusterSpec, plan: Plan, connection: dict[str, dict] | None = None,
                   extra_vars: dict | None = None) -> dict:
    """YAML inventory as data: {all: {vars, children: {group: {hosts: {host: vars}}}}}."""
    connection = connection or {}
    children: dict[str, dict] = {name: {"hosts": {}} for name in GROUPS}
    node_groups: dict[str, dict] = {}
    controllers = [h for g in spec.groups_with_role("controller") for h in g.hosts]
    for group in spec.node_groups:
        member_of = memberships(spec, group)
        hosts = {}
        for i in range(group.count):
            name = group.host(i)
            hv = host_vars(spec, plan, group, i)
            hv.update(connection.get(name, {}))
            hosts[name] = hv
            for contract in member_of:
                children[contract]["hosts"][name] = None
        node_groups[f"nodegroup_{group.name.replace('-', '_')}"] = {"hosts": hosts}
    if spec.slurm.accounting and controllers:
        children["slurm_dbd"]["hosts"][controllers[0]] = None
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


def write_inventory(outdir: Path, spec: ClusterSpec, plan: Plan, connection: dict[str, dict] | None = None,
                    extra_vars: dict | None = None) -> Path:
    """Write outdir/hosts.yml for a spec; returns its path."""
    return write_inventory_data(outdir, inventory_data(spec, plan, connection, extra_vars))
