"""`gpucluster diff OLD NEW`: small edits of examples/staging.yaml, each with the class the key table and
Slurm's man pages give it (docs/operations.md, "What a change disrupts")."""

from __future__ import annotations

import json
from pathlib import Path

import hostlist
import pytest
from conftest import example_path

from gpucluster import slurmkeys
from gpucluster.cli import main
from gpucluster.cluster import load_cluster
from gpucluster.diff import CLASSES, diff_specs
from gpucluster.render import render_all

STAGING = example_path("staging").read_text()


def spec(tmp_path: Path, name: str, text: str, version: str = "22.05") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace('version: "22.05"', f'version: "{version}"', 1))
    return path


def with_parameters(text: str, **params) -> str:
    lines = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in params.items())
    return text.replace("  partitions:\n", f"  parameters:\n{lines}  partitions:\n", 1)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def by_what(result) -> dict[str, str]:
    return {c.what: c.cls for c in result.changes}


def test_the_same_spec_changes_nothing(tmp_path, capsys):
    a, b = spec(tmp_path, "a", STAGING), spec(tmp_path, "b", STAGING)
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["changes"] == [] and doc["class"] == "none"
    rc, out, _ = run(capsys, "diff", str(a), str(b))
    assert rc == 0 and "no change" in out


@pytest.mark.parametrize(("key", "value", "version"), [
    ("SchedulerParameters", "bf_continue,bf_interval=60", "22.05"),
    ("SlurmctldTimeout", 300, "22.05"),
    ("SchedulerType", "sched/builtin", "22.05"),
    ("SchedulerType", "sched/builtin", "24.11"),
    ("MpiDefault", "pmi2", "22.05"),
    ("MpiDefault", "pmi2", "26.05"),
    ("MaxJobCount", 50000, "23.02"),
    ("MaxJobCount", 50000, "23.11"),
])
def test_a_slurm_conf_key_takes_the_tables_class_for_the_new_release(tmp_path, key, value, version):
    a = spec(tmp_path, "a", STAGING, version)
    b = spec(tmp_path, "b", with_parameters(STAGING, **{key: value}), version)
    result = diff_specs(a, b)
    want = {slurmkeys.RECONFIGURE: "reconfigure", slurmkeys.RESTART_SLURMCTLD: "restart-slurmctld",
            slurmkeys.RESTART_SLURMD: "restart-slurmd", slurmkeys.RESTART: "restart-slurmd"}[
        slurmkeys.change_class(key, version)]
    assert by_what(result) == {f"slurm.conf {key}": want}
    change = result.changes[0]
    assert change.new == str(value) and change.source
    hosts = set(change.hosts)
    cluster = load_cluster(b)
    if want == "restart-slurmctld":
        assert hosts == {g.hostlist for g in cluster.spec.node_groups if g.role == "controller"}
    elif want == "restart-slurmd":
        assert {g.hostlist for g in cluster.spec.node_groups if g.role == "compute"} <= hosts


def test_a_select_type_change_loses_jobs_so_it_drains_everything(tmp_path):
    a = spec(tmp_path, "a", STAGING, "24.11")
    b = spec(tmp_path, "b", with_parameters(STAGING, SelectType="select/linear"), "24.11")
    change = diff_specs(a, b).changes[0]
    assert (change.what, change.cls) == ("slurm.conf SelectType", "drain")
    assert "will be lost" in change.source and "gpu[01-04]" in change.hosts


def test_scheduler_type_is_a_restart_on_2205_and_a_reconfigure_from_2311(tmp_path):
    classes = [by_what(diff_specs(spec(tmp_path, f"a{v}", STAGING, v),
                                  spec(tmp_path, f"b{v}", with_parameters(STAGING, SchedulerType="sched/builtin"), v)))
               for v in ("22.05", "24.11")]
    assert classes == [{"slurm.conf SchedulerType": "restart-slurmctld"},
                       {"slurm.conf SchedulerType": "reconfigure"}]


@pytest.mark.parametrize(("version", "want"), [("22.05", "restart-slurmd"), ("23.02", "restart-slurmd"),
                                               ("23.11", "reconfigure"), ("26.05", "reconfigure")])
def test_adding_nodes_per_release(tmp_path, version, want):
    a = spec(tmp_path, "a", STAGING, version)
    b = spec(tmp_path, "b", STAGING.replace("    count: 4\n", "    count: 6\n", 1), version)
    result = diff_specs(a, b)
    classes = by_what(result)
    assert classes["slurm.conf node definitions (NodeName lines)"] == want
    added = next(c for c in result.changes if c.kind == "hosts")
    assert added.hosts == ("gpu05", "gpu06") and added.cls == "none"
    assert classes["partition gpu changed"] == "reconfigure"


def test_removing_nodes_drains_them_first(tmp_path):
    result = diff_specs(spec(tmp_path, "a", STAGING), spec(tmp_path, "b", STAGING.replace("    count: 4\n",
                                                                                           "    count: 3\n", 1)))
    removed = next(c for c in result.changes if c.kind == "hosts")
    assert removed.hosts == ("gpu04",) and removed.cls == "drain"


def test_a_partition_removed_is_drained_and_a_changed_one_reconfigures(tmp_path):
    debug = '    - name: debug\n      groups: [gpu]\n      max_time: "0:30:00"\n'
    two = STAGING.replace('      max_time: "1:00:00"\n', '      max_time: "1:00:00"\n' + debug, 1)
    assert two != STAGING
    result = diff_specs(spec(tmp_path, "a", two), spec(tmp_path, "b", STAGING))
    assert by_what(result)["partition debug removed"] == "drain"
    longer = STAGING.replace('max_time: "1:00:00"', 'max_time: "2:00:00"', 1)
    assert by_what(diff_specs(spec(tmp_path, "c", STAGING), spec(tmp_path, "d", longer))) == {
        "partition gpu changed": "reconfigure"}


def test_a_driver_branch_is_a_reboot_of_its_group_only(tmp_path):
    newer = STAGING.replace("fabric:\n", 'drivers:\n  branch: "580"\nfabric:\n', 1)
    result = diff_specs(spec(tmp_path, "a", STAGING), spec(tmp_path, "b", newer))
    driver = [c for c in result.changes if c.kind == "driver"]
    assert [(c.cls, c.hosts) for c in driver] == [("reboot", ("gpu[01-04]",))]
    assert result.cls == "reboot"


def test_a_slurm_upgrade_drains_and_every_changed_file_is_named(tmp_path, capsys):
    a, b = spec(tmp_path, "a", STAGING), spec(tmp_path, "b", STAGING, "24.11")
    result = diff_specs(a, b)
    assert by_what(result)["Slurm 22.05 -> 24.11"] == "drain"
    ra, rb = (render_all(load_cluster(p), cabling=False) for p in (a, b))
    text = {n: (v if isinstance(v, str) else "".join(v())) for n, v in ra.items()}
    changed = {n for n, v in rb.items() if text.get(n) != (v if isinstance(v, str) else "".join(v()))}
    assert changed and changed <= {c.target for c in result.changes}


def test_the_json_contract(tmp_path, capsys):
    a = spec(tmp_path, "a", STAGING)
    b = spec(tmp_path, "b", with_parameters(STAGING.replace("    count: 4\n", "    count: 5\n", 1),
                                            SchedulerType="sched/builtin"))
    rc, out, _ = run(capsys, "diff", str(a), str(b), "--json")
    doc = json.loads(out)
    assert rc == 0
    assert set(doc) == {"contract", "old", "new", "slurm_version", "class", "classes", "changes", "running"}
    assert doc["contract"] == 1 and doc["classes"] == list(CLASSES)
    assert doc["running"] == {"asked": False, "reached": False, "error": None, "jobs": None}
    assert doc["slurm_version"] == {"old": "22.05", "new": "22.05"}
    for change in doc["changes"]:
        assert set(change) == {"what", "kind", "target", "class", "action", "groups", "hosts", "old", "new",
                               "source", "jobs"}
        assert change["jobs"] is None  # no --inventory: not known, never an empty list
        assert change["class"] in CLASSES
    assert doc["class"] == max((c["class"] for c in doc["changes"]), key=CLASSES.index)
    rc, out, _ = run(capsys, "diff", str(a), str(b))
    assert rc == 0 and "slurm.conf SchedulerType" in out and "least disruptive" in out


def test_a_bad_spec_is_exit_2_located(tmp_path, capsys):
    a = spec(tmp_path, "a", STAGING)
    b = spec(tmp_path, "b", with_parameters(STAGING, SlurmctldDebug="info HealthCheckInterval=7"))
    rc, _, err = run(capsys, "diff", str(a), str(b))
    assert rc == 2 and f"{b}:" in err and "slurm.parameters.SlurmctldDebug" in err


# ---- the classes on the real daemons ----------------------------------------------------------------------------

REAL_KEYS = {"SlurmctldTimeout": 333, "SchedulerType": "sched/builtin", "MaxJobCount": 54321}


def _show_config(cluster, key: str) -> str | None:
    import re

    m = re.search(rf"^{key}\s*=\s*(\S+)", cluster.scontrol("show", "config"), flags=re.M)
    return m.group(1) if m else None


@pytest.mark.slurm
@pytest.mark.parametrize("line", ["22.05", "24.11", "26.05"])
def test_the_named_class_is_enough_and_not_more_on_the_real_slurmctld(line, tmp_path):
    """Each key diff calls `reconfigure` is live after `scontrol reconfigure`; each it calls a restart is not
    (22.05: "SchedulerType change requires restart of the slurmctld daemon", "MaxJobCount reset too high,
    restart slurmctld"). One slurmctld per line; the values come from diff, the classes from the key table."""
    import re
    import time

    from test_slurm_versions_real import need

    from gpucluster.emulate import SlurmCluster
    from gpucluster.render import write_outputs

    need(line)
    a = spec(tmp_path, "a", STAGING, line)
    b = spec(tmp_path, "b", with_parameters(STAGING, **REAL_KEYS), line)
    changes = {c.what.split()[-1]: c for c in diff_specs(a, b).changes}
    assert set(changes) == set(REAL_KEYS)
    conf = tmp_path / "conf"
    write_outputs(render_all(load_cluster(a), cabling=False), conf)
    with SlurmCluster(conf, line=line, start_timeout=120) as cluster:
        before = {k: _show_config(cluster, k) for k in REAL_KEYS}
        text = cluster.conf_path.read_text()
        for key, change in changes.items():
            text = re.sub(rf"^{key}=.*$", f"{key}={change.new}", text, flags=re.M)
        cluster.conf_path.write_text(text)
        cluster.run(["scontrol", "reconfigure"], timeout=60)
        deadline = time.monotonic() + 20
        while _show_config(cluster, "SlurmctldTimeout") == before["SlurmctldTimeout"] and time.monotonic() < deadline:
            time.sleep(0.2)
        after = {k: _show_config(cluster, k) for k in REAL_KEYS}
    for key, change in changes.items():
        live = after[key] != before[key] and str(change.new) in after[key]
        assert live == (change.cls == "reconfigure"), (line, key, change.cls, before[key], after[key])
    assert {c.cls for c in changes.values()} == ({"reconfigure", "restart-slurmctld"} if line == "22.05"
                                                 else {"reconfigure"})


@pytest.mark.slurm
@pytest.mark.parametrize("line", ["22.05", "24.11", "26.05"])
def test_adding_nodes_needs_what_diff_says_on_the_real_slurmctld(line, tmp_path):
    """Two nodes added, then `scontrol reconfigure`: 22.05's slurmctld stops ("fatal: MaxNodeCount has changed
    (4->6) during reconfig, slurmctld must be restarted"), so diff must say restart; 24.11 and 26.05 take them."""
    import contextlib
    import time

    from test_slurm_versions_real import need

    from gpucluster.emulate import SlurmCluster
    from gpucluster.render import write_outputs

    need(line)
    a = spec(tmp_path, "a", STAGING, line)
    b = spec(tmp_path, "b", STAGING.replace("    count: 4\n", "    count: 6\n", 1), line)
    nodes = next(c for c in diff_specs(a, b).changes if c.kind == "slurm-nodes")
    old, new = (load_cluster(p).spec.group("gpu") for p in (a, b))
    conf = tmp_path / "conf"
    write_outputs(render_all(load_cluster(a), cabling=False), conf)
    with SlurmCluster(conf, line=line, start_timeout=120) as cluster:
        assert sorted(cluster.nodes()) == list(old.hosts)
        cluster.conf_path.write_text(cluster.conf_path.read_text().replace(old.hostlist, new.hostlist))
        cluster.run(["scontrol", "reconfigure"], timeout=60)
        seen: list[str] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and seen != list(new.hosts):
            time.sleep(0.3)
            if "fatal:" in cluster.ctld_log.read_text():
                break  # 22.05: the controller stopped; asking it would only wait for a timeout
            with contextlib.suppress(Exception):
                seen = sorted(cluster.nodes())
    assert (seen == list(new.hosts)) == (nodes.cls == "reconfigure"), (line, nodes.cls, seen)


def test_configless_a_served_file_visits_only_the_controllers_but_a_slurmd_restart_visits_the_nodes(tmp_path):
    """slurmctld serves slurm.conf to every slurmd (configless, the rendered SlurmctldParameters): a reconfigure
    change copies to the controllers only; a change slurmd reads at start (MpiDefault) still restarts it on
    every compute node."""
    old = load_cluster(spec(tmp_path, "a", STAGING))
    controllers = tuple(sorted(old.contract_groups["slurm_controller"]))
    compute = set(old.contract_groups["slurm_compute"])
    new = spec(tmp_path, "b", with_parameters(STAGING, MaxArraySize=4321, MpiDefault="pmi2"))
    got = {c.what: c for c in diff_specs(spec(tmp_path, "a", STAGING), new).changes}
    reconf, restart = got["slurm.conf MaxArraySize"], got["slurm.conf MpiDefault"]
    assert (reconf.cls, reconf.groups, reconf.hosts) == ("reconfigure", ("slurm_controller", "slurm_login"),
                                                         controllers)
    assert restart.cls == "restart-slurmd" and "slurm_compute" in restart.groups
    assert compute <= {h for expr in restart.hosts for h in hostlist.expand_hostlist(expr)}
