"""Fabric planning: switches per tier, links, oversubscription, racks, cabling. Neutral: no Slurm words
(render/topology.py translates units and pods into Slurm's tree, block or yaml topology)."""

from gpucluster.fabric.nvlink import NvlinkDomain
from gpucluster.fabric.plan import Plan, PlanError, TierPlan, Unit, plan_cluster

__all__ = ["NvlinkDomain", "Plan", "PlanError", "TierPlan", "Unit", "plan_cluster"]
