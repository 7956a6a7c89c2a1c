"""Fabric planning: switches per tier, links, oversubscription, racks, cabling."""

from gpucluster.fabric.plan import Plan, PlanError, SlurmSwitch, TierPlan, Unit, plan_cluster

__all__ = ["Plan", "PlanError", "SlurmSwitch", "TierPlan", "Unit", "plan_cluster"]
