"""`gpucluster fabric test` on the staged cluster of examples/staging.yaml (the session's staged_cluster).

Staged nodes have no GPU and no HCA, so the probe job finds none and the same orchestration runs iperf3
over the container network: the staging stand-in for the transport, judged against the threshold the
plan gives for the staging NIC (veth-staging, 10 Gb/s) and the stand-in's calibrated efficiency.

1. On the healthy cluster every case passes, each case ran as its own Slurm job on exactly its nodes
   (slurmctld's record of each job), and the figures are printed for docs/fabric.md.
2. One node's interface is throttled from the host side (`tc ... tbf` on its podman veth): the test fails
   and names that node, and only it, as the suspect, with the Slurm jobs that measured it. The throttle is
   removed whatever happens, and the next run passes.

The command under test is the real CLI in a subprocess. Expected values come from the plan.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.fabric.asbuilt import fabrictest
from gpucluster.fabric.asbuilt.jobs import JOB_NAME

pytestmark = pytest.mark.staged

SPEC = Path(__file__).resolve().parents[2] / "examples" / "staging.yaml"
_PLAN = load_cluster(SPEC).plan
FABRIC_NODES = [h for u in _PLAN.units for h in fabrictest.unit_hosts(_PLAN, u)]
THROTTLED = fabrictest.unit_hosts(_PLAN, _PLAN.units[-1])[0]  # the first node under the last leaf
THROTTLE_RATE = "10mbit"  # 0.01 Gb/s: 20x under the stand-in's bar of 0.2 Gb/s (docs/fabric.md)


def _fabric_test(cluster, *args: str) -> tuple[int, dict, str]:
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "fabric", "test", str(cluster.inventory.parent),
                          "--json", *args], capture_output=True, text=True, timeout=900, check=False)
    took = time.monotonic() - t0
    assert res.returncode in (0, 1), f"fabric test exited {res.returncode}: {res.stderr[-2000:]}"
    doc = json.loads(res.stdout)
    print(f"fabric test ({took:.0f} s, exit {res.returncode}): "
          + "; ".join(f"{r['tier']} {'-'.join(r['nodes']) if len(r['nodes']) == 2 else 'all'} {r['value']} "
                      f"{r['unit']} (>= {r['threshold']})" for r in doc["results"]))
    return res.returncode, doc, res.stderr


def _jobs_in_slurm(cluster, job_ids: list[str]) -> dict[str, dict]:
    """slurmctld's record of each job (finished jobs stay for MinJobAge, 300 s by default)."""
    res = cluster.ssh("ctl01", f"for j in {' '.join(job_ids)}; do scontrol -o show job $j; done", check=True)
    out = {}
    for line in res.stdout.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "JobId" in fields:
            out[fields["JobId"]] = fields
    return out


def _expand(nodelist: str) -> list[str]:
    import hostlist

    return hostlist.expand_hostlist(nodelist)


def test_fabric_test_passes_through_slurm_jobs(staged_cluster):
    c = staged_cluster
    assert c.first_configure.ok, f"the first configure failed; log: {c.first_configure.log_path}"
    rc, doc, err = _fabric_test(c)
    assert rc == 0 and doc["ok"], (doc["results"], doc["not_measured"], err[-1000:])
    assert doc["transport"] == "iperf3" and doc["stand_in"], doc["why"]
    assert "no GPU and no HCA" in doc["why"]
    tr = fabrictest.TRANSPORTS["iperf3"]
    want_cases = fabrictest.cases(_PLAN, fabrictest.TIERS, "iperf3")
    assert sorted((r["tier"], tuple(r["nodes"])) for r in doc["results"]) == \
        sorted((k.tier, k.nodes) for k in want_cases)
    for r in doc["results"]:
        assert r["threshold"] == fabrictest.threshold(_PLAN, r["tier"], tr) == _PLAN.speed_gbps * tr.efficiency
        assert r["value"] >= r["threshold"] and not r["slow"]
    assert {n for r in doc["results"] for n in r["nodes"]} == set(FABRIC_NODES)
    assert doc["suspects"] == [] and doc["not_measured"] == []
    # each case was a Slurm job of its own, on exactly its nodes
    record = _jobs_in_slurm(c, [r["job"] for r in doc["results"]])
    for r in doc["results"]:
        job = record[r["job"]]
        assert job["JobName"] == JOB_NAME
        assert sorted(_expand(job["NodeList"])) == sorted(r["nodes"]), (r, job["NodeList"])
        assert job["JobState"] == "COMPLETED", job["JobState"]


def _host_veth(cluster, host: str) -> str:
    """The host-side end of the node's eth0: the interface whose index the container's eth0 links to."""
    index = int(cluster.exec(host, "cat", "/sys/class/net/eth0/iflink", check=True).stdout)
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True,
                                      check=True).stdout)
    name = next((link["ifname"] for link in links if link["ifindex"] == index), None)
    assert name, f"{host}: no host interface with index {index} (its eth0's peer)"
    return name


def _qdisc(dev: str) -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", dev], capture_output=True, text=True, check=False).stdout


@pytest.mark.disruptive
def test_a_throttled_node_is_named_and_the_fabric_passes_once_it_is_lifted(staged_cluster):
    c = staged_cluster
    assert c.first_configure.ok, f"the first configure failed; log: {c.first_configure.log_path}"
    veth = _host_veth(c, THROTTLED)
    try:
        subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", THROTTLE_RATE, "burst", "32kb",
                        "latency", "50ms"], check=True, capture_output=True, text=True)
        assert "tbf" in _qdisc(veth)
        rc, doc, err = _fabric_test(c)
        assert rc == 1 and not doc["ok"], err[-1000:]
        assert doc["not_measured"] == [], doc["not_measured"]
        suspects = [(s["kind"], s["name"]) for s in doc["suspects"]]
        assert suspects == [("node", THROTTLED)], doc["suspects"]
        slow = [r for r in doc["results"] if r["slow"]]
        assert slow and all(THROTTLED in r["nodes"] for r in slow), slow
        pairs_of_it = [r for r in doc["results"] if THROTTLED in r["nodes"] and len(r["nodes"]) == 2]
        assert pairs_of_it and all(r["slow"] for r in pairs_of_it)
        evidence = doc["suspects"][0]["evidence"]
        assert len(evidence) == len(pairs_of_it) and all("job " in e for e in evidence), evidence
        # the slow figures came from Slurm jobs that ran on the throttled node
        record = _jobs_in_slurm(c, [r["job"] for r in slow])
        assert all(THROTTLED in _expand(record[r["job"]]["NodeList"]) for r in slow)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], capture_output=True, check=False)
    assert "tbf" not in _qdisc(veth)
    rc, doc, err = _fabric_test(c)
    assert rc == 0 and doc["ok"] and doc["suspects"] == [], (doc["results"], err[-1000:])
