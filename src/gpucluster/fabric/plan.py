"""The physical design of the back-end fabric: a folded Clos (fat tree) or a rail-optimised one.

Everything here is arithmetic on counts; nothing enumerates cables until `cabling` streams them.
Vocabulary:
- unit: the set of nodes that share the same leaf switches. In a fat tree a unit is the nodes under one
  leaf; in a rail-optimised design it is a scalable unit (SU), whose R rails each have their own leaf.
  Slurm sees a unit as one leaf switch, so no node is ever listed under two leaves.
- rail group: in a rail-optimised design the rails split into groups, each with its own spines.
  A fat tree has one group holding every leaf.
- pod: with three tiers, a set of units and the spines that serve only them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from gpucluster import trace
from gpucluster.errors import Finding
from gpucluster.fabric.nvlink import NvlinkDomain, nvlink_domains
from gpucluster.spec.model import ClusterSpec, NodeGroup


class PlanError(Exception):
    def __init__(self, findings: list[Finding]):
        super().__init__("\n".join(f.render() for f in findings))
        self.findings = findings


@dataclass(frozen=True)
class Unit:
    index: int
    name: str
    group: str
    first: int  # index of the first node within its group
    count: int  # nodes in this unit (the last unit of a group may be partial)
    leaves: tuple[int, ...]  # physical leaf indices, one per rail on rail-optimised fabrics
    pod: int = 0
    up: int = 0  # uplinks of each of its leaves (a partial unit's leaves may need fewer than designed)


@dataclass(frozen=True)
class TierPlan:
    """One tier. down/up are a full switch's ports (a full unit's leaf, a full pod's spine); switches of
    partial units and pods may use fewer (see Unit.up and PodPlan). A core takes `down` links, always."""

    tier: str
    model: str
    count: int
    radix: int
    down: int  # ports facing down, per switch (designed)
    up: int  # ports facing up, per switch
    links_per_peer: int  # links from one switch of the tier below to one switch of this tier

    @property
    def ratio(self) -> str:
        if not self.up:
            return "-"
        value = self.down / self.up
        return f"{value:g}:1" if value == round(value, 2) else f"{value:.2f}:1"


@dataclass(frozen=True)
class PodPlan:
    """The spines that serve a set of units: a pod with 3 tiers; with 2 tiers one 'pod' holds every unit.

    A pod with fewer or smaller units than designed gets fewer spines and spine uplinks, as long as every
    switch still spreads its uplinks evenly: its spine count divides the designed one, so each spine
    reaches `planes` whole core planes, and each core of those planes takes `links_per_core` of its links.
    """

    index: int
    first_unit: int
    units: int
    leaves: int  # per rail group
    spines: int  # per rail group
    spine_down: int  # links down, per spine
    spine_up: int = 0  # links up, per spine (0 with 2 tiers)
    planes: int = 1  # core planes each spine reaches
    links_per_core: int = 0  # links from one of these spines to each core it reaches


@dataclass
class Plan:
    spec: ClusterSpec
    design: str
    tiers: int
    speed_gbps: int
    rails: int
    rail_groups: int
    unit_nodes: int
    units: list[Unit]
    tier_plans: list[TierPlan]
    pods: int
    units_per_pod: int
    spines_per_group: int  # per pod with 3 tiers, per rail group
    cores_per_plane: int
    racks: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # group -> [(rack, first node)]
    warnings: list[Finding] = field(default_factory=list)
    pod_plans: list[PodPlan] = field(default_factory=list)  # spines per pod (one entry with 2 tiers)
    domains: list[NvlinkDomain] = field(default_factory=list)  # rack-scale NVLink domains, one per rack (NVL72)

    # ---- counts -------------------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        return sum(g.count for g in self.spec.node_groups)

    @property
    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.spec.gpu_groups:
            out[g.gpu] = out.get(g.gpu, 0) + g.count * g.gpus_per_node
        return out

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_type.values())

    @property
    def endpoints(self) -> int:
        return sum(g.count * g.nics_per_node for g in self.spec.fabric_groups)

    def tier(self, name: str) -> TierPlan | None:
        return next((t for t in self.tier_plans if t.tier == name), None)

    @property
    def switches(self) -> dict[str, int]:
        return {t.tier: t.count for t in self.tier_plans}

    @property
    def links(self) -> dict[str, int]:
        """Cables per link class, counted as cabled: partial units and pods have fewer uplinks."""
        out = {"node-leaf": self.endpoints,
               "leaf-spine": sum(len(u.leaves) * u.up for u in self.units)}
        if self.tiers == 3:
            out["spine-core"] = self.rail_groups * sum(p.spines * p.spine_up for p in self.pod_plans)
        return out

    @property
    def oversubscription(self) -> dict[str, str]:
        return {t.tier: t.ratio for t in self.tier_plans if t.up}

    @property
    def bisection_tbps(self) -> float:
        """Capacity across the worst even cut: half of the narrowest tier's upward bandwidth."""
        return round(min(self.links.values()) * self.speed_gbps / 2 / 1000, 3)

    @property
    def rack_count(self) -> int:
        return sum(len(r) for r in self.racks.values())

    # ---- membership ---------------------------------------------------------------------------
    def _by_host(self, spans):
        """host -> the span (a unit or an NVLink domain: group, first, count) it lies in."""
        out = {}
        for span in spans:
            group = self.spec.group(span.group)
            for i in range(span.first, span.first + span.count):
                out[group.host(i)] = span
        return out

    @cached_property
    def unit_of_host(self) -> dict[str, Unit]:
        return self._by_host(self.units)

    def unit_hostlist(self, unit: Unit) -> str:
        group = self.spec.group(unit.group)
        head, _, tail = group.hostname.partition("#" * group.digits)
        lo = group.first_index + unit.first
        hi = lo + unit.count - 1
        if lo == hi:
            return group.host(unit.first)
        return f"{head}[{lo:0{group.digits}d}-{hi:0{group.digits}d}]{tail}"

    @cached_property
    def domain_of_host(self) -> dict[str, NvlinkDomain]:
        return self._by_host(self.domains)

    def rack_of(self, group: NodeGroup, index: int) -> str:
        start = self.racks[group.name][0][0]
        return f"rack{start + index // group.nodes_per_rack:04d}"

    def hcas(self, group: NodeGroup) -> list[str]:
        if group.hcas:
            return list(group.hcas)
        prefix = self.spec.parts.nics[group.nic].hca_prefix if group.nic else "mlx5_"
        return [f"{prefix}{i}" for i in range(group.nics_per_node)]

    @property
    def root_name(self) -> str:
        return "core" if self.tiers == 3 else "spine"

    @property
    def logical_switches(self) -> int:
        """Switches of the logical topology a scheduler sees: one per unit, one per (non-empty) pod with
        3 tiers, one root. render/topology.py writes them out for Slurm."""
        pods = len({u.pod for u in self.units}) if self.tiers == 3 else 0
        return len(self.units) + pods + 1


# ---- planning ---------------------------------------------------------------------------------

def _max_down(radix: int, ratio: float) -> int:
    """Most downlinks a switch of this radix carries at this oversubscription."""
    down = int(radix * ratio / (ratio + 1))
    while down > 0 and down + math.ceil(down / ratio - 1e-9) > radix:
        down -= 1
    return down


def _up(down: int, ratio: float) -> int:
    return max(1, math.ceil(down / ratio - 1e-9))


def _divisors(n: int) -> list[int]:
    """Divisors of n in ascending order, in O(sqrt n): a user catalog switch may claim millions of ports."""
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def plan_cluster(spec: ClusterSpec) -> Plan:
    """Plan the fabric and racks of a spec that passed the syntax layer. Raises PlanError."""
    trace.mark("plan")
    findings: list[Finding] = []
    fab = spec.fabric
    parts = spec.parts
    groups = spec.fabric_groups

    def fail(path: tuple, message: str, fix: str, rule: str) -> PlanError:
        findings.append(Finding(path, message, fix, rule))
        return PlanError(findings)

    rails_set = {g.nics_per_node for g in groups}
    if not groups:
        raise fail(("node_groups",), "no compute group has NICs on the fabric",
                   "give the GPU node groups nic and nics_per_node", "fabric-empty")
    rails = max(rails_set)
    speeds = {parts.nics[g.nic].speed_gbps for g in groups if g.nic in parts.nics}
    speed = fab.link_speed_gbps or (max(speeds) if speeds else 0)
    tier_models = {}
    for tier in ("leaf", "spine", "core"):
        model = fab.switches.get(tier)
        if model and model in parts.switches:
            tier_models[tier] = parts.switches[model]

    def radix(tier: str) -> int:
        return tier_models[tier].radix(speed) if tier in tier_models else 0

    for tier in ("leaf", "spine"):
        if tier not in fab.switches:
            raise fail(("fabric", "switches"), f"no switch model for the {tier} tier",
                       f"add switches.{tier}", "fabric-switch")
        if radix(tier) == 0:
            ports = tier_models[tier].ports if tier in tier_models else {}
            raise fail(("fabric", "switches", tier),
                       f"'{fab.switches[tier]}' has no ports at {speed} Gb/s (it has {ports})",
                       "pick a switch with ports at the link speed or set fabric.link_speed_gbps",
                       "switch-speed")

    k1 = radix("leaf")
    r1 = fab.ratio("leaf")
    # ---- units and leaves
    if fab.design == "rail-optimized":
        unit_nodes = fab.scalable_unit_nodes
        if unit_nodes is None:
            raise fail(("fabric", "scalable_unit_nodes"), "a rail-optimized design needs the unit size",
                       "set fabric.scalable_unit_nodes (nodes per scalable unit, e.g. 32)", "required")
        if rails % fab.rail_groups:
            raise fail(("fabric", "rail_groups"), f"{rails} rails do not split into {fab.rail_groups} groups",
                       f"use a divisor of {rails}", "rail-groups")
        d1 = unit_nodes
        leaves_per_unit = rails
    else:
        if fab.rail_groups != 1:
            raise fail(("fabric", "rail_groups"), "rail groups exist only on rail-optimized fabrics",
                       "remove rail_groups or set design: rail-optimized", "rail-groups")
        unit_nodes = fab.nodes_per_leaf or _max_down(k1, r1) // rails
        if unit_nodes < 1:
            raise fail(("fabric", "switches", "leaf"),
                       f"a {k1}-port leaf at {fab.oversubscription.get('leaf', '1:1')} cannot take "
                       f"one node's {rails} NICs", "pick a larger leaf switch", "radix")
        d1 = unit_nodes * rails
        leaves_per_unit = 1
    u1 = _up(d1, r1)
    if d1 + u1 > k1:
        what = "scalable_unit_nodes" if fab.design == "rail-optimized" else "nodes_per_leaf"
        raise fail(("fabric", what),
                   f"a leaf needs {d1} down + {u1} up ports at {fab.oversubscription.get('leaf', '1:1')} "
                   f"but '{fab.switches['leaf']}' has {k1} at {speed} Gb/s",
                   f"lower {what} to at most {_max_down(k1, r1) // (1 if leaves_per_unit > 1 else rails)}",
                   "radix")
    if abs(d1 / u1 - r1) > 1e-9 and "leaf" in fab.oversubscription:
        findings.append(Finding(("fabric", "oversubscription", "leaf"),
                                f"{d1} downlinks cannot split exactly {fab.oversubscription['leaf']}; "
                                f"the plan uses {u1} uplinks ({d1 / u1:.2f}:1)",
                                "adjust the unit size to a multiple of the ratio", "ratio-rounded",
                                level="warning"))

    units: list[Unit] = []
    leaf_index = 0
    for g in groups:
        for first in range(0, g.count, unit_nodes):
            n = len(units) + 1
            name = f"su{n:04d}" if fab.design == "rail-optimized" else f"leaf{n:05d}"
            units.append(Unit(len(units), name, g.name, first, min(unit_nodes, g.count - first),
                              tuple(range(leaf_index, leaf_index + leaves_per_unit))))
            leaf_index += leaves_per_unit
    n_units = len(units)
    groups_n = fab.rail_groups
    leaves_per_unit_per_group = leaves_per_unit // groups_n
    leaves_per_group = n_units * leaves_per_unit_per_group
    k2 = radix("spine")
    # Uplinks a leaf of each unit needs: a partial unit's leaves carry fewer nodes.
    per_leaf = 1 if fab.design == "rail-optimized" else rails
    needs = [_up(u.count * per_leaf, r1) for u in units]

    def spine_down(members: range, spines: int) -> int:
        """Links down per spine when these units' leaves spread their uplinks evenly over `spines`."""
        return leaves_per_unit_per_group * sum(-(-needs[i] // spines) for i in members)

    # ---- two tiers: every leaf of a rail group reaches every spine of that group
    everyone = range(n_units)
    two_tier_spines = next((s for s in _divisors(u1) if spine_down(everyone, s) <= k2), None)
    tiers = fab.tiers
    if tiers == "auto":
        tiers = 2 if two_tier_spines else 3
    tier_plans = [TierPlan("leaf", fab.switches["leaf"], n_units * leaves_per_unit, k1, d1, u1, 0)]
    pods, units_per_pod, spines_per_group, cores_per_plane = 1, n_units, 0, 0
    if tiers == 2:
        if two_tier_spines is None:
            raise fail(("fabric", "tiers"),
                       f"{leaves_per_group} leaves per spine group exceed the {k2}-port spine "
                       f"('{fab.switches['spine']}'): radix exceeded for 2 tiers",
                       "set tiers: 3 (or auto), use a larger spine, or fewer nodes", "radix")
        if "core" in fab.switches:
            findings.append(Finding(("fabric", "switches", "core"), "a 2-tier plan has no core tier",
                                    "remove switches.core or set tiers: 3", "unused-tier", level="warning"))
        if "spine" in fab.oversubscription and fab.ratio("spine") != 1:
            raise fail(("fabric", "oversubscription", "spine"),
                       "the spine is the top tier in a 2-tier plan and has no uplinks to oversubscribe",
                       "remove it, or set tiers: 3 for an oversubscribed aggregation layer", "ratio-tier")
        spines_per_group = two_tier_spines
        d2 = spine_down(everyone, spines_per_group)
        pod_plans = [PodPlan(0, 0, n_units, leaves_per_group, spines_per_group, d2)]
        tier_plans.append(TierPlan("spine", fab.switches["spine"], groups_n * spines_per_group, k2,
                                   d2, 0, u1 // spines_per_group))
    else:
        if "core" not in tier_models:
            raise fail(("fabric", "switches"), "3 tiers need a core switch model",
                       "add switches.core (a core switch with ports at the link speed)", "fabric-switch")
        k3 = radix("core")
        if k3 == 0:
            raise fail(("fabric", "switches", "core"), f"'{fab.switches['core']}' has no {speed} Gb/s ports",
                       "pick a core switch with ports at the link speed", "switch-speed")
        r2 = fab.ratio("spine")
        if fab.nodes_per_pod:
            if fab.nodes_per_pod % unit_nodes:
                raise fail(("fabric", "nodes_per_pod"),
                           f"{fab.nodes_per_pod} nodes per pod is not a whole number of {unit_nodes}-node units",
                           f"use a multiple of {unit_nodes}", "pod-size")
            units_per_pod = fab.nodes_per_pod // unit_nodes
        else:
            most = _max_down(k2, r2) // leaves_per_unit_per_group
            if most < 1:
                raise fail(("fabric", "switches", "spine"), "a spine cannot take one unit's leaves",
                           "use a larger spine switch", "radix")
            pods_needed = math.ceil(n_units / most)
            units_per_pod = math.ceil(n_units / pods_needed)
        pods = math.ceil(n_units / units_per_pod)
        leaves_per_pod_group = units_per_pod * leaves_per_unit_per_group
        choice = None
        for s2 in _divisors(u1):
            d2 = leaves_per_pod_group * (u1 // s2)
            u2 = _up(d2, r2)
            if d2 + u2 <= k2:
                choice = (s2, d2, u2)
                break
        if choice is None:
            raise fail(("fabric", "nodes_per_pod" if fab.nodes_per_pod else "switches"),
                       f"a pod of {units_per_pod} units needs {leaves_per_pod_group} leaf links per spine, "
                       f"more than the {k2}-port spine takes at {fab.oversubscription.get('spine', '1:1')}",
                       "use smaller pods or a larger spine", "radix")
        spines_per_group, d2, u2 = choice
        if "spine" in fab.oversubscription and abs(d2 / u2 - r2) > 1e-9:
            findings.append(Finding(("fabric", "oversubscription", "spine"),
                                    f"{d2} spine downlinks cannot split exactly {fab.oversubscription['spine']}; "
                                    f"the plan uses {u2} uplinks ({d2 / u2:.2f}:1)",
                                    "adjust nodes_per_pod", "ratio-rounded", level="warning"))

        def pod_shape(p: int, cores: int) -> PodPlan:
            """The fewest spines that take this pod's leaves at the designed ports, each spreading its
            uplinks evenly over whole core planes (a full pod gets the designed shape)."""
            members = range(p * units_per_pod, min(n_units, (p + 1) * units_per_pod))
            for s in _divisors(spines_per_group):
                planes = spines_per_group // s
                down = spine_down(members, s)
                per_core = -(-_up(down, r2) // (planes * cores))
                if down <= d2 and planes * cores * per_core <= u2:
                    return PodPlan(p, members.start, len(members), len(members) * leaves_per_unit_per_group,
                                   s, down, planes * cores * per_core, planes, per_core)
            raise AssertionError("the designed spine count always fits")  # s == spines_per_group does

        pod_plans = []
        for c in _divisors(u2):
            shapes = [pod_shape(p, c) for p in range(pods)]
            if sum(s.links_per_core for s in shapes) <= k3:
                cores_per_plane, pod_plans = c, shapes
                break
        if not cores_per_plane:
            raise fail(("fabric", "switches", "core"),
                       f"{pods} pods exceed the {k3}-port core ('{fab.switches['core']}'): radix exceeded "
                       "for 3 tiers", "use larger pods, a larger core switch, or fewer nodes", "radix")
        planes = groups_n * spines_per_group
        tier_plans.append(TierPlan("spine", fab.switches["spine"], groups_n * sum(s.spines for s in pod_plans),
                                   k2, d2, u2, u1 // spines_per_group))
        tier_plans.append(TierPlan("core", fab.switches["core"], planes * cores_per_plane, k3,
                                   sum(s.links_per_core for s in pod_plans), 0, u2 // cores_per_plane))
    # Each leaf reaches every spine of its pod with the same number of links: a partial unit's need, rounded up.
    shaped = []
    for u in units:
        pod = u.index // units_per_pod
        spines = pod_plans[pod].spines
        shaped.append(Unit(u.index, u.name, u.group, u.first, u.count, u.leaves, pod,
                           spines * -(-needs[u.index] // spines)))
    units = shaped

    racks: dict[str, list[tuple[int, int]]] = {}
    rack = 1
    for g in spec.node_groups:
        racks[g.name] = []
        for first in range(0, g.count, g.nodes_per_rack):
            racks[g.name].append((rack, first))
            rack += 1
    return Plan(spec, fab.design, int(tiers), speed, rails, groups_n, unit_nodes, units, tier_plans, pods,
                units_per_pod, spines_per_group, cores_per_plane, racks, warnings=findings, pod_plans=pod_plans,
                domains=nvlink_domains(spec, racks))
