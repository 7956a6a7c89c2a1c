"""What verify knows about the plan before it streams the cables (`cabling_rows`, the rows of
cabling.csv): switch names and tiers, each host's group and HCAs, each rail leaf's rail. Small beside the
cabling map, which is never held whole (a 200k-GPU plan has 600k cables).

Switch names follow the planner's naming (cabling.leaf_name, spineNNNNN, coreNNNNN); a test checks
them against the names in cabling_rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.fabric.cabling import leaf_name
from gpucluster.fabric.plan import Plan


@dataclass
class PlanIndex:
    """What verify needs to know about the plan before it streams the cables."""

    plan: Plan
    switch_tier: dict[str, str] = field(default_factory=dict)  # switch -> leaf | spine | core
    host_group: dict[str, str] = field(default_factory=dict)  # host -> node group
    group_hcas: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> HCA names, rail order
    leaf_rail: dict[str, int] = field(default_factory=dict)  # rail-optimised leaf -> its rail

    @classmethod
    def of(cls, plan: Plan) -> PlanIndex:
        idx = cls(plan)
        spec = plan.spec
        rail_design = plan.design == "rail-optimized"
        for unit in plan.units:
            for r in range(len(unit.leaves)):
                name = leaf_name(plan, unit, r)
                idx.switch_tier[name] = "leaf"
                if rail_design:
                    idx.leaf_rail[name] = r
        for tier in plan.tier_plans[1:]:
            for i in range(1, tier.count + 1):
                idx.switch_tier[f"{tier.tier}{i:05d}"] = tier.tier
        for g in spec.fabric_groups:
            idx.group_hcas[g.name] = tuple(plan.hcas(g))
            for host in g.hosts:
                idx.host_group[host] = g.name
        return idx

    def hcas_of(self, host: str) -> tuple[str, ...]:
        group = self.host_group.get(host)
        return self.group_hcas[group] if group else ()

    def rail(self, host: str, hca: str) -> int:
        hcas = self.hcas_of(host)
        return hcas.index(hca) if hca in hcas else -1
