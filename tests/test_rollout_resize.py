"""Grow and shrink on real Slurm daemons (the emulator: a real slurmctld and one `slurmd -N` per node), on each line
gpucluster runs: 22.05 from the host, where Slurm learns a changed node list by restarting slurmctld and every
slurmd, and 24.11 and 26.05 from their Debian roots, where `scontrol reconfigure` does it (resize.plan_resize, from
gpucluster.slurmkeys). With a job running throughout: 12 nodes in 3 leaves of 4 grow by a leaf to 16, then shrink
by two nodes to 14, one of which runs a job when the shrink starts.

What must hold: the job started before the grow runs through grow and shrink on the same nodes and ends
COMPLETED, never requeued; the new nodes are out of service while they are checked, then join the partition and
the topology (a new leaf); a node that runs a job is never removed (the shrink halts with it drained, and its
job runs on); once the job ends the shrink removes the nodes from Slurm."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import hostlist
import pytest
from conftest import need_slurm_line

from gpucluster.cluster import load_cluster
from gpucluster.emulate.emulator import config_nodes
from gpucluster.emulate.harness import SlurmCluster, tail
from gpucluster.emulate.specs import scaled_spec, write_and_render
from gpucluster.rollout.engine import Halted
from gpucluster.rollout.resize import grow, plan_resize, shrink
from gpucluster.rollout.slurmops import Slurm

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]
LINES = ("22.05", "24.11", "26.05")


@pytest.fixture(scope="module", params=LINES)
def line(request) -> str:
    """The Slurm line, as tests/test_diff_classes_real.py picks it: 22.05 from the host's packages, the others from
    their Debian roots. Module-scoped so that each line is its own xdist group (conftest.py, "loadgroup")."""
    need_slurm_line(request.param)
    return request.param


class Emulated:
    """resize.Controller on the emulator: a new rendered config and the daemons it runs."""

    def __init__(self, cluster: SlurmCluster, conf_dir: Path):
        self.cluster, self.conf_dir = cluster, conf_dir

    def load_config(self, nodes: Sequence[str]) -> None:
        self.cluster.load_config(self.conf_dir, nodes)

    def restart_slurmctld(self) -> None:
        self.cluster.restart_slurmctld()

    def restart_slurmd(self, nodes: Sequence[str]) -> None:
        self.cluster.restart_slurmd(nodes)

    def start_slurmd(self, nodes: Sequence[str]) -> None:
        self.cluster.start_slurmd(nodes)

    def stop_slurmd(self, nodes: Sequence[str]) -> None:
        self.cluster.stop_slurmd(nodes)


def _job(c: SlurmCluster, jobid: str) -> dict[str, str]:
    out = c.run(["scontrol", "show", "job", "-o", jobid]).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


def _sbatch(c: SlurmCluster, *args: str) -> str:
    res = c.run(["sbatch", "--parsable", "--exclusive", "-o", "/dev/null", *args])
    assert res.returncode == 0, res.stderr
    jobid = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while _job(c, jobid).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, _job(c, jobid)
        time.sleep(0.3)
    return jobid


def _until_released(c: SlurmCluster, name: str) -> str:
    """A job's script that runs until the test releases it (creates the file `name` in the cluster's private dir,
    as the job sees it), at most 300 s, then exits 0 (COMPLETED): a job that lasts exactly as long as the test
    needs, where a fixed `sleep` had to outlast the slowest grow and shrink on a loaded machine."""
    flag = c.inner / name
    return f"for i in $(seq 1500); do [ -e {flag} ] && exit 0; sleep 0.2; done; exit 1"


def _release(c: SlurmCluster, name: str) -> None:
    (c.workdir / name).touch()


def test_grow_by_a_leaf_then_shrink_keeps_the_running_job(tmp_path: Path, line: str) -> None:
    specs = {}
    for n in (12, 16, 14):
        text = scaled_spec("meta-24k-ib", {"h100": n}, name="rs", fabric={"scalable_unit_nodes": 4},
                           slurm={"version": line})
        specs[n] = write_and_render(text, tmp_path / str(n), "rs")
    clusters = {n: load_cluster(tmp_path / str(n) / "rs.yaml") for n in specs}
    up, down = plan_resize(clusters[12], clusters[16]), plan_resize(clusters[16], clusters[14])
    assert up.added == ("gti0013", "gti0014", "gti0015", "gti0016") and not up.removed
    assert down.removed == ("gti0015", "gti0016") and not down.added
    assert up.how == down.how == ("restart" if line == "22.05" else "reconfigure"), (line, up.how, down.how)
    conf = specs[12].conf_dir
    with SlurmCluster(conf, slurmd_nodes=config_nodes(conf), line=line, start_timeout=120, reboot_delay=0.5) as c:
        slurm = Slurm(c.run)
        long = _sbatch(c, "-N", "4", "--wrap", _until_released(c, "release-long"))
        before = _job(c, long)
        seen: dict[str, tuple[str, str]] = {}

        def check(nodes: Sequence[str]) -> dict[str, str]:  # the new nodes while they are checked
            now = slurm.nodes(nodes)
            seen.update({n: ("+".join(sorted(now[n].states)), now[n].reason) for n in nodes})
            return {}

        failed = grow(up, Emulated(c, specs[16].conf_dir), slurm, "t1", check=check, say=lambda _: None)
        assert not failed
        assert all("DRAIN" in st and reason == "gpc:grow t1" for st, reason in seen.values()), seen
        nodes = c.nodes()
        assert set(up.added) <= set(nodes) and all("IDLE" in nodes[n]["states"] and "DRAIN" not in nodes[n]["state"]
                                                   for n in up.added), {n: nodes[n]["state"] for n in up.added}
        assert hostlist.expand_hostlist(c.partitions()["train"]["Nodes"]) == list(clusters[16].contract_groups[
            "slurm_compute"])
        assert c.topology()["su0004"]["nodes"] == set(up.added)
        after_grow = _job(c, long)
        assert after_grow["JobState"] == "RUNNING" and after_grow["NodeList"] == before["NodeList"], \
            "\n".join([" ".join(f"{k}={after_grow.get(k)}" for k in ("JobState", "Reason", "Restarts", "NodeList",
                                                                     "StartTime", "Requeue")),
                       c.log_tail(80), "--- the batch node's slurmd:",
                       tail(c.slurmd_log(hostlist.expand_hostlist(before["NodeList"])[0]), 30)])

        # it runs until released, after the first shrink gave up (under load its 1 s timeout took 8 s)
        pinned = _sbatch(c, "-N", "2", "-w", "gti[0015-0016]", "--wrap", _until_released(c, "release-pinned"))
        ctl = Emulated(c, specs[14].conf_dir)
        with pytest.raises(Halted, match="still run jobs"):
            shrink(down, ctl, slurm, "t2", poll=0.3, timeout=1.0, say=lambda _: None)
        assert {"gti0015", "gti0016"} <= set(c.nodes())  # never removed while a job runs there
        assert _job(c, pinned)["JobState"] == "RUNNING"
        _release(c, "release-pinned")
        shrink(down, ctl, slurm, "t2", poll=0.3, timeout=90, say=lambda _: None)
        assert _job(c, pinned)["JobState"] == "COMPLETED"
        left = c.nodes()
        assert not {"gti0015", "gti0016"} & set(left) and len(left) == 14
        assert all(not Slurm(c.run).nodes()[n].out for n in left)
        assert _job(c, long)["JobState"] == "RUNNING"  # it ran through grow and shrink
        _release(c, "release-long")
        deadline = time.monotonic() + 60
        while _job(c, long)["JobState"] in ("RUNNING", "COMPLETING"):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        final = _job(c, long)
        assert final["JobState"] == "COMPLETED" and final["Restarts"] == "0" and final["StartTime"] == \
            before["StartTime"], final
