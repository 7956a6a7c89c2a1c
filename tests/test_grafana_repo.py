"""Grafana on the controller (the spec's metrics.grafana): its apt pin and hold against a real apt on a local
repository of stand-in packages, its provisioning files as rendered, and where the metrics role puts it.

Grafana's repository is not reachable from here, so the test builds one the way tests/test_metrics_repo.py does for
dcgm-exporter: STAND-INS, empty packages made with dpkg-deb whose names copy Grafana's repository:
- grafana at the lock's version (catalog.GRAFANA) and a newer release (12.0.0, a stand-in);
- grafana-enterprise, the other edition in the same repository, at both versions;
- adduser, libfontconfig1 and musl, which Grafana's download page installs before its package: the stand-in grafana
  depends on them. Its real Depends is not confirmed here.
Without pins apt takes the newest grafana (the trap): only the pin keeps the controller on the release whose
dashboard schema the renderer writes.

apt-get runs with a private configuration (test_gpu_repo.Apt) through the pin the role copies byte for byte
(render/metrics.py), and installs what the role's install task asks for, its expression evaluated on the rendered
prometheus-exporters.json; the dpkg hold is applied as the role's task states it, with real dpkg.

Not run: Grafana's real repository, package, unit, drop-in, port and provisioning (no Grafana server runs here).
"""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, compiled, example_data, spec_from_data
from test_gpu_repo import Apt, _build_repo, _installed, _task, role_eval

from gpucluster.catalog import GRAFANA
from gpucluster.cluster import Cluster
from gpucluster.render.dashboards import KINDS
from gpucluster.render.metrics import (
    EXPORTERS,
    GRAFANA_DATASOURCE,
    GRAFANA_DROPIN,
    GRAFANA_PINS,
    GRAFANA_PROVIDER,
    GRAFANA_SOURCES,
    render_metrics,
)

ROLE = ROOT / "roles" / "metrics"
TASKS = ROLE / "tasks" / "grafana.yml"
PACKAGE = "grafana"
OTHER_EDITION = "grafana-enterprise"
NEWER = "12.0.0"  # a stand-in later release (not in the lock)
PREREQUISITES = ("adduser", "libfontconfig1", "musl")
FIXTURES = Path(__file__).resolve().parent / "metrics"

needs_apt = pytest.mark.skipif(not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("dpkg")),
                               reason="needs apt-get, dpkg and dpkg-deb (Debian)")


def _cluster(**metrics) -> Cluster:
    data = example_data("staging")
    data["metrics"] = {"grafana": True, **metrics}
    return compiled(spec_from_data(data))


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_metrics(_cluster())


@pytest.fixture(scope="module")
def facts(rendered) -> dict:
    return json.loads(rendered[EXPORTERS])


@pytest.fixture(scope="module")
def locked(facts) -> str:
    return facts["grafana"]["version"]


def _stanzas(locked: str) -> list[dict[str, str]]:
    out = [{"Package": p, "Version": "1.0-1", "Depends": ""} for p in PREREQUISITES]
    out += [{"Package": PACKAGE, "Version": v, "Depends": ", ".join(PREREQUISITES)} for v in (locked, NEWER)]
    out += [{"Package": OTHER_EDITION, "Version": v, "Depends": ", ".join(PREREQUISITES)} for v in (locked, NEWER)]
    return out


@pytest.fixture(scope="module")
def apt(tmp_path_factory, locked) -> Apt:
    root = tmp_path_factory.mktemp("apt")
    return Apt(root, _build_repo(root, _stanzas(locked)))


def _role_pins(rendered: dict[str, str], facts: dict) -> dict[str, str]:
    """The preference file the role writes, named as its task names it, with the rendered text it copies."""
    task = _task(TASKS, lambda t: "pin it" in t.get("name", ""))
    dest = role_eval(task["ansible.builtin.copy"]["dest"], _role_vars())
    src = role_eval(task["ansible.builtin.copy"]["src"], {**_role_vars(), "__metrics": facts,
                                                          "__metrics_rendered": "R"})
    assert str(dest).startswith("/etc/apt/preferences.d/") and str(src) == f"R/{GRAFANA_PINS}"
    return {Path(str(dest)).name: rendered[GRAFANA_PINS]}


def _role_vars() -> dict:
    return {**yaml.safe_load((ROLE / "vars" / "Debian.yml").read_text()),
            **yaml.safe_load((ROLE / "vars" / "main.yml").read_text())}


def _role_install(facts: dict) -> list[str]:
    task = _task(TASKS, lambda t: "gpucluster_apt" in t)
    return list(role_eval(task["gpucluster_apt"]["name"], {"__metrics": facts}))


def _role_hold(facts: dict) -> tuple[list[str], str]:
    task = _task(TASKS, lambda t: "ansible.builtin.dpkg_selections" in t)
    return list(role_eval(task["loop"], {"__metrics": facts})), task["ansible.builtin.dpkg_selections"]["selection"]


# ---- the lock, against a real apt ------------------------------------------------------------------------------

def test_the_role_installs_the_locked_version(facts, locked) -> None:
    assert locked == GRAFANA.package.version
    assert _role_install(facts) == [f"{PACKAGE}={locked}"]


@needs_apt
def test_the_stand_in_repository_has_the_trap(apt: Apt) -> None:
    """No pins: apt takes the newest Grafana. Without this the tests below would prove nothing."""
    apt.pins({})
    rc, inst, said = apt.simulate("install", PACKAGE)
    assert rc == 0 and inst[PACKAGE] == NEWER, said


@needs_apt
def test_the_locked_version_installs(apt: Apt, rendered, facts, locked) -> None:
    apt.pins(_role_pins(rendered, facts))
    rc, inst, said = apt.simulate("install", *_role_install(facts))
    assert rc == 0 and inst[PACKAGE] == locked, said
    assert OTHER_EDITION not in inst, said


@needs_apt
def test_asked_for_without_a_version_it_stays_on_the_lock(apt: Apt, rendered, facts, locked) -> None:
    apt.pins(_role_pins(rendered, facts))
    rc, inst, said = apt.simulate("install", PACKAGE)
    assert rc == 0 and inst[PACKAGE] == locked, said


@needs_apt
def test_apt_sees_the_locked_version_at_1001_and_no_other(apt: Apt, rendered, facts, locked) -> None:
    apt.pins(_role_pins(rendered, facts))
    policy = apt.run("apt-cache", "policy", PACKAGE).stdout
    table = dict(re.findall(r"^ {5}(\S+) (-?\d+)$", policy.replace(" *** ", "     "), re.M))
    assert table == {locked: "1001", NEWER: "-1"}, policy


@needs_apt
def test_the_other_edition_is_refused(apt: Apt, rendered, facts) -> None:
    """grafana-enterprise, same repository: no version of it is a candidate, so nothing swaps the edition."""
    apt.pins(_role_pins(rendered, facts))
    rc, inst, said = apt.simulate("install", OTHER_EDITION)
    assert rc != 0 and OTHER_EDITION not in inst and "no installation candidate" in said, said


def _installed_by_the_role(tmp_path: Path, apt: Apt, rendered, facts, hold: bool = True) -> Apt:
    """A target root where apt-get and dpkg really installed what the role installs, with the role's pin and its
    dpkg hold applied as its task states it."""
    target = Apt(tmp_path, apt.root / "repo")
    target.pins(_role_pins(rendered, facts))
    target.run("apt-get", "install", "-y", *_role_install(facts))
    held, selection = _role_hold(facts)
    assert held == [PACKAGE] and selection == "hold"
    if hold:
        subprocess.run(["dpkg", f"--admindir={target.admindir}", "--set-selections"], check=True, text=True,
                       input="".join(f"{p} {selection}\n" for p in held), capture_output=True)
    return target


@needs_apt
def test_another_version_is_refused(tmp_path: Path, apt: Apt, rendered, facts, locked) -> None:
    """On a controller the role installed, the newer release asked for by version is refused (the hold)."""
    target = _installed_by_the_role(tmp_path, apt, rendered, facts)
    res = target.run("apt-get", "install", "-y", f"{PACKAGE}={NEWER}", check=False)
    assert res.returncode != 0 and "held" in (res.stdout + res.stderr).lower(), res.stdout + res.stderr
    assert _installed(target)[PACKAGE] == locked


@needs_apt
@pytest.mark.parametrize(("pins_kept", "held"), [(True, True), (True, False), (False, True)],
                         ids=["pins-and-hold", "the-pins-alone", "the-hold-alone"])
def test_the_pin_survives_a_dist_upgrade(tmp_path: Path, apt: Apt, rendered, facts, locked, pins_kept: bool,
                                         held: bool) -> None:
    target = _installed_by_the_role(tmp_path, apt, rendered, facts, hold=held)
    assert _installed(target)[PACKAGE] == locked
    if not pins_kept:
        target.pins({})
    said = target.run("apt-get", "dist-upgrade", "-y").stdout
    assert _installed(target)[PACKAGE] == locked, said
    assert OTHER_EDITION not in _installed(target), said


# ---- the provisioning files, from the spec ---------------------------------------------------------------------

def _datasource(cluster: Cluster) -> dict:
    doc = yaml.safe_load(render_metrics(cluster)[GRAFANA_DATASOURCE])
    assert doc["apiVersion"] == 1 and len(doc["datasources"]) == 1
    return doc["datasources"][0]


@pytest.mark.parametrize(("metrics", "url"), [
    ({}, "http://ctl01:9090"),
    ({"prometheus_port": 19090}, "http://ctl01:19090"),
    ({"external_url": "https://ops.example.org/prometheus"}, "https://ops.example.org/prometheus"),
], ids=["the-controllers-prometheus", "a-moved-port", "the-sites-own-prometheus"])
def test_the_data_source_is_the_clusters_prometheus(metrics, url) -> None:
    cluster = _cluster(**metrics)
    ds = _datasource(cluster)
    facts = json.loads(render_metrics(cluster)[EXPORTERS])
    assert ds["url"] == url == facts["prometheus"]["url"] == facts["grafana"]["url"]
    assert ds["type"] == "prometheus" and ds["access"] == "proxy" and ds["isDefault"] is True
    assert ds["jsonData"]["timeInterval"] == f"{cluster.spec.metrics.scrape_interval}s"


def test_the_data_source_has_a_fixed_uid_grafana_takes() -> None:
    """The dashboards' `datasource` variable picks the default Prometheus data source: this one, under a uid that
    stays the same across renders and fits Grafana's 40 characters, even for the longest cluster name."""
    data = example_data("staging")
    data["name"] = "c" * 40
    data["metrics"] = {"grafana": True}
    ds = _datasource(compiled(spec_from_data(data)))
    assert len(ds["uid"]) <= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", ds["uid"]), ds["uid"]
    assert ds["uid"] == _datasource(compiled(spec_from_data(data)))["uid"]
    dashboard = json.loads(render_metrics(_cluster())["grafana-fleet.json"])
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert variable["type"] == "datasource" and variable["query"] == _datasource(_cluster())["type"]


def test_the_provider_loads_the_rendered_dashboards_from_the_folder_the_role_fills(rendered, facts) -> None:
    provider = yaml.safe_load(rendered[GRAFANA_PROVIDER])["providers"]
    assert len(provider) == 1 and provider[0]["type"] == "file"
    assert provider[0]["options"]["path"] == facts["grafana"]["dashboards_dir"]
    assert facts["grafana"]["dashboards"] == [name for _kind, name, _title in KINDS]
    assert all(name in rendered for name in facts["grafana"]["dashboards"])
    task = _task(TASKS, lambda t: t.get("name", "").endswith("the dashboards (rendered)"))
    dest = role_eval(task["ansible.builtin.copy"]["dest"], {"__metrics": facts, "item": "grafana-fleet.json"})
    assert str(dest) == f"{facts['grafana']['dashboards_dir']}/grafana-fleet.json"
    assert role_eval(task["loop"], {"__metrics": facts}) == facts["grafana"]["dashboards"]


@pytest.mark.parametrize("port", [3000, 13000])
def test_grafana_listens_on_the_specs_port(port) -> None:
    files = render_metrics(_cluster(grafana_port=port))
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(files[GRAFANA_DROPIN])
    assert unit["Service"]["Environment"] == f"GF_SERVER_HTTP_PORT={port}"
    assert json.loads(files[EXPORTERS])["grafana"]["port"] == port


def test_the_source_is_the_locks_and_signed_by_the_key_the_role_fetches(rendered, facts) -> None:
    fields = dict(line.split(": ", 1) for line in rendered[GRAFANA_SOURCES].splitlines()
                  if line and not line.startswith("#"))
    repo = GRAFANA.repository
    assert fields == {"Types": "deb", "URIs": repo.uri, "Suites": " ".join(repo.suites),
                      "Components": " ".join(repo.components), "Signed-By": facts["grafana"]["keyring"]}
    task = _task(TASKS, lambda t: "ansible.builtin.get_url" in t)
    assert role_eval(task["ansible.builtin.get_url"]["dest"], {"__metrics": facts}) == facts["grafana"]["keyring"]
    assert role_eval(task["ansible.builtin.get_url"]["url"], {"__metrics": facts}) == repo.key
    assert facts["grafana"]["probe"] == f"{repo.uri}/dists/{repo.suites[0]}/Release"


def test_without_grafana_nothing_of_it_is_rendered() -> None:
    data = example_data("staging")
    files = render_metrics(compiled(spec_from_data(data)))
    assert not {GRAFANA_DATASOURCE, GRAFANA_PROVIDER, GRAFANA_DROPIN, GRAFANA_PINS, GRAFANA_SOURCES} & set(files)
    assert json.loads(files[EXPORTERS])["grafana"] == {"enabled": False}


# ---- where the role puts it ------------------------------------------------------------------------------------

def _include_when() -> list:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    return next(t for t in tasks if t.get("ansible.builtin.include_tasks") == "grafana.yml")["when"]


@pytest.mark.parametrize(("metrics", "on_first"), [
    ({"grafana": True}, True),
    ({"grafana": True, "external_url": "http://prometheus.example.org:9090"}, True),
    ({}, False),
], ids=["beside-prometheus", "with-the-sites-prometheus", "not-asked-for"])
def test_grafana_goes_on_the_first_controller_only(metrics, on_first) -> None:
    """One Grafana a cluster (its own database holds users and preferences): the first controller, whether
    Prometheus runs on the controllers or is the site's own."""
    data = yaml.safe_load((FIXTURES / "cluster.yaml").read_text())  # two controllers
    data["metrics"] = {**data.get("metrics", {}), **metrics}
    cluster = compiled(spec_from_data(data))
    facts = json.loads(render_metrics(cluster)[EXPORTERS])
    controllers = [h for g in cluster.spec.groups_with_role("controller") for h in g.hosts]
    assert len(controllers) == 2
    hosts = [h for g in cluster.spec.node_groups for h in g.hosts]
    chosen = [h for h in hosts if all(role_eval(c, {"__metrics": facts, "inventory_hostname": h,
                                                    "groups": {"slurm_controller": controllers}})
                                      for c in _include_when())]
    assert chosen == ([controllers[0]] if on_first else [])


def test_every_file_the_grafana_tasks_read_is_rendered(rendered, facts) -> None:
    grafana = facts["grafana"]
    names = [grafana[k] for k in ("datasource", "provider", "dropin", "pins", "sources")] + grafana["dashboards"]
    assert all(n in rendered for n in names), [n for n in names if n not in rendered]
    text = TASKS.read_text()
    assert all(f"__metrics.grafana.{k}" in text for k in ("datasource", "provider", "dropin", "pins", "sources"))
