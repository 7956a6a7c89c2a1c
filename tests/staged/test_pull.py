"""Converging the staged cluster by pull (docs/roles.md "Converging a fleet").

On the Debian 13 cluster, the session's `staged_trixie` (converged by push from the production path's inventory
and secrets file, which installed the pull runner: site.yml's pull play). It runs there to balance the two
clusters' workers: the Debian 12 cluster carries the health, storage and validate tests.
a pull of the fleet changes nothing and every host reports the bundle the operator built; a change to the NCCL
settings in the spec reaches every GPU node by pull (and only them), then the session's spec again.
No second cluster comes up. Measured on the shared 2-core development machine at load 25-30: the no-op pull took
330-377 s and the NCCL change and its restore 178 s. A push no-op took 446 s there, against 122-130 s in CI,
so expect about 3 minutes in CI (an estimate, not measured there), most of it the nodes' own Ansible.

The fast no-op (gpucluster-pull's manifest): the first pull here is a full run on every host and records each
node's manifest; the second verifies it and skips Ansible everywhere; a hand edit of /etc/nccl.conf on one node
makes the next no-op pull run the roles there only, which restore the file. Their cost: one pull with no
Ansible anywhere (the bundle's build and publication, one ssh per host) and one node's full run alone, about
1.5 minutes more in CI (an estimate from the figures above, not measured there).

The timer (--trigger timer): every fleet node's gpucluster-pull.timer picks up the operator's signed pointer
within its interval (60 s plus up to 30 s), verifies its manifest and reports back to the bundle server.
About 1.5 minutes (73.5 s measured), most of it waiting for the ticks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.staged


def _need_converged(c) -> None:
    if not c.first_configure.ok:
        pytest.fail(f"the first configure did not converge ({c.first_configure.failures}); see "
                    f"{c.first_configure.log_path}", pytrace=False)


def _pull(c, inventory: Path, label: str, **kwargs):
    from gpucluster.configure.pull import pull, summary

    lines: list[str] = []
    values = None
    if c.secrets_file:
        from gpucluster.configure.secrets import checked_secrets

        values, _raw = checked_secrets(c.secrets_file)
    result = pull(inventory, secrets=values, log=lines.append, **kwargs)
    (c.logs / f"pull-{label}.log").write_text("\n".join(lines) + "\n" + summary(result) + "\n")
    return result


def _bundle_hash(c, inventory: Path) -> str:
    import json

    from gpucluster.inventory.reader import load_inventory
    from gpucluster.inventory.statedir import state_dirs

    state, _ = state_dirs(load_inventory(inventory).vars)
    return json.loads((state / "bundles" / "current.json").read_text())["hash"]


def _inventory_with_qps(c, tmp_path: Path, qps: int) -> Path:
    """An inventory of a copy of the staged spec whose fabric asks NCCL for `qps` queue pairs per connection."""
    data = yaml.safe_load(Path(c.spec_path).read_text())
    data["fabric"]["qps_per_connection"] = qps
    spec = tmp_path / "nccl-changed.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = tmp_path / "inventory-nccl-changed"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "inventory", str(spec), "-o", str(inv),
                          "--ssh-config", str(c.staged.ssh_config), "--state-dir", str(tmp_path / "state-nccl")],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    return inv


def test_a_pull_of_a_converged_cluster_changes_nothing_and_reports_the_bundle(staged_trixie):
    c = staged_trixie
    _need_converged(c)
    result = _pull(c, c.inventory, "noop")
    from gpucluster.configure.pull import fleet
    from gpucluster.inventory.reader import load_inventory

    want, _push = fleet(load_inventory(c.inventory))
    assert sorted(result.hosts) == sorted(want) and set(c.hosts("gpu_nvidia")) <= set(result.hosts)
    failed = {h: r.error for h, r in result.hosts.items() if r.failed}
    assert not failed, f"pull failed on {failed} (log {c.logs / 'pull-noop.log'})"
    changed = {h: r.changes for h, r in result.hosts.items() if r.changed}
    assert not changed, f"a pull of a converged cluster changed {changed}"
    built = _bundle_hash(c, c.inventory)
    assert {r.bundle for r in result.hosts.values()} == {built} == {result.bundle}


def test_a_second_noop_pull_verifies_each_nodes_manifest_and_skips_ansible(staged_trixie):
    """The first pull above was a full run on every host (no manifest yet); now each node verifies the manifest
    that run recorded (files by sha256, mode, owner; services active) and runs no Ansible."""
    c = staged_trixie
    _need_converged(c)
    result = _pull(c, c.inventory, "noop-fast")
    failed = {h: r.error for h, r in result.hosts.items() if r.failed}
    assert not failed, f"pull failed on {failed}"
    ran = {h: r.drift for h, r in result.hosts.items() if not r.unchanged}
    assert not ran, f"these hosts ran Ansible on a no-op pull of the bundle they last applied: {ran}"
    gpus = set(c.hosts("gpu_nvidia"))
    for host, r in result.hosts.items():  # measured: 43 files and 3 services on a GPU node, 7-11 and 2 elsewhere
        assert r.bundle == result.bundle and r.verified["files"] >= (20 if host in gpus else 1), (host, r)
        assert r.verified["services"] >= 1, (host, r)
        assert r.seconds < 10, f"{host}: the manifest check took {r.seconds} s"
    assert result.elapsed < 120, f"a fast no-op pull took {result.elapsed:.0f} s (log {c.logs / 'pull-noop-fast.log'})"


def test_a_hand_edit_on_one_node_runs_the_roles_there_only_and_is_restored(staged_trixie):
    c = staged_trixie
    _need_converged(c)
    edited = c.hosts("gpu_nvidia")[0]
    c.exec(edited, "sh", "-c", "echo 'NCCL_DEBUG=TRACE  # a hand edit' >> /etc/nccl.conf", check=True)
    result = _pull(c, c.inventory, "noop-drift")
    failed = {h: r.error for h, r in result.hosts.items() if r.failed}
    assert not failed, f"pull failed on {failed}"
    ran = {h for h, r in result.hosts.items() if not r.unchanged}
    assert ran == {edited}, {h: r.drift for h, r in result.hosts.items()}
    r = result.hosts[edited]
    assert any(d.startswith("/etc/nccl.conf: sha256") for d in r.drift), r.drift
    assert r.changed >= 1 and any("nccl" in t.lower() for t in r.changes), r.changes
    conf = c.exec(edited, "cat", "/etc/nccl.conf", check=True).stdout
    assert "hand edit" not in conf and "NCCL_IB_QPS_PER_CONNECTION=1" in conf, conf


def test_the_timer_converges_every_fleet_node_to_a_signed_pointer(staged_trixie):
    """--trigger timer: no ssh to any node. The pointer names the bundle the nodes last applied (the session's
    spec), so each node's tick verifies its manifest and reports "unchanged" to the bundle server, where this
    machine reads every result with one ssh per poll. (A forged, altered or replayed pointer:
    tests/test_pull_timer.py.)"""
    from gpucluster.configure.pull import fleet
    from gpucluster.inventory.reader import load_inventory

    c = staged_trixie
    _need_converged(c)
    want, push_only = fleet(load_inventory(c.inventory))
    for host in want:
        assert c.exec(host, "systemctl", "is-active", "gpucluster-pull.timer").stdout.strip() == "active", host
    for host in push_only:  # the hosts that hold the secrets never converge from a bundle
        assert c.exec(host, "systemctl", "is-active", "gpucluster-pull.timer").stdout.strip() != "active", host
    result = _pull(c, c.inventory, "timer", trigger="timer", wait=420)
    assert result.serial > 0 and sorted(result.hosts) == sorted(want)
    failed = {h: r.error for h, r in result.hosts.items() if r.failed}
    assert not failed, f"the timer did not converge {failed} (log {c.logs / 'pull-timer.log'})"
    assert {r.bundle for r in result.hosts.values()} == {result.bundle}
    ran = {h: r.drift for h, r in result.hosts.items() if not r.unchanged}
    assert not ran, f"these hosts ran Ansible for the bundle they last applied: {ran}"


@pytest.mark.disruptive  # the NCCL settings differ for a while, then the session's spec is pulled again
def test_an_nccl_change_reaches_every_gpu_node_by_pull(staged_trixie, tmp_path):
    c = staged_trixie
    _need_converged(c)
    gpus = c.hosts("gpu_nvidia")
    changed_inv = _inventory_with_qps(c, tmp_path, 2)
    try:
        result = _pull(c, changed_inv, "nccl-changed", tags="nccl")
        failed = {h: r.error for h, r in result.hosts.items() if r.failed}
        assert not failed, f"pull failed on {failed}"
        assert {h for h, r in result.hosts.items() if r.changed} == set(gpus), (
            {h: r.changes for h, r in result.hosts.items()})
        assert {r.bundle for r in result.hosts.values()} == {_bundle_hash(c, changed_inv)}
        for host in gpus:
            conf = c.exec(host, "cat", "/etc/nccl.conf", check=True).stdout
            assert "NCCL_IB_QPS_PER_CONNECTION=2" in conf, f"{host}: {conf}"
    finally:
        restored = _pull(c, c.inventory, "nccl-restored", tags="nccl")
    assert restored.ok and {h for h, r in restored.hosts.items() if r.changed} == set(gpus)
    for host in gpus:
        conf = c.exec(host, "cat", "/etc/nccl.conf", check=True).stdout
        assert "NCCL_IB_QPS_PER_CONNECTION=1" in conf, f"{host}: {conf}"
