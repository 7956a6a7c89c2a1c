"""Fleet metrics (render/metrics.py, docs/metrics.md): the rendered Prometheus files read by the real promtool
(`check config` with its rule and target files, `check rules`, `test rules` on the alert tests in tests/metrics/),
and without promtool: every host once in its group's target file with the plan's topology labels, the scrape jobs by
GPU vendor, the XID classes the alert fires on against the node's own table. The dashboards: tests/test_dashboards.py.
Without promtool the promtool tests are skipped (not run), never passed; in CI they fail (scripts/setup.sh installs
Debian's prometheus package, which ships promtool)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, cluster_example, compiled, example_data, skip_or_fail, spec_from_data

from gpucluster.cluster import Cluster, load_cluster
from gpucluster.node import promtext, slurmmetrics
from gpucluster.node.xid import CLASSES, LADDER, XIDS, classify
from gpucluster.render import slurmunits
from gpucluster.render.dashboards import panel_queries
from gpucluster.render.health.config import TEXTFILE_DIR
from gpucluster.render.metrics import (
    ALERTS,
    CONFIG,
    DCGM_DROPIN,
    EXPORTERS,
    NODE_EXPORTER_ARGS,
    RULES,
    SERVER_ARGS,
    TEXTFILE,
    render_metrics,
    targets_name,
    xid_classes,
)
from gpucluster.spec.ports import DCGM_HOSTENGINE_PORT

FIXTURES = Path(__file__).resolve().parent / "metrics"
RULE_TESTS = sorted(p.name for p in FIXTURES.glob("*.test.yml"))
# promtool reads these: each fabric design and size once, an NVL72 cluster (nvlink_domain) and an AMD one.
CHECKED = ["staging", "meta-24k-ib", "colossus-200k", "gb200-superpod", "mi355x-800g-roce"]
TOPOLOGY = ("cluster", "group", "role", "unit", "pod", "rack", "nvlink_domain")
DRAIN = LADDER.index("drain")


def promtool(folder: Path, *args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    if tool is None:
        skip_or_fail("not run: promtool is not installed (apt-get install prometheus: Debian's package ships it)")
    return subprocess.run([tool, *args], cwd=folder, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, check=False)


def written(cluster: Cluster, folder: Path) -> dict[str, str]:
    files = render_metrics(cluster)
    for name, text in files.items():
        (folder / name).write_text(text)
    return files


def fixture_cluster(test: str = "") -> Cluster:
    """The cluster a rule test describes: tests/metrics/nvl72.yaml for nvl72-*.test.yml (NVLink domains), else
    tests/metrics/cluster.yaml."""
    return load_cluster(FIXTURES / ("nvl72.yaml" if test.startswith("nvl72-") else "cluster.yaml"))


# ---- the real promtool ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", CHECKED)
def test_promtool_accepts_the_config_with_its_rule_and_target_files(name, tmp_path) -> None:
    """`promtool check config` loads the rule files and every file_sd target file the jobs name (a missing one is
    a WARNING, a malformed one a failure)."""
    written(cluster_example(name), tmp_path)
    res = promtool(tmp_path, "check", "config", CONFIG)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "WARNING" not in out, out
    assert "SUCCESS: 2 rule files found" in out, out


@pytest.mark.parametrize("name", CHECKED)
def test_promtool_accepts_the_rules_and_alerts(name, tmp_path) -> None:
    written(cluster_example(name), tmp_path)
    res = promtool(tmp_path, "check", "rules", RULES, ALERTS)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == 2, res.stdout


@pytest.mark.parametrize("fixture", RULE_TESTS)
def test_alerts_under_promtool_test_rules(fixture, tmp_path) -> None:
    """The alert tests of tests/metrics/ (each file says what it shows) against the rules rendered from the cluster
    it describes (fixture_cluster)."""
    written(fixture_cluster(fixture), tmp_path)
    shutil.copy(FIXTURES / fixture, tmp_path / fixture)
    res = promtool(tmp_path, "test", "rules", fixture)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout, res.stdout


# ---- the target files: every host once, with the plan's labels -----------------------------------

def planned_labels(cluster: Cluster, group, index: int) -> dict[str, str]:
    """A host's topology labels from the plan, host by host (the renderer cuts runs by arithmetic instead)."""
    plan, host = cluster.plan, group.host(index)
    out = {"cluster": cluster.name, "group": group.name, "role": group.role}
    unit = plan.unit_of_host.get(host)
    if unit is not None:
        out["unit"] = unit.name
        if plan.tiers == 3:
            out["pod"] = f"pod{unit.pod + 1:03d}"
    out["rack"] = plan.rack_of(group, index)
    domain = plan.domain_of_host.get(host)
    if domain is not None:
        out["nvlink_domain"] = domain.name
    return out


@pytest.mark.parametrize("name", EXAMPLES)
def test_target_files_list_every_host_once_with_its_plan_labels(name) -> None:
    cluster = cluster_example(name)
    files = render_metrics(cluster)
    for group in cluster.spec.node_groups:
        listed = [(host, tg["labels"]) for tg in json.loads(files[targets_name(group.name)]) for host in tg["targets"]]
        assert [host for host, _ in listed] == group.hosts
        for i, (host, labels) in enumerate(listed):
            assert labels == planned_labels(cluster, group, i), host


@pytest.mark.parametrize("name", EXAMPLES)
def test_labels_are_written_once_a_run_not_once_a_host(name) -> None:
    """A target group per run of hosts that share unit, rack and NVLink domain: at most one per unit, rack and
    domain boundary, so the file grows with the hosts' names, and its labels with units and racks."""
    cluster = cluster_example(name)
    plan = cluster.plan
    for group in cluster.spec.node_groups:
        groups = json.loads(render_metrics(cluster)[targets_name(group.name)])
        spans = (len(plan.racks[group.name]) + sum(u.group == group.name for u in plan.units)
                 + sum(d.group == group.name for d in plan.domains))
        assert len(groups) <= spans
        labels = [tg["labels"] for tg in groups]
        assert all(a != b for a, b in pairwise(labels)), "two runs in a row with one label set"


def test_the_rule_tests_labels_are_the_plans() -> None:
    """The series and expected alerts of tests/metrics/*.test.yml carry the labels the plan of the cluster each
    describes gives each host. The controller's Slurm series carry the controller's target labels, and their own
    node_group, unit and pod name the plan's units."""
    seen = 0
    for fixture in RULE_TESTS:
        cluster = fixture_cluster(fixture)
        by_host = {g.host(i): planned_labels(cluster, g, i) for g in cluster.spec.node_groups for i in range(g.count)}
        units = {(u.group, u.name, f"pod{u.pod + 1:03d}" if cluster.plan.tiers == 3 else "")
                 for u in cluster.plan.units}
        doc = yaml.safe_load((FIXTURES / fixture).read_text())
        for test in doc["tests"]:
            found = [(s["series"].split("{")[0], dict(re.findall(r'(\w+)="([^"]*)"', s["series"])))
                     for s in test["input_series"]]
            found += [("", a["exp_labels"]) for t in test.get("alert_rule_test", []) for a in t.get("exp_alerts", [])]
            for name, labels in found:
                if "instance" not in labels:
                    continue
                own = ("unit", "pod", "nvlink_domain") if name.startswith("gpucluster_slurm_") else ()
                topology = {k: v for k, v in labels.items() if k in TOPOLOGY and k not in own}
                assert topology == by_host[labels["instance"]], (fixture, labels)
                if own and "unit" in labels:
                    assert (labels["node_group"], labels["unit"], labels.get("pod", "")) in units, (fixture, labels)
                seen += 1
    assert seen > 100


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    """Each alert the fixture clusters render is expected to fire somewhere in tests/metrics/*.test.yml, and to stay
    silent somewhere (an evaluation that expects no alert of that name at all)."""
    names = {a for f in ("cluster", "nvl72-") for a in alerts_of(fixture_cluster(f))}
    cases: dict[str, set[bool]] = {}
    for fixture in RULE_TESTS:
        for test in yaml.safe_load((FIXTURES / fixture).read_text())["tests"]:
            for t in test.get("alert_rule_test", []):
                cases.setdefault(t["alertname"], set()).add(bool(t.get("exp_alerts")))
    missing = sorted(a for a in names if cases.get(a) != {True, False})
    assert not missing, f"alerts without a firing and a silent case: {missing}"
    assert set(cases) <= names, f"tests of alerts no fixture cluster renders: {sorted(set(cases) - names)}"


# ---- scrape jobs ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_scrape_jobs_node_exporter_everywhere_and_each_gpu_vendor_on_its_groups(name) -> None:
    cluster = cluster_example(name)
    config = yaml.safe_load(render_metrics(cluster)[CONFIG])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    with_dcgm = json.loads(render_metrics(cluster)[EXPORTERS])["dcgm_exporter"]["groups"]  # the lock pairs one
    by_vendor = {v: [targets_name(g.name) for g in cluster.spec.gpu_groups if cluster.gpu_vendor(g) == v
                     and (v == "amd" or g.name in with_dcgm)] for v in ("nvidia", "amd")}
    metrics = cluster.spec.metrics
    expected = {"node": ([targets_name(g.name) for g in cluster.spec.node_groups], metrics.node_exporter_port),
                "dcgm": (by_vendor["nvidia"], metrics.dcgm_exporter_port),
                "amd-gpu": (by_vendor["amd"], metrics.amd_exporter_port)}
    assert set(jobs) == {job for job, (files, _port) in expected.items() if files}
    for job, body in jobs.items():
        files, port = expected[job]
        assert body["file_sd_configs"] == [{"files": files}]
        assert body["relabel_configs"][-1]["replacement"] == f"${{1}}:{port}"
    interval = cluster.spec.metrics.scrape_interval
    assert config["global"]["scrape_interval"] == f"{interval}s"
    assert int(config["global"]["scrape_timeout"].rstrip("s")) <= interval


def test_a_short_scrape_interval_keeps_the_timeout_within_it(tmp_path) -> None:
    """Prometheus refuses a scrape_timeout longer than the interval: the shortest interval the spec takes."""
    data = example_data("staging")
    data["metrics"] = {"scrape_interval": 5}
    cluster = compiled(spec_from_data(data))
    written(cluster, tmp_path)
    res = promtool(tmp_path, "check", "config", CONFIG)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- ports and where Prometheus runs, from the spec -----------------------------------------------

MOVED = {"node_exporter_port": 19100, "dcgm_exporter_port": 19400, "amd_exporter_port": 15000,
         "prometheus_port": 19090}


def _moved(name: str, **extra) -> Cluster:
    data = example_data(name)
    data["metrics"] = {**MOVED, **extra}
    return compiled(spec_from_data(data))


@pytest.mark.parametrize("name", ["staging", "mi355x-800g-roce"])
def test_each_port_is_the_specs_in_every_file_that_names_it(name, tmp_path) -> None:
    """Moved ports: the scrape jobs add them, node_exporter's and Prometheus's arguments listen on them, the
    exporter's drop-in listens on its own; promtool reads the config."""
    cluster = _moved(name)
    files = written(cluster, tmp_path)
    jobs = {j["job_name"]: j for j in yaml.safe_load(files[CONFIG])["scrape_configs"]}
    ports = {"node": MOVED["node_exporter_port"], "dcgm": MOVED["dcgm_exporter_port"],
             "amd-gpu": MOVED["amd_exporter_port"]}
    assert jobs and all(j["relabel_configs"][-1]["replacement"] == f"${{1}}:{ports[n]}" for n, j in jobs.items())
    assert f'--web.listen-address=:{MOVED["node_exporter_port"]} ' in files[NODE_EXPORTER_ARGS]
    assert f'ARGS="--web.listen-address=:{MOVED["prometheus_port"]}"' in files[SERVER_ARGS]
    facts = json.loads(files[EXPORTERS])
    assert facts["node_exporter"]["port"] == MOVED["node_exporter_port"]
    assert facts["prometheus"]["port"] == MOVED["prometheus_port"]
    assert facts["prometheus"]["url"].endswith(f':{MOVED["prometheus_port"]}')
    nvidia = any(cluster.gpu_vendor(g) == "nvidia" for g in cluster.spec.gpu_groups)
    assert (DCGM_DROPIN in files) is nvidia
    if nvidia:
        assert f'Environment=DCGM_EXPORTER_LISTEN=:{MOVED["dcgm_exporter_port"]}\n' in files[DCGM_DROPIN]
        # the node's running host engine (the nvidia-dcgm service), at the port spec/ports.py keeps free for it
        assert f"Environment=DCGM_REMOTE_HOSTENGINE_INFO=localhost:{DCGM_HOSTENGINE_PORT}\n" in files[DCGM_DROPIN]
    res = promtool(tmp_path, "check", "config", CONFIG)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_node_exporter_arguments_keep_the_textfile_folder_the_runner_writes() -> None:
    """Debian's unit takes node_exporter's whole command line from ARGS: the file the role writes names the folder
    the health runner and the Slurm exporter write to."""
    args = render_metrics(cluster_example("staging"))[NODE_EXPORTER_ARGS]
    assert f"--collector.textfile.directory={TEXTFILE_DIR}" in args
    assert TEXTFILE.startswith(TEXTFILE_DIR + "/")


ROLE = Path(__file__).resolve().parent.parent / "roles" / "metrics"


def _include(when_of: str) -> list:
    """The `when` of the role's include of tasks/<when_of>.yml (tasks/main.yml)."""
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    return next(t for t in tasks if (t.get("ansible.builtin.include_tasks") or "") == f"{when_of}.yml")["when"]


def _role_true(conditions: list, variables: dict) -> bool:
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["bool"] = bool
    return all(env.compile_expression(str(c))(**variables) for c in conditions)


@pytest.mark.parametrize("external", [None, "http://prometheus.example.org:9090"], ids=["controller", "external"])
def test_the_spec_alone_says_where_prometheus_runs(external) -> None:
    """metrics.external_url unset: the role's server tasks run on the controllers; set: they do not, the files wait
    on the first controller for the site's server, and no Prometheus arguments are rendered."""
    data = yaml.safe_load((FIXTURES / "cluster.yaml").read_text())  # two controllers
    data["metrics"] = {**data.get("metrics", {}), **({"external_url": external} if external else {})}
    cluster = compiled(spec_from_data(data))
    files = render_metrics(cluster)
    facts = json.loads(files[EXPORTERS])
    controllers = [h for g in cluster.spec.groups_with_role("controller") for h in g.hosts]
    assert len(controllers) == 2
    hosts = {h for g in cluster.spec.node_groups for h in g.hosts}
    groups = {"slurm_controller": controllers}
    server = {h for h in hosts if _role_true(_include("server"), {"__metrics": facts, "inventory_hostname": h,
                                                                 "groups": groups})}
    export = {h for h in hosts if _role_true(_include("external"), {"__metrics": facts, "inventory_hostname": h,
                                                                   "groups": groups})}
    assert server == (set() if external else set(controllers))
    assert export == ({controllers[0]} if external else set())
    assert (SERVER_ARGS in files) is (external is None)
    assert facts["prometheus"]["url"] == (external or f"http://{controllers[0]}:9090")
    config = yaml.safe_load(files[CONFIG])
    named = {CONFIG, *config["rule_files"], *(f for j in config["scrape_configs"] for c in j["file_sd_configs"]
                                              for f in c["files"])}
    assert set(facts["prometheus"]["files"]) == named


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_file_the_role_reads_is_rendered(name) -> None:
    files = render_metrics(cluster_example(name))
    facts = json.loads(files[EXPORTERS])
    names = [facts["node_exporter"]["args"], *facts["prometheus"]["files"],
             *[e["pins"] for e in facts["dcgm_exporter"]["groups"].values()]]
    names += [n for n in (facts["prometheus"]["args"], facts["dcgm_exporter"]["dropin"]) if n]
    assert all(n in files for n in names), [n for n in names if n not in files]
    groups = {g.name for g in cluster_example(name).spec.gpu_groups
              if cluster_example(name).gpu_vendor(g) == "nvidia"}
    assert set(facts["dcgm_exporter"]["groups"]) | set(facts["dcgm_exporter"]["skipped"]) == groups


# ---- thresholds and classes from the spec ---------------------------------------------------------

def alerts_of(cluster: Cluster) -> dict[str, dict]:
    doc = yaml.safe_load(render_metrics(cluster)[ALERTS])
    return {rule["alert"]: rule for group in doc["groups"] for rule in group["rules"]}


def test_thresholds_come_from_the_spec() -> None:
    data = example_data("staging")
    data["metrics"] = {"unit_degraded_pct": 40, "unit_degraded_min_nodes": 3, "down_minutes": 9,
                       "slurm_out_of_service_pct": 15, "flap_count": 4, "flap_minutes": 30,
                       "backfill_cycle_seconds": 45, "scrape_interval": 20}
    data.setdefault("health", {})["ecc_uncorrected_max"] = 7
    cluster = compiled(spec_from_data(data))
    alerts = alerts_of(cluster)
    unit = alerts["GpuclusterUnitDegraded"]
    assert "ratio > 0.4" in unit["expr"] and "sum >= 3" in unit["expr"] and unit["for"] == "9m"
    assert "ratio > 0.4" in alerts["GpuclusterNodeDown"]["expr"]
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job=\"dcgm\"} > 7" in alerts["GpuclusterGpuEccUncorrected"]["expr"]
    assert "count >= 3" in alerts["GpuclusterUnitLost"]["expr"] and alerts["GpuclusterUnitLost"]["for"] == "9m"
    slurm = alerts["GpuclusterSlurmNodesOutOfService"]["expr"]
    assert "ratio > 0.15" in slurm and "sum >= 3" in slurm
    assert "exits{job=\"node\"} >= 4" in alerts["GpuclusterNodeFlapping"]["expr"]
    assert "> 45" in alerts["GpuclusterSlurmBackfillSlow"]["expr"]
    assert "> 60" in alerts["GpuclusterSlurmMetricsStale"]["expr"]  # 3 scrape intervals of 20 s
    rules = {r["record"]: r["expr"] for g in yaml.safe_load(render_metrics(cluster)[RULES])["groups"]
             for r in g["rules"]}
    assert rules["instance:gpucluster_node_out_of_service:exits"].count("[30m]") == 2
    assert ">= 4" in rules["unit:gpucluster_nodes_flapping:count"]


def test_xid_alert_classes_are_the_nodes_classes_that_drain() -> None:
    """The class label the node writes is xid.py's class of the line it read: the alert fires on a class exactly
    when that class's rung, with the site's health.xid_actions, is drain or above."""
    data = example_data("staging")
    data.setdefault("health", {})["xid_actions"] = {13: "drain", 79: "record", 999: "service"}
    cluster = compiled(spec_from_data(data))
    overrides = {str(k): v for k, v in cluster.spec.health.xid_actions.items()}
    regex = re.search(r'class=~"([^"]+)"', alerts_of(cluster)["GpuclusterGpuXid"]["expr"]).group(1)
    assert regex.split("|") == xid_classes(cluster)
    for code in sorted({*XIDS, 13, 79, 999, 1}):
        event = classify(f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, text", overrides)
        assert (re.fullmatch(regex, event["class"]) is not None) == (LADDER.index(event["action"]) >= DRAIN), code
    for cls, (action, _what, _source) in CLASSES.items():
        assert (cls in xid_classes(cluster)) == (LADDER.index(action) >= DRAIN), cls


def test_the_rules_read_the_health_metrics_the_runner_writes() -> None:
    """Every gpucluster_health_* name the rules, alerts and dashboard read is one node/promtext.py writes (the names
    of docs/metrics.md's contract)."""
    summary = {"checks": {"gpu-xid": {"ok": False, "fails": 1, "data": {"open": [{"class": "xid79"}],
                                                                        "counts": {"xid79": 1}}}},
               "started": 1.0, "action": "held"}
    written = set(re.findall(r"^(gpucluster_health_\w+)", promtext.render(summary), re.M))
    cluster = cluster_example("staging")
    files, queries = render_metrics(cluster), "\n".join(expr for _uid, _title, expr in panel_queries(cluster))
    read = set(re.findall(r"(?<![:\w])gpucluster_health_\w+", files[RULES] + files[ALERTS] + queries))
    assert read <= written, read - written


def _slurm_file(cluster: Cluster, tmp_path: Path) -> str:
    """The file gpucluster-slurm-metrics writes for the cluster's plan, every source read: its node table all idle
    but one node drained, a running and a pending job, sdiag's every statistic."""
    plan = tmp_path / slurmunits.FILE
    plan.write_text(slurmunits.render_slurm_units(cluster)[slurmunits.FILE])
    hosts = [h for g in cluster.spec.groups_with_role("compute") for h in g.hosts]
    table = {"errors": [], "nodes": [{"name": h, "state": ["IDLE", *(["DRAIN"] if i == 0 else [])],
                                      "reason": "gpc:gpu-count: 7 of 8" if i == 0 else ""}
                                     for i, h in enumerate(hosts)]}
    heads = {"main": "Main schedule statistics (microseconds):", "backfill": "Backfilling stats"}
    sdiag = "".join(head + "\n" + "".join(f"\t{key}: 1\n" for sec, key in slurmmetrics.SDIAG_KEYS if sec == name)
                    for name, head in heads.items())
    outputs = {slurmmetrics.NODES_JSON: json.dumps(table), slurmmetrics.JOBS: "RUNNING|None\nPENDING|Resources\n",
               slurmmetrics.SDIAG: sdiag}
    text, whys = slurmmetrics.collect(lambda argv, timeout: (outputs[tuple(argv)], ""), str(plan), 5, 1.0)
    assert whys == []
    return text


def _slurm_written(text: str) -> dict[str, dict[str, set[str]]]:
    """name -> label -> values, of the exposition text."""
    out: dict[str, dict[str, set[str]]] = {}
    for name, labels in re.findall(r"^(gpucluster_slurm_\w+)(?:\{(.*)\})? ", text, re.M):
        mine = out.setdefault(name, {})
        for key, value in re.findall(r'(\w+)="([^"]*)"', labels):
            mine.setdefault(key, set()).add(value)
    return out


# The labels Prometheus adds to every series of the controller's node_exporter (its target's, and the job's).
TARGET_LABELS = {"job", "instance", "cluster", "group", "role", "rack"}


@pytest.mark.parametrize("name", ["cluster", "nvl72-"])
def test_the_slurm_rules_read_what_the_slurm_metrics_program_writes(name, tmp_path) -> None:
    """Every gpucluster_slurm_* name the rules, alerts and dashboard read is one node/slurmmetrics.py writes, each
    selector's labels are its labels (or the controller target's) and each fixed value one it writes; the promtool
    tests' Slurm series are such series too."""
    cluster = fixture_cluster(name)
    written_ = _slurm_written(_slurm_file(cluster, tmp_path))
    files = render_metrics(cluster)
    read = files[RULES] + files[ALERTS] + "\n".join(expr for _uid, _title, expr in panel_queries(cluster))
    series = re.findall(r"(?<![:\w])(gpucluster_slurm_\w+)(?:\{([^}]*)\})?", read)
    for fixture in RULE_TESTS:
        doc = yaml.safe_load((FIXTURES / fixture).read_text())
        series += [tuple(s["series"].rstrip("}").split("{", 1)) for t in doc["tests"] for s in t["input_series"]
                   if s["series"].startswith("gpucluster_slurm_")]
    assert len({n for n, _ in series}) >= 10, series
    for metric, selector in series:
        assert metric in written_, f"{metric} is read but not written"
        for key, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', selector):
            if key in TARGET_LABELS:
                continue
            assert key in written_[metric], f"{metric}{{{selector}}}: no label {key}"
            if op == "=" and key in ("scheduler", "state", "source"):
                assert value in written_[metric][key], f"{metric}{{{selector}}}: {key}={value} is never written"


def test_a_metrics_change_disrupts_no_node() -> None:
    """`gpucluster diff`: the metrics files go to the Prometheus and Grafana servers, so a threshold changed is
    class none on no host, never a drain."""
    from gpucluster.diff.changes import NONE, diff_clusters

    data = example_data("staging")
    data["metrics"] = {"unit_degraded_pct": 30}
    result = diff_clusters(cluster_example("staging"), compiled(spec_from_data(data)))
    changed = [c for c in result.changes if c.target.startswith(("prometheus", "grafana-"))]
    assert changed and all(c.cls == NONE and not c.hosts for c in changed), changed


def test_disabled_metrics_render_nothing() -> None:
    data = example_data("staging")
    data["metrics"] = {"enabled": False}
    assert render_metrics(compiled(spec_from_data(data))) == {}


@pytest.mark.parametrize("name", ["gb300-nvl72", "staging"])
def test_the_dcgm_job_scrapes_only_groups_that_get_an_exporter(name) -> None:
    """An NVIDIA group whose locked release pairs no dcgm-exporter (the 580 row of gb300-nvl72) gets none, so no
    dcgm target of it is scraped: its `up` would be 0 for good and GpuclusterGpuExporterDown would page for it."""
    cluster = cluster_example(name)
    exporters = json.loads(render_metrics(cluster)[EXPORTERS])
    jobs = {j["job_name"]: j for j in yaml.safe_load(render_metrics(cluster)[CONFIG])["scrape_configs"]}
    scraped = set(jobs["dcgm"]["file_sd_configs"][0]["files"]) if "dcgm" in jobs else set()
    nvidia = [g.name for g in cluster.spec.gpu_groups if cluster.gpu_vendor(g) == "nvidia"]
    assert nvidia
    for group in nvidia:
        assert (targets_name(group) in scraped) == (group in exporters["dcgm_exporter"]["groups"]), group
    assert (name == "staging") == bool(scraped)
