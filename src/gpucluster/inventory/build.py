"""`gpucluster inventory`'s work: compile the spec, read how each host is reached, write the folder."""

from __future__ import annotations

import os
from pathlib import Path

from gpucluster.cluster import Cluster, load_cluster
from gpucluster.errors import UsageError
from gpucluster.inventory.sources import from_hosts_file, from_ssh_config
from gpucluster.inventory.values import ssh_common_args, valid_path
from gpucluster.inventory.writer import write_inventory


def connections(cluster: Cluster, *, ssh_config: str | os.PathLike | None = None,
                hosts_file: str | os.PathLike | None = None) -> dict[str, dict]:
    """Ansible connection variables per host from the source given ({} without one: hosts by name)."""
    if ssh_config:
        return from_ssh_config(ssh_config, cluster.hosts, spec_file=str(cluster.source))
    if hosts_file:
        return from_hosts_file(hosts_file, cluster.hosts, spec_file=str(cluster.source))
    return {}


def inventory_vars(cluster: Cluster, connection: dict[str, dict], state_dir: str | os.PathLike | None) -> tuple:
    """(per-host connection vars, all-vars): what every host shares goes to group_vars/all.yml once."""
    extra: dict = {"gpucluster_spec": _checked_path(cluster.source.resolve(), "the spec's path")}
    if state_dir:
        extra["gpucluster_state_dir"] = _checked_path(Path(state_dir).expanduser().absolute(), "--state-dir")
    # Every source: gpucluster's host-key options first (values.ssh_common_args); a host whose source gave
    # its own (ssh_config) keeps them, still ours first.
    connection = {h: {"ansible_ssh_common_args": ssh_common_args(), **c} for h, c in connection.items()}
    if not connection or len(connection) < len(cluster.hosts):
        extra["ansible_ssh_common_args"] = ssh_common_args()
    if connection and len(connection) == len(cluster.hosts):
        for key in ("ansible_user", "ansible_ssh_private_key_file", "ansible_ssh_common_args", "ansible_port"):
            values = {repr(c.get(key)) for c in connection.values()}
            if len(values) == 1 and key in next(iter(connection.values())):
                extra[key] = next(iter(connection.values()))[key]
                connection = {h: {k: v for k, v in c.items() if k != key} for h, c in connection.items()}
    return {h: c for h, c in connection.items() if c}, extra


def _checked_path(path: Path, what: str) -> str:
    """A path of ours that goes into the inventory: plain characters only (spaces allowed: it is never part
    of a command line), so no Jinja or ssh token can ride on it. The writer marks it !unsafe as well."""
    text = str(path)
    if not valid_path(text, spaces=True):
        raise UsageError(f"{what} {text!r} holds characters an inventory does not carry (only letters, digits, "
                         "spaces and ._+,=@~/-); move or rename it")
    return text


def keeps_state_folder(output: Path, state_dir: str | os.PathLike | None) -> None:
    """Refuse to rewrite an inventory that names a state folder so that it names another one, unless --state-dir
    says which. The state folder holds the cluster's secrets: an inventory rewritten without --state-dir points
    configure at each operator's default folder, which has none, and a converge from there would install new
    ones (the secrets guard in playbooks/site.yml stops that run; refusing here is sooner, where the mistake is
    made)."""
    from gpucluster.inventory.reader import INVENTORY_NAMES, load_inventory
    from gpucluster.inventory.statedir import literal

    if state_dir or not any((output / name).is_file() for name in INVENTORY_NAMES):
        return
    try:
        old = literal(load_inventory(output).vars.get("gpucluster_state_dir"))
    except UsageError:
        return  # not an inventory this rewrite could take a state folder from: replaced whole
    if old:
        raise UsageError(f"{output}: this inventory points at the state folder {old}, which holds the cluster's "
                         "secrets; written again without --state-dir it would point at each operator's default "
                         f"folder, and a converge from there has none. Pass --state-dir {old} to keep it (or "
                         "another --state-dir to move on purpose, with the cluster's secrets: configure --secrets "
                         "FILE)")


def build_inventory(spec: str | os.PathLike, output: str | os.PathLike, *, ssh_config=None, hosts_file=None,
                    state_dir=None, cluster: Cluster | None = None) -> Path:
    """Write the inventory folder of a spec; returns its hosts.yml. Raises SpecError (located) for a bad
    spec, ssh_config or hosts file: nothing is written then."""
    cluster = cluster or load_cluster(spec)
    keeps_state_folder(Path(output), state_dir)
    per_host, extra = inventory_vars(cluster, connections(cluster, ssh_config=ssh_config, hosts_file=hosts_file),
                                     state_dir)
    return write_inventory(Path(output), cluster, per_host, extra)
