"""The circuit breaker's limits, from the spec's health.breaker, per compute node group: the licenses slurm.conf
declares (the node side's tokens and latch, node/breaker.py) and the `breaker` section of each group's health
config (docs/health.md, "Circuit breaker").

A limit is a share of the group, rounded down, never below `min_nodes`: 5 % of a 30-node group is 1.5, and
one drained node must not open the breaker of a small group. The shares are read as the decimals the spec
wrote (Fraction of their text), so 10 % of 30 nodes is 3, never 2 for a float's sake.
"""

from __future__ import annotations

import math
from fractions import Fraction

from gpucluster.cluster import Cluster
from gpucluster.node.breaker import LATCH_PREFIX, TOKEN_PREFIX


def limit(nodes: int, pct: float, min_nodes: int) -> int:
    """pct % of `nodes`, rounded down, at least `min_nodes`."""
    return max(min_nodes, math.floor(Fraction(str(pct)) * nodes / 100))


def limits(cluster: Cluster, group_name: str) -> tuple[int, int]:
    """(drains per window, nodes out of service at which the breaker opens) of one node group."""
    breaker = cluster.spec.health.breaker
    count = cluster.spec.group(group_name).count
    return (limit(count, breaker.drains_pct, breaker.min_nodes),
            limit(count, breaker.out_of_service_pct, breaker.min_nodes))


def enabled(cluster: Cluster) -> bool:
    health = cluster.spec.health
    return bool(health.enabled and health.breaker.enabled)


def license_entries(cluster: Cluster) -> list[str]:
    """`gpc_drain_<group>:<drains>` and `gpc_breaker_<group>:1` per compute group, for slurm.conf's Licenses=."""
    if not enabled(cluster):
        return []
    out = []
    for group in cluster.spec.groups_with_role("compute"):
        drains, _ = limits(cluster, group.name)
        out += [f"{TOKEN_PREFIX}{group.name}:{drains}", f"{LATCH_PREFIX}{group.name}:1"]
    return out


def config_keys(cluster: Cluster, group_name: str) -> dict:
    """What a group's health config (render/health/config.py node_config) merges in for node/breaker.py."""
    if not enabled(cluster):
        return {"breaker": {"enabled": False}}
    group = cluster.spec.group(group_name)
    drains, out_of_service = limits(cluster, group_name)
    return {"breaker": {"enabled": True, "group": group.name, "nodes": group.hostlist, "size": group.count,
                        "drains": drains, "out_of_service": out_of_service,
                        "window_minutes": cluster.spec.health.breaker.window_minutes}}
