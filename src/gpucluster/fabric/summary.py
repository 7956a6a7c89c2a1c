"""The plan as data: the `plan --json` contract, and the lines of the human summary."""

from __future__ import annotations

from gpucluster.fabric.explain import explain
from gpucluster.fabric.plan import Plan


def plan_summary(plan: Plan) -> dict:
    """`plan --json`. Contract keys: nodes, gpus, gpus_by_type, switches, links, oversubscription,
    bisection_tbps, tiers, racks. More keys may be added; none is removed or renamed. `explanations` holds
    a record per count that rounding or even spreading raised above its arithmetic minimum."""
    spec = plan.spec
    flash = spec.storage.flash
    storage: dict = {"nfs": [{"name": n.name, "servers": spec.group(n.server_group).count,
                              "exports": [e.mount for e in n.exports]} for n in spec.storage.nfs]}
    if flash:
        servers = spec.group(flash.chunk_group).count
        storage["flash"] = {
            "name": flash.name, "chunk_servers": servers,
            "raw_tb": round(servers * flash.nvme_per_server * flash.nvme_tb, 2),
            "usable_tb": round(servers * flash.nvme_per_server * flash.nvme_tb / flash.replicas, 2),
            "write_gbps": round(servers * flash.nvme_per_server * flash.nvme_gbps / flash.replicas, 1),
            "mount": flash.mount,
        }
    out = {
        "cluster": spec.name,
        "nodes": plan.nodes,
        "nodes_by_group": {g.name: g.count for g in spec.node_groups},
        "gpus": plan.gpus,
        "gpus_by_type": plan.gpus_by_type,
        "fabric": {"type": spec.fabric.type, "design": plan.design, "link_gbps": plan.speed_gbps,
                   "rails": plan.rails, "rail_groups": plan.rail_groups, "endpoints": plan.endpoints},
        "tiers": plan.tiers,
        "switches": plan.switches,
        "switch_models": {t.tier: t.model for t in plan.tier_plans},
        "ports_used": {t.tier: {"down": t.down, "up": t.up, "radix": t.radix} for t in plan.tier_plans},
        "links": plan.links,
        "oversubscription": plan.oversubscription,
        "bisection_tbps": plan.bisection_tbps,
        "units": {"count": len(plan.units), "nodes_per_unit": plan.unit_nodes,
                  "kind": "scalable unit" if plan.design == "rail-optimized" else "leaf"},
        "pods": plan.pods if plan.tiers == 3 else 0,
        "racks": plan.rack_count,
        "slurm_switches": plan.logical_switches,
        "storage": storage,
        "warnings": [w.message for w in plan.warnings],
        "explanations": [e.as_dict() for e in explain(plan)],
    }
    if plan.domains:  # only with rack-scale NVLink, so other plans keep their bytes
        out["nvlink_domains"] = [{"name": d.name, "group": d.group, "rack": d.rack, "nodes": plan.unit_hostlist(d),
                                  "trays": d.count, "planned_trays": d.planned, "gpus": d.gpus}
                                 for d in plan.domains]
    return out
