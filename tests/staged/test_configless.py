"""Configless Slurm on the staged cluster (docs/roles.md "Configless Slurm").

slurmctld serves slurm.conf, gres.conf, cgroup.conf and the topology file (SlurmctldParameters=enable_configless);
every compute node's slurmd runs with --conf-server and holds no /etc/slurm/slurm.conf. A slurm.conf change made
through `configure` changes files on the controllers only, and slurmctld's `scontrol reconfigure` brings it to
every slurmd. The checks are functions of a StagedHandle: the tests here run them on the session's
`staged_cluster` (Debian 12, Slurm 22.05); test_trixie.py runs the same ones on its `staged_trixie` (Debian 13,
Slurm 24.11), so no second cluster comes up for them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.staged

CONF_CACHE = "/run/slurm/conf"  # slurmd's link to SlurmdSpoolDir/conf-cache (22.05 and later)
PROPAGATION_S = 60  # the bound held to: every slurmd runs a new value within this


def _need_converged(c) -> None:
    if not c.first_configure.ok:
        pytest.fail(f"the first configure did not converge ({c.first_configure.failures}); see "
                    f"{c.first_configure.log_path}", pytrace=False)


def configless_compute(c) -> list[str]:
    """Compute nodes that hold no Slurm files (those that are not also controller, login or slurmdbd hosts)."""
    holders = set(c.hosts("slurm_controller") + c.hosts("slurm_login") + c.hosts("slurm_dbd"))
    return [h for h in c.hosts("slurm_compute") if h not in holders]


def show_config(c, host: str) -> dict[str, str]:
    """`scontrol show config` run on host, as {key: value}."""
    res = c.exec(host, "scontrol", "show", "config", check=True)
    return dict(re.findall(r"^(\S+)\s*=\s*(.*?)\s*$", res.stdout, re.M))


def check_no_slurm_config_on_any_compute_node(c) -> None:
    hosts = configless_compute(c)
    assert hosts, "the staged spec has no compute node that is only a compute node"
    held = {}
    for host in hosts:
        res = c.exec(host, "sh", "-c", "ls /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/cgroup.conf "
                     "/etc/slurm/topology.conf /etc/slurm/topology.yaml 2>/dev/null; true", check=True)
        if res.stdout.strip():
            held[host] = res.stdout.split()
    assert not held, f"configless compute nodes hold Slurm files slurmctld serves: {held}"


def check_scontrol_on_a_compute_node_answers_from_the_controller(c) -> None:
    """`scontrol show config` on a compute node works with no /etc/slurm there (the client reads slurmd's cache
    to find slurmctld), and what it prints is slurmctld's running config: its SLURM_CONF is the controller's
    file, which this node does not have; configless is on; the controller is the one the spec names."""
    host = configless_compute(c)[0]
    controller = c.hosts("slurm_controller")[0]
    conf = show_config(c, host)
    served_from = conf.get("SLURM_CONF", "")
    assert c.exec(host, "test", "-e", served_from).returncode != 0, (
        f"{host}: {served_from} exists on the node: the answer may not be slurmctld's")
    assert c.exec(controller, "test", "-f", served_from).returncode == 0, f"{controller} has no {served_from}"
    assert c.exec(host, "test", "-f", f"{CONF_CACHE}/slurm.conf").returncode == 0, f"{host}: no {CONF_CACHE}"
    assert "enable_configless" in conf.get("SlurmctldParameters", ""), conf.get("SlurmctldParameters")
    assert conf.get("SlurmctldHost[0]", "").split("(")[0] == controller, conf.get("SlurmctldHost[0]")
    assert conf.get("ClusterName") == c.spec.name
    unit = c.exec(host, "systemctl", "show", "slurmd", "-p", "ExecStart", check=True).stdout
    assert f"--conf-server {controller}:" in unit, f"{host}: slurmd is not started with --conf-server: {unit}"


def _inventory_with(c, tmp_path: Path, name: str, parameters: dict) -> Path:
    """An inventory of the staged spec with slurm.parameters set (a tmp copy of the spec; its own state folder)."""
    data = yaml.safe_load(Path(c.spec_path).read_text())
    data["slurm"]["parameters"] = {**data["slurm"].get("parameters", {}), **parameters}
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = tmp_path / f"inventory-{name}"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "inventory", str(spec), "-o", str(inv),
                          "--ssh-config", str(c.staged.ssh_config), "--state-dir", str(tmp_path / f"state-{name}")],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    return inv


def _configure(c, inv: Path, label: str):
    from gpucluster.configure import configure, summary

    lines: list[str] = []
    result = configure(inv, secrets=c.secrets_file, tags="slurm", log=lines.append)
    (c.logs / f"configless-{label}.log").write_text("\n".join(lines) + "\n" + summary(result))
    assert result.ok, f"configure ({label}) failed: {result.failures} (log {c.logs / f'configless-{label}.log'})"
    return result


def _wait_for_value(c, hosts: list[str], key: str, want: tuple[str, str]) -> tuple[dict, float]:
    """Until every host shows want = (key's value in slurmd's cached slurm.conf, in `scontrol show config` run
    there), or PROPAGATION_S passed; (what each host last showed, seconds)."""
    t0 = time.monotonic()
    seen: dict[str, tuple[str, str]] = {}
    while True:
        for host in hosts:
            if seen.get(host) != want:
                cached = c.exec(host, "sed", "-n", f"s/^{key}=//p", f"{CONF_CACHE}/slurm.conf").stdout.strip()
                seen[host] = (cached, show_config(c, host).get(key, ""))
        elapsed = time.monotonic() - t0
        if all(v == want for v in seen.values()) or elapsed > PROPAGATION_S:
            return seen, elapsed
        time.sleep(2)


def check_a_slurm_conf_change_visits_only_the_controllers(c, tmp_path: Path) -> float:
    """MaxArraySize through the spec and `configure --tags slurm`: files change on the controllers only, every
    configless slurmd holds and shows the value within PROPAGATION_S; then the session's spec again. Returns
    the seconds the new value took to reach every slurmd."""
    compute = configless_compute(c)
    holders = set(c.hosts("slurm_controller") + c.hosts("slurm_login") + c.hosts("slurm_dbd"))
    key, value = "MaxArraySize", "4567"  # applied by `scontrol reconfigure` (not a restart key)
    changed_inv = _inventory_with(c, tmp_path, "configless-changed", {key: value})
    try:
        result = _configure(c, changed_inv, "changed")
        changed = {h: t for h, t in result.changes.items() if t and h != "localhost"}
        assert changed, f"the change changed nothing: {result.changes}"
        assert set(changed) <= holders and not set(changed) & set(compute), (
            f"a slurm.conf change changed compute nodes: {changed}")
        assert set(c.hosts("slurm_controller")) <= set(changed), changed
        seen, elapsed = _wait_for_value(c, compute, key, (value, value))
        late = {h: v for h, v in seen.items() if v != (value, value)}
        assert not late, (f"after {elapsed:.0f}s these slurmd (cache, scontrol show config) lack {key}={value}: "
                          f"{late}")
        note = f"{key}={value} reached {len(compute)} slurmd in {elapsed:.1f}s\n"
        (c.logs / "configless-propagation.txt").write_text(note)
        reached = elapsed
    finally:
        # back to the session's spec (the other tests expect it); also only the controllers change
        restored = _configure(c, c.inventory.parent, "restored")
    changed = {h: t for h, t in restored.changes.items() if t and h != "localhost"}
    assert set(changed) <= holders, f"restoring slurm.conf changed compute nodes: {changed}"
    seen, _ = _wait_for_value(c, compute, key, ("", "1001"))  # gone from the cache; Slurm's default shown
    assert all(v == ("", "1001") for v in seen.values()), f"after restoring: {seen}"
    return reached


# ---------------------------------------------------------------- Debian 12, Slurm 22.05 (the session's cluster)


def test_no_slurm_config_on_any_compute_node(staged_cluster):
    _need_converged(staged_cluster)
    check_no_slurm_config_on_any_compute_node(staged_cluster)


def test_scontrol_on_a_compute_node_answers_from_the_controller(staged_cluster):
    _need_converged(staged_cluster)
    check_scontrol_on_a_compute_node_answers_from_the_controller(staged_cluster)


@pytest.mark.disruptive  # changes slurm.conf for a while, then restores it: after the session's other tests
def test_a_slurm_conf_change_visits_only_the_controllers_and_reaches_every_slurmd(staged_cluster, tmp_path):
    _need_converged(staged_cluster)
    check_a_slurm_conf_change_visits_only_the_controllers(staged_cluster, tmp_path)
