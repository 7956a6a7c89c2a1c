"""The real consumer: slurmctld loads a config and we read back what it understood.

Until the renderer lands this runs on a hand-written config of the shape the renderer produces;
expected values are read from those files, never restated here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest

from gpucluster.emulate import SlurmCluster, SlurmStartError, roots
from gpucluster.emulate.adapt import SlurmConf
from gpucluster.emulate.procs import _exists
from gpucluster.emulate.switchtree import parse_topology_conf
from gpucluster.render.topology import slurm_switches

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not IN_CI and shutil.which("slurmctld") is None and not Path("/usr/sbin/slurmctld").exists(),
        reason="slurmctld not installed (apt-get install slurmctld slurmd slurm-client munge)",
    ),
]

SLURM_CONF = """\
ClusterName=t
SlurmctldHost=ctl01
AuthType=auth/munge
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
TopologyPlugin=topology/tree
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TreeWidth=3
NodeName=gpu[0001-0008] CPUs=8 Boards=1 SocketsPerBoard=2 CoresPerSocket=2 ThreadsPerCore=2 \
RealMemory=4000 Gres=gpu:h100:8 State=UNKNOWN
PartitionName=batch Nodes=gpu[0001-0008] Default=YES MaxTime=INFINITE State=UP
"""
TOPOLOGY_CONF = """\
SwitchName=leaf001 Nodes=gpu[0001-0004]
SwitchName=leaf002 Nodes=gpu[0005-0008]
SwitchName=root Switches=leaf[001-002]
"""
GRES_CONF = "NodeName=gpu[0001-0008] Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"


def write_conf(d: Path, topology: str = TOPOLOGY_CONF) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "slurm.conf").write_text(SLURM_CONF)
    (d / "topology.conf").write_text(topology)
    (d / "gres.conf").write_text(GRES_CONF)
    (d / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    return d


@pytest.fixture(scope="module")
def conf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_conf(tmp_path_factory.mktemp("rendered"))


@pytest.fixture(scope="module")
def cluster(conf_dir: Path) -> Iterator[SlurmCluster]:
    with SlurmCluster(conf_dir) as c:
        yield c


def config_gres(slurm_conf: str) -> dict[str, str]:
    """node -> Gres= as written in slurm.conf."""
    out: dict[str, str] = {}
    for line in SlurmConf.parse(slurm_conf).records("nodename"):
        for n in hostlist.expand_hostlist(line.pairs[0][1]):
            out[n] = line.get("Gres") or ""
    return out


def test_slurmctld_answers(cluster: SlurmCluster) -> None:
    assert " is UP" in cluster.run(["scontrol", "ping"]).stdout


def test_topology_read_back_equals_config(cluster: SlurmCluster, conf_dir: Path) -> None:
    expected = parse_topology_conf((conf_dir / "topology.conf").read_text())
    assert cluster.topology() == expected


@pytest.mark.parametrize("node", sorted(config_gres(SLURM_CONF)))
def test_node_has_configured_gres(cluster: SlurmCluster, conf_dir: Path, node: str) -> None:
    nodes = cluster.nodes()
    assert node in nodes
    assert nodes[node]["gres"] == config_gres((conf_dir / "slurm.conf").read_text())[node]
    assert "batch" in nodes[node]["partitions"]


def test_only_single_machine_settings_adapted(cluster: SlurmCluster) -> None:
    changed = {a.key for a in cluster.adaptations}
    # what the scheduler decides with is never touched
    for key in ("SelectType", "SelectTypeParameters", "TopologyPlugin", "TreeWidth", "GresTypes"):
        assert key not in changed
    assert "SlurmctldHost" in changed and "AuthInfo" in changed


BROKEN = {
    # slurmctld 22.05 only warns about these three and runs on a different topology: the harness fails
    "unknown_node": ("gpu[0005-0008]", "gpu[0005-0008],gpu9999", "gpu9999"),
    "node_under_no_leaf": ("gpu[0005-0008]", "gpu[0005-0007]", "gpu0008"),
    "node_under_two_leaves": ("gpu[0001-0004]", "gpu[0001-0005]", "gpu0005"),
    # ... and this one is fatal to slurmctld itself
    "undefined_switch": ("leaf[001-002]", "leaf[001-003]", "leaf003"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_topology_fails_with_log_tail(tmp_path: Path, case: str) -> None:
    old, new, culprit = BROKEN[case]
    bad = write_conf(tmp_path / "bad", TOPOLOGY_CONF.replace(old, new))
    cluster = SlurmCluster(bad)
    with pytest.raises(SlurmStartError) as err, cluster:
        pass
    msg = str(err.value)
    assert "last lines of" in msg and "slurmctld.log" in msg
    assert culprit in msg  # slurmctld's own complaint, from its log
    assert not [t for t in cluster.tracker.procs if _exists(t.pid)]
    assert not cluster.workdir.exists()


def test_stop_leaves_nothing(conf_dir: Path) -> None:
    with SlurmCluster(conf_dir) as c:
        pids = [t.pid for t in c.tracker.procs]
        workdir = c.workdir
        assert len(pids) == 2  # munged + slurmctld
    assert not [p for p in pids if _exists(p)]
    assert not c.tracker.marked_pids()
    assert not workdir.exists()


# ------------------------------------------------------------------ the rendered examples, for real
EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def _declared_version(path: Path) -> tuple[int, int]:
    import yaml

    major, minor = str(yaml.safe_load(path.read_text())["slurm"].get("version", "22.05")).split(".")
    return int(major), int(minor)


def _installed_version() -> tuple[int, int]:
    import re
    import subprocess

    try:
        out = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return (22, 5)
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (22, 5)


# Only examples rendered for a Slurm this slurmctld is (a newer render is not this consumer's file).
LOADABLE = sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml") if _declared_version(p) <= _installed_version())


def expected_topology(plan) -> dict[str, dict]:
    """What slurmctld must report, from the plan alone: levels as planned, nodes of a switch = all below."""
    switches = {sw.name: sw for sw in slurm_switches(plan)}

    def below(name: str) -> set[str]:
        sw = switches[name]
        nodes = {n for h in sw.nodes for n in hostlist.expand_hostlist(h)}
        for child in sw.switches:
            nodes |= below(child)
        return nodes

    return {
        name: {"level": sw.level, "nodes": below(name), "switches": set(sw.switches), "linkspeed": 1}
        for name, sw in switches.items()
    }


@pytest.fixture(scope="module", params=LOADABLE)
def rendered_example(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from gpucluster.emulate.specs import render_spec

    r = render_spec(EXAMPLES_DIR / f"{request.param}.yaml", tmp_path_factory.mktemp(request.param))
    with SlurmCluster(r.conf_dir, start_timeout=180) as c:
        yield r, c


def test_example_topology_as_planned(rendered_example) -> None:
    r, cluster = rendered_example
    got = cluster.topology()
    assert got == expected_topology(r.plan)
    assert got == parse_topology_conf((r.conf_dir / "topology.conf").read_text())


def test_example_gres_as_specified(rendered_example) -> None:
    r, cluster = rendered_example
    nodes = cluster.nodes()
    for group in r.spec.gpu_groups:
        gtype = r.spec.parts.gpus[group.gpu].slurm_type
        for host in group.hosts:
            assert nodes[host]["gres"] == f"gpu:{gtype}:{group.gpus_per_node}", host


# ------------------------------------------------------------------ Slurm lines from Debian roots


def test_verifier_line_is_the_oldest_line_not_older_than_the_release() -> None:
    from gpucluster.spec.slurm_versions import RELEASES

    got = {r: roots.verifier_line(r) for r in RELEASES}
    assert got == {"22.05": "22.05", "23.02": "24.11", "23.11": "24.11", "24.05": "24.11", "24.11": "24.11",
                   "25.05": "26.05", "25.11": "26.05", "26.05": "26.05"}


def test_an_unclaimed_line_is_refused() -> None:
    with pytest.raises(roots.RootError, match=r"choose one of 22\.05, 24\.11, 26\.05"):
        roots.runtime("23.11")


def test_cache_dir_is_private_and_refused_when_someone_else_owns_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(roots.CACHE_ENV, str(tmp_path / "c"))
    folder = roots.cache_dir()
    assert folder == tmp_path / "c" / "slurm-roots"
    assert (folder.stat().st_mode & 0o777) == 0o700 and folder.stat().st_uid == os.geteuid()
    folder.chmod(0o777)
    assert (roots.cache_dir().stat().st_mode & 0o777) == 0o700  # others' write access taken back
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
        with pytest.raises(roots.RootError, match="not a folder owned by this user"):
            roots.cache_dir()


def test_the_recipe_hash_names_the_root_and_never_the_mirror(monkeypatch, tmp_path) -> None:
    text = "gpucluster slurm root recipe v1\nmirror MIRROR-A"
    name = roots.root_name("sid", text)
    assert name.startswith("sid-") and "MIRROR" not in name
    assert roots.root_name("sid", text.replace("A", "B")) != name  # another mirror, another root
    assert roots.root_name("sid", text) == name


ROOT_LINES = [line for line, suite in roots.LINES.items() if suite]


@pytest.mark.parametrize("line", ROOT_LINES)
def test_a_root_line_runs_and_leaves_nothing(conf_dir: Path, line: str) -> None:
    """slurmctld of the line, through chroot: it answers, reports the line, and stopping it leaves no
    process, no private dir inside the cached root, and no mount (they lived in a private namespace)."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("root lines need root (chroot, mount namespaces)")
        pytest.skip("root lines need root (chroot, mount namespaces)")
    with SlurmCluster(conf_dir, line=line) as c:
        assert c.runtime.root is not None and c.workdir.is_relative_to(c.runtime.root)
        assert " is UP" in c.run(["scontrol", "ping"]).stdout
        assert c.runtime.version().startswith(line + ".")
        assert c.topology() == parse_topology_conf((conf_dir / "topology.conf").read_text())
        pids = [t.pid for t in c.tracker.procs]
        workdir, root = c.workdir, c.runtime.root
    assert not [p for p in pids if _exists(p)]
    assert not workdir.exists()
    mounts = Path("/proc/self/mounts").read_text()
    assert str(root) not in mounts


def test_a_new_config_lands_adapted_and_whole(cluster: SlurmCluster, conf_dir: Path, monkeypatch) -> None:
    """load_config on a running cluster: while the new config is being adapted, etc/ still holds the adapted
    files of before, and then the new adapted ones land, with no temporary file left. Copying the rendered
    files first and adapting them after let a daemon read an unadapted file in between: a batch step read the
    rendered cgroup.conf inside a Debian root, failed to launch, and its job was requeued."""
    from gpucluster.emulate import harness

    def files() -> dict[str, bytes]:
        return {f.name: f.read_bytes() for f in cluster.etc.iterdir() if f.is_file()}

    before, seen = files(), {}
    real = harness.adapt_slurm_conf

    def spy(*args, **kwargs):
        seen.update(files())
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "adapt_slurm_conf", spy)
    cluster.load_config(conf_dir, cluster.slurmd_nodes)
    assert seen == before
    after = files()
    assert set(after) == set(before)
    assert after["slurm.conf"] != (conf_dir / "slurm.conf").read_bytes()  # adapted, not the rendered file
    assert SlurmConf.parse(after["slurm.conf"].decode()).param("SlurmctldHost") == \
        SlurmConf.parse(before["slurm.conf"].decode()).param("SlurmctldHost")
