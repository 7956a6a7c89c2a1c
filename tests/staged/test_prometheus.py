"""Metrics on the staged cluster of examples/staging.yaml: Prometheus on the controller, node_exporter everywhere.

The session's configure installed them (site.yml imports playbooks/metrics.yml: roles/metrics) with the files
`gpucluster render` writes (docs/metrics.md). Asked over Prometheus's HTTP API on the controller:

1. every host of the spec is scraped by the node job (`up == 1`), labelled with its group and, on the fabric, its
   unit and rack as the plan has them; the dcgm job's targets are the NVIDIA groups' hosts, down: no DCGM
   exporter runs on a GPU-less staged node (a stand-in the staged nodes lack, reported as not run);
2. the health runner's metrics reach Prometheus through node_exporter's textfile collector: every compute node in
   production;
3. the controller's Slurm exporter (its timer) counts the plan's whole free units: one fewer while a job holds all of
   a unit's nodes, and the largest free block shrinks to the rest.
tests/staged/test_health.py shows its broken nodes in Prometheus (`test_the_drained_nodes_show_in_prometheus`).
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.parse
from pathlib import Path

import pytest
from test_health import _wait

from gpucluster.cluster import load_cluster
from gpucluster.node.decide import is_drained
from gpucluster.node.slurmctl import parse_nodes
from gpucluster.render.health.config import node_config

pytestmark = pytest.mark.staged

SPEC = Path(__file__).resolve().parents[2] / "examples" / "staging.yaml"
_CLUSTER = load_cluster(SPEC)
_SPEC = _CLUSTER.spec
CONTROLLER = sorted(_CLUSTER.contract_groups["slurm_controller"])[0]
COMPUTE = sorted(_CLUSTER.contract_groups["slurm_compute"])
HOSTS = sorted(h for g in _SPEC.node_groups for h in g.hosts)
NVIDIA = sorted(h for g in _SPEC.node_groups if g.gpu and _SPEC.parts.gpus[g.gpu].vendor == "nvidia" for h in g.hosts)
SCRAPE = _SPEC.metrics.scrape_interval
INTERVAL = _SPEC.health.interval
NODE = COMPUTE[0]


def query(cluster, expr: str) -> list[dict]:
    """Prometheus's instant query on the controller (its API on 127.0.0.1:9090, asked there over SSH)."""
    url = "http://127.0.0.1:9090/api/v1/query?query=" + urllib.parse.quote(expr)
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
