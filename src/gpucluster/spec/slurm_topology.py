"""Rules for how the fabric may be shown to Slurm's topology/tree: merging leaves into logical leaves
is only honest where nothing below the logical leaf blocks (the leaf tier is 1:1)."""

from __future__ import annotations

from collections.abc import Iterator

from gpucluster.errors import Finding
from gpucluster.spec.model import ClusterSpec


def tree_rules(spec: ClusterSpec) -> Iterator[Finding]:
    merge = spec.slurm.tree_merge_leaves
    if merge == 1:
        return
    at = ("slurm", "tree_merge_leaves")
    kinds = {spec.slurm.topology} | {p.topology for p in spec.slurm.partitions if p.topology}
    if "tree" not in kinds:
        yield Finding(at, "tree_merge_leaves shapes topology/tree, which no partition uses",
                      "remove it, or use topology: tree", "topology")
    ratio = spec.fabric.ratio("leaf")
    if ratio > 1:
        # A logical leaf tells Slurm its nodes are as close as one switch's; behind oversubscribed
        # uplinks they are not, and jobs packed "under one leaf" would cross the blocking tier.
        yield Finding(at, f"the leaves' uplinks are oversubscribed ({spec.fabric.oversubscription['leaf']}), so "
                      f"{merge} merged leaves would hide a blocking tier from Slurm",
                      "keep tree_merge_leaves: 1, or make the leaf tier non-blocking (oversubscription.leaf: 1:1)",
                      "topology")
