"""Metrics on the staged cluster of examples/staging.yaml: Prometheus on the controller, node_exporter everywhere.

The session's configure installed them (site.yml imports playbooks/metrics.yml: roles/metrics) with the files
`gpucluster render` writes (docs/metrics.md). Asked over Prometheus's HTTP API on the controller:

1. every host of the spec is scraped by the node job (`up == 1`), labelled with its group and, on the fabric, its
   unit and rack as the plan has them; the dcgm job's targets are the NVIDIA groups' hosts, down: no DCGM
   exporter runs on a GPU-less staged node (a stand-in the staged nodes lack, reported as not run);
2. the health runner's metrics reach Prometheus through node_exporter's textfile collector: every compute node in
   production;
3. the controller's Slurm exporter (its timer) counts the plan's whole free units: one fewer while a job holds all of
   a unit's nodes, and the largest free block shrinks to the rest;
4. every query of every rendered dashboard panel returns a series, and every selector of every panel and alert
   selects one (a recording rule through its own selectors, an event-born family through its targets); what needs
   a GPU, an HCA or an AMD group is reported as not run.
tests/staged/test_health.py shows its broken nodes in Prometheus (`test_the_drained_nodes_show_in_prometheus`).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from test_health import _wait

from gpucluster.cluster import load_cluster
from gpucluster.node.decide import is_drained
from gpucluster.node.slurmctl import parse_nodes
from gpucluster.render import dashboards
from gpucluster.render.health.config import node_config
from gpucluster.render.metrics import RULES, render_metrics

pytestmark = pytest.mark.staged

SPEC = Path(__file__).resolve().parents[2] / "examples" / "staging.yaml"
_CLUSTER = load_cluster(SPEC)
_SPEC = _CLUSTER.spec
CONTROLLER = sorted(_CLUSTER.contract_groups["slurm_controller"])[0]
COMPUTE = sorted(_CLUSTER.contract_groups["slurm_compute"])
HOSTS = sorted(h for g in _SPEC.node_groups for h in g.hosts)
NVIDIA = sorted(h for g in _SPEC.node_groups if g.gpu and _SPEC.parts.gpus[g.gpu].vendor == "nvidia" for h in g.hosts)
SCRAPE = _SPEC.metrics.scrape_interval
PROMETHEUS = _SPEC.metrics.prometheus_port
INTERVAL = _SPEC.health.interval
NODE = COMPUTE[0]
COMPUTE_GROUP = _SPEC.groups_with_role("compute")[0].name


def query(cluster, expr: str) -> list[dict]:
    """Prometheus's instant query on the controller (its API on 127.0.0.1, asked there over SSH)."""
    url = f"http://127.0.0.1:{PROMETHEUS}/api/v1/query?query=" + urllib.parse.quote(expr)
    script = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=20).read().decode())"
    res = cluster.ssh(CONTROLLER, f"python3 -c {shlex.quote(script)}", timeout=60)
    assert res.returncode == 0, f"Prometheus on {CONTROLLER} did not answer: {res.stderr[-500:]}"
    doc = json.loads(res.stdout)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


@pytest.fixture(scope="module")
def scraped(staged_cluster):
    if not staged_cluster.first_configure.ok:
        pytest.fail("the staged cluster did not converge: no Prometheus to ask", pytrace=False)
    return _wait("every host scraped once", lambda: (lambda r: len(r) == len(HOSTS) and r)(
        query(staged_cluster, 'up{job="node"}')), 4 * SCRAPE)


def test_prometheus_scrapes_every_node_with_its_topology_labels(staged_cluster, scraped) -> None:
    up = {r["metric"]["instance"]: r for r in scraped}
    assert sorted(up) == HOSTS
    assert all(r["value"][1] == "1" for r in scraped), {h: r["value"][1] for h, r in up.items()}
    plan = _CLUSTER.plan
    for group in _SPEC.groups_with_role("compute"):
        for i, host in enumerate(group.hosts):
            labels = up[host]["metric"]
            assert (labels["group"], labels["cluster"]) == (group.name, _SPEC.name), labels
            unit = next(u for u in plan.units if u.group == group.name and u.first <= i < u.first + u.count)
            assert labels["unit"] == unit.name, labels
    # each job scrapes its targets on its own schedule: the dcgm job's may come a scrape after the node job's
    dcgm = _wait("the dcgm job's targets scraped once", lambda: (lambda r: len(r) == len(NVIDIA) and r)(
        query(staged_cluster, 'up{job="dcgm"}')), 2 * SCRAPE)
    assert sorted(r["metric"]["instance"] for r in dcgm) == NVIDIA
    print(f"\ndcgm job: {len(dcgm)} targets, not run (no DCGM exporter on a GPU-less staged node): "
          f"up {sorted({r['value'][1] for r in dcgm})}")


def test_the_health_runners_metrics_reach_prometheus(staged_cluster, scraped) -> None:
    """Every compute node's lifecycle state in Prometheus is the one Slurm shows (a node the suite drained is in
    triage), once a health run and a scrape have passed since it last changed."""
    def agree():
        rows = query(staged_cluster, "gpucluster_health_lifecycle == 1")
        nodes = parse_nodes(staged_cluster.ssh(CONTROLLER, "scontrol show node -o", check=True, timeout=60).stdout)
        states = {r["metric"]["instance"]: r["metric"]["state"] for r in rows}
        want = {h: "triage" if is_drained(nodes[h]["State"]) else "production" for h in COMPUTE}
        agree.last = (states, want)
        return states == want
    try:
        _wait("every compute node's lifecycle in Prometheus as Slurm shows it", agree, 2 * SCRAPE + 2 * INTERVAL)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: Prometheus {agree.last[0]}, Slurm {agree.last[1]}") from None
    checks = query(staged_cluster, f'gpucluster_health_check_ok{{instance="{NODE}"}}')
    assert {r["metric"]["check"] for r in checks} >= {c["name"] for c in node_config(_CLUSTER, "gpu")["checks"]}


def test_the_free_whole_units_change_when_a_job_takes_one(staged_cluster, scraped) -> None:
    """The controller's Slurm exporter (gpucluster-slurm-metrics, its timer every scrape interval) counts the plan's
    whole free units: every unit of the GPU group at idle, one fewer while a job holds all of one unit's nodes."""
    c = staged_cluster
    group = _SPEC.groups_with_role("compute")[0]
    units = [u for u in _CLUSTER.plan.units if u.group == group.name]
    expr = f'gpucluster_slurm_units_free{{node_group="{group.name}"}}'

    def free(n: int):
        rows = query(c, expr)
        return rows and rows[0]["value"][1] == str(n)
    _wait(f"{len(units)} free units of {group.name}", lambda: free(len(units)), 4 * SCRAPE)
    hosts = ",".join(group.host(units[0].first + i) for i in range(units[0].count))
    res = c.ssh(CONTROLLER, f"sbatch --parsable -N{units[0].count} -w {hosts} -o /dev/null --wrap 'sleep 300'",
                timeout=60)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    t0 = time.monotonic()
    try:
        _wait(f"{len(units) - 1} free units while job {job} holds {units[0].name}", lambda: free(len(units) - 1),
              4 * SCRAPE)
        print(f"\n{units[0].name} taken by job {job}: free units {len(units)} -> {len(units) - 1} in Prometheus after "
              f"{time.monotonic() - t0:.0f} s (the exporter's timer and the scrape: {SCRAPE} s each)")
        block = query(c, f'gpucluster_slurm_units_free_block_nodes{{node_group="{group.name}"}}')
        assert block and int(float(block[0]["value"][1])) == sum(u.count for u in units[1:]), block
    finally:
        c.ssh(CONTROLLER, f"scancel {job}", timeout=60)  # the test's own job
    _wait(f"{len(units)} free units again", lambda: free(len(units)), 4 * SCRAPE)


# ---- every panel and every alert reads series that exist ------------------------------------------------------------

# Sources a staged node lacks: its queries are reported as not run, never as passed. dcgm-exporter needs a GPU,
# node_exporter's infiniband collector an HCA; the recording rules built on DCGM's metrics inherit that.
NOT_HERE = (("DCGM_FI_", "no GPU: dcgm-exporter does not run on a staged node"),
            ("node_infiniband_", "no HCA: node_exporter's infiniband collector has no device on a staged node"),
            ("gpucluster_gpus_up", "no GPU: a rule over dcgm-exporter's metrics"),
            ("gpucluster_dcgm_", "no GPU: a rule over dcgm-exporter's metrics"),
            ('job="amd-gpu"', "no AMD GPU group in the staged spec: no AMD exporter"),
            ('check=~"hca-ports', "no HCA or NVLink: the staged groups run no link checks"),
            ("ALERTS{", "Prometheus's own series of the alerts firing: none fire on a healthy cluster"))
# Families whose series are born with an event (a pending job, a GPU error): absent on a quiet cluster by design.
# Their selectors are checked for the labels they select: the same matchers must select a node target.
EVENT_BORN = ("gpucluster_slurm_jobs_pending", "gpucluster_health_xid_events_total",
              "gpucluster_health_gpu_errors_open")
TARGET_LABELS = ("job", "cluster", "group", "role", "unit", "pod", "rack", "nvlink_domain", "instance")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")')
_TOKEN = re.compile(r'(?P<str>"(?:[^"\\]|\\.)*")|(?P<brace>\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})|(?P<range>\[[^\]]*\])'
                    r"|(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?)|(?P<id>[A-Za-z_:][\w:]*)|(?P<open>\()|(?P<close>\))|\S")
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right", "sum", "min", "max",
          "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"}


def selectors(expr: str) -> list[str]:
    """The vector selectors of a PromQL expression (`name{matchers}`), in order: every name that is neither a
    function, an operator word nor a label of a grouping clause."""
    tokens = [(m.lastgroup, m.group(0)) for m in _TOKEN.finditer(expr)]
    out, i = [], 0
    while i < len(tokens):
        kind, text = tokens[i]
        after = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "id" and text in _GROUPING and after[0] == "open":
            while i < len(tokens) and tokens[i][0] != "close":
                i += 1
        elif kind == "id" and text == "offset":
            i += 2 if after[0] == "num" else 1  # its duration: a number, then a unit
        elif kind == "id" and after[0] != "open" and text.lower() not in _WORDS:
            out.append(text + (after[1] if after[0] == "brace" else ""))
        i += 1
    return list(dict.fromkeys(out))


def test_the_selector_reader_reads_promql() -> None:
    expr = ('sum by (group, unit) (increase(a_total{job="node", x="b{c}"}[5m])) / on (unit) group_left '
            'count(b:c:d{unit!=""}) > bool 0.25 or absent(e) unless rate(f[1m]) or g offset 1h')
    assert selectors(expr) == ['a_total{job="node", x="b{c}"}', 'b:c:d{unit!=""}', "e", "f", "g"]


def query_many(cluster, exprs: list[str]) -> dict[str, int]:
    """expr -> how many series it returns now, all asked in one SSH call on the controller (the list travels
    base64-encoded in the command line: no quoting of PromQL in a shell)."""
    script = "\n".join([
        "import base64,json,sys,urllib.parse,urllib.request", "out={}",
        "for e in json.loads(base64.b64decode(sys.argv[1])):",
        f" u='http://127.0.0.1:{PROMETHEUS}/api/v1/query?query='+urllib.parse.quote(e)",
        " d=json.load(urllib.request.urlopen(u,timeout=30))", " assert d['status']=='success',(e,d)",
        " out[e]=len(d['data']['result'])", "print(json.dumps(out))"])
    arg = base64.b64encode(json.dumps(exprs).encode()).decode()
    res = cluster.ssh(CONTROLLER, f"python3 -c {shlex.quote(script)} {arg}", timeout=300)
    assert res.returncode == 0, f"Prometheus on {CONTROLLER}: {res.stderr[-1500:]}"
    return json.loads(res.stdout)


def _not_here(expr: str) -> str | None:
    return next((why for prefix, why in NOT_HERE if prefix in expr), None)


def _filled(expr: str) -> str:
    """Grafana's variables given values of the staged cluster: its first GPU group, unit and node."""
    values = {"group": COMPUTE_GROUP, "unit": _CLUSTER.plan.units[0].name, "instance": NODE,
              "__rate_interval": f"{4 * SCRAPE}s"}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)


def _on_targets(sel: str) -> str:
    """An event-born family's selector as one of the node targets it would be scraped from: its matchers on the
    target labels, on `up`."""
    kept = [f"{k}{op}{v}" for k, op, v in _MATCHER.findall(sel.partition("{")[2]) if k in TARGET_LABELS]
    return f"up{{{', '.join(kept)}}}"


def _rules() -> dict[str, str]:
    """Recording rule name -> its expression, as render writes them."""
    doc = yaml.safe_load(render_metrics(_CLUSTER)[RULES])
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def test_every_panel_and_alert_reads_series_that_exist(staged_cluster, scraped) -> None:
    """Every dashboard panel's query returns a series, and every selector of every alert and panel selects one: a
    wrong name, job, label or variable value would leave a panel empty or an alert silent for good. A selector of a
    recording rule with no series now (a count of nodes flapping) is checked through the rule's own selectors; one
    of an event-born family (EVENT_BORN) by its labels on the node targets; GPU and HCA sources are not run here."""
    rules = _rules()
    panels = [(f"{uid}: {title}", _filled(expr)) for uid, title, expr in dashboards.panel_queries(_CLUSTER)]
    alerts = [(f"alert {name}", expr) for name, expr in dashboards.alert_queries(_CLUSTER)]
    wanted: dict[str, str] = {}  # selector -> where it was read
    pending = [(where, s) for where, expr in panels + alerts for s in selectors(expr)]
    while pending:
        where, sel = pending.pop()
        name = re.match(r"[\w:]+", sel).group(0)
        if sel in wanted or _not_here(sel):
            continue
        wanted[sel] = where
        if name in rules:  # also what the rule reads, so an empty rule is traced to its inputs
            pending += [(f"{where} -> rule {name}", s) for s in selectors(rules[name])]
    plain = [s for s in wanted if not s.startswith(EVENT_BORN)]
    born = {s: _on_targets(s) for s in wanted if s.startswith(EVENT_BORN)}
    got = query_many(staged_cluster, [f"count({s})" for s in plain + list(born.values())]
                     + [f"count({e})" for _w, e in panels if not _not_here(e)])
    empty_panels = [w for w, e in panels if not _not_here(e) and not got[f"count({e})"]
                    and not any(s.startswith(EVENT_BORN) or s.split("{")[0] in rules for s in selectors(e))]
    empty_selectors = [f"{wanted[s]}: {s}" for s in plain if not got[f"count({s})"] and s.split("{")[0] not in rules]
    empty_selectors += [f"{wanted[s]}: {s} (its targets: {t})" for s, t in born.items() if not got[f"count({t})"]]
    not_run = sorted({_not_here(e) for _w, e in panels + alerts if _not_here(e)})
    print(f"\n{len(panels)} panel queries, {len(alerts)} alerts, {len(wanted)} selectors read on the staged cluster; "
          f"not run: {'; '.join(not_run)}")
    assert not empty_panels and not empty_selectors, "\n".join(["panels with no series:", *empty_panels,
                                                               "selectors with no series:", *empty_selectors])
