"""The slurm.conf lines the health checks need, from the spec's health: section.

The slurm.conf template (templates/) takes these lines as they are (docs/health.md, "Wiring"): the program
path, the interval, which node states run it, and one Licenses= line: the license that caps the active checks
and the circuit breaker's tokens and latch per compute group (render/health/breakerconf.py).
"""

from __future__ import annotations

import math

from gpucluster.cluster import Cluster
from gpucluster.render.health import breakerconf

PROGRAM = "/usr/local/sbin/gpucluster-health"
LIB_DIR = "/usr/local/lib/gpucluster/health"
CONFIG = "/etc/gpucluster/health/config.json"
LICENSE = "gpc_active"


def active_partition(cluster: Cluster) -> str:
    spec = cluster.spec
    if spec.health.active.partition:
        return spec.health.active.partition
    return next((p.name for p in spec.slurm.partitions if p.default), spec.slurm.partitions[0].name)


def active_nodes(cluster: Cluster) -> int:
    """Nodes the active checks may run on: the compute nodes of their partition."""
    spec = cluster.spec
    part = next(p for p in spec.slurm.partitions if p.name == active_partition(cluster))
    return sum(spec.group(g).count for g in part.groups)


def license_count(cluster: Cluster) -> int:
    """share_pct of the partition's nodes, rounded down, at least 1: the most active checks hold at once."""
    share = cluster.spec.health.active.share_pct
    return max(1, math.floor(active_nodes(cluster) * share / 100))


def slurm_conf_lines(cluster: Cluster) -> list[str]:
    health = cluster.spec.health
    if not health.enabled:
        return []
    lines = [f"HealthCheckProgram={PROGRAM}", f"HealthCheckInterval={health.interval}",
             f"HealthCheckNodeState={health.node_state}"]
    licenses = [f"{LICENSE}:{license_count(cluster)}"] if health.active.checks else []
    licenses += breakerconf.license_entries(cluster)
    if licenses:
        lines.append(f"Licenses={','.join(licenses)}")
    return lines
