"""Racks as they stand: which nodes each holds and at which U, which leaf switch each of its rails lands on,
and which leaves stand in it.

Computed from the plan's arithmetic (racks and units are consecutive ranges of a group's nodes, a node's U
follows from its place in the rack: fabric/plan.py's RackLayout), not by walking every host: Colossus 200k
has 4,168 racks and 26,042 nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.fabric import Plan, Unit
from gpucluster.fabric.cabling import endpoint_media, leaf_name
from gpucluster.fabric.plan import RackLayout, u_text
from gpucluster.spec.model import NodeGroup


@dataclass(frozen=True)
class Rack:
    name: str
    group: str
    role: str
    first: str  # first and last hostnames
    last: str
    nodes: int
    capacity: int  # nodes_per_rack
    leaves: tuple[str, ...] = ()  # the leaf of each rail, in rail order (several units: all of them)
    tor: bool = False  # the leaf sits in this rack (copper); otherwise at the end of the row
    leaf_list: str = ""  # the leaves as a hostlist: "su0001-r[0-7]"
    nvlink: str = ""  # the NVLink domain the rack is (NVL72), else ""
    nvlink_gpus: int = 0
    nvlink_switch_trays: int = 0  # the rack's own NVLink switch trays
    index: int = 0  # the first node's index in its group (hostnames: group.host(index + i))
    layout: RackLayout | None = None  # where the group's racks hold what, in U
    housed: tuple[str, ...] = ()  # the leaves standing in this rack, highest first (fat-tree leaves cabled DAC)

    @property
    def hosts(self) -> str:
        return self.first if self.first == self.last else f"{self.first}–{self.last}"

    @property
    def height(self) -> int:
        return self.layout.height if self.layout else 0

    def node_u(self, slot: int) -> tuple[int, int]:
        """Lowest and highest U of the node in `slot` (0: the rack's lowest node)."""
        return self.layout.node(slot) if self.layout else (0, 0)

    @property
    def span(self) -> str:
        """The U its nodes take, lowest to highest: 'U 5-36'."""
        return u_text(self.node_u(0)[0], self.node_u(self.nodes - 1)[1])


@dataclass
class RackPlan:
    racks: list[Rack] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.racks)

    def sample(self, most: int = 8) -> list[Rack]:
        """The racks an elevation draws: the racks of each fabric group's first unit (at least a few),
        and the first rack of every other group; the rest repeat them."""
        by_group: dict[str, list[Rack]] = {}
        for rack in self.racks:
            by_group.setdefault(rack.group, []).append(rack)
        out: list[Rack] = []
        for racks in by_group.values():
            if racks[0].leaves:
                first_unit = [r for r in racks[:most] if racks[0].leaves[0] in r.leaves]
                out += first_unit if len(first_unit) > 1 else racks[:4]
            else:
                out.append(racks[0])
        return out


def _first_units(plan: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for u in plan.units:
        out.setdefault(u.group, u.index)
    return out


def build_racks(plan: Plan) -> RackPlan:
    spec = plan.spec
    first_unit = _first_units(plan)
    tor = endpoint_media(plan) == "DAC"
    out = RackPlan()
    domains = {d.rack: d for d in plan.domains}
    for g in spec.node_groups:
        on_fabric = g.name in first_unit
        for number, first in plan.racks[g.name]:
            n = min(g.nodes_per_rack, g.count - first)
            leaves: tuple[str, ...] = ()
            housed: tuple[str, ...] = ()
            listed = ""
            layout = plan.layouts[g.name]
            if on_fabric:
                units = _units(plan, g, first_unit[g.name], first, n)
                leaves = tuple(leaf_name(plan, u, r) for u in units for r in range(len(u.leaves)))
                listed = ",".join(_leaf_range(plan, u) for u in units)
                housed = tuple(leaf_name(plan, plan.units[first_unit[g.name] + k], 0)
                               for k in layout.leaf_units(first, n))
            name = f"rack{number:04d}"
            d = domains.get(name)
            gpu = spec.parts.gpus.get(g.gpu or "")
            out.racks.append(Rack(name, g.name, g.role, g.host(first), g.host(first + n - 1), n,
                                  g.nodes_per_rack, leaves, tor and on_fabric, listed,
                                  nvlink=d.name if d else "", nvlink_gpus=d.gpus if d else 0,
                                  nvlink_switch_trays=gpu.nvlink_domain.switch_trays if d and gpu else 0,
                                  index=first, layout=layout, housed=housed))
    return out


def _leaf_range(plan: Plan, unit: Unit) -> str:
    """A unit's leaves as one hostlist expression, written directly (python-hostlist's collect costs
    ~0.1 ms a call, 0.4 s for Colossus 200k's racks)."""
    rails = len(unit.leaves)
    if rails == 1:
        return leaf_name(plan, unit, 0)
    return f"{unit.name}-r[0-{rails - 1}]"


def _units(plan: Plan, group: NodeGroup, first_unit: int, first: int, count: int) -> list[Unit]:
    lo = first_unit + first // plan.unit_nodes
    hi = first_unit + (first + count - 1) // plan.unit_nodes
    return plan.units[lo:hi + 1]
