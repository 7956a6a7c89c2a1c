"""The reboot rung on real daemons (the emulator: slurmctld and one `slurmd -N` per node, 22.05 from the host's
packages, 26.05 from its Debian root; the reboot is the emulator's RebootProgram, which stops the node's slurmd and
starts it again with a new boot time). Three nodes log XID 79 (GPU fallen off the bus) in the kernel log file their
gpu-xid check reads; one of them runs a job. runner.run() on each asks `scontrol reboot ASAP nextstate=RESUME`
through the circuit breaker (a token each): the idle nodes reboot at once, the busy one once its job has ended (the
job COMPLETED); each comes back IDLE with no reason. The run after the boot (a new boot id, as the kernel gives
one) passes and leaves the node in service. A node drained by hand, with the same XID, is never touched.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from conftest import health_slurm_conf, root_scontrol_env, wait_for
from test_health_xid import X79

from gpucluster.emulate import SlurmCluster
from gpucluster.node import breaker, decide, runner, slurmctl

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
FALLEN = NODES[:3]
BUSY = NODES[0]  # runs a job when its reboot is asked
HAND = NODES[3]  # drained by an operator before its run, with the same XID
BY_HAND = "RMA 4711: GPU 0 to be replaced"
JOB_S = 4
REASON = "gpc:gpu-xid: XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot"
BREAKER = {"enabled": True, "group": "gpu", "nodes": "gpu[01-04]", "size": 4, "drains": 3, "out_of_service": 4,
           "window_minutes": 60}
SLURM_CONF = health_slurm_conf("reboot", "gpu[01-04]", "Licenses=gpc_drain_gpu:3,gpc_breaker_gpu:1")


@pytest.fixture(scope="module", params=["22.05", "26.05"])
def cluster(request):
    from conftest import need_slurm_line

    need_slurm_line(request.param)
    base = Path(tempfile.mkdtemp(prefix="gpucluster-reboot-"))
    base.chmod(0o755)  # munged refuses a socket under a folder others cannot search
    (base / "conf").mkdir()
    (base / "conf" / "slurm.conf").write_text(SLURM_CONF)
    t0 = time.monotonic()
    try:
        with SlurmCluster(base / "conf", slurmd_nodes=NODES, line=request.param, start_timeout=120,
                          reboot_delay=0.5) as c:
            c.base = base
            c.session_env = root_scontrol_env(c, base / "bin")
            yield c
    finally:
        print(f"\nSlurm {request.param}: the file's cluster {time.monotonic() - t0:.1f} s")
        shutil.rmtree(base, ignore_errors=True)


def boot(c: SlurmCluster, node: str, boot_id: str) -> None:
    """The boot id the node's gpu-xid check reads (GPC_HEALTH_ROOT/proc/sys/kernel/random/boot_id)."""
    folder = c.base / "roots" / node / "proc/sys/kernel/random"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "boot_id").write_text(f"{boot_id}\n")


def node_config(c: SlurmCluster, node: str, limits: dict = BREAKER, **extra) -> Path:
    """The node's health config: the gpu-xid check on its own kernel log file (XID 79 in it), its own state and
    boot id, the breaker's group and limits (`limits`), any `extra` keys; scontrol the cluster's."""
    home = c.base / "nodes" / node
    home.mkdir(parents=True)
    (home / "kern.log").write_text(f"[ 12.000000] nvidia: module loaded\n{X79}\n")
    boot(c, node, f"{node}-boot-1")
    config = {"env": {**c.session_env, "GPC_HEALTH_ROOT": str(c.base / "roots" / node)}, "munge_key": "",
              "state_dir": str(home / "state"), "site_dir": str(home / "site"), "check_timeout": 10,
              "run_budget": 30, "resume_after": 2, "fail_after": 1, "breaker": limits, **extra,
              "checks": [{"name": "gpu-xid", "kind": "gpu-xid", "kernel_log": str(home / "kern.log"), "timeout": 10}]}
    path = home / "config.json"
    path.write_text(json.dumps(config))
    return path


def slurm_node(c: SlurmCluster, node: str) -> dict[str, str]:
    return slurmctl.parse_nodes(c.scontrol("show", "node", "-o", node))[node]


def job_state(c: SlurmCluster, job: str) -> str:
    out = c.run(["scontrol", "show", "job", "-o", job]).stdout
    return next((t.split("=", 1)[1] for t in out.split() if t.startswith("JobState=")), "gone")




def in_service(info: dict[str, str]) -> bool:
    return info["State"] == "IDLE" and info["reason"] == ""


@pytest.fixture(scope="module")
def rebooted(cluster):
    """Each node's run with XID 79 logged, and what Slurm did: {node: (summary, state right after the run, seconds
    from the run's end to IDLE again)}; the job on BUSY and when it ended."""
    c = cluster
    configs = {n: node_config(c, n) for n in NODES}
    c.scontrol("update", f"nodename={HAND}", "state=drain", f"reason={BY_HAND}")
    res = c.run(["sbatch", "--parsable", "-w", BUSY, "-o", "/dev/null", "--wrap", f"sleep {JOB_S}"])
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    wait_for(f"job {job} running", lambda: job_state(c, job) == "RUNNING", every=0.1)
    out, ended = {}, {}
    for n in NODES:
        t0 = time.monotonic()
        summary = runner.run(str(configs[n]), node=n)
        ended[n] = time.monotonic()
        out[n] = (summary, slurm_node(c, n), ended[n] - t0)
    states: dict[str, list[str]] = {n: [] for n in FALLEN}
    back: dict[str, float] = {}
    job_end = None
    deadline = time.monotonic() + JOB_S + 30
    while len(back) < len(FALLEN) or job_end is None:  # every node and the job, read together
        assert time.monotonic() < deadline, (states, job_state(c, job))
        now, nodes = time.monotonic(), slurmctl.parse_nodes(c.scontrol("show", "node", "-o"))
        for n in FALLEN:
            seen = f"{nodes[n]['State']} {nodes[n]['reason']!r}"
            if not states[n] or states[n][-1] != seen:
                states[n].append(seen)
            if n not in back and in_service(nodes[n]):
                back[n] = now - ended[n]
        if job_end is None and job_state(c, job) != "RUNNING":
            job_end = time.monotonic()
        time.sleep(0.1)
    asked = {n: (seen - ended[n], up - seen) for n, seen, up in c.reboots}
    print(f"\nSlurm {c.line}: " + "\n".join(
        f"{n}: run {out[n][2]:.2f} s; RebootProgram {asked[n][0]:.1f} s after the run, slurmd -b {asked[n][1]:.1f} s "
        f"later; IDLE {back[n]:.1f} s after the run; states {' -> '.join(states[n])}" for n in FALLEN)
        + f"\njob ended {job_end - ended[BUSY]:.1f} s after {BUSY}'s run")
    return {"out": out, "back": back, "job": job, "job_end": job_end, "configs": configs, "states": states}


def test_a_reboot_class_xid_asks_slurm_for_a_reboot_asap_through_the_breaker(cluster, rebooted) -> None:
    for n in FALLEN:
        summary, after, _seconds = rebooted["out"][n]
        assert (summary["action"], summary["applied"], summary["ladder"]) == ("reboot", True, "reboot"), summary
        assert summary["breaker"].startswith(f"drain token {breaker.token_name(n)} taken"), summary
        assert summary["reason"] == REASON
        # ASAP: drained at once (no new job lands), the reason ours while the reboot is pending or under way
        assert decide.is_drained(after["State"]) or after["State"] == "IDLE", after
        assert after["reason"].startswith(REASON) or in_service(after), after
    busy = rebooted["out"][BUSY][1]
    assert busy["State"].split("+")[:3] == ["MIXED", "DRAIN", "REBOOT_REQUESTED"], busy
    assert busy["reason"] == REASON, busy
    tokens = [r["ReservationName"] for r in slurmctl.parse_reservations(cluster.scontrol("show", "reservation", "-o"))]
    assert sorted(tokens) == sorted(breaker.token_name(n) for n in FALLEN)


def test_each_node_reboots_once_after_its_jobs_and_comes_back_idle(cluster, rebooted) -> None:
    c = cluster
    assert sorted(n for n, *_ in c.reboots) == FALLEN, c.reboots
    assert job_state(c, rebooted["job"]) == "COMPLETED"
    seen = {n: t for n, t, _up in c.reboots}
    assert seen[BUSY] >= rebooted["job_end"] - 0.5  # RebootProgram ran only once the job had ended
    for n in FALLEN:
        assert in_service(slurm_node(c, n))
        # pending (REBOOT_REQUESTED), then issued (REBOOT_ISSUED, slurmctld adds ' : reboot issued' to the reason),
        # then back: nextstate=RESUME took the drain and the reason off
        states = rebooted["states"][n]
        assert states[-1] == "IDLE ''" and any("+REBOOT_ISSUED " in x for x in states), states
        assert all(x.split(" ", 1)[1].startswith(repr(REASON)[:-1]) for x in states[:-1]), states


def test_the_run_after_the_boot_passes_and_leaves_the_node_in_service(cluster, rebooted) -> None:
    c = cluster
    for n in FALLEN:
        boot(c, n, f"{n}-boot-2")
        summary = runner.run(str(rebooted["configs"][n]), node=n)
        assert summary["action"] == "none" and summary["why"] == "all checks pass", summary
        assert summary["checks"]["gpu-xid"]["ok"] is True and "ladder" not in summary
        assert in_service(slurm_node(c, n))
    time.sleep(1.0)
    assert sorted(n for n, *_ in c.reboots) == FALLEN  # nothing rebooted twice


def test_a_node_drained_by_hand_is_never_touched(cluster, rebooted) -> None:
    c = cluster
    summary, _after, _seconds = rebooted["out"][HAND]
    assert summary["action"] == "none" and summary["why"] == "drained by hand: left as the operator set it", summary
    assert summary["ladder"] == "reboot" and "applied" not in summary
    again = runner.run(str(rebooted["configs"][HAND]), node=HAND)
    assert again["action"] == "none", again
    info = slurm_node(c, HAND)
    assert decide.is_drained(info["State"]) and info["reason"] == BY_HAND, info
    assert not slurmctl.rebooting(info["State"]) and HAND not in {n for n, *_ in c.reboots}
