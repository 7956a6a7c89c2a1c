"""Rollouts against real Slurm daemons: the emulator (a real slurmctld and one `slurmd -N` per node) on a
12-node spec of 3 leaves of 4. Drain class: the apply step is a stand-in that records when it ran and what
was running on its nodes then. Reboot class: the reboot is the emulator's (RebootProgram stops the node's
slurmd and starts it again with -b, a new boot time, so slurmctld sees a node that rebooted).

What must hold: no job killed (every job ends COMPLETED), every node back in service, a node drained by
hand, or with a gpc: reason not this rollout's (a health check's, another rollout's), stays drained with its
reason and is never counted done, and a rollout killed with SIGKILL in a
wave (a real subprocess, killed while the wave waits for a running job) finishes with --resume and leaves
no node drained by it, for both classes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest

from gpucluster.emulate.emulator import emulate
from gpucluster.emulate.specs import Rendered, scaled_spec, write_and_render
from gpucluster.rollout import state as st
from gpucluster.rollout.engine import Halted, Rollout, new_state
from gpucluster.rollout.slurmops import NodeState, Slurm
from gpucluster.rollout.waves import plan_waves, topology_units

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HAVE_SLURM = all(shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("slurmctld", "slurmd", "munged"))
needs_slurm = pytest.mark.skipif(not IN_CI and not HAVE_SLURM, reason="slurmctld/slurmd/munged not installed")
pytestmark = [needs_slurm, pytest.mark.slurm, pytest.mark.emulate]
BY_HAND = "fan replaced, by hand"
# gpucluster's own reasons that are not this rollout's: a health check's drain, another rollout's failure
NOT_OURS = ("gpc:mount-flash: /mnt/flash is not mounted", "gpc:rollout ro12-20250101T000000 failed: checks")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    text = scaled_spec("meta-24k-ib", {"h100": 12}, name="ro12", fabric={"scalable_unit_nodes": 4})
    return write_and_render(text, tmp_path_factory.mktemp("ro"), "ro12")


@pytest.fixture
def cluster(rendered: Rendered) -> Iterator:
    with emulate(rendered.conf_dir, reboot_delay=0.5) as c:
        yield c


def _sbatch(c, nodes: int, seconds: int) -> str:
    res = c.run(["sbatch", "--parsable", "-N", str(nodes), "--exclusive", "-o", "/dev/null", "--wrap",
                 f"sleep {seconds}"])
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _job_state(c, jobid: str) -> str:
    out = c.run(["scontrol", "show", "job", "-o", jobid]).stdout
    return next((t.split("=", 1)[1] for t in out.split() if t.startswith("JobState=")), "gone")


def _wait_running(c, jobs: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_job_state(c, j) == "RUNNING" for j in jobs):
            return
        time.sleep(0.3)
    raise AssertionError(f"jobs not running: {[(j, _job_state(c, j)) for j in jobs]}")


def _wait_done(c, jobs: list[str], timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {j: _job_state(c, j) for j in jobs}
        if not {"RUNNING", "PENDING", "COMPLETING", "CONFIGURING"} & set(states.values()):
            return states
        time.sleep(0.5)
    return {j: _job_state(c, j) for j in jobs}


def test_drain_rollout_by_leaf_keeps_every_job_and_the_hand_drained_node(cluster, rendered, tmp_path) -> None:
    slurm = Slurm(lambda cmd: cluster.run(cmd))
    hosts = list(cluster.nodes())
    hand = hosts[5]
    cluster.scontrol("update", f"nodename={hand}", "state=DRAIN", f"reason={BY_HAND}")
    jobs = [_sbatch(cluster, 4, 6), _sbatch(cluster, 2, 4), _sbatch(cluster, 1, 3)]
    _wait_running(cluster, jobs)
    units = topology_units(rendered.plan, "leaf", sorted(hosts))
    waves = plan_waves(units, 4, skip={hand})
    seen: list[tuple[list[str], list[str]]] = []

    def apply(nodes):  # stand-in for the converge of these hosts: record what still ran on them
        seen.append((list(nodes), slurm.running_jobs(nodes)))
        return {}

    s = new_state("t1", cluster="ro12", source="", change="drain", by="leaf", max_unavailable=4, waves=waves,
                  skipped=[hand], halt_share=0.0)
    path = st.state_path(tmp_path / "state")
    late = waves[-1].nodes[-1]  # drained by hand after the waves were planned: the engine must see it too
    cluster.scontrol("update", f"nodename={late}", "state=DRAIN", f"reason={BY_HAND}")
    # drained after the planning too, with reasons that start "gpc:" and are not this rollout's
    others = dict(zip((waves[0].nodes[1], waves[1].nodes[0]), NOT_OURS, strict=True))
    for n, why in others.items():
        cluster.scontrol("update", f"nodename={n}", "state=DRAIN", f"reason={why}")
    Rollout(slurm, path, s, apply=apply, poll=0.3, say=lambda _: None, live=False).run()
    assert [len(n) for n, _ in seen] and all(not running for _, running in seen), seen
    assert all(len(n) <= 4 for n, _ in seen)
    states = _wait_done(cluster, jobs)
    assert set(states.values()) == {"COMPLETED"}, states
    now = slurm.nodes()
    for n in (hand, late):
        assert now[n].by_hand and now[n].reason == BY_HAND
    for n, why in others.items():  # never drained over (the reason is still theirs), never resumed
        assert now[n].out and now[n].reason == why, now[n]
    left = {hand, late, *others}
    for n in hosts:
        if n not in left:
            assert not now[n].out and "IDLE" in now[n].states, (n, now[n])
    final = st.load(path)
    assert final["finished"] and {final["nodes"][n]["outcome"] for n in left} == {"by-hand"}
    assert {final["nodes"][n]["outcome"] for n in hosts if n not in left} == {"done"}


def test_a_failed_check_keeps_the_node_drained_and_halts(cluster, rendered, tmp_path) -> None:
    slurm = Slurm(lambda cmd: cluster.run(cmd))
    hosts = sorted(cluster.nodes())
    bad = hosts[1]
    waves = plan_waves(topology_units(rendered.plan, "leaf", hosts), 4)
    s = new_state("t2", cluster="ro12", source="", change="drain", by="leaf", max_unavailable=4, waves=waves,
                  skipped=[], halt_share=0.0)
    path = st.state_path(tmp_path / "state")
    run = Rollout(slurm, path, s, check=lambda nodes: {bad: "gpu burn failed"} if bad in nodes else {},
                  poll=0.3, say=lambda _: None, live=False)
    with pytest.raises(Halted, match="wave 1"):
        run.run()
    now = slurm.nodes()
    assert now[bad].out and now[bad].reason.startswith("gpc:rollout t2 failed")
    assert all(not now[n].out for n in waves[0].nodes if n != bad)
    assert all(not now[n].out for w in waves[1:] for n in w.nodes)  # halted before wave 2
    assert st.load(path)["nodes"][bad]["outcome"] == "failed"


@pytest.mark.parametrize(("change", "apply"), [("drain", True), ("reboot", False), ("reboot", True)],
                         ids=["drain", "reboot", "reboot-apply"])
def test_sigkill_mid_wave_then_resume_finishes(change, apply, cluster, rendered, tmp_path) -> None:
    """Killed while its wave waits for the job: drain (nodes drained by it), reboot (Slurm's reboot ASAP
    requested: DRAIN+REBOOT_REQUESTED), reboot with an apply step (the wave's maintenance reservation holds the
    nodes while the job ends; apply, then reboot)."""
    spec = rendered.conf_dir.parent / "ro12.yaml"
    env = {**cluster.env, "PYTHONUNBUFFERED": "1"}
    state_dir = tmp_path / "state"
    jobs = [_sbatch(cluster, 4, 8)]
    _wait_running(cluster, jobs)
    argv = [sys.executable, "-m", "gpucluster.cli", "rollout", str(spec), "--change", change, "--by", "leaf",
            "--max-unavailable", "4", "--state-dir", str(state_dir), "--poll", "0.3",
            *(["--apply-command", "true"] if apply else [])]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    path = state_dir / st.NAME
    waiting = "draining" if change == "drain" else "waiting" if apply else "rebooting"
    busy = set(_job_nodes(cluster, jobs[0]))
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:  # kill it while a wave waits for the job on its leaf
        if path.exists():
            s = json.loads(path.read_text())
            if any(v["outcome"] == waiting for n, v in s["nodes"].items() if n in busy):
                break
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError(f"never got to {waiting}: {proc.communicate()[0]}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    mid = st.load(path)
    assert not mid["finished"] and [w["status"] for w in mid["waves"]].count("running") == 1  # killed mid-wave
    assert _job_state(cluster, jobs[0]) == "RUNNING"
    held = [n for n, s in Slurm(lambda cmd: cluster.run(cmd)).nodes().items() if s.out] if change == "drain" \
        else _reserved(cluster, "gpc-")
    assert busy <= set(held)  # the kill left the job's nodes held by it (drained or reserved), the job on them
    status = subprocess.run([*argv[:5], "--state-dir", str(state_dir), "--status"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0 and "under way" in status.stdout, status.stdout + status.stderr
    before = len(cluster.reboots)
    again = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _wait_done(cluster, jobs) == {jobs[0]: "COMPLETED"}
    now = Slurm(lambda cmd: cluster.run(cmd)).nodes()
    assert not [n for n, s in now.items() if s.out or s.rebooting or "MAINTENANCE" in s.states], now
    assert "No reservations" in cluster.run(["scontrol", "show", "reservation"]).stdout
    final = st.load(path)
    assert final["finished"] and {v["outcome"] for v in final["nodes"].values()} == {"done"}
    if change == "reboot":  # every node rebooted exactly once across the kill
        assert sorted(n for n, *_ in cluster.reboots) == sorted(now), (cluster.reboots, before)


def _reserved(c, prefix: str) -> list[str]:
    """The nodes of every reservation whose name starts with `prefix`."""
    out = []
    for line in c.run(["scontrol", "show", "reservation", "-o"]).stdout.splitlines():
        fields = dict(t.split("=", 1) for t in line.split() if "=" in t)
        if fields.get("ReservationName", "").startswith(prefix):
            out += hostlist.expand_hostlist(fields.get("Nodes", ""))
    return out


def _job_nodes(c, jobid: str) -> list[str]:
    out = c.run(["scontrol", "show", "job", "-o", jobid]).stdout
    return hostlist.expand_hostlist(next(t.split("=", 1)[1] for t in out.split() if t.startswith("NodeList=")))


def test_reboot_rollout_waits_for_the_job_and_reboots_every_node(cluster, rendered, tmp_path) -> None:
    """The reboot class end to end on real daemons: `scontrol reboot ASAP` keeps the job running and marks the
    node the way the engine reads it (ours, rebooting, never by hand); the node reboots only once the job has
    ended, and comes back in service by itself (nextstate=RESUME)."""
    slurm = Slurm(lambda cmd: cluster.run(cmd))
    hosts = sorted(cluster.nodes())
    job = _sbatch(cluster, 1, 4)
    _wait_running(cluster, [job])
    busy = _job_nodes(cluster, job)[0]
    waves = plan_waves(topology_units(rendered.plan, "leaf", hosts), 4)
    s = new_state("t4", cluster="ro12", source="", change="reboot", by="leaf", max_unavailable=4, waves=waves,
                  skipped=[], halt_share=0.0)
    seen: list[tuple[NodeState, str]] = []
    done = threading.Event()

    def watch() -> None:  # the busy node while the rollout runs: first sight of it rebooting
        while not done.wait(0.2) and not seen:
            node = slurm.nodes([busy])[busy]
            if node.rebooting:
                seen.append((node, _job_state(cluster, job)))

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    Rollout(slurm, st.state_path(tmp_path / "state"), s, poll=0.3, say=lambda _: None, live=False).run()
    done.set()
    t.join()
    node, job_then = seen[0]
    assert node.out and not node.by_hand and node.reason.startswith("gpc:rollout t4"), node
    assert job_then == "RUNNING"
    assert _wait_done(cluster, [job]) == {job: "COMPLETED"}
    rebooted = {n: up for n, _, up in cluster.reboots}
    assert sorted(rebooted) == hosts
    now = slurm.nodes()
    assert all(not now[n].out and not now[n].rebooting for n in hosts), now
