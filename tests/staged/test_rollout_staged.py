"""A running cluster changed under a job that writes a heartbeat every second, on the staged
Debian 13 cluster (Slurm 24.11, production cgroup profile; the `staged_trixie` fixture, brought up once for its
xdist worker, so this test adds no cluster of its own).

Before anything changes, gpu04 is drained by hand, and job A (2 nodes, one leaf) starts writing a heartbeat to the
flash tier (MooseFS, /mnt/flash) every second from each of its nodes. Then, each step through `gpucluster` as an
operator types it, from this machine, with the inventory:

1. grow by one leaf: the spec's GPU group 4 -> 6; `stage up` starts gpu05-06 (the enrolment), `gpucluster
   inventory` writes them in, `gpucluster rollout INVENTORY --resize SPEC` converges the controller (24.11 learns
   the nodes by `scontrol reconfigure`), drains the new nodes, converges them, checks them, resumes them;
2. a reboot-class change (the GPU driver branch, which needs a reboot on a real node) to every GPU node:
   `rollout --change reboot --by leaf --max-unavailable 2`. Each wave is a whole leaf; the leaf under job A goes
   last and waits for it: once its nodes are held (the wave's maintenance reservation) with A still running, A is
   told to finish. Each node is converged (--tags gpu), then rebooted by Slurm (`scontrol reboot ASAP`, the
   RebootProgram slurm_compute installs: here the container restarts), checked, and back in service;
3. job B starts the same way, and a slurm.conf change that `scontrol reconfigure` takes (SlurmctldTimeout) is
   rolled out: `rollout --change reconfigure` (the controller converged, then reconfigure);
4. shrink by one node (6 -> 5: gpu06 leaves): `gpucluster inventory` without it, `rollout --resize` drains it,
   waits, removes it from Slurm; `stage up` then removes its container. Then B is told to finish.

What must hold: both jobs COMPLETED, each node's heartbeat never more than 10 s apart; sacct shows no job of the
test's time killed, failed or requeued; every node in service, except gpu04, still drained with its own reason
and never touched; gpu06 gone from Slurm; every node of a reboot wave rebooted (its container restarted).
Stand-ins: the GPU driver (no GPU here: the converge installs nothing for it, the reboot is real for the
container), the flash tier's disks (MooseFS on container storage).

Cost: the longest staged test (about 15-20 minutes on the 2-core CI machine: two converges of the controller,
three of GPU nodes, three container reboots). It runs last in the 24.11 group (disruptive rank 3).
"""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import hostlist
import pytest
import yaml

pytestmark = [pytest.mark.staged, pytest.mark.disruptive(3)]

CTL = "ctl01"
BY_HAND = "fan swap, by hand"
MAX_GAP_S = 10.0
HB = "/mnt/flash/heartbeat"


def _cli(*args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)


def _ok(res: subprocess.CompletedProcess, what: str, log: Path) -> str:
    log.write_text(f"$ {shlex.join(res.args)}\nexit {res.returncode}\n{res.stdout}\n--- stderr\n{res.stderr}\n")
    assert res.returncode == 0, f"{what} exited {res.returncode} (log {log}):\n{(res.stdout + res.stderr)[-3000:]}"
    return res.stdout


def _spec(c, folder: Path, gpus: int, **changes) -> Path:
    """The staged spec with `gpus` GPU nodes, and changes merged in (same cluster name, same file each time)."""
    data = yaml.safe_load(Path(c.spec_path).read_text())
    next(g for g in data["node_groups"] if g["name"] == "gpu")["count"] = gpus
    for key, value in changes.items():
        if key == "parameters":
            data["slurm"]["parameters"] = value
        else:
            data[key] = value
    path = folder / "staging-trixie.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _enroll(c, spec: Path) -> None:
    """What an operator does before a resize: the machines up (here: stage up) and the inventory written."""
    from gpucluster.stage.lifecycle import stage_up

    c.staged, _inv = stage_up(str(spec), state=str(c.staged.ssh_config.parent),
                              inventory=str(c.logs / "stage-inventory"), log=lambda _m: None)
    _ok(_cli("inventory", str(spec), "-o", str(c.inventory.parent), "--ssh-config", str(c.staged.ssh_config),
             "--state-dir", str(c.state_dir)), "gpucluster inventory", c.logs / "inventory-grow.log")


def _nodes(c) -> dict[str, tuple[str, str]]:
    """node -> (sinfo's long state, reason) as slurmctld has them."""
    out = c.ssh(CTL, "sinfo -h -N -o '%N|%T|%E'", check=True).stdout
    rows = {}
    for line in out.splitlines():
        name, state, reason = line.split("|", 2)
        rows[name] = (state, re.sub(r"\s*\[[^\]]*\]$", "", reason))
    return rows


def _job(c, name: str, nodes: str) -> str:
    script = (f"d={HB}/$SLURM_JOB_ID; mkdir -p $d; i=0; while [ ! -e $d/stop ] && [ $i -lt 3600 ]; do "
              "date +%s.%N >> $d/$(hostname); sleep 1; i=$((i+1)); done; test -e $d/stop")
    cmd = (f"mkdir -p {HB} 2>/dev/null; sbatch --parsable -J {name} -N2 -w {nodes} --ntasks-per-node=1 --mem=64M "
           f"-o /dev/null --wrap {shlex.quote('srun bash -c ' + shlex.quote(script))}")
    job = c.ssh(CTL, cmd, check=True).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        state = _job_state(c, job)
        if state == "RUNNING" and _beats(c, job, nodes):
            return job
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {name} ({job}) is {state}"
        time.sleep(2)
    raise AssertionError(f"job {name} ({job}) did not start writing its heartbeat: {_job_state(c, job)}")


def _job_state(c, job: str) -> str:
    out = c.ssh(CTL, f"scontrol show job -o {job} 2>/dev/null || true").stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "gone"


def _reader(c) -> str:
    """A node that mounts the flash tier and is up now."""
    up = [n for n, (state, _) in _nodes(c).items() if state in ("idle", "mixed", "allocated")]
    return sorted(up)[0]


def _beats(c, job: str, nodes: str) -> dict[str, list[float]]:
    out = {}
    for node in hostlist.expand_hostlist(nodes):
        res = c.ssh(_reader(c), f"cat {HB}/{job}/{node} 2>/dev/null")
        if not res.stdout.strip():
            return {}
        out[node] = [float(x) for x in res.stdout.split()]
    return out


def _finish(c, job: str, nodes: str) -> tuple[str, dict[str, float]]:
    """Tell the job to stop; wait for its end; (final state, each node's largest gap between heartbeats)."""
    c.ssh(_reader(c), f"touch {HB}/{job}/stop", check=True)
    deadline = time.monotonic() + 180
    while _job_state(c, job) in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING") and time.monotonic() < deadline:
        time.sleep(2)
    state = ""
    for _ in range(30):  # slurmdbd's record is written a moment after the job ends
        state = c.ssh(CTL, f"sacct -X -n -P -D -j {job} -o State", check=True).stdout.split()
        if state and state[-1] != "RUNNING":
            break
        time.sleep(2)
    gaps = {n: max((b - a for a, b in itertools.pairwise(t)), default=999.0)
            for n, t in _beats(c, job, nodes).items()}
    return ",".join(state), gaps


def _state_file(c) -> dict:
    import json

    return json.loads((c.state_dir / "rollout.json").read_text())


def _started(c, nodes: list[str]) -> dict[str, str]:
    """When each node's container last started (a container shares the host's kernel and boot id: its start is
    its boot)."""
    return {n: subprocess.run(["podman", "inspect", "-f", "{{.State.StartedAt}}", c.container(n)],
                              capture_output=True, text=True, check=True).stdout.strip() for n in nodes}


def test_grow_reboot_reconfigure_shrink_under_a_running_job(staged_trixie, tmp_path):
    c = staged_trixie
    if not c.first_configure.ok:
        pytest.fail(f"the Debian 13 cluster did not converge; see {c.first_configure.log_path}", pytrace=False)
    inv, secrets = str(c.inventory.parent), str(c.secrets_file)
    started = c.ssh(CTL, "date +%Y-%m-%dT%H:%M:%S", check=True).stdout.strip()
    compute = sorted(c.hosts("slurm_compute"))
    assert compute == ["gpu01", "gpu02", "gpu03", "gpu04"], compute
    c.ssh(CTL, f"scontrol update nodename=gpu04 state=drain reason={shlex.quote(BY_HAND)}", check=True)
    job_a = _job(c, "heartbeat-a", "gpu[01-02]")

    # 1. grow by one leaf: gpu05-06 enrolled, then --resize
    spec = _spec(c, tmp_path, 6)
    _enroll(c, spec)
    out = _ok(_cli("rollout", inv, "--resize", str(spec), "--secrets", secrets, "--tags", "slurm"),
              "rollout --resize (grow)",
              c.logs / "rollout-grow.log")
    assert "2 nodes added, 0 removed" in out and "learns a node list by reconfigure" in out, out
    # in service: idle once their registration settles (seen not idle at once after a resume in a CI run)
    deadline = time.monotonic() + 120
    new_idle = lambda ns: all(ns.get(n, ("",))[0] == "idle" for n in ("gpu05", "gpu06"))  # noqa: E731
    nodes = _nodes(c)
    while not new_idle(nodes) and time.monotonic() < deadline:
        time.sleep(3)
        nodes = _nodes(c)
    assert new_idle(nodes), f"after the grow: {nodes!r}"
    topo = c.ssh(CTL, "scontrol show topology", check=True).stdout
    assert any("gpu[05-06]" in line and "Level=0" in line for line in topo.splitlines()), topo
    assert _job_state(c, job_a) == "RUNNING"

    # 2. a reboot-class change to every GPU node, by leaf, 2 at most: job A's leaf last, and it waits for A
    spec = _spec(c, tmp_path, 6, drivers={"branch": "580"})
    diff = _cli("diff", str(c.spec_path), str(spec), "--json")
    assert '"class": "reboot"' in diff.stdout, diff.stdout + diff.stderr
    boots = _started(c, ["gpu01", "gpu02", "gpu03", "gpu05", "gpu06"])
    log = (c.logs / "rollout-reboot.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "gpucluster.cli", "rollout", inv, "--change", "reboot", "--by",
                             "leaf", "--max-unavailable", "2", "--secrets", secrets, "--tags", "gpu"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 2400
        held = False
        while proc.poll() is None and time.monotonic() < deadline:
            path = c.state_dir / "rollout.json"
            if path.exists():
                s = _state_file(c)
                if all(s["nodes"][n]["outcome"] == "waiting" for n in ("gpu01", "gpu02")):
                    held = True
                    break
            time.sleep(3)
        assert held, f"the rollout never reached job A's leaf (exit {proc.poll()}; log {log.name})"
        s = _state_file(c)
        assert all(len(w["units"]) == 1 for w in s["waves"]), s["waves"]  # one whole leaf per wave
        assert set(s["waves"][-1]["nodes"]) == {"gpu01", "gpu02"}  # the busy leaf went last
        assert all(s["nodes"][n]["outcome"] == "done" for n in ("gpu03", "gpu05", "gpu06")), s["nodes"]
        assert s["nodes"]["gpu04"]["outcome"] == "by-hand"
        assert _job_state(c, job_a) == "RUNNING"  # the wave holds its nodes, and waits for the job
        state_a, gaps_a = _finish(c, job_a, "gpu[01-02]")
        assert proc.wait(timeout=1800) == 0, (c.logs / "rollout-reboot.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert state_a == "COMPLETED", state_a
    assert gaps_a and max(gaps_a.values()) <= MAX_GAP_S, gaps_a
    after = _started(c, list(boots))
    assert all(after[n] != boots[n] for n in boots), (boots, after)  # every node of a wave rebooted
    assert all(v["outcome"] in ("done", "by-hand") for v in _state_file(c)["nodes"].values())

    # 3. job B, and a slurm.conf change that `scontrol reconfigure` takes
    job_b = _job(c, "heartbeat-b", "gpu[01-02]")
    spec = _spec(c, tmp_path, 6, drivers={"branch": "580"}, parameters={"SlurmctldTimeout": 333})
    _ok(_cli("rollout", inv, "--change", "reconfigure", "--secrets", secrets, "--tags", "slurm"),
        "rollout --change reconfigure", c.logs / "rollout-reconfigure.log")
    conf = c.ssh("gpu03", "scontrol show config", check=True).stdout
    assert re.search(r"^SlurmctldTimeout\s*=\s*333 sec", conf, re.M), conf

    # 4. shrink by one node: gpu06 leaves
    spec = _spec(c, tmp_path, 5, drivers={"branch": "580"}, parameters={"SlurmctldTimeout": 333})
    _ok(_cli("inventory", str(spec), "-o", inv, "--ssh-config", str(c.staged.ssh_config), "--state-dir",
             str(c.state_dir)), "gpucluster inventory (shrink)", c.logs / "inventory-shrink.log")
    out = _ok(_cli("rollout", inv, "--resize", str(spec), "--secrets", secrets, "--tags", "slurm"),
              "rollout --resize (shrink)",
              c.logs / "rollout-shrink.log")
    assert "0 nodes added, 1 removed" in out, out
    from gpucluster.stage.lifecycle import stage_up

    c.staged, _inv = stage_up(str(spec), state=str(c.staged.ssh_config.parent),
                              inventory=str(c.logs / "stage-inventory"), log=lambda _m: None)
    assert _job_state(c, job_b) == "RUNNING"
    state_b, gaps_b = _finish(c, job_b, "gpu[01-02]")
    assert state_b == "COMPLETED", state_b
    assert gaps_b and max(gaps_b.values()) <= MAX_GAP_S, gaps_b

    # what the whole sequence left
    nodes = _nodes(c)
    assert "gpu06" not in nodes, nodes
    assert nodes["gpu04"][0] in ("drained", "draining") and nodes["gpu04"][1] == BY_HAND, nodes["gpu04"]
    assert all(nodes[n][0] == "idle" for n in ("gpu01", "gpu02", "gpu03", "gpu05")), nodes
    rows = c.ssh(CTL, f"sacct -X -n -P -D -a -S {started} -o JobID,JobName,State", check=True).stdout.split()
    assert rows and all(r.split("|")[2] == "COMPLETED" for r in rows), rows  # nothing killed, failed or requeued
    assert len([r for r in rows if r.split("|")[0] in (job_a, job_b)]) == 2, rows  # each ran once: no requeue
    assert "No reservations" in c.ssh(CTL, "scontrol show reservation", check=True).stdout
