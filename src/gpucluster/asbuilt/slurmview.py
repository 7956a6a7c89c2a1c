"""The fabric the wires describe, in the shape Slurm's topology translators read (render/topology.py):
logical leaves (units) with their hosts, grouped into pods, so `fabric verify` writes the discovered
topology.conf with the same templates that wrote the plan's, and the two can be compared line by line.

From the discovered graph and verify's match:
- a unit is a connected set of leaves and the hosts cabled to them (one leaf in a fat tree; a scalable
  unit's rail leaves, which share their hosts, on a rail-optimised fabric); it takes the plan's name of
  the unit most of its leaves were matched to, else its first leaf's description;
- a pod (3 tiers) is a connected set of leaves and spines; a fabric whose spines reach a higher tier has
  3 tiers;
- a host is the plan's name verify matched its HCA to (or the name an unplanned host gave itself); an
  HCA without a usable name cannot be a Slurm node and is left out (verify reports it).
Units and pods keep the plan's order where they match it; anything else follows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import hostlist

from gpucluster.asbuilt.discover import switch_levels
from gpucluster.asbuilt.graph import HCA, PORT_SPAN, SWITCH, Fabric
from gpucluster.asbuilt.match import Match
from gpucluster.fabric.cabling import leaf_name
from gpucluster.fabric.plan import Plan


@dataclass(frozen=True)
class FoundUnit:
    """A logical leaf as the wires have it (the fields the translators read from a plan's Unit)."""

    name: str
    group: str
    pod: int
    hosts: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.hosts)


@dataclass
class FoundFabric:
    """A plan-like neutral view of a discovered fabric, for render.topology.topology_files."""

    spec: object
    design: str
    tiers: int
    units: list[FoundUnit] = field(default_factory=list)
    pods: int = 1

    @property
    def units_per_pod(self) -> int:
        per = Counter(u.pod for u in self.units)
        return max(per.values(), default=1)

    @property
    def root_name(self) -> str:
        return "core" if self.tiers == 3 else "spine"

    def unit_hostlist(self, unit: FoundUnit) -> str:
        return hostlist.collect_hostlist(list(unit.hosts))


class _Sets:
    """Union-find over node indices."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def found_fabric(plan: Plan, fab: Fabric, m: Match) -> FoundFabric:
    nodes = fab.nodes
    level = switch_levels(fab)
    leaves = [i for i, lv in level.items() if lv == 1]
    host_of: dict[int, str] = {}  # HCA node -> host name
    for end, key in m.hca_key.items():
        host_of[end // PORT_SPAN] = key.partition(",")[0]
    for node, name in m.unplanned_hosts.items():
        host_of.setdefault(node, name)
    plan_unit = {}  # plan leaf name -> (unit index, unit name, pod)
    for u in plan.units:
        for r in range(len(u.leaves)):
            plan_unit[leaf_name(plan, u, r)] = (u.index, u.name, u.pod)
    # units: leaves joined through the hosts they share
    units = _Sets()
    leaf_hosts: dict[int, set[str]] = {i: set() for i in leaves}
    host_leaf: dict[str, int] = {}
    for i in leaves:
        units.find(i)
        for _port, peer in nodes[i].ports():
            j = peer // PORT_SPAN
            if nodes[j].kind != HCA or j not in host_of:
                continue
            host = host_of[j]
            leaf_hosts[i].add(host)
            if host in host_leaf:
                units.join(i, host_leaf[host])
            else:
                host_leaf[host] = i
    # pods: leaves joined through the spines above them (3 tiers)
    tiers = 3 if any(lv >= 3 for lv in level.values()) else 2
    pods = _Sets()
    if tiers == 3:
        for i in leaves:
            for _port, peer in nodes[i].ports():
                j = peer // PORT_SPAN
                if nodes[j].kind == SWITCH and level.get(j) == 2:
                    pods.join(i, j)
    members: dict[int, list[int]] = {}
    for i in leaves:
        members.setdefault(units.find(i), []).append(i)
    order = {h: n for n, h in enumerate(plan.unit_of_host)}
    found: list[tuple[tuple, FoundUnit, int]] = []
    for group_leaves in members.values():
        hosts = sorted({h for i in group_leaves for h in leaf_hosts[i]}, key=lambda h: (order.get(h, len(order)), h))
        if not hosts:
            continue  # a leaf with no named host is no Slurm leaf
        names = Counter(plan_unit[m.sw_name[i]][:2] for i in group_leaves
                        if i in m.sw_name and m.sw_name[i] in plan_unit)
        if names:
            (index, name), _n = names.most_common(1)[0]
            key = (0, index, name)
        else:
            name = fab.label(min(group_leaves))
            key = (1, 0, name)
        groups = Counter(plan.unit_of_host[h].group for h in hosts if h in plan.unit_of_host)
        group = groups.most_common(1)[0][0] if groups else "?"
        found.append((key, FoundUnit(name, group, 0, tuple(hosts)), pods.find(min(group_leaves))))
    found.sort(key=lambda t: t[0])
    pod_index: dict[int, int] = {}
    for _key, _unit, pod_root in found:
        pod_index.setdefault(pod_root, len(pod_index))
    units_out = [FoundUnit(u.name, u.group, pod_index[r] if tiers == 3 else 0, u.hosts) for _k, u, r in found]
    return FoundFabric(plan.spec, plan.design, tiers, units_out, len(pod_index) if tiers == 3 else 1)


def compare_topology(plan: Plan, fab: Fabric, m: Match, max_lines: int = 40) -> dict:
    """The discovered topology file beside the plan's: name, both texts, and a unified diff (capped)."""
    import difflib

    from gpucluster.render.topology import topology_files

    planned = topology_files(plan.spec, plan)
    if not planned:
        return {"name": None, "same_as_plan": True, "diff": [], "text": ""}
    (name, want), = planned.items()
    got = topology_files(plan.spec, found_fabric(plan, fab, m))[name]
    diff = list(difflib.unified_diff(want.splitlines(), got.splitlines(), f"{name} (plan)",
                                     f"{name} (discovered)", lineterm="", n=0))
    return {"name": name, "same_as_plan": want == got, "diff": diff[:max_lines], "diff_lines": len(diff),
            "text": got}
