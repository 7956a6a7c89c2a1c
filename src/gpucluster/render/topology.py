"""Slurm's view of the fabric: the plan's units and pods translated into topology/tree switches,
topology/block blocks, or the named topologies of topology.yaml. The plan itself stays neutral (NVIDIA
Topograph keeps its topology model apart from its translators the same way).

Which syntax a release takes (BlockSizes from 24.05, topology.yaml from 25.05, blocks smaller than the
base size from 25.05) is read from the version table, spec/slurm_versions.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import hostlist

from gpucluster.fabric import NvlinkDomain, Plan, Unit
from gpucluster.spec.model import ClusterSpec
from gpucluster.spec.slurm_versions import has

MAX_BLOCK_LEVEL = 15  # Slurm's block plugin: each BlockSize is base * 2^k with k <= 15
KINDS = {"tree": "tree", "block": "block", "none": "flat"}  # spec word -> topology.yaml type


@dataclass(frozen=True)
class SlurmSwitch:
    name: str
    level: int
    nodes: tuple[str, ...] = ()  # hostlist expressions
    switches: tuple[str, ...] = ()


def logical_leaves(plan: Plan) -> list[tuple[Unit, ...]]:
    """The units each logical leaf of topology/tree stands for: one unit each, or with
    slurm.tree_merge_leaves = k, k consecutive units of one pod and one node group (spec/slurm_topology.py
    allows it only where the leaf tier is non-blocking)."""
    k = plan.spec.slurm.tree_merge_leaves
    out: list[list[Unit]] = []
    for u in plan.units:
        last = out[-1] if out else None
        if last and len(last) < k and last[0].pod == u.pod and last[0].group == u.group:
            last.append(u)
        else:
            out.append([u])
    return [tuple(g) for g in out]


def _hostlist(plan: Plan, units: tuple[Unit, ...]) -> str:
    """One hostlist for consecutive units of one group (their nodes are one range)."""
    if len(units) == 1:
        return plan.unit_hostlist(units[0])
    return hostlist.collect_hostlist([h for u in units for h in hostlist.expand_hostlist(plan.unit_hostlist(u))])


def slurm_switches(plan: Plan) -> list[SlurmSwitch]:
    """topology/tree: a logical leaf per unit (a scalable unit's rail leaves together, so no node sits
    under two leaves) or per group of merged units, named after its first unit; a switch per pod
    (3 tiers), one root. Leaves first, then each level above."""
    groups = logical_leaves(plan)
    leaves = [SlurmSwitch(g[0].name, 0, nodes=(_hostlist(plan, g),)) for g in groups]
    if plan.tiers == 3:
        pods = []
        for p in range(plan.pods):
            members = tuple(g[0].name for g in groups if g[0].pod == p)
            if members:
                pods.append(SlurmSwitch(f"pod{p + 1:03d}", 1, switches=members))
        root = SlurmSwitch(plan.root_name, 2, switches=tuple(s.name for s in pods))
        return [*leaves, *pods, root]
    return [*leaves, SlurmSwitch(plan.root_name, 1, switches=tuple(s.name for s in leaves))]


@dataclass(frozen=True)
class Blocks:
    """topology/block: a block per NVLink domain (rack-scale NVLink groups) or per unit (the others),
    and the block sizes Slurm may aggregate them into. `units` holds either kind: each has a name and
    the group, first and count that `plan.unit_hostlist` reads."""

    units: tuple[Unit | NvlinkDomain, ...]
    sizes: tuple[int, ...]


def block_members(plan: Plan) -> list[Unit | NvlinkDomain]:
    """The blocks: a cluster with NVLink domains gets one block per domain, the unit a large job wants
    most (jobs inside one share NVLink); groups without rack-scale NVLink keep a block per unit."""
    domains = list(getattr(plan, "domains", []) or [])
    if not domains:
        return list(plan.units)
    nvlink_groups = {d.group for d in domains}
    return [*domains, *(u for u in plan.units if u.group not in nvlink_groups)]


def _per_pod(plan: Plan, members: list) -> int:
    """Blocks under one pod of the scale-out fabric: an aggregated block never crosses the tier above."""
    if not getattr(plan, "domains", None):
        return max(1, min(plan.units_per_pod, len(plan.units)))
    pod_nodes = plan.units_per_pod * max(u.count for u in plan.units)
    trays = max(d.planned for d in plan.domains)
    return max(1, min(pod_nodes // trays, len(members)))


def block_sizes(plan: Plan, version: str) -> tuple[int, ...]:
    """The base block size, then every power-of-two multiple up to the blocks of one pod (a larger
    block would span the oversubscribed tier above the pod). The base is a block's node count (an
    NVLink domain's trays where there are domains); before 25.05 every block had to hold a whole base
    block, so a partial last one sets it instead."""
    members = block_members(plan)
    sized = [d for d in members if isinstance(d, NvlinkDomain)] or members
    full = max(u.count for u in sized)
    base = full if has(version, "block-below-base") else min(u.count for u in sized)
    top = base * _per_pod(plan, members)
    sizes = [base]
    while sizes[-1] * 2 <= top and len(sizes) < 8:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def block_sizes_problem(sizes: tuple[int, ...], block_nodes: list[int], version: str) -> str | None:
    """Why Slurm would refuse these BlockSizes for blocks of these node counts; None when it takes them.
    topology.conf has refused such sizes since 24.05 ("Invalid BlockSizes value"); topology.yaml only
    from 26.05, which is why gpucluster checks them itself for every release."""
    if not sizes or min(sizes) <= 0:
        return "BlockSizes must be positive"
    base = sizes[0]
    for prev, size in pairwise(sizes):
        if size <= prev:
            return f"BlockSizes must grow: {size} follows {prev}"
    for size in sizes:
        level = size / base
        if size % base or level != 2 ** round(math.log2(level)) or math.log2(level) > MAX_BLOCK_LEVEL:
            return f"{size} is not the base size {base} times a power of two up to 2^{MAX_BLOCK_LEVEL}"
    if not has(version, "block-below-base") and min(block_nodes) < base:
        return f"a block of {min(block_nodes)} nodes is smaller than the base size {base} (allowed from 25.05)"
    return None


def blocks(plan: Plan, version: str) -> Blocks:
    found = Blocks(tuple(block_members(plan)), block_sizes(plan, version))
    problem = block_sizes_problem(found.sizes, [u.count for u in found.units], version)
    if problem:  # a bug in block_sizes, never the user's input: the spec cannot choose sizes
        raise AssertionError(f"rendered BlockSizes {found.sizes} would be refused: {problem}")
    return found


@dataclass(frozen=True)
class NamedTopology:
    """One entry of topology.yaml: a whole-fabric topology of one kind (tree, block or flat)."""

    name: str
    kind: str
    default: bool
    switches: tuple[SlurmSwitch, ...] = ()
    blocks: Blocks | None = None


def partition_kinds(spec: ClusterSpec) -> dict[str, str]:
    """Partition name -> the topology type its jobs are placed with (its own, else slurm.topology)."""
    return {p.name: KINDS[p.topology or spec.slurm.topology] for p in spec.slurm.partitions}


def named_topologies(spec: ClusterSpec, plan: Plan, version: str) -> list[NamedTopology]:
    """topology.yaml (25.05+): one topology per design the partitions use, each over the whole fabric;
    the cluster's own (slurm.topology) first and cluster_default. Named by type: a partition's Topology=
    then reads as its placement model. Every topology spans every fabric node, so slurmctld never warns
    that a topology lacks nodes (it would for one cut down to a partition: 'Blocks lack access to N
    nodes'). Empty when nothing but flat placement is asked for."""
    kinds = [KINDS[spec.slurm.topology]]
    for kind in partition_kinds(spec).values():
        if kind not in kinds:
            kinds.append(kind)
    if kinds == ["flat"]:
        return []
    out = []
    for i, kind in enumerate(kinds):
        out.append(NamedTopology(
            kind, kind, i == 0,
            switches=tuple(slurm_switches(plan)) if kind == "tree" else (),
            blocks=blocks(plan, version) if kind == "block" else None,
        ))
    return out


def topology_files(spec: ClusterSpec, plan) -> dict[str, str]:
    """Slurm's topology file of a fabric: topology.conf, or topology.yaml from 25.05 (none for
    slurm.topology none), through the templates `gpucluster render` uses. `plan` is the Plan, or any
    neutral view of a fabric with the same shape: what the translators read is `units` (name, group,
    pod, count), `pods`, `tiers`, `units_per_pod`, `root_name`, `design`, `spec` and `unit_hostlist(unit)`.
    `fabric verify` passes the fabric the wires describe, so the two files can be compared line by line."""
    from gpucluster.render.templating import environment

    version = spec.slurm.version
    topologies = named_topologies(spec, plan, version) if has(version, "topology-yaml") else []
    ctx = {"spec": spec, "plan": plan, "topologies": topologies, "block_sizes": has(version, "block-sizes"),
           "switches": slurm_switches(plan) if spec.slurm.topology == "tree" else None,
           "blocks": blocks(plan, version) if spec.slurm.topology == "block" else None}
    if topologies:
        name, template = "topology.yaml", "slurm/topology.yaml.j2"
    elif spec.slurm.topology != "none":
        name, template = "topology.conf", "slurm/topology.conf.j2"
    else:
        return {}
    return {name: environment().get_template(template).render(ctx)}
