"""The controller's Slurm metrics (node/slurmmetrics.py) on a real slurmctld of every line: 22.05 from the host's
packages, 24.11 and 26.05 from the emulator's Debian roots. The program runs as the timer runs it (python3 in
isolated mode, Slurm's commands from PATH: here wrappers that run the line's own) and its file is read with a strict
parser of the exposition format, and with `promtool check metrics` where promtool is installed.

The cluster: 8 nodes with a `slurmd -N` each (partition batch), two topology units of 4 and two NVLink domains of
4 in the plan file; 504 more nodes State=CLOUD (IDLE+CLOUD+POWERED_DOWN, a partition of their own that no job here
asks for) in 21 units of 24, so the node table is a real one of 512 nodes. One story per line:

- all idle: every unit free, the largest free block every node of the group;
- a job takes su0002 whole (`--exclusive -w`): su0002 has no free node, one unit and one domain less are free, the
  largest block is su0001's 4 nodes;
- three nodes of su0001 drained by hand: one with a hostile reason (quote, brace, newline, a fake sample), counted
  as `operator` and the file still one valid exposition; one with gpucluster's `gpc:mount-flash: ...`; one with
  Slurm's own words; pending jobs held, waiting on a dependency and on resources, each by Slurm's code;
- sdiag's main and backfill gauges (sched_interval=1 and bf_interval=1: both run within seconds).
The wall time of each run of the program and of the whole file are printed (docs/metrics.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import health_slurm_conf, need_slurm_line, wait_for
from test_slurm_metrics import SCRIPT, parse_exposition, promtool_check, value

from gpucluster.emulate import SlurmCluster
from gpucluster.node import slurmmetrics as sm

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]

GPU = [f"gpu{i:03d}" for i in range(1, 9)]
CLOUD = 504
UNIT = 24  # nodes of a CLOUD unit
PLAN = {"cluster": "metrics", "units": [
    {"unit": "su0001", "group": "gpu", "pod": "", "hosts": "gpu[001-004]"},
    {"unit": "su0002", "group": "gpu", "pod": "", "hosts": "gpu[005-008]"},
    *({"unit": f"su{3 + i:04d}", "group": "cpu", "pod": "", "hosts": f"cpu[{i * UNIT + 1:03d}-{(i + 1) * UNIT:03d}]"}
      for i in range(CLOUD // UNIT))],
    "nvlink_domains": [{"nvlink_domain": "nvl0001", "group": "gpu", "hosts": "gpu[001-004]"},
                       {"nvlink_domain": "nvl0002", "group": "gpu", "hosts": "gpu[005-008]"}]}
HOSTILE = 'x"} 1\nevil_metric 1'
DRAINS = {"gpu001": HOSTILE, "gpu002": "gpc:mount-flash: /mnt/flash did not answer", "gpu003": "Kill task failed"}
SLURM_CONF = health_slurm_conf(
    "metrics", "gpu[001-008]", "PrivateData=cloud", "SchedulerParameters=bf_interval=1,sched_interval=1",
    f"NodeName=cpu[001-{CLOUD:03d}] CPUs=2 RealMemory=500 State=UNKNOWN",
    f"PartitionName=cloud Nodes=cpu[001-{CLOUD:03d}] MaxTime=INFINITE State=UP")
T0 = time.monotonic()


def tool_env(c: SlurmCluster, folder: Path) -> dict[str, str]:
    """The cluster's environment with scontrol, sinfo, squeue and sdiag first on PATH: wrappers that run the line's
    own (inside its Debian root for 24.11 and 26.05), as the controller's PATH has them."""
    folder.mkdir()
    for tool in ("scontrol", "sinfo", "squeue", "sdiag"):
        argv = " ".join(f"'{a}'" for a in c.runtime.argv([tool]))
        (folder / tool).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (folder / tool).chmod(0o755)
    return {**c.env, "PATH": f"{folder}:{c.env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}


def scrape(c: SlurmCluster) -> dict:
    """One run of the program; its file read strictly. Records the run's wall time."""
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-I", str(SCRIPT), "--output", str(c.out), "--plan", str(c.plan),
                          "--timeout", "30"], capture_output=True, text=True, env=c.tool_env, timeout=120)
    c.walls.append(time.monotonic() - t0)
    assert res.returncode == 0 and not res.stderr, res.stderr
    c.text = c.out.read_text()
    return parse_exposition(c.text)


@pytest.fixture(scope="module", params=["22.05", "24.11", "26.05"])
def cluster(request):
    need_slurm_line(request.param)
    base = Path(tempfile.mkdtemp(prefix="gpucluster-slurm-metrics-"))
    base.chmod(0o755)  # munged refuses a socket under a folder others cannot search
    (base / "conf").mkdir()
    (base / "conf" / "slurm.conf").write_text(SLURM_CONF)
    t0 = time.monotonic()
    try:
        with SlurmCluster(base / "conf", slurmd_nodes=GPU, absent_state="CLOUD", line=request.param,
                          start_timeout=120) as c:
            c.tool_env = tool_env(c, base / "bin")
            c.plan, c.out, c.walls = base / "slurm-metrics.json", base / "textfile" / "gpucluster_slurm.prom", []
            c.plan.write_text(json.dumps(PLAN))
            c.out.parent.mkdir()
            yield c
            print(f"\nSlurm {c.line}: {len(c.walls)} runs of gpucluster-slurm-metrics on 512 nodes, "
                  f"{min(c.walls):.2f}-{max(c.walls):.2f} s each; the line's cluster {time.monotonic() - t0:.1f} s, "
                  f"the file so far {time.monotonic() - T0:.1f} s")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def submit(c: SlurmCluster, *args: str) -> str:
    return c.run(["sbatch", "--parsable", *args, "--wrap", "sleep 600"], check=True).stdout.strip().split(";")[0]


def job_state(c: SlurmCluster, job: str) -> str:
    return c.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()


@pytest.fixture(scope="module")
def story(cluster):
    """The scrapes of the story, in order."""
    c = cluster
    wait_for("every slurmd registered", lambda: all(c.nodes()[n]["State"] == "IDLE" for n in GPU), timeout=60,
             every=0.2)
    out = {"idle": scrape(c)}
    whole = submit(c, "-N4", "--exclusive", "-w", "gpu[005-008]")
    wait_for(f"job {whole} running", lambda: job_state(c, whole) == "RUNNING", timeout=60, every=0.2)
    out["su0002 taken"] = scrape(c)
    for node, reason in DRAINS.items():
        c.scontrol("update", f"nodename={node}", "state=drain", f"reason={reason}")
    held = submit(c, "--hold", "-N1")
    after = submit(c, "-N1", f"--dependency=afterok:{whole}")
    big = submit(c, "-N4", "--exclusive")
    out["jobs"] = {"held": held, "dependency": after, "resources": big, "running": whole}
    wait_for("the pending jobs' reasons set by the scheduler", lambda: "None" not in c.run(
        ["squeue", "-h", "-t", "PD", "-o", "%r"]).stdout.split(), timeout=30, every=0.3)
    out["drained"] = scrape(c)
    out["backfilled"] = wait_for("a main and a backfill cycle", lambda: (s := scrape(c)) and all(value(
        s, "gpucluster_slurm_sched_cycles", scheduler=k) for k in ("main", "backfill")) and s, timeout=30, every=0.5)
    out["text"] = c.text
    yield out
    c.cancel_all()


def test_all_idle_every_unit_is_free(story) -> None:
    s = story["idle"]
    assert [value(s, "gpucluster_slurm_up", source=src) for src in sm.SOURCES] == [1, 1, 1, 1]
    assert value(s, "gpucluster_slurm_nodes", state="idle") == len(GPU) + CLOUD
    assert value(s, "gpucluster_slurm_nodes_with_flag", flag="cloud") == CLOUD
    assert value(s, "gpucluster_slurm_units_free", node_group="gpu") == 2
    assert value(s, "gpucluster_slurm_units_free", node_group="cpu") == CLOUD // UNIT
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="gpu") == len(GPU)
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="cpu") == CLOUD
    assert value(s, "gpucluster_slurm_nvlink_domains_free", node_group="gpu") == 2


def test_a_job_on_a_whole_unit_takes_the_unit_and_halves_the_block(story) -> None:
    s = story["su0002 taken"]
    assert value(s, "gpucluster_slurm_unit_free_nodes", node_group="gpu", unit="su0002") == 0
    assert value(s, "gpucluster_slurm_unit_free_nodes", node_group="gpu", unit="su0001") == 4
    assert value(s, "gpucluster_slurm_units_free", node_group="gpu") == 1
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="gpu") == 4
    assert value(s, "gpucluster_slurm_nvlink_domain_free_nodes", node_group="gpu", nvlink_domain="nvl0002") == 0
    assert value(s, "gpucluster_slurm_nvlink_domains_free", node_group="gpu") == 1
    assert value(s, "gpucluster_slurm_nodes", state="allocated") == 4
    assert value(s, "gpucluster_slurm_jobs", state="running") == 1


def test_drained_nodes_count_by_reason_class_and_a_hostile_reason_is_operator(story) -> None:
    s = story["drained"]
    assert value(s, "gpucluster_slurm_nodes", state="drained") == len(DRAINS)
    assert value(s, "gpucluster_slurm_nodes_out_of_service", reason_class="operator") == 1
    assert value(s, "gpucluster_slurm_nodes_out_of_service", reason_class="gpc:mount-flash") == 1
    assert value(s, "gpucluster_slurm_nodes_out_of_service", reason_class="slurm:kill-task-failed") == 1
    assert sum(v for (name, _l), v in s.items() if name == "gpucluster_slurm_nodes_out_of_service") == len(DRAINS)
    # su0001 lost three nodes: no gpu unit is whole, so no block
    assert value(s, "gpucluster_slurm_unit_free_nodes", node_group="gpu", unit="su0001") == 1
    assert value(s, "gpucluster_slurm_units_free", node_group="gpu") == 0
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="gpu") == 0
    assert not any(name == "evil_metric" or "evil" in str(labels) for name, labels in s)


def test_pending_jobs_by_slurms_reason_code(story) -> None:
    s = story["drained"]
    assert value(s, "gpucluster_slurm_jobs", state="pending") == 3
    assert value(s, "gpucluster_slurm_jobs_pending", reason="JobHeldUser") == 1
    assert value(s, "gpucluster_slurm_jobs_pending", reason="Dependency") == 1
    # the big job waits for nodes: Slurm's code is one of these, depending on the line and the moment
    codes = {dict(labels)["reason"] for (name, labels) in s if name == "gpucluster_slurm_jobs_pending"}
    waiting = {"Resources", "Priority", "ReqNodeNotAvail", "Nodes_required"}
    assert codes - {"JobHeldUser", "Dependency"} <= waiting, codes
    assert sum(v for (name, _l), v in s.items() if name == "gpucluster_slurm_jobs_pending") == 3


def test_sdiag_gives_both_schedulers_cycles(story) -> None:
    s = story["backfilled"]
    for scheduler in ("main", "backfill"):
        assert value(s, "gpucluster_slurm_sched_cycles", scheduler=scheduler) >= 1
        for metric in ("cycle_last_seconds", "cycle_max_seconds", "cycle_mean_seconds", "depth_mean",
                       "queue_length"):
            got = value(s, f"gpucluster_slurm_sched_{metric}", scheduler=scheduler)
            assert got is not None and got >= 0, (metric, scheduler)
        assert 0 < value(s, "gpucluster_slurm_sched_cycle_max_seconds", scheduler=scheduler) < 60
    assert value(s, "gpucluster_slurm_sched_depth_last", scheduler="backfill") is not None


def test_the_file_passes_promtool(story) -> None:
    promtool_check(story["text"])
