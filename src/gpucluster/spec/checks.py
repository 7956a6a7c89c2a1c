"""The meaning layer: rules a well-typed spec can still break. Every finding is collected."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from gpucluster.errors import Finding, did_you_mean
from gpucluster.spec import stacks
from gpucluster.spec.model import ClusterSpec
from gpucluster.spec.slurm_topology import tree_rules
from gpucluster.spec.versions import version_rules

RESERVED_MOUNTS = ("/", "/etc", "/usr", "/bin", "/sbin", "/lib", "/proc", "/sys", "/dev", "/boot", "/run",
                   "/var", "/tmp")


def check_rules(spec: ClusterSpec) -> Iterator[Finding]:
    """The rules of meaning alone (no planner): what `gpucluster.cluster` runs before it plans."""
    return _rules(spec)


def _rules(spec: ClusterSpec) -> Iterator[Finding]:
    yield from _catalog_refs(spec)
    yield from _groups(spec)
    yield from _partitions(spec)
    yield from _slurm(spec)
    yield from version_rules(spec)
    yield from tree_rules(spec)
    yield from _parameters(spec)
    yield from _fabric(spec)
    yield from _storage(spec)
    yield from stacks.check(spec)  # drivers: and health: sections (issue 14)


def _catalog_refs(spec: ClusterSpec) -> Iterator[Finding]:
    parts = spec.parts
    for i, g in enumerate(spec.node_groups):
        at = ("node_groups", i)
        if g.gpu is not None and g.gpu not in parts.gpus:
            yield Finding(at + ("gpu",), f"'{g.gpu}' is not a known GPU",
                          did_you_mean(g.gpu, parts.gpus) or f"use one of {', '.join(parts.gpus)}", "catalog")
        if g.nic is not None and g.nic not in parts.nics:
            yield Finding(at + ("nic",), f"'{g.nic}' is not a known NIC",
                          did_you_mean(g.nic, parts.nics) or f"use one of {', '.join(parts.nics)}", "catalog")
    for tier, model in spec.fabric.switches.items():
        if model not in parts.switches:
            yield Finding(("fabric", "switches", tier), f"'{model}' is not a known switch",
                          did_you_mean(model, parts.switches) or f"use one of {', '.join(parts.switches)}",
                          "catalog")
        elif spec.fabric.type not in parts.switches[model].fabrics:
            yield Finding(("fabric", "switches", tier), f"'{model}' is not a {spec.fabric.type} switch",
                          f"pick a switch for {spec.fabric.type}", "fabric-type")


def _groups(spec: ClusterSpec) -> Iterator[Finding]:
    parts = spec.parts
    names = Counter(g.name for g in spec.node_groups)
    for i, g in enumerate(spec.node_groups):
        at = ("node_groups", i)
        if names[g.name] > 1:
            yield Finding(at + ("name",), f"node group '{g.name}' is declared {names[g.name]} times",
                          "give each group its own name", "duplicate")
        if bool(g.gpu) != bool(g.gpus_per_node):
            yield Finding(at + ("gpus_per_node",), "gpu and gpus_per_node go together",
                          "set both (a GPU model and its count per node) or neither", "gpu-count")
        elif g.gpu in parts.gpus:
            model = parts.gpus[g.gpu]
            if g.gpus_per_node not in model.allowed_per_node:
                yield Finding(at + ("gpus_per_node",),
                              f"{g.gpus_per_node} x {g.gpu} is not a count the platform is built with",
                              f"use one of {list(model.allowed_per_node)}", "gpu-count")
        if bool(g.nic) != bool(g.nics_per_node):
            yield Finding(at + ("nics_per_node",), "nic and nics_per_node go together",
                          "set both (a NIC model and its count per node) or neither", "nic-count")
        elif g.nic in parts.nics and spec.fabric.type not in parts.nics[g.nic].fabrics:
            yield Finding(at + ("nic",), f"'{g.nic}' does not speak {spec.fabric.type}",
                          f"pick a NIC for {spec.fabric.type}", "fabric-type")
        if g.hcas is not None and len(g.hcas) != g.nics_per_node:
            yield Finding(at + ("hcas",), f"{len(g.hcas)} HCA names for {g.nics_per_node} NICs",
                          "name one HCA per NIC", "rails")
        if g.role != "compute" and g.gpus_per_node:
            yield Finding(at + ("role",), f"a {g.role} group with GPUs is never scheduled by Slurm",
                          "make it role: compute, or drop its GPUs", "role", level="warning")
        if not g.hostname.endswith("#"):
            # Slurm's hostlists take no text after the bracket: slurmctld refuses NodeName=gpu[01-04]-ib
            yield Finding(at + ("hostname",), f"'{g.hostname}' has text after the index; Slurm cannot list "
                          f"such names as a range ({g.hostlist})", "end the hostname with the '#' run",
                          "hostname")
    yield from _collisions(spec)
    roles = Counter(g.role for g in spec.node_groups)
    if roles["controller"] == 0:
        yield Finding(("node_groups",), "no controller group", "add a group with role: controller (1 or 2 nodes)",
                      "roles")
    for i, g in enumerate(spec.node_groups):
        if g.role == "controller" and g.count > 2:
            yield Finding(("node_groups", i, "count"), f"{g.count} controllers; Slurm runs one primary and backups",
                          "use 1 or 2 controller nodes", "roles")


def _collisions(spec: ClusterSpec) -> Iterator[Finding]:
    """Hostnames two groups both generate. Names are only built for groups whose fixed parts could
    produce the same text (one prefix starts the other): 26k names cost 0.1 s, most pairs cost nothing."""
    groups = list(enumerate(spec.node_groups))
    for i, g in groups:
        head, _, _tail = g.hostname.partition("#" * g.digits)
        for _j, other in groups[:i]:
            o_head, _, _o_tail = other.hostname.partition("#" * other.digits)
            if not (head.startswith(o_head) or o_head.startswith(head)):
                continue
            clash = set(g.hosts).intersection(other.hosts)
            if clash:
                yield Finding(("node_groups", i, "hostname"),
                              f"hostname {min(clash)} is also generated by group '{other.name}'",
                              "change hostname or first_index so the groups do not overlap", "hostname-collision")
                break


def _partitions(spec: ClusterSpec) -> Iterator[Finding]:
    names = {g.name: g for g in spec.node_groups}
    compute = {g.name for g in spec.node_groups if g.role == "compute"}
    used: set[str] = set()
    defaults = 0
    seen = Counter(p.name for p in spec.slurm.partitions)
    for i, p in enumerate(spec.slurm.partitions):
        at = ("slurm", "partitions", i)
        defaults += p.default
        if seen[p.name] > 1:
            yield Finding(at + ("name",), f"partition '{p.name}' is declared twice", "rename one", "duplicate")
        if p.name.lower() == "default":  # PartitionName=DEFAULT only sets defaults; slurmctld then has none
            yield Finding(at + ("name",), "'default' is Slurm's keyword for partition defaults, not a partition",
                          "give the partition another name (mark it default: true instead)", "partition")
        for j, group in enumerate(p.groups):
            if group not in names:
                yield Finding(at + ("groups", j), f"'{group}' is not a node group",
                              did_you_mean(group, names) or "name a declared node group", "partition")
            elif group not in compute:
                yield Finding(at + ("groups", j), f"'{group}' is a {names[group].role} group, Slurm runs no jobs there",
                              "list only compute groups in partitions", "partition")
            used.add(group)
    for i, g in enumerate(spec.node_groups):
        if g.role == "compute" and g.name not in used:
            yield Finding(("node_groups", i, "name"), f"compute group '{g.name}' is in no partition",
                          "add it to a partition's groups", "partition")
    if defaults > 1:
        yield Finding(("slurm", "partitions"), f"{defaults} partitions are marked default",
                      "mark one partition default: true", "partition")


def _slurm(spec: ClusterSpec) -> Iterator[Finding]:
    n = sum(g.count for g in spec.node_groups if g.role == "compute")
    if n > 65536:
        yield Finding(("node_groups",), f"{n} compute nodes exceed Slurm's 65,536-node limit",
                      "split the cluster into several Slurm clusters", "slurm-limit")


# slurm.conf keys gpucluster writes from the spec or relies on (roles install to these paths and ports;
# the validator checks them): slurm.parameters may not set them. Value: the spec field that does.
OWNED_KEYS = {
    "ClusterName": "name",
    "SlurmctldHost": "node_groups (role: controller)",
    "ControlMachine": "node_groups (role: controller)",
    "NodeName": "node_groups",
    "PartitionName": "slurm.partitions",
    "TopologyPlugin": "slurm.topology",
    "TopologyParam": "slurm.topology",
    "GresTypes": "node_groups[].gpu",
    "AccountingStorageType": "slurm.accounting",
    "AccountingStorageHost": "slurm.accounting (slurmdbd runs on the first controller)",
    "AccountingStoragePort": "slurm.accounting",
    "AccountingStorageTRES": "slurm.accounting",
    "ProctrackType": "slurm.profile",
    "TaskPlugin": "slurm.profile",
    "JobAcctGatherType": "slurm.profile",
    "PrologFlags": "slurm.profile",
    "Prolog": "slurm.prolog",
    "Epilog": "slurm.epilog",
    "HealthCheckProgram": "health (gpucluster's checks; health.enabled)",
    "HealthCheckInterval": "health.interval",
    "HealthCheckNodeState": "health.node_state",
    "AuthType": "gpucluster's munge setup (role munge)",
    "SlurmUser": "gpucluster's Slurm packages (role slurm_common)",
    "SlurmdUser": "gpucluster's Slurm packages (role slurm_common)",
    "SlurmctldPort": "gpucluster's Slurm roles and validator",
    "SlurmdPort": "gpucluster's Slurm roles and validator",
    "StateSaveLocation": "gpucluster's Slurm roles (role slurm_controller)",
    "SlurmdSpoolDir": "gpucluster's Slurm roles (role slurm_compute)",
    "SlurmctldPidFile": "gpucluster's Slurm roles",
    "SlurmdPidFile": "gpucluster's Slurm roles",
    "SlurmctldLogFile": "gpucluster's Slurm roles and validator",
    "SlurmdLogFile": "gpucluster's Slurm roles and validator",
    "Include": "gpucluster's rendered files (render the spec instead)",
}
_OWNED = {k.lower(): (k, field) for k, field in OWNED_KEYS.items()}


def _parameters(spec: ClusterSpec) -> Iterator[Finding]:
    """slurm.parameters: extra keys, never one gpucluster owns (Slurm reads keys case-insensitively)."""
    seen: dict[str, str] = {}
    for key in spec.slurm.parameters:
        at = ("slurm", "parameters", key)
        owned = _OWNED.get(key.lower())
        if owned:
            name, field = owned
            yield Finding(at, f"{name} is set by gpucluster from {field}",
                          f"remove it from slurm.parameters and change {field} instead", "owned-key")
        if key.lower() in seen:
            yield Finding(at, f"'{key}' and '{seen[key.lower()]}' are the same slurm.conf key",
                          "keep one of them", "duplicate")
        seen.setdefault(key.lower(), key)


def _fabric(spec: ClusterSpec) -> Iterator[Finding]:
    fab = spec.fabric
    groups = spec.fabric_groups
    counts = {g.nics_per_node for g in groups}
    if fab.rails is not None:
        for i, g in enumerate(spec.node_groups):
            if g in groups and g.nics_per_node != fab.rails:
                yield Finding(("node_groups", i, "nics_per_node"),
                              f"{g.nics_per_node} NICs per node but the fabric has {fab.rails} rails",
                              f"give the group {fab.rails} NICs or change fabric.rails", "rails")
    elif len(counts) > 1:
        yield Finding(("fabric", "rails"), f"fabric groups have different NIC counts {sorted(counts)}",
                      "give every GPU group the same NICs per node (one per rail)", "rails")
    if fab.design == "rail-optimized":
        for g in groups:
            if g.gpus_per_node and g.nics_per_node != g.gpus_per_node:
                idx = spec.node_groups.index(g)
                yield Finding(("node_groups", idx, "nics_per_node"),
                              f"{g.nics_per_node} NICs for {g.gpus_per_node} GPUs: a rail-optimized node has one "
                              "NIC per GPU", "match NICs to GPUs", "rails", level="warning")
        if fab.nodes_per_leaf is not None:
            yield Finding(("fabric", "nodes_per_leaf"), "nodes_per_leaf is for fat-tree designs",
                          "use scalable_unit_nodes on rail-optimized fabrics", "design")
    elif fab.scalable_unit_nodes is not None:
        yield Finding(("fabric", "scalable_unit_nodes"), "scalable units are for rail-optimized designs",
                      "use nodes_per_leaf on fat-tree fabrics", "design")
    if spec.slurm.topology != "none":
        for i, g in enumerate(spec.node_groups):
            if g.role == "compute" and g not in groups:
                # slurmctld: "switches lack access to N nodes"; jobs need a common switch to span nodes
                yield Finding(("node_groups", i, "nics_per_node"),
                              f"compute group '{g.name}' has no fabric NICs, so topology.conf puts it under no "
                              "switch and multi-node jobs cannot use it", "give it nic and nics_per_node, or set "
                              "slurm.topology: none", "topology", level="warning")
    if "core" in fab.oversubscription:
        yield Finding(("fabric", "oversubscription", "core"), "the core is the top tier and has no uplinks",
                      "remove it; oversubscribe leaf or spine", "ratio-tier")
    if fab.tiers == 2 and fab.nodes_per_pod:
        yield Finding(("fabric", "nodes_per_pod"), "pods exist only with 3 tiers", "remove it or set tiers: 3",
                      "design")


def _storage(spec: ClusterSpec) -> Iterator[Finding]:
    st = spec.storage
    names = {g.name: g for g in spec.node_groups}
    mounts: list[tuple[tuple, str]] = []

    def server(path: tuple, group: str) -> Iterator[Finding]:
        if group not in names:
            yield Finding(path, f"'{group}' is not a node group", did_you_mean(group, names) or
                          "name a declared storage group", "storage")
        elif names[group].role != "storage":
            yield Finding(path, f"'{group}' is a {names[group].role} group", "serve storage from role: storage groups",
                          "storage")

    def clients(path: tuple, groups) -> Iterator[Finding]:
        for j, group in enumerate(groups or ()):
            if group not in names:
                yield Finding(path + (j,), f"'{group}' is not a node group", did_you_mean(group, names) or
                              "name a declared group", "storage")

    if st.flash:
        f = st.flash
        yield from server(("storage", "flash", "metadata_group"), f.metadata_group)
        yield from server(("storage", "flash", "chunk_group"), f.chunk_group)
        yield from clients(("storage", "flash", "client_groups"), f.client_groups)
        mounts.append((("storage", "flash", "mount"), f.mount))
        if f.chunk_group in names:
            servers = names[f.chunk_group].count
            if f.replicas > servers:
                yield Finding(("storage", "flash", "replicas"), f"{f.replicas} copies need {f.replicas} chunk servers, "
                              f"'{f.chunk_group}' has {servers}", "lower replicas or add chunk servers", "storage")
            if f.target_bandwidth_gbps:
                write = servers * f.nvme_per_server * f.nvme_gbps / f.replicas
                if write < f.target_bandwidth_gbps:
                    need = -(-f.target_bandwidth_gbps * f.replicas // (f.nvme_per_server * f.nvme_gbps))
                    yield Finding(("storage", "flash", "target_bandwidth_gbps"),
                                  f"{servers} chunk servers write {write:g} GB/s with {f.replicas} copies, below "
                                  f"the {f.target_bandwidth_gbps:g} GB/s target",
                                  f"use at least {int(need)} chunk servers or faster drives", "storage")
    for i, nfs in enumerate(st.nfs):
        yield from server(("storage", "nfs", i, "server_group"), nfs.server_group)
        # One ganesha.conf per server group: its NFSv4 grace and lease times are the server's, not a tier's.
        first = next(j for j, t in enumerate(st.nfs) if t.server_group == nfs.server_group)
        for key in ("grace_period", "lease_lifetime"):
            mine, theirs = getattr(nfs.ganesha, key), getattr(st.nfs[first].ganesha, key)
            if mine != theirs:
                yield Finding(("storage", "nfs", i, "ganesha", key), f"{key} {mine} differs from {theirs} of tier "
                              f"'{st.nfs[first].name}', served by the same group '{nfs.server_group}'",
                              f"give the tiers of one server group the same {key}", "storage")
        yield from clients(("storage", "nfs", i, "client_groups"), nfs.client_groups)
        for j, ex in enumerate(nfs.exports):
            mounts.append((("storage", "nfs", i, "exports", j, "mount"), ex.mount))
    for idx, (path, mount) in enumerate(mounts):
        clean = mount.rstrip("/") or "/"
        if clean in RESERVED_MOUNTS:
            yield Finding(path, f"mounting over {clean} hides the node's system files",
                          "mount under /mnt, /home, /scratch or similar", "mount-clash")
        for other_path, other in mounts[:idx]:
            o = other.rstrip("/") or "/"
            if o == clean or clean.startswith(o + "/") or o.startswith(clean + "/"):
                yield Finding(path, f"mount {clean} clashes with {o} (at {'.'.join(map(str, other_path))})",
                              "give each tier its own, non-nested mount point", "mount-clash")
