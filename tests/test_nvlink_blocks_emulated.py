"""A job asking for a whole NVLink domain lands inside one, on real daemons: the emulator (a real
slurmctld and one `slurmd -N` per tray, docs/slurm-versions.md) running the GB200 example's rendered block
topology, scaled to 2 racks (36 trays, 2 domains), on each line that has topology/block (24.11 from the
trixie root, 26.05 from the sid root; 22.05 has no block plugin).

The first tray of domain 1 is taken by a one-node job first, so a topology-blind scheduler would place an
18-node job on gb[0002-0019], across both domains; topology/block must put it whole into domain 2."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest
from conftest import compiled, example_data, skip_or_fail, spec_from_data

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]


def _cluster_files(line: str, out: Path):
    from gpucluster.render import render_all, write_outputs

    data = example_data("gb200-superpod")
    next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = 36
    data["slurm"].update(version=line, topology="block")
    cluster = compiled(spec_from_data(data))
    write_outputs(render_all(cluster, cabling=False), out)
    return cluster


@contextlib.contextmanager
def two_racks(line: str, out: Path) -> Iterator:
    """(cluster, trays, the running emulator) of the GB200 example's two racks on a Slurm line with
    topology/block, its files rendered into `out`; skipped (failed in CI) without root or the line's root."""
    from gpucluster.emulate import SlurmCluster
    from gpucluster.emulate.roots import RootError, runtime

    if os.geteuid() != 0:
        skip_or_fail(f"Slurm {line} runs from a Debian root through chroot, which needs root")
    try:
        runtime(line)
    except RootError as exc:
        skip_or_fail(f"Slurm {line}: {exc}")
    cluster = _cluster_files(line, out)
    g = cluster.spec.group("gb200")
    trays = [g.host(i) for i in range(g.count)]
    with SlurmCluster(out, line=line, slurmd_nodes=trays, start_timeout=120) as sc:
        yield cluster, trays, sc


@pytest.fixture(scope="module", params=["24.11", "26.05"])
def emulated(request, tmp_path_factory) -> Iterator:
    with two_racks(request.param, tmp_path_factory.mktemp(f"blocks-{request.param}")) as (cluster, _trays, sc):
        yield cluster, sc


def _domains(cluster) -> dict[str, set[str]]:
    g = cluster.spec.group("gb200")
    return {d.name: {g.host(i) for i in range(d.first, d.first + d.count)} for d in cluster.plan.domains}


def _sbatch(sc, *args: str) -> str:
    res = sc.run(["sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "sleep 300"])
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _nodes_when_running(sc, job: str, timeout: float = 30) -> set[str]:
    """The job's nodes from `scontrol show job`, once it runs."""
    from gpucluster import slurmtext

    deadline = time.monotonic() + timeout
    rec: dict[str, str] = {}
    while time.monotonic() < deadline:
        rec = slurmtext.record(sc.scontrol("show", "job", "-o", job).strip())
        if rec.get("JobState") == "RUNNING":
            return set(hostlist.expand_hostlist(rec["NodeList"]))
        time.sleep(0.3)
    raise AssertionError(f"job {job} not running after {timeout} s: {rec.get('JobState')} {rec.get('Reason')}")


def test_a_whole_domain_job_lands_inside_one_domain(emulated) -> None:
    cluster, sc = emulated
    domains = _domains(cluster)
    assert len(domains) == 2 and {len(n) for n in domains.values()} == {18}
    sc.cancel_all()
    first = sorted(domains["nvl0001"])[0]
    blocker = _sbatch(sc, "-N1", "-w", first)
    assert _nodes_when_running(sc, blocker) == {first}
    whole = _sbatch(sc, "-N18", "--exclusive")
    got = _nodes_when_running(sc, whole)
    inside = [name for name, nodes in domains.items() if got <= nodes]
    assert inside == ["nvl0002"], f"an 18-node job got {hostlist.collect_hostlist(sorted(got))}, across domains"
    sc.cancel_all()


def test_segments_each_land_inside_one_domain(emulated) -> None:
    """With the first tray of each domain taken, no domain has 18 free trays: an 18-node job in segments of
    9 (--segment=9) gets 9 trays in each domain, never a segment split across two (topology-blind placement
    would take 17 trays of one domain and 1 of the other)."""
    cluster, sc = emulated
    domains = _domains(cluster)
    sc.cancel_all()
    for name in ("nvl0001", "nvl0002"):
        first = sorted(domains[name])[0]
        assert _nodes_when_running(sc, _sbatch(sc, "-N1", "-w", first)) == {first}
    got = _nodes_when_running(sc, _sbatch(sc, "-N18", "--segment=9", "--exclusive"))
    assert {name: len(got & nodes) for name, nodes in domains.items()} == {"nvl0001": 9, "nvl0002": 9}, (
        f"segments of 9 got {hostlist.collect_hostlist(sorted(got))}")
    sc.cancel_all()


def test_a_domain_that_lost_a_tray_gets_no_whole_domain_job(emulated) -> None:
    """docs/health.md: the failing tray drains, its 17 healthy neighbours do not. Slurm's block plugin then
    keeps whole-domain jobs out of the short domain by itself: the first 18-node job takes nvl0002, the second
    waits rather than run on the 17 trays left of nvl0001 plus one elsewhere."""
    cluster, sc = emulated
    domains = _domains(cluster)
    sc.cancel_all()
    lost = sorted(domains["nvl0001"])[5]
    sc.scontrol("update", f"NodeName={lost}", "State=DRAIN", "Reason=gpc:nvlink-fabric: test")
    try:
        first = _sbatch(sc, "-N18", "--exclusive")
        assert _nodes_when_running(sc, first) == domains["nvl0002"]
        second = _sbatch(sc, "-N18", "--exclusive")
        time.sleep(3)
        from gpucluster import slurmtext

        rec = slurmtext.record(sc.scontrol("show", "job", "-o", second).strip())
        assert rec["JobState"] == "PENDING", f"ran on {rec.get('NodeList')} with {lost} drained"
    finally:
        sc.cancel_all()
        sc.scontrol("update", f"NodeName={lost}", "State=RESUME")
