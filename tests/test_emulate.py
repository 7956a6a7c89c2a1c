"""Emulated clusters: config adaptation (pure), leaf arithmetic (pure), and the real thing:
slurmctld + 64 ``slurmd -N`` from a rendered spec, where every job that fits under one leaf must be
placed under one leaf.

Expected values come from the rendered files and the plan, never from copies of them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import hostlist
import pytest

from gpucluster.emulate import SlurmStartError
from gpucluster.emulate import placement as P
from gpucluster.emulate.adapt import ConfError, Layout, SlurmConf, adapt_gres_conf, adapt_slurm_conf
from gpucluster.emulate.emulator import emulate
from gpucluster.emulate.procs import _exists
from gpucluster.emulate.specs import Rendered, scaled_spec, write_and_render
from gpucluster.emulate.switchtree import Fabric, parse_topology_conf
from gpucluster.render.topology import slurm_switches

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HAVE_SLURM = all(shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("slurmctld", "slurmd", "munged"))
needs_slurm = pytest.mark.skipif(
    not IN_CI and not HAVE_SLURM,
    reason="slurmctld/slurmd/munged not installed (apt-get install slurmctld slurmd slurm-client munge)",
)

# 64 nodes in 8 scalable units of 8 (rail-optimised, the meta-24k-ib shape): small leaves, so jobs
# of 1-16 nodes both fit and do not fit under one leaf.
CI_NODES = 64
CI_UNIT = 8


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    text = scaled_spec("meta-24k-ib", {"h100": CI_NODES}, name="emu64", fabric={"scalable_unit_nodes": CI_UNIT})
    return write_and_render(text, tmp_path_factory.mktemp("emu"), "emu64")


@pytest.fixture(scope="module")
def fabric(rendered: Rendered) -> Fabric:
    return Fabric.from_topology(parse_topology_conf((rendered.conf_dir / "topology.conf").read_text()))


def layout(emulated: tuple[str, ...] = (), absent: str | None = None) -> Layout:
    return Layout(
        workdir=PurePosixPath("/w"),
        hostname="here",
        ctld_port=20000,
        slurmd_port=20001,
        munge_socket=PurePosixPath("/w/munge/sock"),
        emulated=emulated,
        node_port_base=20002,
        absent_state=absent,
    )


# ------------------------------------------------------------------------------- adaptation (pure)
# what the adaptation may change; everything else in slurm.conf must come through verbatim
MAY_CHANGE = {
    "SlurmctldHost", "SlurmctldPort", "SlurmdPort", "StateSaveLocation", "SlurmdSpoolDir",
    "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile", "SlurmdLogFile", "SlurmUser", "SlurmdUser",
    "AuthInfo", "AccountingStorageType", "AccountingStorageHost", "AccountingStoragePort",
    "AccountingStorageTRES", "ProctrackType", "TaskPlugin", "JobAcctGatherType", "SlurmdParameters",
    "PrologFlags",
    "RebootProgram",  # the emulated reboot (harness.REBOOT_SCRIPT)
    # the node health checks' program lives on real nodes only (and would run once per emulated node)
    "HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState",
}  # fmt: skip


def _params(text: str) -> dict[str, str]:
    conf = SlurmConf.parse(text)
    return {ln.pairs[0][0]: ln.pairs[0][1] for ln in conf.lines if ln.kind == "param"}


def test_adaptation_keeps_every_scheduling_setting(rendered: Rendered) -> None:
    src = (rendered.conf_dir / "slurm.conf").read_text()
    nodes = tuple(SlurmConf.parse(src).node_names())
    out, notes, _ = adapt_slurm_conf(src, layout(nodes))
    before, after = _params(src), _params(out)
    for key, value in before.items():
        if key not in MAY_CHANGE:
            assert after.get(key) == value, key
    assert {n.key for n in notes if n.file == "slurm.conf" and not n.key.startswith("NodeName")} <= MAY_CHANGE
    # partitions come through verbatim
    assert [ln.render() for ln in SlurmConf.parse(src).records("partitionname")] == [
        ln.render() for ln in SlurmConf.parse(out).records("partitionname")
    ]


def test_emulated_nodes_get_localhost_and_one_port_each(rendered: Rendered) -> None:
    src = (rendered.conf_dir / "slurm.conf").read_text()
    nodes = tuple(SlurmConf.parse(src).node_names())
    out, _, ports = adapt_slurm_conf(src, layout(nodes))
    assert sorted(ports) == sorted(nodes)
    assert sorted(ports.values()) == list(range(20002, 20002 + len(nodes)))
    conf = SlurmConf.parse(out)
    for line in conf.records("nodename"):
        assert line.get("NodeHostname") == "localhost"
        names = hostlist.expand_hostlist(line.pairs[0][1])
        first, _, last = line.get("Port").strip("[]").partition("-")
        assert [ports[n] for n in names] == list(range(int(first), int(last or first) + 1))
    # node hardware (CPUs, memory, gres) untouched
    for old, new in zip(SlurmConf.parse(src).records("nodename"), conf.records("nodename"), strict=True):
        for key in ("CPUs", "RealMemory", "Gres", "CoresPerSocket", "Feature"):
            assert old.get(key) == new.get(key)


def test_kept_ports_stay_and_new_nodes_get_new_ones(rendered: Rendered) -> None:
    """A grown cluster (SlurmCluster.load_config): nodes that ran keep their ports, the new ones get a block of
    their own, and a NodeName line is split wherever ports stop following each other."""
    src = (rendered.conf_dir / "slurm.conf").read_text()
    nodes = tuple(SlurmConf.parse(src).node_names())
    kept = {n: 20002 + i for i, n in enumerate(nodes[:-2])}
    lay = Layout(workdir=PurePosixPath("/w"), hostname="h", ctld_port=20000, slurmd_port=20001,
                 munge_socket=PurePosixPath("/w/m"), emulated=nodes, node_port_base=30000, node_ports=kept,
                 reboot_program='"/w/bin/reboot /w/reboot"')
    out, notes, ports = adapt_slurm_conf(src, lay)
    assert {n: ports[n] for n in kept} == kept and [ports[n] for n in nodes[-2:]] == [30000, 30001]
    conf = SlurmConf.parse(out)
    assert conf.param("RebootProgram") == '"/w/bin/reboot /w/reboot"'
    assert any(n.key == "RebootProgram" for n in notes)
    for line in conf.records("nodename"):
        names = hostlist.expand_hostlist(line.pairs[0][1])
        first, _, last = line.get("Port").strip("[]").partition("-")
        assert [ports[n] for n in names] == list(range(int(first), int(last or first) + 1))
    assert sorted(hostlist.expand_hostlist(",".join(ln.pairs[0][1] for ln in conf.records("nodename")))) == \
        sorted(nodes)


def test_nodes_not_emulated_stay_defined(rendered: Rendered) -> None:
    src = (rendered.conf_dir / "slurm.conf").read_text()
    nodes = SlurmConf.parse(src).node_names()
    out, _, ports = adapt_slurm_conf(src, layout(tuple(nodes[:10]), absent="FUTURE"))
    conf = SlurmConf.parse(out)
    assert sorted(conf.node_names()) == sorted(nodes)
    future = [n for ln in conf.records("nodename") if ln.get("State") == "FUTURE"
              for n in hostlist.expand_hostlist(ln.pairs[0][1])]  # fmt: skip
    assert sorted(future) == sorted(nodes[10:])
    assert sorted(ports) == sorted(nodes[:10])


def test_emulator_never_invents_nodes(rendered: Rendered) -> None:
    src = (rendered.conf_dir / "slurm.conf").read_text()
    with pytest.raises(ConfError, match="never invents"):
        adapt_slurm_conf(src, layout(("gti9999",)))


def test_gres_conf_keeps_count_and_type(rendered: Rendered) -> None:
    src = (rendered.conf_dir / "gres.conf").read_text()
    out, notes, stand_ins = adapt_gres_conf(src, PurePosixPath("/w"))
    gpus_per_node = rendered.spec.group("h100").gpus_per_node
    assert len(stand_ins) == gpus_per_node
    assert all(p.startswith("/w/dev/") for p in stand_ins)
    assert "AutoDetect" not in out.replace("# AutoDetect", "")
    assert f"Type={rendered.plan.spec.parts.gpus['h100-sxm5-80g'].slurm_type}" in out
    assert {n.key for n in notes} <= {"AutoDetect", "File"}


# -------------------------------------------------------------------------------- topology (pure)
def test_topology_conf_matches_plan(rendered: Rendered, fabric: Fabric) -> None:
    topo = parse_topology_conf((rendered.conf_dir / "topology.conf").read_text())
    for sw in slurm_switches(rendered.plan):
        assert topo[sw.name]["level"] == sw.level
        if sw.nodes:
            assert topo[sw.name]["nodes"] == {n for h in sw.nodes for n in hostlist.expand_hostlist(h)}
        assert topo[sw.name]["switches"] == set(sw.switches)
    assert len(fabric.leaf_nodes) == CI_NODES // CI_UNIT


def test_leaf_arithmetic(fabric: Fabric) -> None:
    leaves = sorted(fabric.leaf_nodes)
    assert fabric.min_leaves(CI_UNIT) == 1
    assert fabric.min_leaves(CI_UNIT + 1) == 2
    one_leaf = sorted(fabric.leaf_nodes[leaves[0]])
    assert fabric.lca_level(one_leaf) == 0
    two = [one_leaf[0], sorted(fabric.leaf_nodes[leaves[1]])[0]]
    assert fabric.lca_level(two) >= 1
    # a leaf with two nodes taken cannot hold a full unit any more
    usable = fabric.nodes - set(one_leaf[:2])
    assert fabric.capacity(usable)[leaves[0]] == CI_UNIT - 2


def test_workload_is_seeded_and_in_range() -> None:
    a = P.make_workload(50, seed=3, max_nodes=64)
    assert a == P.make_workload(50, seed=3, max_nodes=64)
    assert a != P.make_workload(50, seed=4, max_nodes=64)
    assert all(1 <= j.nodes <= 64 for j in a)


def test_scores_count_needless_spine_crossings(fabric: Fabric) -> None:
    leaves = sorted(fabric.leaf_nodes)
    l0, l1 = (sorted(fabric.leaf_nodes[x]) for x in leaves[:2])
    job = P.JobSpec("j", 4, 1)
    good = P.Placed(job, "1", nodes=l0[:4], started=1.0)
    bad = P.Placed(job, "2", nodes=l0[4:6] + l1[:2], started=2.0)
    run = P.RunResult("t", [good, bad], 2.0, fabric.nodes, {}, None, False)
    s = P.score(run, fabric)
    assert s.on_min_leaves == 0.5
    assert s.needless_spine == 0.5
    assert s.mean_leaves == 1.5


# --------------------------------------------------------------------------- the real thing (slurm)
@pytest.fixture(scope="module")
def cluster(rendered: Rendered) -> Iterator:
    with emulate(rendered.conf_dir) as c:
        yield c


@needs_slurm
@pytest.mark.slurm
@pytest.mark.emulate
def test_every_node_registers_with_its_gres(cluster, rendered: Rendered) -> None:
    nodes = cluster.nodes()
    expected = {n: ln.get("Gres") for ln in SlurmConf.parse((rendered.conf_dir / "slurm.conf").read_text())
                .records("nodename") for n in hostlist.expand_hostlist(ln.pairs[0][1])}  # fmt: skip
    assert set(nodes) == set(expected)
    for name, rec in nodes.items():
        assert rec["registered"], name
        assert rec["gres"] == expected[name]
        assert "IDLE" in rec["states"], (name, rec["state"])


@needs_slurm
@pytest.mark.slurm
@pytest.mark.emulate
def test_topology_read_back_equals_rendered(cluster, rendered: Rendered) -> None:
    assert cluster.topology() == parse_topology_conf((rendered.conf_dir / "topology.conf").read_text())


@needs_slurm
@pytest.mark.slurm
@pytest.mark.emulate
def test_job_that_fits_one_leaf_is_placed_under_one_leaf(cluster, fabric: Fabric) -> None:
    jobs = P.make_workload(30, seed=11, max_nodes=2 * CI_UNIT, min_seconds=8, max_seconds=25)
    # every placement is known once the last job has started: cancel the sleeps rather than wait them out (~20 s)
    run = P.run_sequential(cluster, jobs, fabric, label="ci", wait_done=False)
    assert cluster.cancel_all(), "the workload's jobs did not end when cancelled"
    fitted = [p for p in run.placed if p.fit_one_leaf_now]
    spread = [(p.jobid, p.job.nodes, hostlist.collect_hostlist(p.nodes)) for p in fitted
              if len(fabric.leaves(p.nodes)) > 1]  # fmt: skip
    assert len(run.placed) == len(jobs)
    assert len(fitted) >= len(jobs) // 2  # the check below is not vacuous
    assert not spread, f"jobs that fit under one leaf but were spread: {spread}"


@needs_slurm
@pytest.mark.slurm
@pytest.mark.emulate
def test_emulate_subset_and_cleanup(rendered: Rendered) -> None:
    with emulate(rendered.conf_dir, nodes=4) as c:
        pids = [t.pid for t in c.tracker.procs]
        workdir = c.workdir
        assert len(c.slurmd) == 4
        assert sorted(c.nodes()) == sorted(c.slurmd)  # the rest are FUTURE: defined, not shown
        out = c.run(["sbatch", "--parsable", "-N", "2", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 300"])
        assert out.returncode == 0, out.stderr
    assert not [p for p in pids if _exists(p)]
    assert not c.tracker.marked_pids()  # slurmstepd and the job's sleep are gone too
    assert not workdir.exists()


def test_emulate_refuses_more_nodes_than_the_spec_has(rendered: Rendered) -> None:
    with pytest.raises(SlurmStartError, match="never invents"), emulate(rendered.conf_dir, nodes=CI_NODES + 1):
        pass


@needs_slurm
@pytest.mark.slurm
@pytest.mark.emulate
def test_cli_runs_a_command_against_the_emulated_cluster(rendered: Rendered, capfd) -> None:
    from gpucluster.cli import main

    rc = main(["emulate", str(rendered.conf_dir), "--nodes", "3", "--run", "sinfo -h -o '%D %T'"])
    out = capfd.readouterr().out
    assert rc == 0
    assert "3 idle" in out
