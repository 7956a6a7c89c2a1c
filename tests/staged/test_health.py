"""Node health checks on the staged cluster of examples/staging.yaml: the passive and active checks.

The session's configure installed them (site.yml imports playbooks/health.yml), with the spec's short
interval (staging.yaml: health.interval 30 s; each check keeps its 20 s budget). Here:

1. Every compute node runs every check of its group and passes, the stand-ins included (GPU device files
   that are /dev/null, the kernel-NFS mount the nfs role skipped with a record); no node was drained by
   gpucluster while the rest of the suite ran jobs on them (checked after every other test of the session,
   so it is marked disruptive, though it breaks nothing).
2. Four faults at once, each on its own compute node: a stand-in GPU device file removed (unlinked; a hard
   link keeps it for the undo, as a container may not mknod), the flash tier
   unmounted, munged stopped (the node drains itself through a private munged), the slurmd spool's file
   system filled past health.min_free_pct (a small tmpfs mounted over SlurmdSpoolDir). Each node drains
   with `gpc:<check>: ...` (slurmctld's own time of the reason) within two HealthCheckInterval periods, or,
   for the flash mount and munged (a shared or transient cause), within health.fail_after + 1 of them;
   `gpucluster health status` shows them by reason and since when; undone, each resumes by itself.
3. A site check (installed through the role's slurm_health_site_checks, from host_vars) that sleeps past
   its budget drains its node with "timed out after 20s" while slurmd answers, slurmctld answers `scontrol
   ping` and a job runs on another node throughout; a node drained by hand meanwhile stays drained.

Everything broken is restored, and every node is idle before and after (the node-stop test runs later).
Expected values (hosts, devices, paths, thresholds, interval) come from the spec, the plan and the
rendered health config, never from copies.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.node.decide import PREFIX, is_drained, shared_cause
from gpucluster.node.slurmctl import parse_nodes
from gpucluster.render.health.config import STATE_DIR, node_config, stale_after, timer_period
from gpucluster.render.slurm import SPOOL_DIR

pytestmark = pytest.mark.staged

SPEC = Path(__file__).resolve().parents[2] / "examples" / "staging.yaml"
_CLUSTER = load_cluster(SPEC)
_SPEC = _CLUSTER.spec
HEALTH = _SPEC.health
INTERVAL = HEALTH.interval
CONTROLLER = sorted(_CLUSTER.contract_groups["slurm_controller"])[0]
COMPUTE = sorted(_CLUSTER.contract_groups["slurm_compute"])
GROUP = {h: g.name for g in _SPEC.groups_with_role("compute") for h in g.hosts}
CONFIG = {g.name: node_config(_CLUSTER, g.name) for g in _SPEC.groups_with_role("compute")}
SLURMCTLD_LOG = "/var/log/slurm/slurmctld.log"  # slurm.conf's SlurmctldLogFile (render/slurm.py)
SPOOL_MB = 16  # the tmpfs mounted over SlurmdSpoolDir to fill it


def _need_configured(cluster) -> None:
    if not cluster.first_configure.ok:
        pytest.fail(f"the staged cluster did not converge (configure exit {cluster.first_configure.rc}; "
                    f"log {cluster.first_configure.log_path}): no health checks to test", pytrace=False)


def _nodes(cluster) -> dict[str, dict[str, str]]:
    return parse_nodes(cluster.ssh(CONTROLLER, "scontrol show node -o", check=True, timeout=60).stdout)


def _state(cluster, host: str) -> dict:
    res = cluster.ssh(host, f"cat {STATE_DIR}/state.json", timeout=60)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def _epoch(cluster, slurm_time: str) -> float:
    """slurmctld's time of a reason ([user@2026-11-23T01:23:51]), as the controller's clock reads it."""
    return float(cluster.ssh(CONTROLLER, f"date -d '{slurm_time}' +%s", check=True).stdout)


def _wait(what: str, probe, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def _all_idle(cluster, timeout: float = 120) -> None:
    """Every compute node idle, nothing drained and nothing not responding: how a test finds the cluster
    and leaves it."""
    def idle():
        nodes = _nodes(cluster)
        return all(nodes.get(h, {}).get("State") == "IDLE" for h in COMPUTE) and nodes
    try:
        _wait("every compute node idle", idle, timeout, every=2)
    except AssertionError:
        nodes = _nodes(cluster)
        raise AssertionError("not every compute node is idle: " + "; ".join(
            f"{h} {nodes.get(h, {}).get('State')} {nodes.get(h, {}).get('reason', '')!r}" for h in COMPUTE)) from None


def _diagnose(cluster, host: str) -> str:
    """What the node's health runs say, for a failure message."""
    out = cluster.ssh(host, f"cat {STATE_DIR}/state.json; systemctl status gpucluster-health.timer --no-pager "
                            "| head -5; journalctl -u gpucluster-health.service -n 8 --no-pager", timeout=60)
    return out.stdout[-2500:] + out.stderr[-500:]


# ------------------------------------------------------------------ 1. healthy nodes stay in service


def test_slurm_runs_the_program_at_the_specs_interval(staged_cluster):
    _need_configured(staged_cluster)
    config = staged_cluster.ssh(CONTROLLER, "scontrol show config", check=True).stdout
    got = dict(re.findall(r"(?m)^(HealthCheck\w+)\s*=\s*(.+?)\s*$", config))
    assert got == {"HealthCheckInterval": f"{INTERVAL} sec", "HealthCheckNodeState": HEALTH.node_state,
                   "HealthCheckProgram": "/usr/local/sbin/gpucluster-health"}, got


@pytest.mark.parametrize("host", COMPUTE)
def test_every_check_passes_on_a_healthy_staged_node(staged_cluster, host):
    """The stand-ins pass as what they are: device files 1:3 counted as GPUs and said to be stand-ins,
    the NFS mount the nfs role skipped (no kernel NFS client in a container) passes with its record."""
    _need_configured(staged_cluster)
    config = CONFIG[GROUP[host]]
    newest = stale_after(INTERVAL) + timer_period(INTERVAL) + 5  # slurmd's runs, or else the timer's

    def recent() -> dict | None:
        state = _state(staged_cluster, host)
        return state if state.get("started", 0) > time.time() - newest else None

    state = _wait(f"{host}: a health run within {newest} s", recent, 2 * INTERVAL)
    checks = state["checks"]
    assert sorted(checks) == sorted(c["name"] for c in config["checks"]), _diagnose(staged_cluster, host)
    failed = {n: c["message"] for n, c in checks.items() if not c["ok"]}
    assert not failed, f"{host}: {failed}\n{_diagnose(staged_cluster, host)}"
    assert state["action"] == "none" and state["why"] == "all checks pass", state
    gpus = next(c for c in config["checks"] if c["name"] == "gpu-count")["count"]
    assert checks["gpu-count"]["message"] == (f"{gpus} of {gpus} GPUs (device files, no vendor tool; {gpus} "
                                              "stand-ins (character device 1:3), not GPUs)")
    nfs = [c for c in config["checks"] if c.get("skip_record")]
    for c in nfs:
        assert checks[c["name"]]["message"].startswith("not mounted, as the role recorded: "), checks[c["name"]]
    assert max(c["seconds"] for c in checks.values()) < HEALTH.check_timeout


@pytest.mark.disruptive
def test_no_healthy_node_was_drained_while_the_suite_ran_jobs(staged_cluster):
    """Runs after every non-disruptive test of the session (disruptive orders it last; it breaks nothing):
    slurmctld's log has no drain with a gpc: reason, so the checks left the suite's nodes alone."""
    _need_configured(staged_cluster)
    res = staged_cluster.ssh(CONTROLLER, f"grep -E 'reason set to: {PREFIX}' {SLURMCTLD_LOG} || true", check=True)
    assert res.stdout.strip() == "", f"gpucluster drained healthy staged nodes:\n{res.stdout[-2000:]}"
    _all_idle(staged_cluster)


# ------------------------------------------------------------------ 2. four faults, four nodes


@dataclass
class Fault:
    check: str  # the check that must fail
    host: str
    reason: str  # the node's reason starts with this
    undo: str = ""  # shell, as root on the host; set when broken
    broken_at: float = 0.0
    undone_at: float = 0.0
    drained_s: float | None = None
    resumed_s: float | None = None


def _gpu_fault(cluster, host: str) -> tuple[str, str]:
    """The last stand-in device file unlinked; a hard link under a hidden name (which the check does not
    count) keeps the node for the undo: a container may not mknod (its device cgroup says no)."""
    check = next(c for c in CONFIG[GROUP[host]]["checks"] if c["name"] == "gpu-count")
    dev = f"/dev/{check['device_prefix']}{check['device_first'] + check['count'] - 1}"
    keep = f"/dev/.gpc-health-test-{Path(dev).name}"
    return f"ln {dev} {keep} && rm {dev}", f"ln {keep} {dev} && rm {keep}"


def _flash_fault(cluster, host: str) -> tuple[str, str]:
    mount = _SPEC.storage.flash.mount
    unit = f"$(systemd-escape --path --suffix=mount {mount})"
    return f"systemctl stop {unit}", f"systemctl start {unit}"


def _spool_fault(cluster, host: str) -> tuple[str, str]:
    """A small tmpfs over SlurmdSpoolDir, holding the spool's files, filled to half the free space the
    check wants; undone by unmounting it (the spool underneath was never touched)."""
    leave = int(SPOOL_MB * 2**20 * HEALTH.min_free_pct / 100 / 2)
    do = (f"set -e; keep=$(mktemp -d); cp -a {SPOOL_DIR}/. $keep/; "
          f"mount -t tmpfs -o size={SPOOL_MB}m,mode=0755 gpc-health-test {SPOOL_DIR}; cp -a $keep/. {SPOOL_DIR}/; "
          f"rm -rf $keep; fallocate -l $(( $(stat -f -c '%a*%S' {SPOOL_DIR}) - {leave} )) "
          f"{SPOOL_DIR}/gpc-health-test.fill")
    return do, f"umount {SPOOL_DIR} || umount -l {SPOOL_DIR}"


FAULTS = {
    "gpu-count": (_gpu_fault, lambda c: f"gpc:gpu-count: {c['count'] - 1} of {c['count']} GPUs "
                                        f"(/dev/{c['device_prefix']}{c['device_first'] + c['count'] - 1} missing"),
    f"mount-{_SPEC.storage.flash.name}": (_flash_fault, lambda c: f"gpc:{c['name']}: {c['path']} not mounted"),
    "munge": (lambda cluster, host: ("systemctl stop munge", "systemctl start munge"),
              lambda c: "gpc:munge: munge -n failed: "),
    "disk-spool": (_spool_fault, lambda c: f"gpc:disk-spool: {c['path']} "),
}


@pytest.fixture(scope="module")
def faults(staged_cluster):
    """The four faults, made at once on four compute nodes (so their waits overlap); undone at the end
    whatever the tests did."""
    _need_configured(staged_cluster)
    assert len(COMPUTE) >= len(FAULTS), f"the staged spec has {len(COMPUTE)} compute nodes; these tests need 4"
    _all_idle(staged_cluster)
    made: dict[str, Fault] = {}
    try:
        for (check, (how, reason)), host in zip(FAULTS.items(), COMPUTE, strict=False):
            conf = next(c for c in CONFIG[GROUP[host]]["checks"] if c["name"] == check)
            do, undo = how(staged_cluster, host)
            fault = Fault(check, host, reason(conf), undo=undo)
            res = staged_cluster.ssh(host, f"{do} && date +%s.%N", timeout=120)
            made[check] = fault
            assert res.returncode == 0, f"{host}: `{do}` failed: {res.stderr[-800:]}"
            fault.broken_at = float(res.stdout.split()[-1])
        yield made
    finally:
        undo_all(staged_cluster, made)


def undo_all(cluster, made: dict[str, Fault]) -> None:
    """Undo every fault not undone yet; every undo is tried before a failure is reported."""
    failed = []
    for fault in made.values():
        if not fault.undone_at:
            res = cluster.ssh(fault.host, f"{fault.undo} && date +%s.%N", timeout=120)
            if res.returncode == 0:
                fault.undone_at = float(res.stdout.split()[-1])
            else:
                failed.append(f"{fault.host}: `{fault.undo}` failed: {res.stderr[-800:]}")
    assert not failed, "\n".join(failed)


@pytest.mark.disruptive
@pytest.mark.parametrize("check", FAULTS)
def test_a_broken_node_drains_with_the_check_in_its_reason(staged_cluster, faults, check):
    fault = faults[check]

    def drained():
        info = _nodes(staged_cluster).get(fault.host, {})
        return info if is_drained(info.get("State", "")) and info.get("reason", "").startswith(PREFIX) else None

    try:
        info = _wait(f"{fault.host} drained for {check}", drained, (runs_to_drain(check) + 1) * INTERVAL + 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(staged_cluster, fault.host)}") from None
    assert info["reason"].startswith(fault.reason), (info["reason"], fault.reason)
    assert info["reason_user"] == "root"
    fault.drained_s = _epoch(staged_cluster, info["reason_time"]) - fault.broken_at
    print(f"{fault.host}: {check} broken, drained {fault.drained_s:.0f} s later "
          f"(HealthCheckInterval {INTERVAL} s): {info['reason']}")
    # the reason's time has whole seconds; the break time is exact. The first run after the fault fails (within an
    # interval), and the node drains on the run that makes the check's failures in a row reach runs_to_drain.
    limit = (runs_to_drain(check) + 1) * INTERVAL + 1
    assert fault.drained_s <= limit, f"{fault.host} drained {fault.drained_s:.0f} s after the fault (limit {limit})"
    held = _state(staged_cluster, fault.host)["checks"][check].get("fails", 1)
    assert held >= runs_to_drain(check), (check, held)
    state = _state(staged_cluster, fault.host)
    assert not state["checks"][check]["ok"], state
    if check == "munge":  # its scontrol had no credential: the drain went through a private munged
        assert state.get("auth", "").startswith("private munged (the node's did not answer: "), state
        # each run stops its munged and removes its folder; one older than a run would be a leftover
        left = staged_cluster.ssh(fault.host, "find /run/gpucluster/health -mindepth 1 -maxdepth 1 -mmin +1",
                                  timeout=60).stdout.split()
        assert left == [], f"private munged folders left behind: {left}"
    logged = staged_cluster.ssh(CONTROLLER, f"grep -c 'node {fault.host} reason set to: {check_prefix(check)}' "
                                            f"{SLURMCTLD_LOG}", timeout=60)
    assert int(logged.stdout.strip() or 0) >= 1  # what test_no_healthy_node_was_drained... greps for


def runs_to_drain(check: str) -> int:
    """Failing runs in a row before a check drains: health.fail_after for a shared or transient cause (munge, the
    mounts: decide.HYSTERESIS), 1 for the rest."""
    return HEALTH.fail_after if shared_cause(check) else 1


def check_prefix(check: str) -> str:
    return f"{PREFIX}{check}:"


@pytest.mark.disruptive
def test_health_status_shows_the_drained_nodes_by_reason_and_since_when(staged_cluster, faults):
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "health", "status",
                          str(staged_cluster.inventory.parent)], capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    print(out)
    nodes = _nodes(staged_cluster)
    drained = [h for h in COMPUTE if is_drained(nodes[h]["State"])]
    assert f"drained: {len(drained)} of {len(COMPUTE)} nodes\n" in out
    for fault in faults.values():
        info = nodes[fault.host]
        assert info["reason"].startswith(fault.reason)
        block = (f"  {info['reason']}\n    {fault.host}: since {info['reason_time']} by root "
                 "(resumed by gpucluster when its checks pass)\n")
        assert block in out, f"no block for {fault.host}:\n{block}"
        assert re.search(rf"(?m)^  {fault.host} \[[A-Z_+*]*DRAIN[A-Z_+*]*\] \d+s ago: ", out), fault.host
        assert re.search(rf"(?m)^    FAIL {re.escape(fault.check)}: .+ \(since \d{{4}}-\d\d-\d\dT", out), fault.check


@pytest.mark.disruptive
def test_the_drained_nodes_show_in_prometheus(staged_cluster, faults):
    """Each broken node, drained, is in triage in Prometheus (the health runner's metrics through node_exporter) with
    its failing check at 0, within a check interval and a scrape interval of its drain (docs/metrics.md)."""
    from test_prometheus import SCRAPE, query

    for fault in faults.values():
        def seen(fault=fault):
            rows = query(staged_cluster, f'gpucluster_health_lifecycle{{instance="{fault.host}", state="triage"}} == 1')
            failing = query(staged_cluster, f'gpucluster_health_check_ok{{instance="{fault.host}", '
                                            f'check="{fault.check}"}} == 0')
            return rows and failing
        _wait(f"{fault.host} in triage in Prometheus", seen, INTERVAL + 2 * SCRAPE + 30, every=2)
        print(f"{fault.host}: {fault.check} broken, in triage in Prometheus {time.time() - fault.broken_at:.0f} s "
              f"after the fault (drained {fault.drained_s or 0:.0f} s after it; check interval {INTERVAL} s, scrape "
              f"{SCRAPE} s)")


@pytest.mark.disruptive
@pytest.mark.parametrize("check", FAULTS)
def test_an_undone_node_resumes_by_itself(staged_cluster, faults, check):
    undo_all(staged_cluster, faults)  # all at once (the first of these tests), so their waits overlap
    fault = faults[check]

    def back():
        info = _nodes(staged_cluster).get(fault.host, {})
        return info if info.get("State") == "IDLE" else None

    limit = (HEALTH.resume_after + 2) * INTERVAL + 60
    try:
        _wait(f"{fault.host} resumed after {check} was undone", back, limit)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(staged_cluster, fault.host)}") from None
    if fault.resumed_s is None:
        fault.resumed_s = time.time() - fault.undone_at
    print(f"{fault.host}: {check} undone, idle again within {fault.resumed_s:.0f} s "
          f"(resume_after {HEALTH.resume_after}, HealthCheckInterval {INTERVAL} s)")
    state = _state(staged_cluster, fault.host)
    assert state["checks"][check]["ok"], state["checks"][check]
    if check == "disk-spool":
        mounted = staged_cluster.ssh(fault.host, f"findmnt -n {SPOOL_DIR} || true", timeout=60).stdout
        assert mounted.strip() == "", f"the test's tmpfs is still on {SPOOL_DIR}: {mounted}"


@pytest.mark.disruptive
def test_every_node_idle_after_the_faults(staged_cluster, faults):
    undo_all(staged_cluster, faults)
    _all_idle(staged_cluster, timeout=(HEALTH.resume_after + 2) * INTERVAL + 60)
    drained = {c: f.drained_s for c, f in faults.items()}
    resumed = {c: f.resumed_s for c, f in faults.items()}
    print(f"drained after (s): {drained}; idle again after undoing (s): {resumed}")


# ------------------------------------------------------------------ 3. a check past its budget, a hand drain


SLEEPER = "50-sleepy.sh"


def _site_checks(cluster, host: str, checks: dict[str, str]) -> None:
    """slurm_health_site_checks for one host, set where an operator sets a host's role variable (host_vars
    beside the inventory), installed with playbooks/health.yml on that host alone."""
    host_vars = cluster.inventory.parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    path = host_vars / f"{host}.yml"
    if checks:
        path.write_text(json.dumps({"slurm_health_site_checks": checks}) + "\n")
    else:
        path.unlink(missing_ok=True)
    result = cluster.configure(playbook="health.yml", limit=host)
    assert result.ok, f"health.yml on {host} failed: {result.failures} (log {result.log_path})"


@pytest.mark.disruptive
def test_a_check_sleeping_past_its_budget_drains_while_slurm_answers(staged_cluster):
    _need_configured(staged_cluster)
    _all_idle(staged_cluster)
    victim, bystander, by_hand, spare = COMPUTE[:4]
    sleeper_name = "sleepy"  # runner.site_checks: 50-sleepy.sh is the check 'sleepy'
    hand_reason = "maintenance by hand (staged health test)"
    job = staged_cluster.ssh(CONTROLLER, f"sbatch --parsable -w {bystander} -J gpc-health-bystander -o /dev/null "
                                         "--wrap 'sleep 900'", check=True).stdout.strip().split(";")[0]
    try:
        _wait(f"job {job} running on {bystander}", lambda: "JobState=RUNNING" in staged_cluster.ssh(
            CONTROLLER, f"scontrol show job {job}", timeout=60).stdout, 60)
        staged_cluster.ssh(CONTROLLER, f"scontrol update nodename={by_hand} state=drain reason='{hand_reason}'",
                           check=True)
        hand_drained_at = time.time()
        _site_checks(staged_cluster, victim, {SLEEPER: "#!/bin/sh\n# staged test: sleeps past its budget\n"
                                                       f"sleep {3 * HEALTH.check_timeout}\n"})
        # From the end of the install: the role's own try run (--no-act, it runs the sleeper too and holds
        # the run lock for its budget) comes first, and slurmd's run that arrives meanwhile is skipped.
        installed = time.time()
        copied = float(staged_cluster.ssh(victim, f"stat -c %Y /etc/gpucluster/health.d/{SLEEPER}",
                                          check=True).stdout)
        want = f"{PREFIX}{sleeper_name}: timed out after {HEALTH.check_timeout}s"
        deadline = time.monotonic() + 2 * INTERVAL + 60
        pings = 0
        while True:
            info = _nodes(staged_cluster)
            if is_drained(info[victim]["State"]) and info[victim]["reason"].startswith(PREFIX):
                break
            assert time.monotonic() < deadline, (f"{victim} not drained: {info[victim]}\n"
                                                 f"{_diagnose(staged_cluster, victim)}")
            ping = staged_cluster.ssh(CONTROLLER, "scontrol ping", timeout=60)
            assert ping.returncode == 0 and "is UP" in ping.stdout, ping.stdout + ping.stderr
            slurmd = staged_cluster.ssh(victim, "scontrol show slurmd", timeout=60)  # the node's slurmd answers
            assert slurmd.returncode == 0 and "Slurmd PID" in slurmd.stdout, slurmd.stdout + slurmd.stderr
            assert "NOT_RESPONDING" not in info[victim]["State"], info[victim]
            assert "JobState=RUNNING" in staged_cluster.ssh(CONTROLLER, f"scontrol show job {job}").stdout
            pings += 1
            time.sleep(1)
        assert info[victim]["reason"] == want, info[victim]
        at = _epoch(staged_cluster, info[victim]["reason_time"])
        took = at - installed
        print(f"{victim}: a site check sleeping {3 * HEALTH.check_timeout} s drained it {took:.0f} s after the install "
              f"ended ({at - copied:.0f} s after the file was copied): {want}; {pings} rounds of scontrol ping / "
              "show slurmd answered meanwhile")
        assert took <= 2 * INTERVAL + 1
        # a new job starts on another node while the victim is drained
        res = staged_cluster.ssh(CONTROLLER, f"srun -N1 -w {spare} --immediate=60 hostname", timeout=120)
        assert res.returncode == 0 and res.stdout.strip() == spare, res.stderr
        assert "JobState=RUNNING" in staged_cluster.ssh(CONTROLLER, f"scontrol show job {job}").stdout
    finally:
        staged_cluster.ssh(CONTROLLER, f"scancel {job}", timeout=60)
        _site_checks(staged_cluster, victim, {})
    gone = staged_cluster.ssh(victim, "ls -A /etc/gpucluster/health.d", check=True).stdout.split()
    assert SLEEPER not in gone, f"the role left the dropped site check: {gone}"
    t0 = time.monotonic()
    _wait(f"{victim} resumed once the sleeper was gone", lambda: _nodes(staged_cluster)[victim]["State"] == "IDLE",
          (HEALTH.resume_after + 2) * INTERVAL + 60)
    print(f"{victim}: idle again {time.monotonic() - t0:.0f} s after the sleeper was removed")
    # the hand-drained node has had resume_after passing runs and more, and is still drained as its operator left it
    _wait("resume_after + 1 intervals since the hand drain",
          lambda: time.time() - hand_drained_at > (HEALTH.resume_after + 1) * INTERVAL, 10 * INTERVAL)
    info = _nodes(staged_cluster)[by_hand]
    assert is_drained(info["State"]) and info["reason"] == hand_reason, info
    state = _state(staged_cluster, by_hand)
    assert state["why"] == "drained by hand: never resumed by gpucluster" and state["started"] > hand_drained_at
    assert all(c["ok"] for c in state["checks"].values()), state["checks"]
    staged_cluster.ssh(CONTROLLER, f"scontrol update nodename={by_hand} state=resume", check=True)
    _all_idle(staged_cluster)
