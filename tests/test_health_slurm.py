"""The real consumer: slurmctld and slurmd (Slurm from Debian, on loopback through the emulate harness) run
the runner as their HealthCheckProgram every 5 s. A check broken on one node drains it within two
intervals with the check's reason; undone, the node resumes by itself after resume_after passes; a node
drained by hand stays drained; a check that sleeps past its budget drains its node with "timed out"
while slurmctld answers and jobs run on another node.

The checks here are site checks (files in the site folder) toggled by flag files, because this machine
has no GPU or HCA; the built-in checks have their own tests (test_health_checks.py). The staged-node
version of this scenario, with the built-in checks on real services, is tests/staged/test_health.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import health_slurm_conf, wait_for

from gpucluster.emulate import SlurmCluster
from gpucluster.node import runner

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(not IN_CI and shutil.which("slurmctld") is None and not Path("/usr/sbin/slurmctld").exists(),
                       reason="slurmctld not installed (apt-get install slurmctld slurmd slurm-client munge)"),
]

INTERVAL = 5
NODES = ["gpu01", "gpu02"]
SLURM_CONF = health_slurm_conf("health", "gpu[01-02]")


@pytest.fixture(scope="module")
def cluster():
    # munged refuses a socket under a folder others cannot search (pytest's tmp base is 0700): like the
    # harness itself, a fresh mkdtemp folder in the system temp dir, opened to 0755, removed at the end.
    base = Path(tempfile.mkdtemp(prefix="gpucluster-health-"))
    base.chmod(0o755)
    conf, work, site, state, flags = (base / d for d in ("conf", "work", "site", "state", "flags"))
    for d in (conf, site, state, flags):
        d.mkdir()
    (conf / "slurm.conf").write_text(SLURM_CONF)
    config = base / "health.json"
    # These tests break gpu01 three times and expect each drain to name its check: a node's third triage in a
    # week would be service-required (nodestate.py, health.lifecycle), so the limit is raised here.
    config.write_text(json.dumps({
        "check_timeout": 2, "run_budget": 8, "resume_after": 2, "state_dir": str(state), "site_dir": str(site),
        "lifecycle": {"triages": 20, "window_s": 7 * 86400},
        "checks": [], "env": {"SLURM_CONF": str(work / "etc" / "slurm.conf"), "FLAGS": str(flags)}}))
    # Each node keeps its own state: the runner's state_dir is per node on a real cluster.
    program = base / "gpucluster-health"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {runner.__file__} --config {config}.$SLURMD_NODENAME\n")
    program.chmod(0o755)
    for node in NODES:
        data = json.loads(config.read_text())
        data["state_dir"] = str(state / node)
        Path(f"{config}.{node}").write_text(json.dumps(data))
    for name, body in (("10-flag", 'f="$FLAGS/broken-$SLURMD_NODENAME"; [ -e "$f" ] && { cat "$f"; exit 1; }; '
                                   "echo fine\n"),
                       ("20-sleepy", '[ -e "$FLAGS/sleep-$SLURMD_NODENAME" ] && sleep 30; echo awake\n')):
        (site / name).write_text("#!/bin/sh\n" + body)
        (site / name).chmod(0o755)
    overrides = {"HealthCheckProgram": str(program), "HealthCheckInterval": str(INTERVAL),
                 "HealthCheckNodeState": "ANY"}
    try:
        with SlurmCluster(conf, slurmd_nodes=NODES, workdir=work, overrides=overrides, keep=False) as c:
            c.flags = flags
            c.state = state
            c.base = base
            yield c
    finally:
        shutil.rmtree(base, ignore_errors=True)


def node(c: SlurmCluster, name: str) -> dict:
    return c.nodes()[name]


def drained_with(c: SlurmCluster, name: str, prefix: str):
    n = node(c, name)
    return n if "DRAIN" in n["states"] and n.get("Reason", "").startswith(prefix) else None


def test_nodes_start_healthy(cluster) -> None:
    time.sleep(INTERVAL + 1)
    for name in NODES:
        assert "DRAIN" not in node(cluster, name)["states"], node(cluster, name)
    state = json.loads((cluster.state / "gpu01" / "state.json").read_text())
    assert state["checks"]["flag"]["ok"] and state["action"] == "none"


def test_a_broken_node_drains_then_resumes_and_a_hand_drain_stays(cluster) -> None:
    (cluster.flags / "broken-gpu01").write_text("GPU 3 fell off the bus\n")
    t0 = time.monotonic()
    n = wait_for("gpu01 drained", lambda: drained_with(cluster, "gpu01", "gpc:flag: GPU 3 fell off the bus"),
                 2 * INTERVAL + 10)
    took = time.monotonic() - t0
    print(f"gpu01 drained {took:.1f} s after its check broke (HealthCheckInterval {INTERVAL} s)")
    assert took <= 2 * INTERVAL + 10
    assert n["Reason"].endswith("]")  # Slurm adds [user@time]
    cluster.scontrol("update", "nodename=gpu02", "state=drain", "reason=maintenance by hand")
    (cluster.flags / "broken-gpu01").unlink()
    t0 = time.monotonic()
    wait_for("gpu01 resumed", lambda: "DRAIN" not in node(cluster, "gpu01")["states"], (2 + 2) * INTERVAL + 10)
    print(f"gpu01 resumed {time.monotonic() - t0:.1f} s after its check was mended (resume_after 2)")
    # the runner resumes with state=undrain (only the drain flag): slurmctld clears gpucluster's reason too
    assert not node(cluster, "gpu01").get("Reason"), node(cluster, "gpu01")
    time.sleep(2 * INTERVAL)  # several passing runs on gpu02 too
    assert drained_with(cluster, "gpu02", "maintenance by hand"), node(cluster, "gpu02")
    cluster.scontrol("update", "nodename=gpu02", "state=resume")


def test_a_check_sleeping_past_its_budget_drains_while_slurm_stays_responsive(cluster) -> None:
    (cluster.flags / "sleep-gpu01").write_text("")
    try:
        deadline = time.monotonic() + 2 * INTERVAL + 15
        while not drained_with(cluster, "gpu01", "gpc:sleepy: timed out after 2s"):
            assert time.monotonic() < deadline, node(cluster, "gpu01")
            ping = cluster.run(["scontrol", "ping"], timeout=20)
            assert ping.returncode == 0 and "UP" in ping.stdout, ping.stdout + ping.stderr
            time.sleep(0.5)
        job = cluster.run(["srun", "-N1", "-w", "gpu02", "--immediate=20", "hostname"], timeout=60)
        assert job.returncode == 0, job.stderr
    finally:
        (cluster.flags / "sleep-gpu01").unlink()
    wait_for("gpu01 resumed after the sleeper stopped", lambda: "DRAIN" not in node(cluster, "gpu01")["states"],
             (2 + 2) * INTERVAL + 15)


def test_a_node_that_cannot_reach_its_munged_still_drains_itself(cluster) -> None:
    """The munge gap: gpu01's scontrol is pointed at a munge socket nobody serves (its munged is down). A
    failing check still drains it: the runner starts a private munged with the node's key (the cluster's,
    so slurmctld decodes the credential), sends the drain through it, and stops it."""
    config_path = Path(str(cluster.base / "health.json") + ".gpu01")
    original = config_path.read_text()
    node_view = cluster.base / "gpu01-slurm.conf"
    conf = cluster.conf_path.read_text()
    assert "AuthInfo=socket=" in conf  # the harness's munged, the one slurmctld uses
    node_view.write_text(re.sub(r"(?m)^AuthInfo=socket=[^,\s]+", f"AuthInfo=socket={cluster.base}/dead/munge.sock",
                                conf))
    run_dir = cluster.base / "run"
    data = json.loads(original)
    data["env"]["SLURM_CONF"] = str(node_view)
    data.update(munge_key=str(cluster.workdir / "munge" / "key" / "munge.key"), run_dir=str(run_dir))
    config_path.write_text(json.dumps(data))
    (cluster.flags / "broken-gpu01").write_text("munged is down\n")
    try:
        t0 = time.monotonic()
        wait_for("gpu01 drained through the private munged",
                 lambda: drained_with(cluster, "gpu01", "gpc:flag: munged is down"), 2 * INTERVAL + 10)
        print(f"gpu01 drained {time.monotonic() - t0:.1f} s after its check broke, its munge socket dead")
        # The run writes its state file after the drain and after stopping the private munged: wait for it.
        state_file = cluster.state / "gpu01" / "state.json"
        wait_for("the run that drained gpu01 recorded its state",
                 lambda: (lambda st: st.get("action") == "drain" and st.get("applied") is True)(
                     json.loads(state_file.read_text())), INTERVAL + 10)
        state = json.loads(state_file.read_text())
        assert state["auth"].startswith("private munged (the node's did not answer: Failed to access"), state
        assert state["applied"] is True
        time.sleep(1)
        assert list(run_dir.iterdir()) == [], "the private munged's folder outlived its run"
    finally:
        config_path.write_text(original)
        (cluster.flags / "broken-gpu01").unlink()
    wait_for("gpu01 resumed", lambda: "DRAIN" not in node(cluster, "gpu01")["states"], (2 + 2) * INTERVAL + 15)
