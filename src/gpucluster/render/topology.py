"""Slurm's view of the fabric: the plan's units and pods translated into topology/tree switches or
topology/block blocks. The plan itself stays neutral (NVIDIA Topograph keeps its topology model apart
from its translators the same way)."""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.fabric import Plan


@dataclass(frozen=True)
class SlurmSwitch:
    name: str
    level: int
    nodes: tuple[str, ...] = ()  # hostlist expressions
    switches: tuple[str, ...] = ()


def slurm_switches(plan: Plan) -> list[SlurmSwitch]:
    """topology/tree: a logical leaf per unit (a scalable unit's rail leaves together, so no node sits
    under two leaves), a switch per pod (3 tiers), one root. Leaves first, then each level above."""
    leaves = [SlurmSwitch(u.name, 0, nodes=(plan.unit_hostlist(u),)) for u in plan.units]
    if plan.tiers == 3:
        pods = []
        for p in range(plan.pods):
            members = tuple(u.name for u in plan.units if u.pod == p)
            if members:
                pods.append(SlurmSwitch(f"pod{p + 1:03d}", 1, switches=members))
        root = SlurmSwitch(plan.root_name, 2, switches=tuple(s.name for s in pods))
        return [*leaves, *pods, root]
    return [*leaves, SlurmSwitch(plan.root_name, 1, switches=tuple(u.name for u in plan.units))]


def blocks(plan: Plan) -> dict:
    """topology/block: a block per unit; aggregate sizes up to a pod (BlockSizes needs 24.05+)."""
    base = min(u.count for u in plan.units)
    sizes = [base]
    while sizes[-1] * 2 <= base * plan.units_per_pod and len(sizes) < 8:
        sizes.append(sizes[-1] * 2)
    return {"units": plan.units, "sizes": ",".join(map(str, sizes))}
