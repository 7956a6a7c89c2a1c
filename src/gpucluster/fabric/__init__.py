"""Fabric planning: switches per tier, links, oversubscription, racks, cabling. Neutral: no Slurm words
(render/topology.py translates units and pods into Slurm's tree, block or yaml topology).

The sub-package gpucluster.fabric.asbuilt checks the fabric as built against this plan (`gpucluster fabric`).
It sits a floor above the planner (it reads the inventory and the rendered topology too), so nothing here
imports it, and importing this package does not load it."""

from gpucluster.fabric.nvlink import NvlinkDomain
from gpucluster.fabric.plan import Plan, PlanError, TierPlan, Unit, plan_cluster

__all__ = ["NvlinkDomain", "Plan", "PlanError", "TierPlan", "Unit", "plan_cluster"]
