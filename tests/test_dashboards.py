"""The Grafana dashboards (render/dashboards.py, docs/metrics.md): each file read back through the SDK's own models,
laid out on Grafana's grid, every panel query parsed by the real promtool, every metric a query names one this
project makes (the health runner, the Slurm exporter, the recording rules, node_exporter and dcgm-exporter), and the
dashboards following the spec (its groups, its units, its NVLink domains, health on or off, GPUs or none).

No Grafana server here: whether a Grafana release draws a panel as intended is not seen (docs/metrics.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import cluster_example, compiled, example_data, skip_or_fail, spec_from_data
from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom
from test_metrics import _slurm_file

from gpucluster.cluster import Cluster
from gpucluster.commands.render import RENDER_FAMILIES
from gpucluster.node import promtext
from gpucluster.render.dashboards import (
    DCGM_METRICS,
    KINDS,
    NODE_EXPORTER_METRICS,
    alert_queries,
    panel_queries,
    render_dashboards,
    uid,
)
from gpucluster.render.metrics import ALERTS, RULES, render_metrics

# Each fabric design and size once, an NVL72 plan (NVLink domains) and an AMD one (no dcgm-exporter).
CHECKED = ["staging", "meta-24k-ib", "colossus-200k", "gb200-superpod", "mi355x-800g-roce"]
CASES = [(name, kind) for name in CHECKED for kind, _file, _title in KINDS]
FILES = {kind: file for kind, file, _title in KINDS}
# The variables a query may use: the dashboards' own and Grafana's rate window; `datasource` is the panels' data
# source, never in a query.
QUERY_VARIABLES = {"group", "unit", "instance", "__rate_interval"}
PROMQL_WORDS = {"bool", "and", "or", "unless", "offset"}

register_default_plugins()


def promtool(folder: Path, *args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    if tool is None:
        skip_or_fail("not run: promtool is not installed (apt-get install prometheus: Debian's package ships it)")
    return subprocess.run([tool, *args], cwd=folder, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, check=False)


def _dashboard(name: str, kind: str) -> dict:
    return json.loads(render_dashboards(cluster_example(name))[FILES[kind]])


def _targets(dashboard: dict) -> list[tuple[dict, dict]]:
    return [(panel, target) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def _within(found, expected, path: str = "") -> list[str]:
    """Where `expected` (the file) is not within `found` (read back): a field dropped or changed."""
    if isinstance(expected, dict) and isinstance(found, dict):
        return [w for k, v in expected.items()
                for w in (_within(found[k], v, f"{path}/{k}") if k in found else [f"{path}/{k} dropped"])]
    if isinstance(expected, list) and isinstance(found, list) and len(found) == len(expected):
        return [w for i, (f, e) in enumerate(zip(found, expected, strict=True)) for w in _within(f, e, f"{path}[{i}]")]
    return [] if found == expected else [f"{path}: {expected!r} read back as {found!r}"]


# ---- valid per the SDK's model ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "kind"), CASES)
def test_the_sdk_reads_each_dashboard_back_whole(name, kind) -> None:
    """Grafana's SDK decodes the file into its Dashboard model and writes back every field the file has (a field
    its schema does not know is dropped, so it fails here); every panel is a type the SDK knows, every query a
    Prometheus query, every variable of a known type."""
    data = _dashboard(name, kind)
    board = model.Dashboard.from_json(data)
    back = json.loads(json.dumps(board, cls=JSONEncoder))
    assert not _within(back, data), _within(back, data)
    for panel in board.panels:
        if isinstance(panel, model.RowPanel):
            continue
        assert runtime.panelcfg_config(panel.type_val) is not None, panel.type_val
        assert panel.targets and all(isinstance(t, prom.Dataquery) for t in panel.targets), panel.title
    for var in data["templating"]["list"]:
        model.VariableType(var["type"])
    assert board.uid == uid(cluster_example(name), kind) and len(board.uid) <= 40


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_the_panels_lie_on_the_grid(name, kind) -> None:
    """Unique panel ids; panels inside the 24 columns and not overlapping; every query with its own refId and an
    expr; every panel on the dashboard's data source variable; every variable a query uses defined or Grafana's."""
    dashboard = _dashboard(name, kind)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs) and all(t["expr"] for t in panel["targets"]), panel["title"]
    for _panel, target in _targets(dashboard):
        used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
        assert used <= QUERY_VARIABLES, used - QUERY_VARIABLES
        assert used - {"__rate_interval"} <= variables, target["expr"]


@pytest.mark.parametrize("name", CHECKED)
def test_panel_queries_are_the_dashboards_queries(name) -> None:
    """panel_queries() (what the staged test evaluates against a real Prometheus) is every target of every file."""
    cluster = cluster_example(name)
    files = render_dashboards(cluster)
    in_files = [(uid(cluster, kind), panel["title"], target["expr"])
                for kind, file, _title in KINDS for panel, target in _targets(json.loads(files[file]))]
    assert panel_queries(cluster) == in_files
    assert {file for _kind, file, _title in KINDS} <= set(render_metrics(cluster))


def test_render_names_the_dashboard_files() -> None:
    """The files are one of render's families (its one-liner and tests/test_cli_help.py read them)."""
    pattern = dict(RENDER_FAMILIES)["Grafana dashboards"]
    assert all(re.fullmatch(pattern, file) for file in FILES.values())


# ---- promtool parses every query ---------------------------------------------------------------------------------

def _filled(cluster: Cluster, expr: str) -> str:
    """The query as Grafana sends it for a choice of the variables: the plan's first group, unit and host."""
    group = cluster.spec.node_groups[0]
    values = {"$__rate_interval": "2m", "$group": group.name, "$instance": group.host(0),
              "$unit": cluster.plan.units[0].name if cluster.plan.units else "none"}
    for var, value in values.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_every_query_parses_under_promtool(name, kind, tmp_path) -> None:
    """Each panel query, and the instance variable's selector, as a recording rule promtool parses."""
    cluster = cluster_example(name)
    dashboard = _dashboard(name, kind)
    exprs = [target["expr"] for _panel, target in _targets(dashboard)]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), ([a-z_]+)\)", var["query"]["query"])
            assert m, var["query"]
            exprs.append(m.group(1))
    rules = [{"record": f"dashboard:query_{i}", "expr": _filled(cluster, e)} for i, e in enumerate(exprs)]
    (tmp_path / "dashboard-rules.yml").write_text(yaml.safe_dump({"groups": [{"name": kind, "rules": rules}]}))
    res = promtool(tmp_path, "check", "rules", "dashboard-rules.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout, res.stdout


# ---- every metric is one this project makes -----------------------------------------------------------------------

def metric_names(expr: str) -> tuple[list[str], list[str]]:
    """(every metric name the query reads, those read without a {selector})."""
    body = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    body = re.sub(r"\[[^\]]*\]", "", body)
    selected = re.findall(r"([A-Za-z_:][\w:]*)\{", body)
    rest = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", re.sub(r"\{[^}]*\}", "", body))
    names = [t for t in re.findall(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", rest) if t not in PROMQL_WORDS]
    return names, [n for n in names if n not in selected]


def _slurm_names(cluster: Cluster, folder: Path) -> set[str]:
    """The names gpucluster-slurm-metrics writes, every source read, for the cluster's plan."""
    return set(re.findall(r"^(gpucluster_slurm_\w+)", _slurm_file(cluster, folder), re.M))


def known_names(cluster: Cluster, folder: Path) -> set[str]:
    """What this project's exporters and rules make: the recording rules render writes, the health runner's file
    (node/promtext.py), the Slurm exporter's (node/slurmmetrics.py), node_exporter's and dcgm-exporter's series
    the dashboards name, and Prometheus's `up`."""
    rules = yaml.safe_load(render_metrics(cluster)[RULES])
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"]}
    summary = {"checks": {"gpu-xid": {"ok": False, "fails": 1, "data": {"open": [{"class": "xid79"}],
                                                                        "counts": {"xid79": 1}}}},
               "started": 1.0, "action": "held"}
    health = set(re.findall(r"^(gpucluster_health_\w+)", promtext.render(summary), re.M))
    return recorded | health | _slurm_names(cluster, folder) | {*NODE_EXPORTER_METRICS, *DCGM_METRICS, "up"}


@pytest.mark.parametrize("name", CHECKED)
def test_every_metric_a_query_reads_is_made_here(name, tmp_path) -> None:
    """Every name a panel query reads is written by an exporter or a recording rule of this project, each read with
    a selector that names this cluster."""
    cluster = cluster_example(name)
    known = known_names(cluster, tmp_path)
    read: set[str] = set()
    for board, title, expr in panel_queries(cluster):
        names, bare = metric_names(expr)
        assert names and not bare, f"{board} {title}: {bare or 'no metric'} in {expr}"
        assert len(re.findall(r"\{", expr)) == len(re.findall(rf'cluster="{re.escape(cluster.name)}"', expr)), expr
        read |= set(names)
    assert read <= known, sorted(read - known)


@pytest.mark.parametrize("name", CHECKED)
def test_the_exporter_names_are_those_the_rules_and_alerts_read(name) -> None:
    """The node_exporter and dcgm-exporter names the rendered rules and alerts read are in the dashboards' lists
    too: one list of each exporter's names for the whole metrics set."""
    files = render_metrics(cluster_example(name))
    exprs = [r["expr"] for f in (RULES, ALERTS) for g in yaml.safe_load(files[f])["groups"] for r in g["rules"]]
    read = {n for e in exprs for n in metric_names(e)[0] if n.startswith(("DCGM_FI_", "node_")) and ":" not in n}
    assert read <= {*NODE_EXPORTER_METRICS, *DCGM_METRICS}, read - {*NODE_EXPORTER_METRICS, *DCGM_METRICS}


@pytest.mark.parametrize("name", CHECKED)
def test_alert_queries_are_the_rendered_alerts(name) -> None:
    cluster = cluster_example(name)
    doc = yaml.safe_load(render_metrics(cluster)[ALERTS])
    rules = [(r["alert"], r["expr"]) for g in doc["groups"] for r in g["rules"]]
    assert alert_queries(cluster) == rules and len(rules) >= 10


# ---- the dashboards follow the spec -------------------------------------------------------------------------------

def _variable(dashboard: dict, name: str) -> dict:
    return next(v for v in dashboard["templating"]["list"] if v["name"] == name)


def _options(dashboard: dict, name: str) -> list[str]:
    """The options Grafana makes of a custom variable: its comma-separated values."""
    return _variable(dashboard, name)["query"].split(",")


def _with_group(name: str) -> Cluster:
    data = example_data("staging")
    data["node_groups"].append({"name": name, "role": "login", "count": 1, "hostname": "login##",
                                "cpu": {"sockets": 1, "cores_per_socket": 1, "threads_per_core": 1},
                                "memory_gb": 1})
    return compiled(spec_from_data(data))


@pytest.mark.parametrize("group", ["login", "entry"])
def test_a_group_added_to_the_spec_is_an_option_of_the_group_variable(group) -> None:
    cluster = _with_group(group)
    options = _options(json.loads(render_dashboards(cluster)[FILES["group"]]), "group")
    assert options == [g.name for g in cluster.spec.node_groups] and group in options
    assert group not in _options(_dashboard("staging", "group"), "group")


@pytest.mark.parametrize("name", CHECKED)
def test_the_unit_variable_offers_the_plans_units(name) -> None:
    cluster = cluster_example(name)
    dashboard = _dashboard(name, "unit")
    assert _options(dashboard, "unit") == [u.name for u in cluster.plan.units]
    assert _variable(dashboard, "unit")["current"]["value"] == cluster.plan.units[0].name


@pytest.mark.parametrize("name", CHECKED)
def test_the_instance_variable_lists_this_clusters_nodes(name) -> None:
    query = _variable(_dashboard(name, "node"), "instance")["query"]["query"]
    assert query == f'label_values(up{{job="node", cluster="{name}"}}, instance)'


@pytest.mark.parametrize(("name", "kind"), [(n, k) for n in CHECKED for k in ("fleet", "group")])
def test_nvl72_racks_are_shown_where_the_plan_has_them(name, kind) -> None:
    exprs = " ".join(target["expr"] for _panel, target in _targets(_dashboard(name, kind)))
    assert ("gpucluster_slurm_nvlink_domains_free" in exprs) == bool(cluster_example(name).plan.domains)


@pytest.mark.parametrize("name", CHECKED)
def test_the_units_are_named_as_the_fabric_names_them(name) -> None:
    """Leaves on a fat tree, scalable units on a rail-optimised fabric, in the free-units panel's title."""
    word = "scalable units" if cluster_example(name).plan.design == "rail-optimized" else "leaves"
    titles = [panel["title"] for panel in _dashboard(name, "fleet")["panels"]]
    assert f"Whole {word} free, of those planned" in titles


@pytest.mark.parametrize("name", CHECKED)
def test_gpu_exporter_panels_only_with_nvidia_gpus(name) -> None:
    cluster = cluster_example(name)
    nvidia = any(cluster.gpu_vendor(g) == "nvidia" for g in cluster.spec.gpu_groups)
    exprs = " ".join(expr for _uid, _title, expr in panel_queries(cluster))
    assert ("DCGM_FI_DEV_" in exprs) == nvidia
    assert ("gpucluster_gpus_up" in exprs) == bool(cluster.spec.gpu_groups)


@pytest.mark.parametrize("enabled", [True, False])
def test_health_panels_follow_health_enabled(enabled) -> None:
    data = example_data("staging")
    data["health"]["enabled"] = enabled
    exprs = " ".join(expr for _uid, _title, expr in panel_queries(compiled(spec_from_data(data))))
    assert ("gpucluster_health_" in exprs) == enabled


def test_a_renamed_cluster_renames_every_selector_and_uid() -> None:
    data = example_data("staging")
    data["name"] = "other"
    cluster = compiled(spec_from_data(data))
    for board, title, expr in panel_queries(cluster):
        assert board.startswith("gpucluster-other-") and 'cluster="other"' in expr, (title, expr)
        assert "staging" not in expr
