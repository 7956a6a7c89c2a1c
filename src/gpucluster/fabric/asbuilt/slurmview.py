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

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import hostlist

from gpucluster.fabric.asbuilt.graph import PORT_SPAN, SWITCH, Fabric
from gpucluster.fabric.asbuilt.match import Match
from gpucluster.fabric.cabling import leaf_name
from gpucluster.fabric.plan import Plan


@dataclass(frozen=True)
class FoundUnit:
    """A logical leaf as the wires have it (the fields the translators read from a plan's Unit)."""

    name: str
    group: str
    pod: int
    hosts: tuple[str, ...]
    hostlist: str = ""  # Slurm's hostlist of `hosts` (the plan unit's own where they are the same)

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
        return unit.hostlist or hostlist.collect_hostlist(list(unit.hosts))


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
    """Sized for a 25,000-node dump: the hosts are walked once from verify's match (200,000 HCA ends),
    and the switch ports once each as whole arrays, not port by port."""
    nodes, span = fab.nodes, PORT_SPAN
    is_switch = [n.kind == SWITCH for n in nodes]
    leaf_hosts: dict[int, set[str]] = defaultdict(set)
    host_leaf: dict[str, int] = {}
    edges: set[tuple[int, int]] = set()  # leaves one host reaches: they are one logical leaf
    peers_of = [n.peers for n in nodes]
    ends = list(m.hca_key.items())
    for node, name in m.unplanned_hosts.items():
        ends += [(node * span + port, f"{name},") for port, _peer in nodes[node].ports()]
    for end, key in ends:
        peer = peers_of[end // span][end % span]
        leaf = peer // span
        if peer < 0 or not is_switch[leaf]:
            continue
        host = key[:key.index(",")]
        leaf_hosts[leaf].add(host)
        first = host_leaf.setdefault(host, leaf)
        if first != leaf:
            edges.add((leaf, first))
    units = _Sets()
    for a, b in edges:
        units.join(a, b)
    leaves = set(leaf_hosts)
    # tiers and pods: the switches above the leaves (spines), and whether anything is above those
    spine_leaf: dict[int, int] = {}  # spine -> the first leaf seen under it
    pod_edges: set[tuple[int, int]] = set()  # leaves under one spine: one pod
    for i in leaves:
        for j in {p // span for p in nodes[i].peers if p >= 0}:
            if is_switch[j] and j not in leaves:
                first = spine_leaf.setdefault(j, i)
                if first != i:
                    pod_edges.add((i, first))
    spines = set(spine_leaf)
    pods = _Sets()
    for a, b in pod_edges:
        pods.join(a, b)
    tiers = 3 if any(is_switch[j] and j not in leaves and j not in spines
                     for i in spines for j in {p // span for p in nodes[i].peers if p >= 0}) else 2
    plan_unit = {}  # plan leaf name -> (unit index, unit name)
    planned_hosts = {}  # unit name -> (its hosts, its hostlist)
    for u in plan.units:
        for r in range(len(u.leaves)):
            plan_unit[leaf_name(plan, u, r)] = (u.index, u.name)
        planned_hosts[u.name] = (tuple(plan.spec.group(u.group).hosts[u.first:u.first + u.count]),
                                 plan.unit_hostlist(u))
    members: dict[int, list[int]] = {}
    for i in leaves:
        members.setdefault(units.find(i), []).append(i)
    order = {h: n for n, h in enumerate(plan.unit_of_host)}
    found: list[tuple[tuple, FoundUnit, int]] = []
    for group_leaves in members.values():
        hosts = sorted({h for i in group_leaves for h in leaf_hosts[i]}, key=lambda h: (order.get(h, len(order)), h))
        names = Counter(plan_unit[m.sw_name[i]] for i in group_leaves
                        if i in m.sw_name and m.sw_name[i] in plan_unit)
        if names:
            (index, name), _n = names.most_common(1)[0]
            key = (0, index, name)
        else:
            name = fab.label(min(group_leaves))
            key = (1, 0, name)
        groups = Counter(plan.unit_of_host[h].group for h in hosts if h in plan.unit_of_host)
        group = groups.most_common(1)[0][0] if groups else "?"
        want, want_list = planned_hosts.get(name, ((), ""))
        hosts_t = tuple(hosts)
        found.append((key, FoundUnit(name, group, 0, hosts_t, want_list if hosts_t == want else ""),
                      pods.find(min(group_leaves))))
    found.sort(key=lambda t: t[0])
    pod_index: dict[int, int] = {}
    for _key, _unit, pod_root in found:
        pod_index.setdefault(pod_root, len(pod_index))
    units_out = [FoundUnit(u.name, u.group, pod_index[r] if tiers == 3 else 0, u.hosts, u.hostlist)
                 for _k, u, r in found]
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
