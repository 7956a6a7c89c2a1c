"""The plan's topology units and NVLink domains for the controller's Slurm metrics: `slurm-metrics.json`.

The controller's exporter (node/slurmmetrics.py, gpucluster-slurm-metrics) counts free nodes per unit, whole free
units and the largest free block of consecutive units, which only the plan knows: which hosts a unit (the leaf or
scalable unit the planner cabled) and an NVLink domain hold, in plan order. The file gives them as Slurm hostlists,
one span a line, named as the scrape targets' `unit`, `pod` and `nvlink_domain` labels name them
(render/metrics.py), so the exporter's series and the fleet's rules speak of the same units.

Arithmetic only: a span is its group's host pattern with its first and last index, never a host-by-host walk
(Colossus 200k, 26,042 nodes: docs/metrics.md gives the time and size).
"""

from __future__ import annotations

import json

from gpucluster.cluster import Cluster

FILE = "slurm-metrics.json"
PROGRAM = "/usr/local/sbin/gpucluster-slurm-metrics"  # node/slurmmetrics.py, as the metrics role installs it
PLAN = "/etc/gpucluster/slurm-metrics.json"  # this file on the controller (the program's --plan default)
OUTPUT = "/var/lib/prometheus/node-exporter/gpucluster_slurm.prom"
UNITS = ("gpucluster-slurm-metrics.service", "gpucluster-slurm-metrics.timer")
_compact = json.JSONEncoder(separators=(",", ":")).encode


def slurm_units(cluster: Cluster) -> dict:
    """{cluster, units: [{unit, group, pod, hosts}], nvlink_domains: [{nvlink_domain, group, hosts}]} in plan
    order; `pod` is "" with two tiers (the targets carry no pod label then)."""
    plan = cluster.plan
    units = [{"unit": u.name, "group": u.group, "pod": f"pod{u.pod + 1:03d}" if plan.tiers == 3 else "",
              "hosts": plan.unit_hostlist(u)} for u in plan.units]
    # A domain is a span of its group's nodes as a unit is (group, first, count): the same hostlist arithmetic.
    domains = [{"nvlink_domain": d.name, "group": d.group, "hosts": plan.unit_hostlist(d)} for d in plan.domains]
    return {"cluster": cluster.name, "units": units, "nvlink_domains": domains}


def slurm_units_text(cluster: Cluster) -> str:
    doc = slurm_units(cluster)
    lines = [f'{{"cluster":{_compact(doc["cluster"])},"units":[']
    lines.append(",\n".join(_compact(u) for u in doc["units"]))
    lines.append('],"nvlink_domains":[')
    lines.append(",\n".join(_compact(d) for d in doc["nvlink_domains"]))
    lines.append("]}")
    return "\n".join(line for line in lines if line) + "\n"


def render_slurm_units(cluster: Cluster) -> dict[str, str]:
    """slurm-metrics.json and the exporter's systemd units (a timer every scrape interval); none when the spec's
    metrics.enabled is false (no metrics, no exporter)."""
    if not cluster.spec.metrics.enabled:
        return {}
    from gpucluster.render.templating import environment

    period = cluster.spec.metrics.scrape_interval
    ctx = {"cluster": cluster.name, "program": PROGRAM, "plan": PLAN, "output": OUTPUT, "period": period,
           "timeout": max(30, 2 * period)}
    env = environment()
    units = {name: env.get_template(f"metrics/{name}.j2").render(**ctx) for name in UNITS}
    return {FILE: slurm_units_text(cluster), **units}
