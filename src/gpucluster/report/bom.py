"""The bill of materials as a procurement list states it: switches by model, then for each link class
the cable (copper inside a rack, optical beyond) and the optics at both ends, by distance class.

Distance classes are assumed from where each tier sits, not measured: a leaf in the nodes' rack is
reached by copper (DAC, up to 3 m); rail leaves at the end of the row by active optical cable (AOC,
up to 30 m, optics built in); spines within a pod's rows by multimode fibre and SR optics (up to
100 m); cores across the hall by single-mode fibre and DR optics (up to 500 m). Quantities are the
plan's links, so the totals always match `plan --json` and bom.csv.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.fabric import Plan
from gpucluster.fabric.cabling import endpoint_media, nvlink_rows


@dataclass(frozen=True)
class LinkClass:
    link: str  # node-leaf, leaf-spine, spine-core
    distance: str  # in-rack, in-row, within a pod, across the hall
    reach: str  # "<= 3 m"
    cable: str  # what is ordered per link
    optics: str  # what is ordered per end ("" for copper and AOC)
    cables: int
    transceivers: int


@dataclass(frozen=True)
class SwitchLine:
    tier: str
    model: str
    description: str
    ports: str
    quantity: int


@dataclass(frozen=True)
class Bom:
    switches: list[SwitchLine]
    links: list[LinkClass]
    other: list[tuple[str, str, str, int]]  # (category, item, description, quantity)
    nvlink: list[tuple[str, str, str, int]] = field(default_factory=list)  # (item, GPU, description, quantity)

    @property
    def switch_total(self) -> int:
        return sum(s.quantity for s in self.switches)

    @property
    def cable_total(self) -> int:
        return sum(c.cables for c in self.links)

    @property
    def transceiver_total(self) -> int:
        return sum(c.transceivers for c in self.links)


def build_bom(plan: Plan) -> Bom:
    spec = plan.spec
    parts = spec.parts
    speed = plan.speed_gbps
    switches = [SwitchLine(t.tier, t.model, parts.switches[t.model].name, f"{t.radix} × {speed}G", t.count)
                for t in plan.tier_plans]
    links = plan.links
    classes = []
    if endpoint_media(plan) == "DAC":
        classes.append(LinkClass("node-leaf", "in-rack", "≤ 3 m", f"{speed}G DAC copper cable", "",
                                 links["node-leaf"], 0))
    else:
        classes.append(LinkClass("node-leaf", "in-row", "≤ 30 m", f"{speed}G active optical cable (AOC)", "",
                                 links["node-leaf"], 0))
    within = "within a pod" if plan.tiers == 3 else "within the hall"
    classes.append(LinkClass("leaf-spine", within, "≤ 100 m", "multimode fibre (OM4, MPO)",
                             f"{speed}G SR optic (multimode)", links["leaf-spine"], 2 * links["leaf-spine"]))
    if "spine-core" in links:
        classes.append(LinkClass("spine-core", "across the hall", "≤ 500 m", "single-mode fibre (OS2, MPO)",
                                 f"{speed}G DR optic (single-mode)", links["spine-core"], 2 * links["spine-core"]))
    other: list[tuple[str, str, str, int]] = []
    for g in spec.node_groups:
        other.append(("node", g.name, f"{g.role}: {g.cpu.sockets} × {g.cpu.cores_per_socket} cores, "
                      f"{g.memory_gb:,} GB", g.count))
    for key, n in plan.gpus_by_type.items():
        model = parts.gpus[key]
        other.append(("gpu", key, model.name, n // model.devices_per_card))
    nics: dict[str, int] = {}
    for g in spec.node_groups:
        if g.nic:
            nics[g.nic] = nics.get(g.nic, 0) + g.count * g.nics_per_node
    for key, n in nics.items():
        other.append(("nic", key, parts.nics[key].name, n))
    other.append(("rack", "node racks", "racks holding nodes (network racks not counted)", plan.rack_count))
    nvlink = [(item, key, text, n) for _cat, item, key, text, n in nvlink_rows(plan)]
    return Bom(switches, classes, other, nvlink)
