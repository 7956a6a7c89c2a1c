"""Staged nodes follow the Slurm release, and compute nodes on the production profile can run Slurm's
cgroup plugins: the pure parts (no container is started here; tests/staged/test_trixie.py runs them).

Expected values come from the spec, the image's SUITES table and the emulator's Slurm roots (the suite
each Slurm line was measured in), never from copies.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cluster_example, example_data, example_path, load_file

from gpucluster.aptsources import SUITE, debian_mirror
from gpucluster.emulate import roots
from gpucluster.errors import OperationError, UsageError
from gpucluster.stage import image
from gpucluster.stage.lifecycle import node_suite, stage_nodes
from gpucluster.stage.podman import (
    _CGROUP_INIT,
    STAND_IN_MAJOR,
    StageConfig,
    StageNode,
    _ensure_stand_ins,
    _run_args,
    _spec_hash,
    container_name,
)

MIRROR = "http://mirror.example/debian"
SECURITY = "http://mirror.example/debian-security"


def _apt(tmp_path: Path, sources: str, name: str = "debian.sources") -> Path:
    (tmp_path / "sources.list.d").mkdir(parents=True)
    (tmp_path / "sources.list.d" / name).write_text(sources)
    return tmp_path


BOOKWORM_DEB822 = (f"Types: deb\nURIs: {MIRROR}\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
                   f"Types: deb\nURIs: {SECURITY}\nSuites: bookworm-security\nComponents: main\n")


# ---------------------------------------------------------------- the mirror of another suite


def test_a_suite_the_host_does_not_list_comes_from_the_hosts_own_mirror(tmp_path):
    m = debian_mirror(_apt(tmp_path, BOOKWORM_DEB822), suite="trixie")
    assert (m.uri, m.security_uri, m.updates, m.suite) == (MIRROR, SECURITY, True, "trixie")
    text = m.sources_deb822()
    assert "Suites: trixie trixie-updates\n" in text and "Suites: trixie-security\n" in text
    assert "bookworm" not in text


def test_the_hosts_own_suite_is_unchanged(tmp_path):
    m = debian_mirror(_apt(tmp_path, BOOKWORM_DEB822))
    assert m.suite == SUITE == "bookworm"
    assert "Suites: bookworm bookworm-updates\n" in m.sources_deb822()


def test_a_suite_the_host_lists_is_read_as_listed(tmp_path):
    apt = _apt(tmp_path, "deb http://other.example/debian trixie main\n"
                         "deb http://mirror.example/debian bookworm main\n", "x.list")
    m = debian_mirror(apt, suite="trixie")
    assert (m.uri, m.security_uri, m.updates) == ("http://other.example/debian", None, False)


def test_no_debian_mirror_is_an_error_naming_both_suites(tmp_path):
    with pytest.raises(OperationError, match="'trixie' or 'bookworm'"):
        debian_mirror(_apt(tmp_path, "deb http://x.example/ubuntu noble main\n", "u.list"), suite="trixie")


# ---------------------------------------------------------------- which suite a spec stages


def test_staged_suites_are_the_suites_whose_slurm_was_measured():
    """The release each suite ships was measured by the emulator's roots (22.05 on the host, 24.11 in trixie)."""
    for version, suite in image.SUITES.items():
        measured = roots.LINES[version] or SUITE
        assert suite == measured, f"Slurm {version}: staged on {suite}, but the roots found it in {measured}"


@pytest.mark.parametrize(("name", "suite"), [("staging", "bookworm"), ("staging-trixie", "trixie")])
def test_the_examples_stage_the_suite_of_their_slurm(name, suite):
    cluster = cluster_example(name)
    assert node_suite(cluster, str(example_path(name))) == image.SUITES[cluster.spec.slurm.version] == suite


def test_each_suite_has_its_own_image():
    """One image per suite, each from the host's mirror (the recipe reads this machine's apt sources)."""
    recipes = {s: image.image_recipe(s) for s in set(image.SUITES.values())}
    assert all(f"debootstrap --variant=minbase {s}\n" in r for s, r in recipes.items())
    refs = {image.image_ref(r) for r in recipes.values()}
    assert len(refs) == len(recipes), "two suites share an image tag"


def test_a_release_no_debian_ships_is_refused_with_its_location(tmp_path, capsys):
    """stage up on 23.11: exit 2 naming file, line, field and the fix, before anything is created."""
    data = example_data("staging")
    data["slurm"]["version"] = "23.11"
    import yaml

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if text.strip().startswith("version:"))
    state = tmp_path / "state"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "stage", "up", str(spec), "--state-dir", str(state),
                          "--inventory", str(tmp_path / "inv")], capture_output=True, text=True, check=False,
                         stdin=subprocess.DEVNULL, timeout=120)
    assert res.returncode == 2, res.stderr
    assert f"{spec}:{line}: slurm.version: 23.11 cannot be staged" in res.stderr
    assert "set slurm.version to 22.05 or 24.11" in res.stderr and "Traceback" not in res.stderr
    assert not state.exists() and not (tmp_path / "inv").exists()


def test_suite_for_names_every_staged_release():
    with pytest.raises(UsageError) as err:
        image.suite_for("26.05", "x.yaml:3")
    assert all(v in str(err.value) and s in str(err.value) for v, s in image.SUITES.items())


# ---------------------------------------------------------------- nodes for Slurm's cgroup plugins


@pytest.mark.parametrize("name", ["staging", "staging-trixie"])
def test_compute_nodes_of_the_production_profile_get_cgroups(name):
    cluster = cluster_example(name)
    compute = set(cluster.contract_groups["slurm_compute"])
    production = cluster.spec.slurm.profile == "production"
    for node in stage_nodes(cluster):
        assert node.cgroups == (production and node.name in compute), node
        assert ("SYS_NICE" in node.caps) == node.cgroups, node  # task/affinity's sched_setaffinity as root


def _cfg(tmp_path: Path) -> StageConfig:
    return StageConfig(cluster="t", state_dir=tmp_path / "state")


def test_a_cgroup_node_runs_in_its_own_cgroup_namespace_with_numbered_stand_ins(tmp_path):
    cfg = _cfg(tmp_path)
    node = StageNode("gpu01", ("slurm_compute",), gpu_devices=("/dev/nvidia0", "/dev/nvidia1"), fuse=True, cgroups=True)
    args = _run_args(cfg, node, "img", 2222)
    devices = [args[i + 1] for i, a in enumerate(args) if a == "--device"]
    assert devices == [f"{cfg.state_dir}/stand-ins/gpu0:/dev/nvidia0", f"{cfg.state_dir}/stand-ins/gpu1:/dev/nvidia1",
                       "/dev/fuse"]
    assert args[args.index("--cgroupns") + 1] == "private"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--cap-add"] == ["SYS_ADMIN"]
    assert args[-4:] == ["img", "/bin/sh", "-c", _CGROUP_INIT] and _CGROUP_INIT.endswith("exec /sbin/init")


def test_other_nodes_keep_dev_null_stand_ins_and_systemd_as_pid_1(tmp_path):
    cfg = _cfg(tmp_path)
    node = StageNode("gpu01", ("slurm_compute",), gpu_devices=("/dev/nvidia0",))
    args = _run_args(cfg, node, "img", 2222)
    assert "/dev/null:/dev/nvidia0" in args and "--cgroupns" not in args and "--cap-add" not in args
    assert args[-2:] == ["img", "/sbin/init"]
    assert _spec_hash(cfg, node, "img") != _spec_hash(cfg, StageNode(**{**node.__dict__, "cgroups": True}), "img")


def test_stand_ins_are_character_devices_of_their_own_numbers(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("creating device nodes needs root (CAP_MKNOD)")
    cfg = _cfg(tmp_path)
    cfg.state_dir.mkdir()
    nodes = [StageNode("gpu01", gpu_devices=("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"), cgroups=True),
             StageNode("ctl01")]
    _ensure_stand_ins(cfg, nodes)
    _ensure_stand_ins(cfg, nodes)  # a second run keeps them
    folder = cfg.state_dir / "stand-ins"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for i in range(3):
        st = (folder / f"gpu{i}").lstat()
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (STAND_IN_MAJOR, i)
    with pytest.raises(OSError):  # no driver claims the number: opening it is refused, nothing is reached
        (folder / "gpu0").open("rb").close()


def _load(path: Path, name: str):
    return load_file(path, name)


def test_every_stand_in_detector_knows_the_stand_in_number():
    """The roles' filter, the health checks and the validation checks each tell stand-ins from GPUs by
    their numbers; they must agree with what `stage up` creates."""
    from gpucluster.node import checks

    filters = _load(ROOT / "plugins" / "filter" / "gpucluster_stacks.py", "gpucluster_stacks_filters_suites")
    checklib = _load(ROOT / "src" / "gpucluster" / "validate" / "checks" / "gpc_checklib.py", "gpc_checklib")
    assert filters.STAND_IN_MAJOR == checks.STAND_IN_MAJOR == checklib.STAND_IN_MAJOR == STAND_IN_MAJOR
    lines = [f"/dev/nvidia0 character special file {STAND_IN_MAJOR:x}:0", "/dev/nvidia1 character special file c3:1"]
    assert filters.device_files(lines) == {"devices": ["/dev/nvidia1"], "stand_ins": ["/dev/nvidia0"]}


def test_nfs_exports_are_volumes_of_the_node_on_the_hosts_file_system(tmp_path):
    """The overlayfs root gives NFS-Ganesha no file handles and Ganesha 6 skips tmpfs: each export path of an
    NFS server is a podman volume of its own, named after the node and the path, part of the node's spec."""
    cluster = cluster_example("staging-trixie")
    exports = {e.path for n in cluster.spec.storage.nfs for e in n.exports}
    servers = {h for n in cluster.spec.storage.nfs for h in cluster.spec.group(n.server_group).hosts}
    cfg = _cfg(tmp_path)
    for node in stage_nodes(cluster):
        assert set(node.volumes) == (exports if node.name in servers else set()) and not node.tmpfs
        if node.name in servers:
            args = _run_args(cfg, node, "img", 2222)
            mounts = [args[i + 1] for i, a in enumerate(args) if a == "--mount"]
            assert mounts == [f"type=volume,src={container_name(cfg, node.name)}-{p.strip('/').replace('/', '_')},"
                              f"dst={p}" for p in node.volumes]
            assert _spec_hash(cfg, node, "img") != _spec_hash(cfg, StageNode(node.name, node.groups), "img")
