"""The meaning layer: rules a well-typed spec can still break. Every finding is collected."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

from gpucluster import slurmkeys
from gpucluster.catalog import REPOSITORIES_BY_ARCH
from gpucluster.errors import Finding, did_you_mean, shown
from gpucluster.fields import HOST_LABEL, MAX_ALL_NODES, SLURM_MAX_CPUS, SLURM_MAX_NODES
from gpucluster.spec import jobcontainers, ports, stacks
from gpucluster.spec.effects import no_effect
from gpucluster.spec.model import ClusterSpec, NodeGroup
from gpucluster.spec.slurm_topology import tree_rules
from gpucluster.spec.slurm_versions import changes_for
from gpucluster.spec.versions import version_rules

# System directories no storage tier may mount over or export, each with what it holds. Every one is
# a prefix (a mount at /etc/x hides part of /etc; exporting /var/x can hand out /var/lib/munge), except
# '/' itself. The Slurm and munge directories sit under these and are named for the message.
RESERVED_DIRS = {
    "/etc": "the node's configuration", "/usr": "the installed software", "/var": "the node's state and logs",
    "/boot": "the kernel and boot loader", "/proc": "the kernel's process file system",
    "/sys": "the kernel's device file system", "/dev": "the device files", "/run": "the running services' state",
    "/tmp": "the world-writable temporary folder", "/bin": "the system programs",
    "/sbin": "the system programs", "/lib": "the system libraries", "/lib64": "the system libraries",
    "/root": "root's home", "/etc/slurm": "Slurm's configuration", "/etc/munge": "munge's key",
    "/var/lib/munge": "munge's state", "/run/munge": "munge's socket", "/var/log/munge": "munge's log",
    "/var/spool/slurmctld": "slurmctld's state", "/var/spool/slurmd": "slurmd's spool",
    "/var/lib/slurm": "Slurm's state", "/var/log/slurm": "Slurm's logs", "/run/slurm": "Slurm's runtime files",
}


def reserved(path: str) -> tuple[str, str] | None:
    """(reserved directory, what it holds) that `path` (normalised) is or lies under, the most specific one."""
    if path == "/":
        return "/", "the root file system"
    hits = [d for d in RESERVED_DIRS if path == d or path.startswith(d + "/")]
    if not hits:
        return None
    best = max(hits, key=len)
    return best, RESERVED_DIRS[best]


def check_rules(spec: ClusterSpec) -> Iterator[Finding]:
    """The rules of meaning alone (no planner): what `gpucluster.cluster` runs before it plans."""
    for unit in rule_units(spec):
        yield from unit()


Unit = Callable[[], Iterable[Finding]]


def rule_units(spec: ClusterSpec) -> list[Unit]:
    """Every rule, in report order, as units of work: one per node group for the per-group rules, one
    for each cross-cutting rule. `gpucluster.spec.partial` runs each unit on its own, so on a spec whose
    syntax failed in one group, a unit that reads a refused value stops alone and the other groups
    are still checked."""
    groups = _listed(lambda: spec.node_groups)
    units: list[Unit] = [partial(_group_catalog, spec, i, g) for i, g in groups]
    units += [partial(_switch_catalog, spec), partial(_size, spec), partial(_duplicate_groups, spec)]
    units += [partial(_group, spec, i, g) for i, g in groups]
    units += [partial(_limits, ("node_groups", i), g) for i, g in groups]
    units += [partial(rule, spec) for rule in (_collisions, _roles, _partitions, _slurm, version_rules,
                                                tree_rules, _parameters, _fabric, _nvlink, _imex,
                                                _host_arch)]
    units.append(partial(stacks.check, spec))  # the drivers: and health: sections
    units.append(partial(jobcontainers.check, spec))  # the containers: sections
    units.append(partial(ports.check, spec))  # the metrics ports against the cluster's (spec/ports.py)
    units.append(partial(no_effect, spec))  # settings that change nothing where they are written
    return units + _storage_units(spec)


def _group_catalog(spec: ClusterSpec, i: int, g: NodeGroup) -> Iterator[Finding]:
    parts = spec.parts
    at = ("node_groups", i)
    if g.gpu is not None and g.gpu not in parts.gpus:
        yield Finding(at + ("gpu",), f"'{g.gpu}' is not a known GPU",
                      did_you_mean(g.gpu, parts.gpus) or f"use one of {', '.join(parts.gpus)}", "catalog")
    if g.nic is not None and g.nic not in parts.nics:
        yield Finding(at + ("nic",), f"'{g.nic}' is not a known NIC",
                      did_you_mean(g.nic, parts.nics) or f"use one of {', '.join(parts.nics)}", "catalog")


def _switch_catalog(spec: ClusterSpec) -> Iterator[Finding]:
    parts = spec.parts
    for tier, model in spec.fabric.switches.items():
        if model not in parts.switches:
            yield Finding(("fabric", "switches", tier), f"'{model}' is not a known switch",
                          did_you_mean(model, parts.switches) or f"use one of {', '.join(parts.switches)}",
                          "catalog")
        elif spec.fabric.type not in parts.switches[model].fabrics:
            yield Finding(("fabric", "switches", tier), f"'{model}' is not a {spec.fabric.type} switch",
                          f"pick a switch for {spec.fabric.type}", "fabric-type")


def _duplicate_groups(spec: ClusterSpec) -> Iterator[Finding]:
    names = Counter(g.name for g in spec.node_groups)
    for i, g in enumerate(spec.node_groups):
        if names[g.name] > 1:
            yield Finding(("node_groups", i, "name"), f"node group '{g.name}' is declared {names[g.name]} times",
                          "give each group its own name", "duplicate")


def _group(spec: ClusterSpec, i: int, g: NodeGroup) -> Iterator[Finding]:
    parts = spec.parts
    at = ("node_groups", i)
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


def _roles(spec: ClusterSpec) -> Iterator[Finding]:
    roles = Counter(g.role for g in spec.node_groups)
    if roles["controller"] == 0:
        yield Finding(("node_groups",), "no controller group", "add a group with role: controller (1 or 2 nodes)",
                      "roles")
    for i, g in enumerate(spec.node_groups):
        if g.role == "controller" and g.count > 2:
            yield Finding(("node_groups", i, "count"), f"{g.count} controllers; Slurm runs one primary and backups",
                          "use 1 or 2 controller nodes", "roles")


def _limits(at: tuple, g: NodeGroup) -> Iterator[Finding]:
    """What Slurm and DNS take from one group: a 63-character host label, CPUs= as a 16-bit count."""
    last = g.host(g.count - 1)
    if len(last) > HOST_LABEL:
        field = "first_index" if g.first_index else "hostname"
        yield Finding(at + (field,), f"the last hostname, {shown(last, 80)}, is {len(last)} characters; a host "
                      f"label holds at most {HOST_LABEL} (slurmctld's hostlist cuts longer names)",
                      "lower first_index or shorten the hostname pattern", "hostname")
    if g.cpu.cpus > SLURM_MAX_CPUS:
        yield Finding(at + ("cpu",), f"{g.cpu.cpus} CPUs per node exceed Slurm's {SLURM_MAX_CPUS:,} (CPUs= is 16 bits)",
                      "lower sockets, cores_per_socket or threads_per_core", "slurm-limit")


def _collisions(spec: ClusterSpec) -> Iterator[Finding]:
    """Hostnames two groups both generate. Names are only built for groups whose fixed parts could
    produce the same text (one prefix starts the other), once each: one pass over at most the cluster's
    hosts (26k names cost 0.1 s), and nothing for a spec over the node limit (reported by _size)."""
    if _total(spec) > MAX_ALL_NODES:
        return
    heads = [g.hostname.partition("#" * g.digits)[0] for g in spec.node_groups]
    seen = Counter(heads)
    starts = {h[:k] for h in heads for k in range(len(h)) if h[:k] in seen}  # heads that start another
    related = {i for i, h in enumerate(heads)
               if seen[h] > 1 or h in starts or any(h[:k] in seen for k in range(len(h)))}
    owner: dict[str, int] = {}
    for i, g in enumerate(spec.node_groups):
        if i not in related:
            continue
        clash: dict[int, list[str]] = {}
        for host in g.hosts:
            j = owner.setdefault(host, i)
            if j != i:
                clash.setdefault(j, []).append(host)
        if clash:
            j = min(clash)
            yield Finding(("node_groups", i, "hostname"),
                          f"hostname {min(clash[j])} is also generated by group '{spec.node_groups[j].name}'",
                          "change hostname or first_index so the groups do not overlap", "hostname-collision")


def _total(spec: ClusterSpec) -> int:
    return sum(g.count for g in spec.node_groups)


def _size(spec: ClusterSpec) -> Iterator[Finding]:
    """Every host is a name in the inventory, a rack slot and a row of the plan: bound them all."""
    total = _total(spec)
    if total > MAX_ALL_NODES:
        yield Finding(("node_groups",), f"{total:,} nodes in all groups exceed gpucluster's {MAX_ALL_NODES:,} "
                      f"(Slurm's {SLURM_MAX_NODES:,} compute nodes and as many service nodes)",
                      "lower the counts, or split the cluster into several specs", "cluster-size")


def _partitions(spec: ClusterSpec) -> Iterator[Finding]:
    names = {g.name: g for g in spec.node_groups}
    compute = {g.name for g in spec.node_groups if g.role == "compute"}
    used: set[str] = set()
    defaults = 0
    meant: set[str] = set()  # groups a misspelt partition entry stands for: one typo, one finding
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
                hint = did_you_mean(group, names)
                meant.update(difflib.get_close_matches(str(group)[:64], sorted(names), n=1, cutoff=0.6))
                yield Finding(at + ("groups", j), f"'{group}' is not a node group",
                              hint or "name a declared node group", "partition")
            elif group not in compute:
                yield Finding(at + ("groups", j), f"'{group}' is a {names[group].role} group, Slurm runs no jobs there",
                              "list only compute groups in partitions", "partition")
            used.add(group)
    for i, g in enumerate(spec.node_groups):
        if g.role == "compute" and g.name not in used and g.name not in meant:
            yield Finding(("node_groups", i, "name"), f"compute group '{g.name}' is in no partition",
                          "add it to a partition's groups", "partition")
    if defaults > 1:
        yield Finding(("slurm", "partitions"), f"{defaults} partitions are marked default",
                      "mark one partition default: true", "partition")


def _slurm(spec: ClusterSpec) -> Iterator[Finding]:
    # which releases exist, and what each takes, are the version rules (spec/versions.py)
    n = sum(g.count for g in spec.node_groups if g.role == "compute")
    if n > SLURM_MAX_NODES:
        yield Finding(("node_groups",), f"{n} compute nodes exceed Slurm's 65,536-node limit",
                      "split the cluster into several Slurm clusters", "slurm-limit")


# slurm.conf keys gpucluster writes from the spec or relies on (roles install to these paths and ports;
# the validator checks them), with their aliases: slurm.parameters may not set them. Value: the spec field
# that does. The one table of slurm.conf keys is gpucluster.slurmkeys.
OWNED_KEYS = slurmkeys.owned()
_OWNED = {k.lower(): (k, field) for k, field in OWNED_KEYS.items()}


def _parameters(spec: ClusterSpec) -> Iterator[Finding]:
    """slurm.parameters: extra keys, never one gpucluster owns nor an alias or companion of one (Slurm reads
    keys case-insensitively), each value as Slurm reads it (gpucluster.slurmkeys)."""
    seen: dict[str, str] = {}
    for key, value in spec.slurm.parameters.items():
        at = ("slurm", "parameters", key)
        owned = _OWNED.get(key.lower())
        entry = slurmkeys.key(key)
        if owned and entry and entry.of:
            name, field = owned
            yield Finding(at, f"{name} goes with {entry.of}, which gpucluster sets from {field}",
                          f"remove it from slurm.parameters and change {field} instead", "owned-key")
        elif owned:
            name, field = owned
            yield Finding(at, f"{name} is set by gpucluster from {field}",
                          f"remove it from slurm.parameters and change {field} instead", "owned-key")
        elif not slurmkeys.documented(key, spec.slurm.version) and not changes_for(key, str(value)):
            hint = slurmkeys.suggest(key)
            fix = (f"a later Slurm documents {hint}: raise slurm.version, or remove it" if hint.lower() == key.lower()
                   else f"check the spelling{f' (did you mean {hint!r}?)' if hint else ''} against slurm.conf(5), "
                        "or remove it")
            yield Finding(at, f"'{shown(key)}' is not a slurm.conf key of Slurm {spec.slurm.version} (slurmctld "
                              "stops on a key it does not know)", fix, "unknown-key")
        else:
            problem = slurmkeys.value_problem(key, str(value))
            if problem:
                yield Finding(at, problem[0], problem[1], "slurm-value")
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


def _nvlink(spec: ClusterSpec) -> Iterator[Finding]:
    """Rack-scale NVLink (NVL72): a rack holds one whole domain, and the scale-out fabric never splits one.
    Why an error and not a fix-up: a rack of other than 18 trays is not an NVL72, and a scalable unit that
    cuts a domain would put one NVLink domain under two sets of leaves, which no block topology can show."""
    fab = spec.fabric
    for i, g in enumerate(spec.node_groups):
        model = spec.parts.gpus.get(g.gpu or "")
        rack = model.nvlink_domain if model and g.gpus_per_node else None
        if rack is None:
            continue
        trays = rack.compute_trays
        if g.nodes_per_rack != trays:
            yield Finding(("node_groups", i, "nodes_per_rack"),
                          f"a {g.gpu} rack is one NVLink domain of {trays} compute trays, not {g.nodes_per_rack}",
                          f"set nodes_per_rack: {trays}", "nvlink-domain")
        if g.gpus_per_node != rack.gpus_per_tray:
            yield Finding(("node_groups", i, "gpus_per_node"),
                          f"a {g.gpu} compute tray has {rack.gpus_per_tray} GPUs, not {g.gpus_per_node}",
                          f"set gpus_per_node: {rack.gpus_per_tray}", "nvlink-domain")
        if g.count % trays:
            yield Finding(("node_groups", i, "count"),
                          f"{g.count} trays are not whole NVLink domains of {trays}: the last rack's domain has "
                          f"{g.count % trays}", f"use a multiple of {trays}", "nvlink-domain", level="warning")
        if g in spec.fabric_groups and fab.design == "rail-optimized" and fab.scalable_unit_nodes \
                and fab.scalable_unit_nodes % trays:
            yield Finding(("fabric", "scalable_unit_nodes"),
                          f"{fab.scalable_unit_nodes} nodes per scalable unit split the {trays}-tray NVLink "
                          f"domains of group '{g.name}' across units", f"use a multiple of {trays}",
                          "nvlink-domain")


def _imex(spec: ClusterSpec) -> Iterator[Finding]:
    """SwitchType=switch/nvidia_imex where Debian's build of the line lacks the plugin (measured: 22.05 has
    none, 24.11 and 26.05 have it; docs/slurm-versions.md). slurmctld would refuse to start."""
    key = next((k for k in spec.slurm.parameters if k.lower() == "switchtype"), None)
    if key is None or str(spec.slurm.parameters[key]).strip() != "switch/nvidia_imex":
        return
    version = spec.slurm.version_tuple
    if version < (23, 11):
        yield Finding(("slurm", "parameters", key), f"Slurm {spec.slurm.version} (Debian's build) has no "
                      "switch/nvidia_imex plugin", "use Slurm 24.11 or later, or drop SwitchType", "nvlink-imex")
    elif version < (24, 11):
        yield Finding(("slurm", "parameters", key), f"switch/nvidia_imex was not verified on Slurm "
                      f"{spec.slurm.version} (measured on 24.11 and 26.05)", "use 24.11 or later to be sure",
                      "nvlink-imex", level="warning")


# Grace superchips (GH200, GB200, GB300): their trays' CPUs are Grace (Arm Neoverse V2), so arm64 hosts only.
_GRACE = re.compile(r"\bG[BH]\d{3}\b", re.IGNORECASE)


def _host_arch(spec: ClusterSpec) -> Iterator[Finding]:
    """What an arm64 node group can install. The lock has NVIDIA's sbsa repository beside the x86_64 one
    (catalog.REPOSITORIES_BY_ARCH), and the roles take the tree of the node's architecture fact; refused here is what
    has no arm64 path, and a Grace part declared x86_64 (the roles would refuse every one of its hosts)."""
    for i, g in enumerate(spec.node_groups):
        model = spec.parts.gpus.get(g.gpu or "")
        if model is None or not g.gpus_per_node:
            continue
        if model.host_arch != "arm64":
            if _GRACE.search(model.name) or _GRACE.search(g.gpu or ""):
                at = ("catalog", "gpus", g.gpu) if g.gpu in spec.catalog.gpus else ("node_groups", i, "gpu")
                yield Finding(at + (("host_arch",) if at[0] == "catalog" else ()),
                              f"{g.gpu} ({model.name}) is a Grace part, whose trays are arm64, declared "
                              f"{model.host_arch} for group '{g.name}'", "set host_arch: arm64 (or drop it from the "
                              "spec's catalog entry: the built-in GB200 and GB300 are arm64)", "host-arch")
            continue
        r = stacks.resolve(spec, g)
        if r.source.value in ("cuda-repo", "rocm-repo", "local-mirror") and r.vendor is not None \
                and stacks.VENDOR_REPO[r.vendor] not in REPOSITORIES_BY_ARCH["arm64"]:
            yield Finding(r.source.path or ("node_groups", i, "gpu"), f"group '{g.name}' is arm64 ({g.gpu}), and "
                          f"the version lock has no arm64 build of {stacks.VENDOR_REPO[r.vendor]}",
                          "use x86_64 hosts for it, or drivers source: debian", "host-arch")
        if g in spec.fabric_groups and r.ofed.value != "inbox":
            yield Finding(r.ofed.path or ("drivers", "ofed"), f"group '{g.name}' is arm64 ({g.gpu}), and the version "
                          f"lock's {stacks.OFED_NAMES[r.ofed.value]} repository is the x86_64 build",
                          f"use ofed: inbox for group '{g.name}' (drivers.groups.{g.name}.ofed)", "host-arch")


def _storage_units(spec: ClusterSpec) -> list[Unit]:
    """The storage rules as units: the flash tier, each NFS tier, each mount and export path, the clashes."""
    tiers = _listed(lambda: spec.storage.nfs)
    paths = _storage_paths(spec, tiers)
    return ([partial(_flash, spec)] + [partial(_nfs_tier, spec, i, t) for i, t in tiers]
            + [partial(_reserved_path, kind, path, value) for kind, path, value in paths]
            + [partial(_mount_clashes, [(path, value) for kind, path, value in paths if kind == "mount"])])


def _listed(items: Callable[[], Iterable]) -> list[tuple[int, Any]]:
    """Enumerated items; none where a partial spec (gpucluster.spec.partial) holds a refused list."""
    try:
        return list(enumerate(items() or ()))
    except Exception:
        return []


def _storage_paths(spec: ClusterSpec, tiers: list[tuple[int, Any]]) -> list[tuple[str, tuple, str]]:
    """(mount, export or data, field path, value) of every storage path that is text (a partial spec's
    refused paths are not). `data` is a folder a daemon keeps as its own (chowned to it)."""
    out: list[tuple[str, tuple, str]] = []

    def add(kind: str, at: tuple, get: Callable[[], Any]) -> None:
        try:
            value = get()
        except Exception:  # no flash tier, or a refused one
            return
        if isinstance(value, str):
            out.append((kind, at, value))

    add("mount", ("storage", "flash", "mount"), lambda: spec.storage.flash.mount)
    # MooseFS's own folders: the storage role creates them and chowns them to mfs
    add("data", ("storage", "flash", "moosefs", "data_path"), lambda: spec.storage.flash.moosefs.data_path)
    for j, chunk in _listed(lambda: spec.storage.flash.moosefs.chunk_dirs):
        add("data", ("storage", "flash", "moosefs", "chunk_dirs", j, "path"), lambda chunk=chunk: chunk.path)
    for i, tier in tiers:
        for j, ex in _listed(lambda tier=tier: tier.exports):
            at = ("storage", "nfs", i, "exports", j)
            add("export", at + ("path",), lambda ex=ex: ex.path)
            add("mount", at + ("mount",), lambda ex=ex: ex.mount)
    return out


def _groups_by_name(spec: ClusterSpec) -> dict[str, NodeGroup]:
    return {g.name: g for g in spec.node_groups}


def _server(names: dict[str, NodeGroup], path: tuple, group: str) -> Iterator[Finding]:
    if group not in names:
        yield Finding(path, f"'{group}' is not a node group", did_you_mean(group, names) or
                      "name a declared storage group", "storage")
    elif names[group].role != "storage":
        yield Finding(path, f"'{group}' is a {names[group].role} group", "serve storage from role: storage groups",
                      "storage")


def _clients(names: dict[str, NodeGroup], path: tuple, groups) -> Iterator[Finding]:
    for j, group in enumerate(groups or ()):
        if group not in names:
            yield Finding(path + (j,), f"'{group}' is not a node group", did_you_mean(group, names) or
                          "name a declared group", "storage")


def _flash(spec: ClusterSpec) -> Iterator[Finding]:
    f = spec.storage.flash
    if f is None:
        return
    names = _groups_by_name(spec)
    yield from _server(names, ("storage", "flash", "metadata_group"), f.metadata_group)
    yield from _server(names, ("storage", "flash", "chunk_group"), f.chunk_group)
    yield from _clients(names, ("storage", "flash", "client_groups"), f.client_groups)
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


def _nfs_tier(spec: ClusterSpec, i: int, nfs) -> Iterator[Finding]:
    names = _groups_by_name(spec)
    st = spec.storage
    yield from _server(names, ("storage", "nfs", i, "server_group"), nfs.server_group)
    # One ganesha.conf per server group: its NFSv4 grace and lease times are the server's, not a tier's.
    first = next(j for j, t in enumerate(st.nfs) if t.server_group == nfs.server_group)
    for key in ("grace_period", "lease_lifetime"):
        mine, theirs = getattr(nfs.ganesha, key), getattr(st.nfs[first].ganesha, key)
        if mine != theirs:
            yield Finding(("storage", "nfs", i, "ganesha", key), f"{key} {mine} differs from {theirs} of tier "
                          f"'{st.nfs[first].name}', served by the same group '{nfs.server_group}'",
                          f"give the tiers of one server group the same {key}", "storage")
    yield from _clients(names, ("storage", "nfs", i, "client_groups"), nfs.client_groups)


def _reserved_path(kind: str, path: tuple, value: str) -> Iterator[Finding]:
    """Mounts and exports alike stay out of the system directories (paths are normalised by the syntax
    layer: no '..', '//', '.' or trailing '/', so a prefix test on the text holds)."""
    hit = reserved(value)
    if hit and kind == "data":
        # a daemon's own folder may sit under /var (the default /var/lib/mfs), never be a system folder
        # itself, nor lie under another one or another service's folder (/var/lib/munge, /etc/munge)
        if value == hit[0] or hit[0] != "/var":
            yield Finding(path, f"{value} would be handed to MooseFS (chowned to mfs), taking over {hit[1]} "
                          f"({hit[0]})", "give MooseFS a folder of its own, e.g. /var/lib/mfs or /srv/mfs/chunks",
                          "reserved-path")
    elif hit and kind == "mount":
        yield Finding(path, f"mounting at {value} hides {hit[1]} ({hit[0]})",
                      "mount under /mnt, /home, /scratch or similar", "mount-clash")
    elif hit:
        yield Finding(path, f"exporting {value} would share {hit[1]} ({hit[0]}) with every client",
                      "export a folder of its own, e.g. under /export or /srv", "reserved-path")


def _mount_clashes(mounts: list[tuple[tuple, str]]) -> Iterator[Finding]:
    for idx, (path, mount) in enumerate(mounts):
        for other_path, other in mounts[:idx]:
            if other == mount or mount.startswith(other.rstrip("/") + "/") or other.startswith(mount + "/"):
                yield Finding(path, f"mount {mount} clashes with {other} (at {'.'.join(map(str, other_path))})",
                              "give each tier its own, non-nested mount point", "mount-clash")

