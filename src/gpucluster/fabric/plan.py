"""The physical design of the back-end fabric: a folded Clos (fat tree) or a rail-optimised one.

Everything here is arithmetic on counts; nothing enumerates cables until `cabling` streams them.
Vocabulary:
- unit: the set of nodes that share the same leaf switches. In a fat tree a unit is the nodes under one
  leaf; in a rail-optimised design it is a scalable unit (SU), whose R rails each have their own leaf.
  Slurm sees a unit as one leaf switch, so no node is ever listed under two leaves.
- rail group: in a rail-optimised design the rails split into groups, each with its own spines.
  A fat tree has one group holding every leaf.
- pod: with three tiers, a set of units and the spines that serve only them.
- rack layout: where a rack of a node group holds its nodes, its NVLink switch trays, its own leaves and its
  management switches, in U from 1 at the bottom (docs/plan.md, "Rack elevations").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from gpucluster import trace
from gpucluster.catalog import CPU_SERVER_RACK_UNITS, NVLINK_SWITCH_TRAY_UNITS, SwitchModel
from gpucluster.errors import Finding
from gpucluster.fabric.nvlink import NvlinkDomain, nvlink_domains
from gpucluster.spec.model import ClusterSpec, Fabric, NodeGroup


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


@dataclass(frozen=True)
class RackLayout:
    """Where a rack of one node group holds what, in U counted from 1 at the bottom, as elevations are written:
    the nodes from `first_u` up, lowest first (an NVLink rack's switch trays after the first `below` of them),
    free U, then at the top the rack's own leaves (fat-tree leaves cabled with DAC: each sits in the rack of its
    unit's first node), highest first, under the management switches. Arithmetic only: a node's U follows from
    its place in the rack, so no host is walked."""

    height: int
    first_u: int  # lowest U of the lowest node
    node_u: int  # height of one node
    capacity: int  # nodes of a full rack (nodes_per_rack)
    below: int  # nodes under the NVLink switch trays (all of them without trays)
    switch_trays: int  # NVLink switch trays
    leaf_u: int  # height of one of the rack's own leaves; 0 when the leaves stand elsewhere
    unit_nodes: int  # nodes under one leaf (a unit)
    management_u: int

    def node(self, slot: int) -> tuple[int, int]:
        """Lowest and highest U of the node in `slot` (0: the rack's lowest node)."""
        lo = self.first_u + slot * self.node_u + (self.trays_u if slot >= self.below else 0)
        return lo, lo + self.node_u - 1

    @property
    def trays_u(self) -> int:
        return self.switch_trays * NVLINK_SWITCH_TRAY_UNITS

    @property
    def trays(self) -> tuple[int, int] | None:
        """U of the NVLink switch trays, lowest and highest; None without."""
        lo = self.first_u + self.below * self.node_u
        return (lo, lo + self.trays_u - 1) if self.switch_trays else None

    def leaf_units(self, first: int, count: int) -> range:
        """The units (counted within the group) whose leaf the rack of nodes first..first+count-1 holds."""
        if not self.leaf_u:
            return range(0)
        return range(-(-first // self.unit_nodes), -(-(first + count) // self.unit_nodes))

    def leaf(self, k: int) -> tuple[int, int]:
        """U of the rack's k-th own leaf (0: the highest, right under the management switches)."""
        hi = self.height - self.management_u - k * self.leaf_u
        return hi - self.leaf_u + 1, hi

    @property
    def management(self) -> tuple[int, int] | None:
        return (self.height - self.management_u + 1, self.height) if self.management_u else None

    def needs(self, nodes: int) -> int:
        """U a rack of `nodes` nodes takes, from U1 to its management switches (its first rack: the most leaves)."""
        leaves = len(self.leaf_units(0, nodes))
        return self.first_u - 1 + nodes * self.node_u + self.trays_u + leaves * self.leaf_u + self.management_u


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
    layouts: dict[str, RackLayout] = field(default_factory=dict)  # group -> where its racks hold what

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

    def u_of(self, group: NodeGroup, index: int) -> tuple[int, int]:
        """Lowest and highest U of the group's node `index` in its rack (racks start at the group's node 0)."""
        return self.layouts[group.name].node(index % group.nodes_per_rack)

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


@dataclass
class _Draft:
    """A plan being drawn up: the spec, the rails and link speed it settled, the catalog model of each tier
    the spec names, and the findings so far. Every step reports through it, so the PlanError of an error
    carries the warnings found before it."""

    spec: ClusterSpec
    rails: int
    speed: int
    models: dict[str, SwitchModel]
    findings: list[Finding] = field(default_factory=list)

    @property
    def fab(self) -> Fabric:
        return self.spec.fabric

    def fail(self, path: tuple, message: str, fix: str, rule: str) -> PlanError:
        """The error to raise: this finding after the warnings found so far."""
        self.findings.append(Finding(path, message, fix, rule))
        return PlanError(self.findings)

    def warn(self, path: tuple, message: str, fix: str, rule: str) -> None:
        self.findings.append(Finding(path, message, fix, rule, level="warning"))

    def radix(self, tier: str) -> int:
        """Ports of the tier's switch at the link speed: 0 when it has none there or the tier has no model."""
        return self.models[tier].radix(self.speed) if tier in self.models else 0


@dataclass(frozen=True)
class _Leaves:
    """The leaf tier as designed and what the tiers above build on: a full leaf's ports, the units, and the
    uplinks each unit's leaves need (a partial unit's leaves carry fewer nodes)."""

    unit_nodes: int
    per_unit: int  # leaves per unit: one per rail on rail-optimised fabrics
    down: int  # ports facing down, per full leaf
    up: int  # ports facing up, per full leaf
    units: list[Unit]
    needs: list[int]  # uplinks of each unit's leaves
    per_group: int  # leaves per unit in each rail group

    def spine_down(self, members: range, spines: int) -> int:
        """Links down per spine when these units' leaves spread their uplinks evenly over `spines`."""
        return self.per_group * sum(-(-self.needs[i] // spines) for i in members)


@dataclass(frozen=True)
class _PodSpines:
    """A full pod's spines with 3 tiers: the units per pod, the pods, and per rail group the spines and
    each one's links down and up at the spine's oversubscription."""

    units_per_pod: int
    pods: int
    per_group: int
    down: int
    up: int
    ratio: float


@dataclass(frozen=True)
class _UpperTiers:
    """The tiers above the leaves: their switches (the spine's, then the core's with 3 tiers), each pod's
    spines (one pod holding every unit with 2 tiers) and the counts Plan records of them."""

    plans: list[TierPlan]
    pod_plans: list[PodPlan]
    pods: int
    units_per_pod: int
    spines_per_group: int
    cores_per_plane: int = 0


def plan_cluster(spec: ClusterSpec) -> Plan:
    """Plan the fabric and racks of a spec that passed the syntax layer: the leaves and their units, the
    tiers above them, each unit's uplinks to its pod's spines, then the racks. Raises PlanError."""
    trace.mark("plan")
    draft = _draft(spec)
    leaves = _leaves(draft)
    fab = spec.fabric
    two_tier_spines = _two_tier_spines(draft, leaves)
    tiers = fab.tiers
    if tiers == "auto":
        tiers = 2 if two_tier_spines else 3
    leaf = TierPlan("leaf", fab.switches["leaf"], len(leaves.units) * leaves.per_unit, draft.radix("leaf"),
                    leaves.down, leaves.up, 0)
    upper = _two_tiers(draft, leaves, two_tier_spines) if tiers == 2 else _three_tiers(draft, leaves)
    units = _uplinked(leaves, upper)
    racks = _racks(spec)
    layouts = _rack_layouts(draft, leaves.unit_nodes)
    return Plan(spec, fab.design, int(tiers), draft.speed, draft.rails, fab.rail_groups, leaves.unit_nodes, units,
                [leaf, *upper.plans], upper.pods, upper.units_per_pod, upper.spines_per_group, upper.cores_per_plane,
                racks, warnings=draft.findings, pod_plans=upper.pod_plans, domains=nvlink_domains(spec, racks),
                layouts=layouts)


def _draft(spec: ClusterSpec) -> _Draft:
    """The rails, link speed and switch models the plan is drawn with. Raises PlanError when no compute group
    is on the fabric, or the leaf or spine tier has no model with ports at the link speed."""
    fab = spec.fabric
    parts = spec.parts
    groups = spec.fabric_groups
    if not groups:
        raise PlanError([Finding(("node_groups",), "no compute group has NICs on the fabric",
                                 "give the GPU node groups nic and nics_per_node", "fabric-empty")])
    speeds = {parts.nics[g.nic].speed_gbps for g in groups if g.nic in parts.nics}
    speed = fab.link_speed_gbps or (max(speeds) if speeds else 0)
    models = {}
    for tier in ("leaf", "spine", "core"):
        model = fab.switches.get(tier)
        if model and model in parts.switches:
            models[tier] = parts.switches[model]
    draft = _Draft(spec, max(g.nics_per_node for g in groups), speed, models)
    for tier in ("leaf", "spine"):
        if tier not in fab.switches:
            raise draft.fail(("fabric", "switches"), f"no switch model for the {tier} tier",
                             f"add switches.{tier}", "fabric-switch")
        if draft.radix(tier) == 0:
            ports = models[tier].ports if tier in models else {}
            raise draft.fail(("fabric", "switches", tier),
                             f"'{fab.switches[tier]}' has no ports at {speed} Gb/s (it has {ports})",
                             "pick a switch with ports at the link speed or set fabric.link_speed_gbps",
                             "switch-speed")
    return draft


def _leaf_ports(d: _Draft) -> tuple[int, int, int, int]:
    """Nodes per unit, leaves per unit, and a full leaf's ports down and up at the leaf's oversubscription.
    Raises PlanError when the design lacks its unit size or a leaf cannot take a unit."""
    fab, rails = d.fab, d.rails
    k1 = d.radix("leaf")
    r1 = fab.ratio("leaf")
    if fab.design == "rail-optimized":
        unit_nodes = fab.scalable_unit_nodes
        if unit_nodes is None:
            raise d.fail(("fabric", "scalable_unit_nodes"), "a rail-optimized design needs the unit size",
                         "set fabric.scalable_unit_nodes (nodes per scalable unit, e.g. 32)", "required")
        if rails % fab.rail_groups:
            raise d.fail(("fabric", "rail_groups"), f"{rails} rails do not split into {fab.rail_groups} groups",
                         f"use a divisor of {rails}", "rail-groups")
        d1 = unit_nodes
        leaves_per_unit = rails
    else:
        if fab.rail_groups != 1:
            raise d.fail(("fabric", "rail_groups"), "rail groups exist only on rail-optimized fabrics",
                         "remove rail_groups or set design: rail-optimized", "rail-groups")
        unit_nodes = fab.nodes_per_leaf or _max_down(k1, r1) // rails
        if unit_nodes < 1:
            raise d.fail(("fabric", "switches", "leaf"),
                         f"a {k1}-port leaf at {fab.oversubscription.get('leaf', '1:1')} cannot take "
                         f"one node's {rails} NICs", "pick a larger leaf switch", "radix")
        d1 = unit_nodes * rails
        leaves_per_unit = 1
    u1 = _up(d1, r1)
    if d1 + u1 > k1:
        what = "scalable_unit_nodes" if fab.design == "rail-optimized" else "nodes_per_leaf"
        raise d.fail(("fabric", what),
                     f"a leaf needs {d1} down + {u1} up ports at {fab.oversubscription.get('leaf', '1:1')} "
                     f"but '{fab.switches['leaf']}' has {k1} at {d.speed} Gb/s",
                     f"lower {what} to at most {_max_down(k1, r1) // (1 if leaves_per_unit > 1 else rails)}",
                     "radix")
    if abs(d1 / u1 - r1) > 1e-9 and "leaf" in fab.oversubscription:
        d.warn(("fabric", "oversubscription", "leaf"),
               f"{d1} downlinks cannot split exactly {fab.oversubscription['leaf']}; "
               f"the plan uses {u1} uplinks ({d1 / u1:.2f}:1)",
               "adjust the unit size to a multiple of the ratio", "ratio-rounded")
    return unit_nodes, leaves_per_unit, d1, u1


def _leaves(d: _Draft) -> _Leaves:
    """The leaf tier: its ports, then a unit per `unit_nodes` nodes of each group on the fabric (a group's
    last unit may be partial), each unit with leaves of its own."""
    fab = d.fab
    unit_nodes, leaves_per_unit, down, up = _leaf_ports(d)
    units: list[Unit] = []
    leaf_index = 0
    for g in d.spec.fabric_groups:
        for first in range(0, g.count, unit_nodes):
            n = len(units) + 1
            name = f"su{n:04d}" if fab.design == "rail-optimized" else f"leaf{n:05d}"
            units.append(Unit(len(units), name, g.name, first, min(unit_nodes, g.count - first),
                              tuple(range(leaf_index, leaf_index + leaves_per_unit))))
            leaf_index += leaves_per_unit
    per_leaf = 1 if fab.design == "rail-optimized" else d.rails
    r1 = fab.ratio("leaf")
    needs = [_up(u.count * per_leaf, r1) for u in units]
    return _Leaves(unit_nodes, leaves_per_unit, down, up, units, needs, leaves_per_unit // fab.rail_groups)


def _two_tier_spines(d: _Draft, leaves: _Leaves) -> int | None:
    """Spines per rail group with 2 tiers: the fewest that take every leaf of the group in one switch's ports,
    a divisor of a full leaf's uplinks so that each leaf spreads them evenly; None when no count fits."""
    everyone = range(len(leaves.units))
    k2 = d.radix("spine")
    return next((s for s in _divisors(leaves.up) if leaves.spine_down(everyone, s) <= k2), None)


def _two_tiers(d: _Draft, leaves: _Leaves, spines: int | None) -> _UpperTiers:
    """Every leaf of a rail group reaches every spine of that group. Raises PlanError when no spine count
    fits, or the spine, the top tier here, is given an oversubscription."""
    fab = d.fab
    n_units = len(leaves.units)
    k2 = d.radix("spine")
    if spines is None:
        raise d.fail(("fabric", "tiers"),
                     f"{n_units * leaves.per_group} leaves per spine group exceed the {k2}-port spine "
                     f"('{fab.switches['spine']}'): radix exceeded for 2 tiers",
                     "set tiers: 3 (or auto), use a larger spine, or fewer nodes", "radix")
    if "core" in fab.switches:
        d.warn(("fabric", "switches", "core"), "a 2-tier plan has no core tier",
               "remove switches.core or set tiers: 3", "unused-tier")
    if "spine" in fab.oversubscription and fab.ratio("spine") != 1:
        raise d.fail(("fabric", "oversubscription", "spine"),
                     "the spine is the top tier in a 2-tier plan and has no uplinks to oversubscribe",
                     "remove it, or set tiers: 3 for an oversubscribed aggregation layer", "ratio-tier")
    down = leaves.spine_down(range(n_units), spines)
    pod = PodPlan(0, 0, n_units, n_units * leaves.per_group, spines, down)
    spine = TierPlan("spine", fab.switches["spine"], fab.rail_groups * spines, k2, down, 0, leaves.up // spines)
    return _UpperTiers([spine], [pod], 1, n_units, spines)


def _three_tiers(d: _Draft, leaves: _Leaves) -> _UpperTiers:
    """Pods of units, each pod with spines of its own, and core planes over the pods' spines. Raises
    PlanError when the core tier has no usable switch, or a pod or the pods do not fit the spine or core."""
    fab = d.fab
    if "core" not in d.models:
        raise d.fail(("fabric", "switches"), "3 tiers need a core switch model",
                     "add switches.core (a core switch with ports at the link speed)", "fabric-switch")
    k3 = d.radix("core")
    if k3 == 0:
        raise d.fail(("fabric", "switches", "core"), f"'{fab.switches['core']}' has no {d.speed} Gb/s ports",
                     "pick a core switch with ports at the link speed", "switch-speed")
    spines = _pod_spines(d, leaves)
    cores_per_plane, pod_plans = _core_planes(d, leaves, spines, k3)
    planes = fab.rail_groups * spines.per_group
    return _UpperTiers(
        [TierPlan("spine", fab.switches["spine"], fab.rail_groups * sum(s.spines for s in pod_plans),
                  d.radix("spine"), spines.down, spines.up, leaves.up // spines.per_group),
         TierPlan("core", fab.switches["core"], planes * cores_per_plane, k3,
                  sum(s.links_per_core for s in pod_plans), 0, spines.up // cores_per_plane)],
        pod_plans, spines.pods, spines.units_per_pod, spines.per_group, cores_per_plane)


def _units_per_pod(d: _Draft, leaves: _Leaves) -> int:
    """Units per pod: nodes_per_pod's, else as few pods as the spine's ports allow, filled evenly. Raises
    PlanError when nodes_per_pod is not whole units or a spine cannot take one unit's leaves."""
    fab = d.fab
    if fab.nodes_per_pod:
        if fab.nodes_per_pod % leaves.unit_nodes:
            raise d.fail(("fabric", "nodes_per_pod"),
                         f"{fab.nodes_per_pod} nodes per pod is not a whole number of {leaves.unit_nodes}-node "
                         f"units", f"use a multiple of {leaves.unit_nodes}", "pod-size")
        return fab.nodes_per_pod // leaves.unit_nodes
    most = _max_down(d.radix("spine"), fab.ratio("spine")) // leaves.per_group
    if most < 1:
        raise d.fail(("fabric", "switches", "spine"), "a spine cannot take one unit's leaves",
                     "use a larger spine switch", "radix")
    pods_needed = math.ceil(len(leaves.units) / most)
    return math.ceil(len(leaves.units) / pods_needed)


def _pod_spines(d: _Draft, leaves: _Leaves) -> _PodSpines:
    """A full pod's spines: the fewest per rail group whose ports take the pod's leaf links and the uplinks
    they need at the spine's oversubscription. Raises PlanError when no count fits."""
    fab = d.fab
    k2 = d.radix("spine")
    r2 = fab.ratio("spine")
    units_per_pod = _units_per_pod(d, leaves)
    pods = math.ceil(len(leaves.units) / units_per_pod)
    leaves_per_pod_group = units_per_pod * leaves.per_group
    choice = None
    for s2 in _divisors(leaves.up):
        d2 = leaves_per_pod_group * (leaves.up // s2)
        u2 = _up(d2, r2)
        if d2 + u2 <= k2:
            choice = (s2, d2, u2)
            break
    if choice is None:
        raise d.fail(("fabric", "nodes_per_pod" if fab.nodes_per_pod else "switches"),
                     f"a pod of {units_per_pod} units needs {leaves_per_pod_group} leaf links per spine, "
                     f"more than the {k2}-port spine takes at {fab.oversubscription.get('spine', '1:1')}",
                     "use smaller pods or a larger spine", "radix")
    spines_per_group, d2, u2 = choice
    if "spine" in fab.oversubscription and abs(d2 / u2 - r2) > 1e-9:
        d.warn(("fabric", "oversubscription", "spine"),
               f"{d2} spine downlinks cannot split exactly {fab.oversubscription['spine']}; "
               f"the plan uses {u2} uplinks ({d2 / u2:.2f}:1)", "adjust nodes_per_pod", "ratio-rounded")
    return _PodSpines(units_per_pod, pods, spines_per_group, d2, u2, r2)


def _pod_shape(leaves: _Leaves, spines: _PodSpines, p: int, cores: int) -> PodPlan:
    """The fewest spines that take pod p's leaves at the designed ports, each spreading its uplinks evenly
    over whole core planes of `cores` cores (a full pod gets the designed shape)."""
    members = range(p * spines.units_per_pod, min(len(leaves.units), (p + 1) * spines.units_per_pod))
    for s in _divisors(spines.per_group):
        planes = spines.per_group // s
        down = leaves.spine_down(members, s)
        per_core = -(-_up(down, spines.ratio) // (planes * cores))
        if down <= spines.down and planes * cores * per_core <= spines.up:
            return PodPlan(p, members.start, len(members), len(members) * leaves.per_group,
                           s, down, planes * cores * per_core, planes, per_core)
    raise AssertionError("the designed spine count always fits")  # s == spines.per_group does


def _core_planes(d: _Draft, leaves: _Leaves, spines: _PodSpines, k3: int) -> tuple[int, list[PodPlan]]:
    """Cores per plane: the fewest whose ports take the links of every pod's spines, with each pod's shape at
    that count. Raises PlanError when no count fits the core."""
    for c in _divisors(spines.up):
        shapes = [_pod_shape(leaves, spines, p, c) for p in range(spines.pods)]
        if sum(s.links_per_core for s in shapes) <= k3:
            return c, shapes
    raise d.fail(("fabric", "switches", "core"),
                 f"{spines.pods} pods exceed the {k3}-port core ('{d.fab.switches['core']}'): radix exceeded "
                 "for 3 tiers", "use larger pods, a larger core switch, or fewer nodes", "radix")


def _uplinked(leaves: _Leaves, upper: _UpperTiers) -> list[Unit]:
    """The units with their pod and the uplinks of each of their leaves: a leaf reaches every spine of its
    pod with the same number of links, so a partial unit's need is rounded up to a multiple of the spines."""
    units = []
    for u in leaves.units:
        pod = u.index // upper.units_per_pod
        spines = upper.pod_plans[pod].spines
        units.append(Unit(u.index, u.name, u.group, u.first, u.count, u.leaves, pod,
                          spines * -(-leaves.needs[u.index] // spines)))
    return units


def _racks(spec: ClusterSpec) -> dict[str, list[tuple[int, int]]]:
    """Group -> its racks as (rack number, first node), numbered from 1 across the groups in spec order."""
    racks: dict[str, list[tuple[int, int]]] = {}
    rack = 1
    for g in spec.node_groups:
        racks[g.name] = []
        for first in range(0, g.count, g.nodes_per_rack):
            racks[g.name].append((rack, first))
            rack += 1
    return racks


def u_text(lo: int, hi: int) -> str:
    """A span of rack units as elevations write it: 'U 17-24', or 'U 5' for one unit."""
    return f"U {lo}" if lo == hi else f"U {lo}-{hi}"


def leaves_in_racks(spec: ClusterSpec, unit_nodes: int) -> bool:
    """Whether the leaves stand in their nodes' racks: a fat tree whose racks each hold at least one whole unit
    (cabled with DAC, as fabric/cabling.py's endpoint_media says); rail leaves stand at the end of the row."""
    return spec.fabric.design == "fat-tree" and all(g.nodes_per_rack >= unit_nodes for g in spec.fabric_groups)


def _layout(spec: ClusterSpec, group: NodeGroup, leaf_u: int, unit_nodes: int) -> RackLayout:
    """The rack layout of one group: its node height (the group's, else its GPU's, else a CPU server's) and an
    NVLink rack's switch trays."""
    gpu = spec.parts.gpus.get(group.gpu or "")
    node_u = group.node_rack_units or (gpu.rack_units if gpu else CPU_SERVER_RACK_UNITS)
    rack = gpu.nvlink_domain if gpu and group.gpus_per_node else None
    trays = rack.switch_trays if rack else 0
    below = group.nodes_per_rack
    if rack and rack.trays_below_switches is not None:
        below = min(below, rack.trays_below_switches)
    return RackLayout(spec.racks.height_u, group.rack_first_u, node_u, group.nodes_per_rack, below, trays, leaf_u,
                      unit_nodes, spec.racks.management_u)


def _rack_layouts(d: _Draft, unit_nodes: int) -> dict[str, RackLayout]:
    """Each group's rack layout. Raises PlanError naming every group whose full rack does not fit its height."""
    spec = d.spec
    leaf_u = d.models["leaf"].rack_units if leaves_in_racks(spec, unit_nodes) else 0
    on_fabric = {g.name for g in spec.fabric_groups}
    out: dict[str, RackLayout] = {}
    overfull = False
    for i, g in enumerate(spec.node_groups):
        out[g.name] = layout = _layout(spec, g, leaf_u if g.name in on_fabric else 0, unit_nodes)
        if layout.needs(layout.capacity) > layout.height:
            d.findings.append(_overfull(i, g, layout))
            overfull = True
    if overfull:
        raise PlanError(d.findings)
    return out


def _overfull(i: int, g: NodeGroup, layout: RackLayout) -> Finding:
    """A rack too full, with what fills it and the changes that make it fit."""
    n = layout.capacity
    parts = [f"{n} node{'s' if n > 1 else ''} of {layout.node_u}U"]
    if layout.first_u > 1:
        parts.append(f"{layout.first_u - 1}U kept below them (rack_first_u: {layout.first_u})")
    if layout.switch_trays:
        parts.append(f"{layout.switch_trays} NVLink switch trays of {NVLINK_SWITCH_TRAY_UNITS}U")
    if leaves := len(layout.leaf_units(0, n)):
        parts.append(f"{leaves} in-rack leaf switch{'es' if leaves > 1 else ''} of {layout.leaf_u}U")
    if layout.management_u:
        parts.append(f"{layout.management_u}U of management switches")
    fits = next((k for k in range(n - 1, 0, -1) if layout.needs(k) <= layout.height), 0)
    fixes = [f"nodes_per_rack: {fits} or fewer"] if fits and not layout.switch_trays else []
    fixes += [f"node_rack_units to the servers' real height ({layout.node_u}U now)",
              f"racks.height_u: {layout.needs(n)} where the racks are that tall"]
    return Finding(("node_groups", i, "nodes_per_rack"),
                   f"a rack of group '{g.name}' needs {layout.needs(n)}U ({', '.join(parts)}) but racks are "
                   f"{layout.height}U", "set " + ", or ".join(fixes), "rack-space")
