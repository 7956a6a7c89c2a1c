"""NVLink domains: the racks of a node group whose GPUs share one rack-scale NVLink domain (NVL72).

A domain is the unit a large job wants most: inside it GPUs talk over NVLink, between domains over the
scale-out fabric. The planner puts one whole domain in each rack of such a group; the scale-out fabric
(units, pods) sits on top and never splits a domain (spec/rules.py keeps scalable units whole domains).
Neutral like the rest of the plan: render/topology.py translates domains into Slurm blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.spec.model import ClusterSpec, NodeGroup


@dataclass(frozen=True)
class NvlinkDomain:
    """One rack's NVLink domain. `count` nodes from the group's `first`; `planned` is the full size."""

    index: int
    name: str
    group: str
    rack: str
    first: int
    count: int
    planned: int  # compute trays of a full domain (a partial last rack has fewer nodes)
    gpus: int  # GPUs in this domain as planned for its nodes


def domain_trays(spec: ClusterSpec, group: NodeGroup) -> int | None:
    """Compute trays (nodes) of one NVLink domain of this group; None for a group without rack-scale NVLink."""
    model = spec.parts.gpus.get(group.gpu or "")
    if model is None or model.nvlink_domain is None or not group.gpus_per_node:
        return None
    return model.nvlink_domain.compute_trays


def nvlink_domains(spec: ClusterSpec, racks: dict[str, list[tuple[int, int]]]) -> list[NvlinkDomain]:
    """A domain per rack of every NVLink group, in rack order. `racks` is the plan's group -> [(rack, first)]."""
    out: list[NvlinkDomain] = []
    for g in spec.node_groups:
        trays = domain_trays(spec, g)
        if trays is None:
            continue
        for rack, first in racks.get(g.name, []):
            count = min(g.nodes_per_rack, g.count - first)
            out.append(NvlinkDomain(len(out), f"nvl{len(out) + 1:04d}", g.name, f"rack{rack:04d}", first, count,
                                    trays, count * g.gpus_per_node))
    return out
