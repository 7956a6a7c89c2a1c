"""Fleet metrics from the plan: Prometheus's scrape config, its file_sd target files labelled with the topology,
recording rules by topology unit, pod and node group, the alerts, and a Grafana dashboard (docs/metrics.md).

Why by topology unit: a leaf switch, a scalable unit's rails or a rack's power takes its nodes down together, so
the unit is the thing to page about. Every target carries its unit, pod, rack and NVLink domain as labels, the
rules sum nodes out of service per unit, and one alert fires for a degraded unit where its nodes' own alerts are
held back.

Size: file_sd has no host ranges, so each host is listed once, by name, in its node group's target file. The
labels are written once per run of hosts that share them (a rack within a unit: the cuts come from the plan's
arithmetic, unit and rack starts, never from a host-by-host lookup), and the port is not in the file: each scrape
job adds its exporter's port by relabelling, so one file serves node_exporter and the GPU exporter alike.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterator
from itertools import pairwise

from gpucluster.catalog import GRAFANA
from gpucluster.cluster import Cluster
from gpucluster.node.promtext import FILE as PROM_FILE
from gpucluster.node.xid import CLASSES, LADDER, XIDS
from gpucluster.render.dashboards import KINDS, render_dashboards
from gpucluster.render.health.config import TEXTFILE_DIR
from gpucluster.render.templating import environment
from gpucluster.spec import ports, stacks
from gpucluster.spec.model import NodeGroup

# The ports are the spec's (metrics.*_port; spec/ports.py refuses a clash). Files for the nodes and the controller,
# rendered from them so the role writes each port once (the metrics role copies them; docs/metrics.md):
NODE_EXPORTER_ARGS = "prometheus-node-exporter.default"  # /etc/default/prometheus-node-exporter, every node
SERVER_ARGS = "prometheus.default"  # /etc/default/prometheus, the controller (Prometheus there only)
DCGM_DROPIN = "prometheus-dcgm-exporter.conf"  # nvidia-dcgm-exporter.service's drop-in, NVIDIA GPU nodes
EXPORTERS = "prometheus-exporters.json"  # what the role reads: ports, the exporter per group, the server's files
# Grafana on the controller, with the spec's metrics.grafana (its package from the vendor's repository, the lock's
# catalog.GRAFANA):
GRAFANA_DATASOURCE = "grafana-datasource.yaml"  # /etc/grafana/provisioning/datasources/, the cluster's Prometheus
GRAFANA_PROVIDER = "grafana-dashboards.yaml"  # /etc/grafana/provisioning/dashboards/, the folder below
GRAFANA_DROPIN = "grafana-server.conf"  # grafana-server.service's drop-in: its port
GRAFANA_PINS = "grafana-apt.pref"  # its apt pin, from the lock
GRAFANA_SOURCES = "grafana-apt.sources"  # its package source (deb822), from the lock
# Where the rendered dashboards lie on the controller for the provider to load (Grafana's data folder is its own).
GRAFANA_DASHBOARDS_DIR = "/var/lib/grafana/dashboards/gpucluster"
GRAFANA_KEYRING = "/etc/apt/keyrings/gpucluster-grafana.asc"
GRAFANA_RESCAN_S = 60  # how often Grafana reads the folder again
# Where the health runner writes its metrics for node_exporter's textfile collector (node/promtext.py), read by the
# rules and alerts: the contract in docs/metrics.md.
TEXTFILE = f"{TEXTFILE_DIR}/{PROM_FILE}"
# Files render writes (flat, beside each other: Prometheus reads rule and target files relative to its config).
CONFIG = "prometheus.yml"
RULES = "prometheus-rules.yml"
ALERTS = "prometheus-alerts.yml"
# How long an XID the health runner read keeps its alert up, and the window of the link error counters.
XID_WINDOW = "1h"
ERROR_WINDOW = "15m"
# A node's health metrics older than this many health intervals are stale (the node's timer runs the checks
# itself after about 1.25 intervals without slurmd: docs/health.md).
STALE_INTERVALS = 3
# The health checks whose failure says a link is at fault (docs/health.md, The checks).
LINK_CHECKS = ("hca-ports", "link-flap", "nvlink-fabric", "fabric-manager")
# The controller's Slurm metrics (node/slurmmetrics.py) are written once a scrape interval by a timer: a file older
# than this many intervals missed several runs in a row (one late run, or one slow on a large node table, is not).
SLURM_STALE_INTERVALS = 3


def targets_name(group: str) -> str:
    return f"prometheus-targets.{group}.json"


def _cuts(cluster: Cluster, group: NodeGroup) -> list[int]:
    """Indices where a label of the group's nodes may change: unit, rack and NVLink domain starts and ends."""
    plan = cluster.plan
    cuts = {0, group.count, *range(0, group.count, group.nodes_per_rack)}
    for span in (*plan.units, *plan.domains):
        if span.group == group.name:
            cuts.update((span.first, span.first + span.count))
    return sorted(c for c in cuts if 0 <= c <= group.count)


def _spans_of(spans, group: str) -> tuple[list, list[int]]:
    """A group's units (or domains) in node order, and their first indices, for bisection."""
    mine = sorted((s for s in spans if s.group == group), key=lambda s: s.first)
    return mine, [s.first for s in mine]


def _at(spans: list, firsts: list[int], index: int):
    """The span holding node `index`, or None."""
    i = bisect_right(firsts, index) - 1
    if i >= 0 and index < spans[i].first + spans[i].count:
        return spans[i]
    return None


def label_runs(cluster: Cluster, group: NodeGroup) -> Iterator[tuple[int, int, dict[str, str]]]:
    """(first, count, labels) for each run of the group's nodes that share their topology labels: cluster, group,
    role; unit and (with three tiers) pod on the fabric; rack; nvlink_domain in a rack-scale NVLink group."""
    plan = cluster.plan
    units, unit_firsts = _spans_of(plan.units, group.name)
    domains, domain_firsts = _spans_of(plan.domains, group.name)
    base = {"cluster": cluster.name, "group": group.name, "role": group.role}
    cuts = _cuts(cluster, group)
    for first, end in pairwise(cuts):
        labels = dict(base)
        unit = _at(units, unit_firsts, first)
        if unit is not None:
            labels["unit"] = unit.name
            if plan.tiers == 3:
                labels["pod"] = f"pod{unit.pod + 1:03d}"
        labels["rack"] = plan.rack_of(group, first)
        domain = _at(domains, domain_firsts, first)
        if domain is not None:
            labels["nvlink_domain"] = domain.name
        yield first, end - first, labels


_compact = json.JSONEncoder(separators=(",", ":")).encode  # one encoder for the thousands of runs


def _hosts(group: NodeGroup, first: int, count: int) -> list[str]:
    """Host names of `count` nodes from the group's `first`: NodeGroup.host's format, with the name split once."""
    head, _, tail = group.hostname.partition("#" * group.digits)
    lo = group.first_index + first
    return [f"{head}{i:0{group.digits}d}{tail}" for i in range(lo, lo + count)]


def targets_text(cluster: Cluster, group: NodeGroup) -> str:
    """The group's file_sd target file: a JSON list, one target group (hosts and their labels) a line."""
    lines = [f'{{"targets":{_compact(_hosts(group, first, count))},"labels":{_compact(labels)}}}'
             for first, count, labels in label_runs(cluster, group)]
    return "[\n" + ",\n".join(lines) + "\n]\n"


def xid_classes(cluster: Cluster) -> list[str]:
    """The GPU error classes (node/xid.py's names) at `drain` or above on the ladder, the site's health.xid_actions
    applied as the node applies them: the classes whose events the XID alert fires on."""
    overrides = cluster.spec.health.xid_actions
    drain = LADDER.index("drain")
    out = [f"xid{code}" for code in sorted(set(XIDS) | set(overrides))
           if LADDER.index(overrides.get(code, XIDS.get(code, ("record",))[0])) >= drain]
    out += [name for name, (action, _what, _source) in CLASSES.items() if LADDER.index(action) >= drain]
    return out


def dcgm_xids(cluster: Cluster) -> list[int]:
    """The XID numbers at `drain` or above, as DCGM reports them (its last XID value): the same table."""
    return [int(name[3:]) for name in xid_classes(cluster) if name[3:].isdigit()]


def _jobs(cluster: Cluster) -> list[dict]:
    """The scrape jobs: node_exporter on every node group, each GPU vendor's exporter on its GPU groups. An NVIDIA
    group whose locked release pairs no dcgm-exporter gets none installed, so it is not scraped for one either (its
    targets would be down for good, and GpuclusterGpuExporterDown would page for nothing)."""
    spec = cluster.spec
    metrics = spec.metrics
    with_dcgm = dcgm_exporters(cluster)[0]
    jobs = [{"name": "node", "port": metrics.node_exporter_port, "what": "node_exporter, every node",
             "files": [targets_name(g.name) for g in spec.node_groups]}]
    for name, vendor, port, what in (("dcgm", "nvidia", metrics.dcgm_exporter_port,
                                      "NVIDIA's dcgm-exporter, NVIDIA GPU groups"),
                                     ("amd-gpu", "amd", metrics.amd_exporter_port,
                                      "AMD's device-metrics-exporter, AMD GPU groups")):
        files = [targets_name(g.name) for g in spec.gpu_groups if cluster.gpu_vendor(g) == vendor
                 and (vendor != "nvidia" or g.name in with_dcgm)]
        if files:
            jobs.append({"name": name, "port": port, "what": what, "files": files})
    return jobs


def _levels(cluster: Cluster) -> list[dict]:
    """The levels the rules aggregate at: unit and pod (nodes on the fabric), node group (every node). `match`
    keeps a level to the series that carry its label; `sel` is the same, to follow other matchers."""
    levels = [("unit", "cluster, group, pod, unit", 'unit!=""')]
    if cluster.plan.tiers == 3:
        levels.append(("pod", "cluster, pod", 'pod!=""'))
    levels.append(("group", "cluster, group", ""))
    return [{"name": name, "by": by, "match": match, "sel": f", {match}" if match else ""}
            for name, by, match in levels]


def _pct(value: float) -> str:
    return f"{value / 100:g}"


def metrics_context(cluster: Cluster) -> dict:
    """Everything the metrics templates read, from the spec and the plan."""
    spec = cluster.spec
    metrics, health = spec.metrics, spec.health
    gpu_groups = [{"name": g.name, "gpus": g.gpus_per_node} for g in spec.gpu_groups]
    jobs = _jobs(cluster)
    return {
        "cluster": cluster.name,
        "interval": f"{metrics.scrape_interval}s",
        "timeout": f"{min(10, metrics.scrape_interval)}s",
        "rule_files": [RULES, ALERTS],
        "jobs": jobs,
        "levels": _levels(cluster),
        "pods": cluster.plan.tiers == 3,
        "gpu_groups": gpu_groups,
        "gpu_jobs": "|".join(j["name"] for j in jobs[1:]),
        "down": f"{metrics.down_minutes}m",
        "share": _pct(metrics.unit_degraded_pct),
        "share_pct": f"{metrics.unit_degraded_pct:g}",
        "min_nodes": metrics.unit_degraded_min_nodes,
        "health": health.enabled,
        "stale_s": STALE_INTERVALS * health.interval,
        "stale_intervals": STALE_INTERVALS,
        "xid_classes": "|".join(xid_classes(cluster)),
        "dcgm_xids": "|".join(str(n) for n in dcgm_xids(cluster)),
        "xid_window": XID_WINDOW,
        "error_window": ERROR_WINDOW,
        "ecc_max": health.ecc_uncorrected_max,
        "link_downed_max": health.link_downed_max,
        "link_checks": "|".join(LINK_CHECKS),
        "textfile": TEXTFILE,
        "domains": bool(cluster.plan.domains),
        "flap_count": metrics.flap_count,
        "flap_window": f"{metrics.flap_minutes}m",
        **_slurm_context(cluster),
    }


def _slurm_context(cluster: Cluster) -> dict:
    """The thresholds of the rules and alerts over the controller's Slurm metrics (docs/metrics.md)."""
    metrics = cluster.spec.metrics
    return {
        "slurm_share": _pct(metrics.slurm_out_of_service_pct),
        "slurm_share_pct": f"{metrics.slurm_out_of_service_pct:g}",
        "slurm_stale_s": SLURM_STALE_INTERVALS * metrics.scrape_interval,
        "slurm_stale_intervals": SLURM_STALE_INTERVALS,
        "backfill_s": f"{metrics.backfill_cycle_seconds:g}",
    }


def render_metrics(cluster: Cluster) -> dict[str, str]:
    """Every metrics file render writes, by name; none when the spec's metrics.enabled is false."""
    if not cluster.spec.metrics.enabled:
        return {}
    env = environment()
    ctx = metrics_context(cluster)
    out = {name: env.get_template(f"metrics/{name}.j2").render(ctx) for name in (CONFIG, RULES, ALERTS)}
    out |= render_dashboards(cluster)  # the Grafana dashboards: render/dashboards.py
    out |= {targets_name(g.name): targets_text(cluster, g) for g in cluster.spec.node_groups}
    out |= node_files(cluster, [name for name in out if name in (CONFIG, RULES, ALERTS) or name.startswith(
        "prometheus-targets.")])
    return out


def exporter_pins_name(group: str) -> str:
    return f"prometheus-dcgm-exporter.{group}.pref"


def dcgm_exporters(cluster: Cluster) -> tuple[dict[str, dict], dict[str, str]]:
    """({group: {packages: {name: version}, pins: file}} of the NVIDIA GPU groups whose locked release pairs a
    dcgm-exporter with its DCGM, {group: why not} of the others): the version lock's row (catalog.py), as the
    group's driver stack resolves it."""
    spec = cluster.spec
    found: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    for group in spec.gpu_groups:
        r = stacks.resolve(spec, group)
        if r.vendor != "nvidia":
            continue
        pin = r.release.dcgm_exporter if r.release is not None else None
        if pin is None:
            skipped[group.name] = (f"the version lock's row for driver branch {r.branch.value} ({r.source.value}) "
                                   "pairs no dcgm-exporter with its DCGM: add one in the spec's catalog.releases")
            continue
        found[group.name] = {"packages": {p: pin.version for p in pin.packages}, "version": pin.version,
                             "install": [f"{p}={pin.version}" for p in pin.packages],
                             "branch": r.branch.value, "dcgm": r.release.dcgm.version if r.release.dcgm else "",
                             "pins": exporter_pins_name(group.name)}
    return found, skipped


def _controller_url(cluster: Cluster) -> str:
    """Where the controller's Prometheus answers: the first controller, at the spec's port."""
    controllers = [g.host(0) for g in cluster.spec.groups_with_role("controller") if g.count]
    return f"http://{controllers[0]}:{cluster.spec.metrics.prometheus_port}" if controllers else ""


def node_files(cluster: Cluster, server_files: list[str]) -> dict[str, str]:
    """The exporters' and the server's own settings: each port of the spec written once, for the metrics role."""
    metrics = cluster.spec.metrics
    env = environment()
    exporters, skipped = dcgm_exporters(cluster)
    server = {"on_controller": metrics.on_controller, "port": metrics.prometheus_port,
              "url": metrics.external_url or _controller_url(cluster), "files": sorted(server_files)}
    ctx = {"cluster": cluster.name, "metrics": metrics, "textfile_dir": TEXTFILE_DIR,
           "hostengine": f"localhost:{ports.DCGM_HOSTENGINE_PORT}"}
    out = {NODE_EXPORTER_ARGS: env.get_template(f"metrics/{NODE_EXPORTER_ARGS}.j2").render(ctx)}
    if metrics.on_controller:
        out[SERVER_ARGS] = env.get_template(f"metrics/{SERVER_ARGS}.j2").render(ctx)
    if exporters or skipped:
        out[DCGM_DROPIN] = env.get_template(f"metrics/{DCGM_DROPIN}.j2").render(ctx)
    for group, exporter in exporters.items():
        out[exporter["pins"]] = env.get_template("metrics/prometheus-dcgm-exporter.pref.j2").render(
            {**ctx, "group": group, **exporter})
    grafana, grafana_files = grafana_setup(cluster, server["url"])
    out |= grafana_files
    out[EXPORTERS] = json.dumps({
        "grafana": grafana,
        "node_exporter": {"port": metrics.node_exporter_port, "args": NODE_EXPORTER_ARGS},
        "dcgm_exporter": {"port": metrics.dcgm_exporter_port, "dropin": DCGM_DROPIN if DCGM_DROPIN in out else "",
                          "groups": exporters, "skipped": skipped},
        "prometheus": {**server, "args": SERVER_ARGS if SERVER_ARGS in out else ""},
    }, indent=1, sort_keys=True) + "\n"
    return out


def grafana_uid(cluster: Cluster) -> str:
    """The provisioned data source's uid: at most 40 characters, as Grafana allows, stable across renders."""
    return f"gpucluster-{cluster.name}"[:29] + "-prometheus"


def grafana_setup(cluster: Cluster, url: str) -> tuple[dict, dict[str, str]]:
    """(what the metrics role reads of Grafana, Grafana's files by name): nothing but `enabled: false` unless the
    spec's metrics.grafana. The data source is the cluster's Prometheus, `url`: the first controller's at the
    spec's port, or metrics.external_url (the same URL prometheus-exporters.json names for every tool)."""
    metrics = cluster.spec.metrics
    if not metrics.grafana:
        return {"enabled": False}, {}
    env = environment()
    lock = GRAFANA
    ctx = {"cluster": cluster.name, "port": metrics.grafana_port, "url": url, "uid": grafana_uid(cluster),
           "name": f"Prometheus ({cluster.name})", "interval": f"{metrics.scrape_interval}s",
           "provider": f"gpucluster-{cluster.name}", "folder": f"gpucluster {cluster.name}",
           "path": GRAFANA_DASHBOARDS_DIR, "update_s": GRAFANA_RESCAN_S, "repo": lock.repository,
           "keyring": GRAFANA_KEYRING, "packages": list(lock.package.packages), "version": lock.package.version,
           "refused": list(lock.refused)}
    files = {name: env.get_template(f"metrics/{name}.j2").render(ctx)
             for name in (GRAFANA_DATASOURCE, GRAFANA_PROVIDER, GRAFANA_DROPIN, GRAFANA_PINS, GRAFANA_SOURCES)}
    repo = lock.repository
    facts = {"enabled": True, "port": metrics.grafana_port, "url": url, "uid": ctx["uid"],
             "packages": list(lock.package.packages), "version": lock.package.version,
             "install": [f"{p}={lock.package.version}" for p in lock.package.packages],
             "key": repo.key, "keyring": GRAFANA_KEYRING,
             "probe": f"{repo.uri.rstrip('/')}/dists/{repo.suites[0]}/Release",
             "datasource": GRAFANA_DATASOURCE, "provider": GRAFANA_PROVIDER, "dropin": GRAFANA_DROPIN,
             "pins": GRAFANA_PINS, "sources": GRAFANA_SOURCES,
             "dashboards_dir": GRAFANA_DASHBOARDS_DIR, "dashboards": [name for _kind, name, _title in KINDS]}
    return facts, files
