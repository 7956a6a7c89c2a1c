"""Switch trees as Slurm sees them, and the leaf arithmetic the placement metrics need.

Both ``topology.conf`` and ``scontrol show topology`` are read into the same shape,
``name -> {level, nodes, switches, linkspeed}``, with an upper switch's ``nodes`` being every node
below it and ``level`` computed the way slurmctld does (leaves 0, a parent one above its highest
child), so "what slurmctld understood" can be compared with "what we rendered" by plain equality.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import hostlist

from gpucluster.emulate.adapt import parse_lines

Topology = dict[str, dict]


def _expand(spec: str | None) -> set[str]:
    if not spec or spec == "(null)":
        return set()
    return set(hostlist.expand_hostlist(spec))


def parse_topology_conf(text: str) -> Topology:
    """topology.conf -> name -> {level, nodes, switches, linkspeed}, levels and nodes derived."""
    raw: dict[str, dict] = {}
    for line in parse_lines(text):
        if line.kind != "switchname":
            continue
        name = line.pairs[0][1]
        speed = line.get("LinkSpeed")
        raw[name] = {
            "nodes": _expand(line.get("Nodes")),
            "switches": _expand(line.get("Switches")),
            "linkspeed": int(speed) if speed else 1,
        }
    out: Topology = {}

    def resolve(name: str, stack: tuple[str, ...] = ()) -> tuple[int, set[str]]:
        if name in out:
            return out[name]["level"], out[name]["nodes"]
        if name in stack:
            raise ValueError(f"topology.conf: switch loop through {' -> '.join((*stack, name))}")
        if name not in raw:
            raise ValueError(f"topology.conf: switch '{name}' is referenced but not defined")
        sw = raw[name]
        level, nodes = 0, set(sw["nodes"])
        for child in sw["switches"]:
            clevel, cnodes = resolve(child, (*stack, name))
            level = max(level, clevel + 1)
            nodes |= cnodes
        out[name] = {
            "level": level,
            "nodes": nodes,
            "switches": set(sw["switches"]),
            "linkspeed": sw["linkspeed"],
        }
        return level, nodes

    for name in raw:
        resolve(name)
    return {name: out[name] for name in raw}


def parse_show_topology(text: str) -> Topology:
    """``scontrol show topology`` output -> the same shape as :func:`parse_topology_conf`."""
    out: Topology = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("SwitchName="):
            continue
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        out[fields["SwitchName"]] = {
            "level": int(fields.get("Level", 0)),
            "nodes": _expand(fields.get("Nodes")),
            "switches": _expand(fields.get("Switches")),
            "linkspeed": int(fields.get("LinkSpeed", 1)),
        }
    return out


@dataclass(frozen=True)
class Fabric:
    """Leaf membership and the tree above it, for scoring where jobs landed."""

    leaf_of: Mapping[str, str]  # node -> leaf switch
    parent: Mapping[str, str]  # switch -> its parent (root absent)
    level: Mapping[str, int]
    leaf_nodes: Mapping[str, frozenset[str]]

    @classmethod
    def from_topology(cls, topo: Topology) -> Fabric:
        leaf_of: dict[str, str] = {}
        leaf_nodes: dict[str, frozenset[str]] = {}
        parent: dict[str, str] = {}
        for name, sw in topo.items():
            if sw["level"] == 0:
                leaf_nodes[name] = frozenset(sw["nodes"])
                for node in sw["nodes"]:
                    if node in leaf_of:
                        raise ValueError(f"node {node} sits under two leaves: {leaf_of[node]} and {name}")
                    leaf_of[node] = name
            for child in sw["switches"]:
                parent[child] = name
        return cls(leaf_of, parent, {n: sw["level"] for n, sw in topo.items()}, leaf_nodes)

    @property
    def nodes(self) -> set[str]:
        return set(self.leaf_of)

    def leaves(self, nodes: Iterable[str]) -> set[str]:
        return {self.leaf_of[n] for n in nodes}

    def _ancestors(self, switch: str) -> list[str]:
        chain = [switch]
        while chain[-1] in self.parent:
            chain.append(self.parent[chain[-1]])
        return chain

    def lca_level(self, nodes: Iterable[str]) -> int:
        """Level of the lowest switch above all of ``nodes`` (0 = one leaf)."""
        leaves = self.leaves(nodes)
        if len(leaves) <= 1:
            return 0
        chains = [self._ancestors(leaf) for leaf in leaves]
        common = set(chains[0]).intersection(*map(set, chains[1:]))
        if not common:
            return math.inf  # type: ignore[return-value]  # no common switch (TopoOptional forest)
        return min(self.level[s] for s in common)

    def capacity(self, usable: set[str] | None = None) -> dict[str, int]:
        """Usable nodes per leaf."""
        return {leaf: len(members if usable is None else members & usable) for leaf, members in self.leaf_nodes.items()}

    def min_leaves(self, k: int, usable: set[str] | None = None) -> int:
        """Fewest leaves that can hold k nodes, using only ``usable`` nodes (largest leaves first)."""
        caps = sorted(self.capacity(usable).values(), reverse=True)
        total = 0
        for i, cap in enumerate(caps, 1):
            total += cap
            if total >= k:
                return i
        raise ValueError(f"{k} nodes do not fit in the {total} usable nodes")

    def min_lca_level(self, k: int, usable: set[str] | None = None) -> int:
        """Lowest switch level with one switch that has k usable nodes below it."""
        below: dict[str, int] = {}
        for leaf, cap in self.capacity(usable).items():
            for sw in self._ancestors(leaf):
                below[sw] = below.get(sw, 0) + cap
        fits = [self.level[sw] for sw, n in below.items() if n >= k]
        if not fits:
            raise ValueError(f"no switch has {k} usable nodes below it")
        return min(fits)
