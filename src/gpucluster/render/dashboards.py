"""Grafana dashboards of one cluster, built with Grafana's own SDK (grafana-foundation-sdk) from the cluster model
(docs/metrics.md, Dashboards): the fleet, one node group (`$group`), one topology unit (`$unit`) and one node
(`$instance`).

Why the SDK and not a template: the SDK's builders lay the panels out on Grafana's grid and its models write the JSON
Grafana's own schema reads, so a dashboard is checked against that schema (tests/test_dashboards.py reads every
file back through the SDK's models) instead of against a hand-written copy of it.

Every query reads only what this project makes: node_exporter's and dcgm-exporter's series (the names below), the
health runner's (node/promtext.py), the Slurm exporter's (node/slurmmetrics.py) and the recording rules
(templates/metrics/prometheus-rules.yml.j2). The cluster's name is written into every selector, and the group and
unit variables offer the plan's node groups and units, so each file is the dashboard of this cluster and no other.
The only variables a query uses are `$group`, `$unit`, `$instance` and Grafana's `$__rate_interval`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml
from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as sdk
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from gpucluster.cluster import Cluster

# node_exporter's series the dashboards read (its cpu, meminfo, filesystem, loadavg and infiniband collectors, all on
# by default), and dcgm-exporter's (fields of its default-counters.csv; the ECC and NVLink error rows are commented
# out there: docs/metrics.md says to enable them). `up` is Prometheus's own.
NODE_EXPORTER_METRICS = (
    "node_cpu_seconds_total", "node_load1", "node_memory_MemAvailable_bytes", "node_memory_MemTotal_bytes",
    "node_filesystem_avail_bytes", "node_filesystem_size_bytes", "node_infiniband_link_downed_total",
    "node_infiniband_link_error_recovery_total", "node_infiniband_port_errors_received_total",
)
DCGM_METRICS = (
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
# The dashboards, each as (kind, file name, title): the names are a contract (docs/metrics.md); render writes them flat
# beside the Prometheus files.
KINDS = (
    ("fleet", "grafana-fleet.json", "fleet"),
    ("group", "grafana-group.json", "node group $group"),
    ("unit", "grafana-unit.json", "topology unit $unit"),
    ("node", "grafana-node.json", "node $instance"),
)
WIDTH = 24  # Grafana's grid columns
WINDOW = "$__rate_interval"
_DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
_REF_IDS = "ABCDEFGH"


@dataclass(frozen=True)
class Panel:
    """One panel as data: its kind (timeseries, stat, bargauge, table), title, queries as (expr, legend), unit;
    `kind` "state" is a stat that shows the series' legend, not its value (the lifecycle state whose series is 1)."""

    kind: str
    title: str
    queries: tuple[tuple[str, str], ...]
    unit: str = "none"
    width: int = 8
    height: int = 8


def _p(kind: str, title: str, *queries: tuple[str, str], unit: str = "none", width: int = 8) -> Panel:
    return Panel(kind, title, tuple(queries), unit, width, 4 if kind in ("stat", "state") else 8)


def uid(cluster: Cluster, kind: str) -> str:
    """The dashboard's uid: at most 40 characters, as Grafana allows, stable across renders."""
    return f"gpucluster-{cluster.name}"[:34] + f"-{kind}"


def _has_nvidia(cluster: Cluster) -> bool:
    return any(cluster.gpu_vendor(g) == "nvidia" for g in cluster.spec.gpu_groups)


def _units_word(cluster: Cluster) -> str:
    """What the plan's units are called where a person reads them: leaves, or scalable units."""
    return "scalable units" if cluster.plan.design == "rail-optimized" else "leaves"


# ---- the panels of each dashboard ---------------------------------------------------------------------------------

def _node_rows(level: str, sel: str, total: bool) -> list[tuple[str, list[Panel]]]:
    """Nodes out of service, down and drained by the recording rules at `level`, summed when `total` (the fleet);
    scrape targets down by job."""
    def rule(name: str) -> str:
        expr = f"{level}:gpucluster_{name}{{{sel}}}"
        return f"sum({expr})" if total else expr

    return [("Nodes", [
        _p("stat", "Nodes out of service", (rule("nodes_out_of_service:sum"), "out of service"), width=6),
        _p("stat", "Nodes down", (rule("nodes_down:sum"), "down"), width=6),
        _p("stat", "Nodes drained", (rule("nodes_drained:sum"), "drained"), width=6),
        _p("stat", "Scrape targets down, by job", (f"sum by (job) (up{{{sel}}} == bool 0)", "{{job}}"), width=6),
    ])]


def _health_panels(cluster: Cluster, sel: str, by: str) -> list[Panel]:
    if not cluster.spec.health.enabled:
        return []
    return [
        _p("timeseries", "Nodes by lifecycle state",
           (f'sum by (state) (gpucluster_health_lifecycle{{job="node", {sel}}})', "{{state}}")),
        _p("timeseries", "Drains held by the circuit breaker",
           (f'sum by ({by}) (gpucluster_health_breaker_held{{job="node", {sel}}})', f"{{{{{by}}}}}")),
    ]


def _slurm_free_panels(cluster: Cluster, sel: str, by: str) -> list[Panel]:
    """Whole units free, the largest free block, NVL72 blocks free: per node group (label node_group)."""
    out = [
        _p("timeseries", f"Whole {_units_word(cluster)} free, of those planned",
           (f'max by (node_group) (gpucluster_slurm_units_free{{job="node", {sel}}})', "{{node_group}} free"),
           (f"node_group:gpucluster_slurm_units:count{{{sel}}}", "{{node_group}} planned")),
        _p("timeseries", f"Largest free block of whole {_units_word(cluster)} (nodes)",
           (f'max by (node_group) (gpucluster_slurm_units_free_block_nodes{{job="node", {sel}}})', "{{node_group}}")),
    ]
    if cluster.plan.domains:
        out.append(_p("timeseries", "NVL72 racks (NVLink domains) wholly free",
                      (f'max by (node_group) (gpucluster_slurm_nvlink_domains_free{{job="node", {sel}}})',
                       "{{node_group}}")))
    if by:
        out.append(_p("timeseries", "Free nodes, by unit",
                      (f'max by ({by}) (gpucluster_slurm_unit_free_nodes{{job="node", {sel}}})', f"{{{{{by}}}}}")))
    return out


def _gpu_error_panels(cluster: Cluster, sel: str, by: str) -> list[Panel]:
    """GPU errors: the health runner's by class, DCGM's last XID, double-bit ECC errors and row remap failures."""
    out = []
    if cluster.spec.health.enabled:
        out.append(_p("timeseries", "GPU errors read, by class",
                      (f'sum by ({by}class) (increase(gpucluster_health_xid_events_total{{job="node", {sel}}}'
                       f"[{WINDOW}]))", "{{class}}" if not by else "{{instance}} {{class}}")))
    if _has_nvidia(cluster):
        out += [
            _p("timeseries", "GPUs by DCGM's last XID",
               (f"count by ({by}xid) (gpu:gpucluster_dcgm_xid:count_values{{{sel}}})",
                "XID {{xid}}" if not by else "{{instance}} XID {{xid}}")),
            _p("timeseries", "ECC double-bit errors",
               (f'sum by ({by[:-2] or "group"}) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{job="dcgm", {sel}}}'
                f"[{WINDOW}]))", "{{instance}}" if by else "{{group}}")),
            _p("timeseries", "GPUs whose row remapping failed",
               (f'sum by ({by[:-2] or "group"}) (DCGM_FI_DEV_ROW_REMAP_FAILURE{{job="dcgm", {sel}}})',
                "{{instance}}" if by else "{{group}}")),
        ]
    return out


def _gpus_reporting(cluster: Cluster, level: str, sel: str, total: bool) -> list[Panel]:
    if not cluster.spec.gpu_groups:
        return []
    up, planned = f"{level}:gpucluster_gpus_up:count{{{sel}}}", f"{level}:gpucluster_gpus_planned:sum{{{sel}}}"
    if total:
        up, planned = f"sum({up})", f"sum({planned})"
    return [_p("timeseries", "GPUs reporting, of those planned", (up, "reporting"), (planned, "planned"))]


def _fleet(cluster: Cluster) -> list[tuple[str, list[Panel]]]:
    sel = f'cluster="{cluster.name}"'
    slurm = f'job="node", {sel}'
    return [*_node_rows("group", sel, True), ("Health and service", [
        _p("timeseries", "Out of service, by node group",
           (f"group:gpucluster_nodes_out_of_service:ratio{{{sel}}}", "{{group}}"), unit="percentunit"),
        *_health_panels(cluster, sel, "group"),
    ]), ("Slurm", [
        _p("timeseries", "Slurm nodes by state", (f"max by (state) (gpucluster_slurm_nodes{{{slurm}}})", "{{state}}")),
        _p("timeseries", "Slurm nodes drained, down or failed, by reason class",
           (f"max by (reason_class) (gpucluster_slurm_nodes_out_of_service{{{slurm}}})", "{{reason_class}}")),
        _p("timeseries", "Jobs pending, by reason",
           (f"max by (reason) (gpucluster_slurm_jobs_pending{{{slurm}}})", "{{reason}}")),
        _p("timeseries", "Scheduler cycle times",
           (f"max by (scheduler) (gpucluster_slurm_sched_cycle_last_seconds{{{slurm}}})", "{{scheduler}} last"),
           (f"max by (scheduler) (gpucluster_slurm_sched_cycle_mean_seconds{{{slurm}}})", "{{scheduler}} mean"),
           unit="s"),
    ]), ("Free whole units", _slurm_free_panels(cluster, sel, "")),
        ("GPUs", [*_gpus_reporting(cluster, "group", sel, True), *_gpu_error_panels(cluster, sel, "")])]


def _group(cluster: Cluster) -> list[tuple[str, list[Panel]]]:
    sel = f'cluster="{cluster.name}", group="$group"'
    return [*_node_rows("group", sel, False), ("Units of $group", [
        _p("bargauge", "Share of each unit out of service",
           (f"unit:gpucluster_nodes_out_of_service:ratio{{{sel}}}", "{{unit}}"), unit="percentunit"),
        _p("timeseries", "Nodes failing each health check",
           (f"sum by (check) (unit:gpucluster_checks_failing:sum{{{sel}}})", "{{check}}")),
        *_health_panels(cluster, sel, "group"),
    ]), ("Free whole units", _slurm_free_panels(cluster, f'cluster="{cluster.name}", node_group="$group"', "unit")),
        ("GPUs", [*_gpus_reporting(cluster, "group", sel, False), *_gpu_error_panels(cluster, sel, "")])]


def _link_panels(cluster: Cluster, sel: str) -> list[Panel]:
    """InfiniBand port counters (node_exporter; RoCE NICs are listed there too) and, on NVIDIA, NVLink errors."""
    node = f'job="node", {sel}'
    out = [_p("timeseries", title, (f"sum by (instance, device, port) (increase({name}{{{node}}}[{WINDOW}]))",
                                    "{{instance}} {{device}}/{{port}}"))
           for title, name in (("InfiniBand links downed", "node_infiniband_link_downed_total"),
                               ("InfiniBand link error recoveries", "node_infiniband_link_error_recovery_total"),
                               ("InfiniBand port receive errors", "node_infiniband_port_errors_received_total"))]
    if _has_nvidia(cluster):
        dcgm = f'job="dcgm", {sel}'
        out.append(_p("timeseries", "NVLink errors",
                      (f"sum by (instance) (increase(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{dcgm}}}"
                       f"[{WINDOW}]))", "{{instance}} data CRC"),
                      (f"sum by (instance) (increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{dcgm}}}"
                       f"[{WINDOW}]))", "{{instance}} recovery")))
    return out


def _unit(cluster: Cluster) -> list[tuple[str, list[Panel]]]:
    sel = f'cluster="{cluster.name}", unit="$unit"'
    health = [_p("timeseries", "GPU errors open, by node and class",
                 (f'sum by (instance, class) (gpucluster_health_gpu_errors_open{{job="node", {sel}}}) > 0',
                  "{{instance}} {{class}}"))] if cluster.spec.health.enabled else []
    return [("Nodes of $unit", [
        _p("timeseries", "Nodes out of service in $unit",
           *((f"unit:gpucluster_{name}{{{sel}}}", legend) for name, legend in (
               ("nodes_out_of_service:sum", "out of service"), ("nodes_down:sum", "down"),
               ("nodes_drained:sum", "drained"), ("nodes:count", "nodes")))),
        _p("table", "Nodes out of service now",
           (f'instance:gpucluster_node_out_of_service:bool{{job="node", {sel}}} == 1', "{{instance}}")),
        _p("timeseries", "Nodes failing each health check",
           (f"unit:gpucluster_checks_failing:sum{{{sel}}}", "{{check}}")),
        _p("timeseries", "Nodes flapping", (f"unit:gpucluster_nodes_flapping:count{{{sel}}}", "flapping")),
        _p("timeseries", "Free nodes in Slurm",
           (f'max(gpucluster_slurm_unit_free_nodes{{job="node", {sel}}})', "free")),
    ]), ("Links", _link_panels(cluster, sel)),
        ("GPUs", [*_gpus_reporting(cluster, "unit", sel, False), *_gpu_error_panels(cluster, sel, "instance, "),
                  *health])]


def _node(cluster: Cluster) -> list[tuple[str, list[Panel]]]:
    sel = f'cluster="{cluster.name}", instance="$instance"'
    node, dcgm = f'job="node", {sel}', f'job="dcgm", {sel}'
    health = [
        _p("state", "Lifecycle state", (f"gpucluster_health_lifecycle{{{node}}} == 1", "{{state}}"), width=6),
        _p("stat", "Age of the last health run",
           (f"time() - gpucluster_health_last_run_timestamp_seconds{{{node}}}", "age"), unit="s", width=6),
        _p("stat", "Drain held by the circuit breaker", (f"gpucluster_health_breaker_held{{{node}}}", "held"),
           width=6),
        _p("timeseries", "Health checks (1 passed, 0 failed)", (f"gpucluster_health_check_ok{{{node}}}", "{{check}}")),
        _p("timeseries", "Failing runs in a row, by check", (f"gpucluster_health_check_fails{{{node}}}", "{{check}}")),
        _p("timeseries", "GPU errors read, by class",
           (f"sum by (class) (increase(gpucluster_health_xid_events_total{{{node}}}[{WINDOW}]))", "{{class}}"),
           (f"gpucluster_health_gpu_errors_open{{{node}}}", "{{class}} open")),
    ] if cluster.spec.health.enabled else []
    gpus = [_p("timeseries", title, (f"{name}{{{dcgm}}}", "GPU {{gpu}}"), unit=unit) for title, name, unit in (
        ("GPU temperature", "DCGM_FI_DEV_GPU_TEMP", "celsius"), ("GPU power", "DCGM_FI_DEV_POWER_USAGE", "watt"),
        ("GPU utilisation", "DCGM_FI_DEV_GPU_UTIL", "percent"), ("GPU memory used", "DCGM_FI_DEV_FB_USED", "decmbytes"),
        ("Last XID, by GPU", "DCGM_FI_DEV_XID_ERRORS", "none"),
        ("Row remapping failed, by GPU", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "none"))]
    gpus.append(_p("timeseries", "ECC double-bit errors, by GPU",
                   (f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{dcgm}}}[{WINDOW}])", "GPU {{gpu}}")))
    return [("Health of $instance", [
        _p("stat", "Scrape targets up", (f"up{{{sel}}}", "{{job}}"), width=6), *health,
        _p("timeseries", "Times it left service", (f"instance:gpucluster_node_out_of_service:exits{{{sel}}}", "exits")),
    ]), ("GPUs", gpus if _has_nvidia(cluster) else []), ("Host", [
        _p("timeseries", "CPU busy",
           (f'1 - avg(rate(node_cpu_seconds_total{{{node}, mode="idle"}}[{WINDOW}]))', "busy"), unit="percentunit"),
        _p("timeseries", "Load (1 minute)", (f"node_load1{{{node}}}", "load")),
        _p("timeseries", "Memory used",
           (f"1 - node_memory_MemAvailable_bytes{{{node}}} / node_memory_MemTotal_bytes{{{node}}}", "used"),
           unit="percentunit"),
        _p("timeseries", "Filesystems used",
           (f'1 - node_filesystem_avail_bytes{{{node}, fstype!~"tmpfs|overlay|squashfs|ramfs"}}'
            f" / node_filesystem_size_bytes{{{node}}}", "{{mountpoint}}"), unit="percentunit"),
        *_link_panels(cluster, sel),
    ])]


_PANELS = {"fleet": _fleet, "group": _group, "unit": _unit, "node": _node}


# ---- variables, and the SDK's builders ----------------------------------------------------------------------------

def _custom(name: str, label: str, values: list[str]) -> sdk.CustomVariable:
    """A variable whose options are the plan's (node groups, units): there before Prometheus has any series. Grafana
    makes a custom variable's options from its comma-separated values when the dashboard loads, so they are
    written once, not again as a list of options (1,536 units of meta-24k-roce would be 200 kB)."""
    first = values[0] if values else ""
    return (sdk.CustomVariable(name).label(label).values(",".join(values))
            .current(model.VariableOption(selected=True, text=first, value=first)).multi(False))


def _variables(cluster: Cluster, kind: str) -> list:
    out = [sdk.DatasourceVariable("datasource").label("Prometheus").type("prometheus")]
    if kind == "group":
        out.append(_custom("group", "node group", [g.name for g in cluster.spec.node_groups]))
    elif kind == "unit":
        out.append(_custom("unit", "topology unit", [u.name for u in cluster.plan.units]))
    elif kind == "node":
        # hosts come from Prometheus: a custom list of every host would be megabytes on a large cluster
        out.append(sdk.QueryVariable("instance").label("node").datasource(_DATASOURCE)
                   .query({"query": f'label_values(up{{job="node", cluster="{cluster.name}"}}, instance)',
                           "refId": "instance"})
                   .refresh(model.VariableRefresh.ON_DASHBOARD_LOAD).sort(model.VariableSort.NATURAL_ASC)
                   .multi(False))
    return out


_BUILDERS = {"timeseries": timeseries.Panel, "stat": stat.Panel, "bargauge": bargauge.Panel, "table": table.Panel,
             "state": lambda: stat.Panel().text_mode(common.BigValueTextMode.NAME)}


def _built(panel: Panel, ident: int):
    out = (_BUILDERS[panel.kind]().id(ident).title(panel.title).datasource(_DATASOURCE)
           .span(panel.width).height(panel.height).unit(panel.unit))
    for ref, (expr, legend) in zip(_REF_IDS, panel.queries, strict=False):
        query = prom.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
        out = out.with_target(query.instant() if panel.kind == "table" else query)
    return out


def dashboard(cluster: Cluster, kind: str) -> model.Dashboard:
    """One dashboard (fleet, group, unit, node) as the SDK's model."""
    title = dict((k, t) for k, _f, t in KINDS)[kind]
    out = (sdk.Dashboard(f"gpucluster {cluster.name}: {title}").uid(uid(cluster, kind))
           .tags(["gpucluster", cluster.name]).timezone("utc").refresh("1m").time("now-6h", "now").editable()
           .variables(_variables(cluster, kind)))
    ident = 0
    for row, panels in _PANELS[kind](cluster):
        if not panels:
            continue
        ident += 1
        out = out.with_row(sdk.Row(row).id(ident))
        for panel in panels:
            ident += 1
            out = out.with_panel(_built(panel, ident))
    return out.build()


def render_dashboards(cluster: Cluster) -> dict[str, str]:
    """file name -> JSON of each dashboard."""
    return {name: json.dumps(dashboard(cluster, kind), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
            for kind, name, _title in KINDS}


def panel_queries(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every query of every panel, with Grafana's variables as written."""
    return [(uid(cluster, kind), panel.title, expr)
            for kind, _name, _title in KINDS for _row, panels in _PANELS[kind](cluster)
            for panel in panels for expr, _legend in panel.queries]


def alert_queries(cluster: Cluster) -> list[tuple[str, str]]:
    """(alert name, expr) of every alert rule render writes for the cluster (prometheus-alerts.yml)."""
    from gpucluster.render.metrics import ALERTS, render_metrics  # metrics renders these dashboards: import late

    text = render_metrics(cluster).get(ALERTS)
    if text is None:
        return []
    return [(rule["alert"], rule["expr"]) for group in yaml.safe_load(text)["groups"] for rule in group["rules"]
            if "alert" in rule]
