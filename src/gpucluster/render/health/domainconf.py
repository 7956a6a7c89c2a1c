"""The domain guard's files, from the plan's NVLink domains: its config and the controller's timer that runs it.

The guard (node/domainguard.py) runs on the controller, where slurmctld sees every tray of a domain at once; it
reads only this config: each domain's trays by name in tray order (a standalone script has no hostlist library),
each node group's hostlist (one `scontrol show node` per group), the spec's share, and the circuit breaker's limits
of each group, as the node runners have them (render/health/breakerconf.py). None of it exists for a cluster whose
groups have no NVLink domain (health.nvlink_domain applies to GB200/GB300 groups only; elsewhere it is ignored).
"""

from __future__ import annotations

import json

from gpucluster.cluster import Cluster
from gpucluster.render.health import breakerconf
from gpucluster.render.health.slurmconf import LIB_DIR
from gpucluster.render.templating import environment

CONFIG_NAME = "domains.json"
CONFIG = f"/etc/gpucluster/health/{CONFIG_NAME}"  # on the controller
UNITS = ("gpucluster-domain-guard.service", "gpucluster-domain-guard.timer")
PERIOD_S = 60  # a domain drains within a minute of its trays' drains (they come every health.interval)


def enabled(cluster: Cluster) -> bool:
    health = cluster.spec.health
    return bool(health.enabled and health.nvlink_domain.enabled and cluster.plan.domains)


def guard_config(cluster: Cluster) -> dict:
    """What node/domainguard.py reads."""
    spec, plan = cluster.spec, cluster.plan
    groups = sorted({d.group for d in plan.domains})
    domains = [{"name": d.name, "group": d.group,
                "trays": [spec.group(d.group).host(i) for i in range(d.first, d.first + d.count)]}
               for d in plan.domains]
    return {"out_of_service_pct": spec.health.nvlink_domain.out_of_service_pct,
            "groups": {g: spec.group(g).hostlist for g in groups},
            "breakers": {g: breakerconf.config_keys(cluster, g)["breaker"] for g in groups},
            "domains": domains}


def files(cluster: Cluster) -> dict[str, str]:
    """{file name: text}: domains.json and the timer units; {} without NVLink domains or with the guard off."""
    if not enabled(cluster):
        return {}
    ctx = {"cluster": cluster.name, "program": f"{LIB_DIR}/domainguard.py", "config": CONFIG, "period": PERIOD_S}
    env = environment()
    out = {CONFIG_NAME: json.dumps(guard_config(cluster), indent=1, sort_keys=True) + "\n"}
    return out | {unit: env.get_template(f"health/{unit}.j2").render(ctx) for unit in UNITS}
