"""`gpucluster validate` on the staged cluster of examples/staging.yaml (the session's staged_cluster).

1. The full suite passes; hardware checks skip with "no GPU" / "no HCA"; the staging profile shows up
   as differences from production, not as passes.
2. A broken node makes the right checks fail with messages naming it: slurmd stopped, then a wrong
   munge key (each restored afterwards, and the cluster waited on until Slurm sees it healthy).
3. --via-slurm: compute nodes validated inside a Slurm job, one result file per node, merged.

The command under test is the real CLI, in a subprocess, as a user types it. Expected values (hosts,
groups, the profile differences) come from the spec, the plan and the renderer.
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.render.fileset import profile_differences
from gpucluster.render.topology import slurm_switches
from gpucluster.validate.report import parse_junit

pytestmark = pytest.mark.staged

SPEC = Path(__file__).resolve().parents[2] / "examples" / "staging.yaml"
_CLUSTER = load_cluster(SPEC)
_SPEC, _PLAN = _CLUSTER.spec, _CLUSTER.plan
ALL_HOSTS = sorted(h for g in _SPEC.node_groups for h in g.hosts)
COMPUTE = [h for g in _SPEC.groups_with_role("compute") for h in g.hosts]
CONTROLLER = _SPEC.groups_with_role("controller")[0].hosts[0]


def _validate(cluster, tmp_path: Path, *args: str, timeout: float = 900) -> tuple[int, str, list]:
    """Run `gpucluster validate INVENTORY ARGS --junit ...`; returns (exit status, stdout, results)."""
    junit = tmp_path / f"validate-{time.monotonic_ns()}.xml"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "validate", str(cluster.inventory.parent),
                          "--junit", str(junit), *args], capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL, check=False)
    assert junit.exists(), (f"validate wrote no JUnit (exit {res.returncode}):\n{res.stdout[-3000:]}\n"
                            f"{res.stderr[-3000:]}")
    return res.returncode, res.stdout + res.stderr, parse_junit(junit)


def _need_configured(cluster) -> None:
    if not cluster.first_configure.ok:
        pytest.fail(f"the staged cluster did not converge (configure exit {cluster.first_configure.rc}; "
                    f"log {cluster.first_configure.log_path}): nothing to validate", pytrace=False)


def _slurm_healthy(cluster, timeout: float = 300) -> None:
    """Until slurmctld sees every compute node up (idle, alloc or mix; no '*'), so a test leaves the
    cluster as it found it."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        res = cluster.ssh(CONTROLLER, "sinfo -h -N -o '%N %t'", timeout=60)
        states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
        if all(states.get(h, "?").rstrip("+") in ("idle", "alloc", "mix") for h in COMPUTE):
            return
        for h, st in states.items():
            if st.startswith(("down", "drain")) and h in COMPUTE:
                cluster.ssh(CONTROLLER, f"scontrol update nodename={h} state=resume", timeout=60)
        time.sleep(3)
    raise AssertionError(f"Slurm did not see every compute node healthy within {timeout:.0f}s: {states}")


def _failed(results) -> dict[tuple[str, str], str]:
    return {(r.name, r.host): r.message for r in results if r.outcome == "failed"}


# ------------------------------------------------------------------ 1. the full suite


def test_full_suite_passes_on_the_staged_cluster(staged_cluster, tmp_path):
    _need_configured(staged_cluster)
    _slurm_healthy(staged_cluster)
    html = tmp_path / "validate.html"
    rc, out, results = _validate(staged_cluster, tmp_path, "-n", "4", "--probes", "--html", str(html))
    failed = _failed(results)
    assert rc == 0 and not failed, ("failed checks:\n" + "\n".join(f"{k}: {v[:600]}" for k, v in failed.items())
                                    + f"\n\n{out[-3000:]}")
    assert "\nPASSED" in out
    # every host of the spec was validated, under the inventory's groups
    assert sorted({r.host for r in results}) == ALL_HOSTS
    groups = {r.group for r in results}
    assert {"all", "slurm_controller", "slurm_dbd", "slurm_compute", "flash_client", "nfs_server",
            "nfs_client", "gpu_nvidia", "fabric_roce"} <= groups
    # the checks that matter ran and passed on every node they apply to
    passed = {(r.test, r.host) for r in results if r.outcome == "passed"}
    for h in COMPUTE:
        for test in ("test_node_known_and_usable", "test_node_gres", "test_slurmd_answers",
                     "test_munge_key_matches_cluster", "test_flash_read_write",
                     "test_flash_same_content_across_nodes"):
            assert (test, h) in passed, f"{test} did not pass on {h}"
    assert ("test_foreign_munge_key_cannot_register", COMPUTE[0]) in passed
    switches = {r.item for r in results if r.test == "test_topology_switch" and r.outcome == "passed"}
    assert switches == {s.name for s in slurm_switches(_PLAN)}
    # hardware checks skip, each with its reason
    for r in results:
        if r.group in ("gpu_nvidia", "gpu_amd") and r.test.startswith(("test_gpu_", "test_nccl_all_reduce")):
            assert r.outcome == "skipped" and "no GPU" in r.message, (r.name, r.host, r.outcome, r.message)
        if r.group in ("fabric_roce", "fabric_ib"):
            assert r.outcome == "skipped" and "no HCA" in r.message, (r.name, r.host, r.outcome, r.message)
    assert all(r.message for r in results if r.outcome == "skipped"), "a skip without a reason"
    # the staging profile is reported as a difference, key by key, never passed silently
    differs = {r.item for r in results if r.outcome == "differs"}
    assert differs == {d["key"] for d in profile_differences(_CLUSTER)}
    assert "differs from production" in out
    text = html.read_text()
    assert all(f'id="host-{h}"' in text for h in ALL_HOSTS) and "no GPU" in text


# ------------------------------------------------------------------ 2. broken nodes


@pytest.mark.disruptive
def test_stopped_slurmd_fails_the_right_checks_naming_the_host(staged_cluster, tmp_path):
    _need_configured(staged_cluster)
    victim = COMPUTE[1]
    staged_cluster.ssh(victim, "systemctl stop slurmd", timeout=120)
    try:
        rc, out, results = _validate(staged_cluster, tmp_path, "--limit", victim, "-n", "2")
    finally:
        staged_cluster.ssh(victim, "systemctl start slurmd", timeout=120)
    failed = _failed(results)
    assert rc == 1
    must = {("test_service_active[slurmd]", victim), ("test_slurmd_answers", victim)}
    assert must <= set(failed), f"expected {must} among failures; got {sorted(failed)}\n{out[-2000:]}"
    # slurmctld may or may not have noticed yet (SlurmdTimeout); nothing else may fail
    assert set(failed) <= must | {("test_node_known_and_usable", victim)}, sorted(failed)
    for (_name, host), message in failed.items():
        assert message.startswith(f"{host}: "), message
    assert "journal lines of slurmd" in failed[("test_service_active[slurmd]", victim)]  # the unit's journal
    assert f"FAILING HOSTS (1):\n  {victim}: " in out
    _slurm_healthy(staged_cluster)


@pytest.mark.disruptive
def test_wrong_munge_key_fails_the_right_checks_naming_the_host(staged_cluster, tmp_path):
    _need_configured(staged_cluster)
    victim = COMPUTE[-1]
    key = "/etc/munge/munge.key"
    backup = "/root/.gpucluster-test-munge.key"
    staged_cluster.ssh(victim, f"cp -p {key} {backup} && dd if=/dev/urandom of={key} bs=1024 count=1 status=none "
                               f"&& chown munge:munge {key} && chmod 0400 {key} && systemctl restart munge",
                       check=True, timeout=120)
    try:
        rc, out, results = _validate(staged_cluster, tmp_path, "--limit", f"{victim},{CONTROLLER}", "-n", "2")
    finally:
        staged_cluster.ssh(victim, f"cp -p {backup} {key} && rm -f {backup} && systemctl restart munge "
                                   "&& systemctl restart slurmd", check=True, timeout=120)
    failed = _failed(results)
    assert rc == 1
    assert ("test_munge_key_matches_cluster", victim) in failed, f"{sorted(failed)}\n{out[-2000:]}"
    message = failed[("test_munge_key_matches_cluster", victim)]
    assert message.startswith(f"{victim}: munge key differs from the cluster's"), message
    assert {h for _n, h in failed} == {victim}, sorted(failed)  # the controller and its key are fine
    # the key itself never appears: only 8 hex digits of its hash
    secret = (staged_cluster.state_dir / "secrets" / "munge.key").read_bytes()
    assert secret.hex()[:16] not in out
    _slurm_healthy(staged_cluster)


# ------------------------------------------------------------------ 3. --via-slurm


def test_via_slurm_runs_the_compute_checks_inside_a_job(staged_cluster, tmp_path):
    _need_configured(staged_cluster)
    _slurm_healthy(staged_cluster)
    junit = tmp_path / "via-slurm.xml"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "validate", str(staged_cluster.inventory.parent),
                          "--via-slurm", "-n", "3", "--junit", str(junit)], capture_output=True, text=True,
                         timeout=1200, stdin=subprocess.DEVNULL, check=False)
    results = parse_junit(junit)
    failed = _failed(results)
    assert res.returncode == 0 and not failed, "\n".join(f"{k}: {v[:400]}" for k, v in failed.items()) + res.stdout
    assert f"{len(COMPUTE)} nodes in job" in res.stdout
    # one suite per node from the job, plus the SSH suite for the hosts outside Slurm
    suites = {s.get("name") for s in ET.parse(junit).getroot().iter("testsuite")}
    assert suites == {"ssh"} | {f"slurm:{h}" for h in COMPUTE}
    for h in COMPUTE:
        mine = [r for r in results if r.host == h]
        assert mine and all(r.source == f"slurm:{h}" for r in mine), h
        assert any(r.test == "test_flash_same_content_across_nodes" and r.outcome == "passed" for r in mine), h
    others = [r for r in results if r.host not in COMPUTE]
    assert {r.host for r in others} == set(ALL_HOSTS) - set(COMPUTE)
    assert all(r.source == "ssh" for r in others)
    # the job went through slurmctld and accounting, and the run folder on the flash tier is gone
    acct = staged_cluster.ssh(CONTROLLER, "sacct -n -X -P -S now-1hour -o JobName,State,NNodes", timeout=60)
    jobs = acct.stdout.splitlines()
    assert any(line.startswith(f"gpucluster-validate|COMPLETED|{len(COMPUTE)}") for line in jobs), acct.stdout
    mount = _SPEC.storage.flash.mount
    left = staged_cluster.ssh(COMPUTE[0], f"ls -A {mount}/.gpucluster-validate 2>/dev/null", timeout=60).stdout.split()
    assert not left, f"left on the flash tier: {left}"
