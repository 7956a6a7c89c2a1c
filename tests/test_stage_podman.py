"""Staged nodes end to end: real podman containers with systemd and sshd, brought up by the stage API.

Runs wherever podman is installed; in CI (CI set) a missing podman is a failure, not a skip.
The first run on a machine builds the node image (a few minutes); later runs reuse it.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from gpucluster.stage.podman import (
    StageConfig,
    StagedCluster,
    StageNode,
    container_name,
    down,
    network_name,
    state_hash,
    status,
    up,
    volume_name,
)

pytestmark = pytest.mark.staged

NODES = [
    StageNode("gpu0001", ("slurm_compute",), gpu_devices=("/dev/nvidia0", "/dev/nvidia1"), memory_mb=1024),
    StageNode("login01", ("login",), fuse=True),
]
BY_NAME = {n.name: n for n in NODES}


def _require_podman() -> None:
    if shutil.which("podman") is None:
        if os.environ.get("CI"):
            pytest.fail("podman is not installed but CI is set: run scripts/stage-deps.sh first")
        pytest.skip("podman is not installed (scripts/stage-deps.sh installs it)")


def _cluster_name() -> str:
    """Unique per test session, so parallel runs and checkouts on one machine never share a cluster."""
    return f"t{os.getpid()}-{secrets.token_hex(3)}"


def _sh(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)


def _exec(cfg: StageConfig, node: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return _sh("podman", "exec", container_name(cfg, node), *cmd)


def _ssh(sc: StagedCluster, node: str, known_hosts: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    _host, port = sc.nodes[node]
    return _sh(
        "ssh", "-F", "/dev/null",
        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-o", "ConnectTimeout=10", "-i", str(sc.ssh_key), "-p", str(port),
        f"{sc.ssh_user}@127.0.0.1", *cmd,
    )


@pytest.fixture(scope="module")
def staged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    _require_podman()
    cfg = StageConfig(cluster=_cluster_name(), state_dir=tmp_path_factory.mktemp("stage") / "state")
    request.addfinalizer(lambda: down(cfg))  # registered first: runs even when up() fails half-way
    started = time.monotonic()
    sc = up(cfg, NODES)
    print(f"up() for {len(NODES)} nodes took {time.monotonic() - started:.1f}s (image build included "
          "on a machine's first run)")
    return cfg, sc


def _settled_state(cfg: StageConfig, node: str, within: float = 90) -> subprocess.CompletedProcess[str]:
    """`systemctl is-system-running` once systemd has settled, or the last answer after `within` seconds. While
    it boots it says initializing or starting; right after `podman start` PID 1 may not yet listen on its bus,
    and systemctl prints nothing ("Failed to connect to bus": a CI run met it)."""
    deadline = time.monotonic() + within
    while True:
        res = _exec(cfg, node, "systemctl", "is-system-running")
        if res.stdout.strip() not in ("", "initializing", "starting") or time.monotonic() > deadline:
            return res
        time.sleep(1)


@pytest.mark.parametrize("node", list(BY_NAME))
def test_systemd_is_running(staged, node: str) -> None:
    cfg, _ = staged
    state = _settled_state(cfg, node).stdout.strip()
    if state == "degraded":
        failed = _exec(cfg, node, "systemctl", "--failed", "--no-legend", "--no-pager").stdout
        units = [line.replace("●", " ").split()[0] for line in failed.splitlines() if line.strip()]
        journal = "".join(
            _exec(cfg, node, "journalctl", "-u", u, "-n", "15", "--no-pager").stdout for u in units
        ) + _exec(cfg, node, "journalctl", "-b", "-p", "err", "-n", "15", "--no-pager").stdout
        warnings.warn(f"{node}: systemd degraded, failed units: {units}\n{journal}", stacklevel=1)
    assert state in ("running", "degraded"), _exec(cfg, node, "systemctl", "--failed", "--no-pager").stdout


@pytest.mark.parametrize("node", list(BY_NAME))
def test_ssh_with_strict_host_key_checking(staged, node: str) -> None:
    _, sc = staged
    res = _ssh(sc, node, sc.known_hosts, "hostname")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == node


def test_generated_files_are_private(staged) -> None:
    _, sc = staged
    for path in (sc.ssh_key, sc.known_hosts, sc.ssh_config):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_ssh_config_reaches_every_node(staged) -> None:
    _, sc = staged
    for node in sc.nodes:
        res = _sh("ssh", "-F", str(sc.ssh_config), "-o", "BatchMode=yes", node, "hostname")
        assert (res.returncode, res.stdout.strip()) == (0, node), res.stderr


def test_host_keys_are_unique_per_node(staged) -> None:
    _, sc = staged
    keys = [line.split()[2] for line in sc.known_hosts.read_text().splitlines()]
    assert len(keys) == len(NODES)
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize("entry", ["other-node-key", "no-entry"])
def test_wrong_known_hosts_is_refused(staged, tmp_path: Path, entry: str) -> None:
    _, sc = staged
    lines = dict(line.split(" ", 1) for line in sc.known_hosts.read_text().splitlines())
    target, other = list(sc.nodes)[:2]
    target_host = f"[127.0.0.1]:{sc.nodes[target][1]}"
    other_host = f"[127.0.0.1]:{sc.nodes[other][1]}"
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{target_host} {lines[other_host]}\n" if entry == "other-node-key" else "")
    res = _ssh(sc, target, wrong, "hostname")
    assert res.returncode != 0
    assert "Host key verification failed" in res.stderr, res.stderr


@pytest.mark.parametrize(("src", "dst"), list(itertools.permutations(BY_NAME, 2)))
def test_nodes_reach_each_other_by_name(staged, src: str, dst: str) -> None:
    cfg, _ = staged
    fmt = f'{{{{(index .NetworkSettings.Networks "{network_name(cfg)}").IPAddress}}}}'
    dst_ip = _sh("podman", "inspect", "--format", fmt, container_name(cfg, dst)).stdout.strip()
    res = _exec(cfg, src, "getent", "hosts", dst)
    assert res.returncode == 0, f"{src} cannot resolve {dst}: {res.stderr}"
    assert res.stdout.split()[0] == dst_ip
    probe = f"import socket; socket.create_connection(('{dst}', 22), 5).recv(4)"
    res = _exec(cfg, src, "python3", "-c", probe)
    assert res.returncode == 0, f"{src} cannot open {dst}:22: {res.stderr}"


@pytest.mark.parametrize(
    ("node", "device"), [(n.name, d) for n in NODES for d in n.gpu_devices]
)
def test_gpu_stand_in_is_a_char_device(staged, node: str, device: str) -> None:
    cfg, _ = staged
    res = _exec(cfg, node, "stat", "-c", "%F", device)
    assert res.stdout.strip() == "character special file", res.stderr


@pytest.mark.parametrize("node", [n.name for n in NODES if n.fuse])
def test_fuse_device_present(staged, node: str) -> None:
    cfg, _ = staged
    assert _exec(cfg, node, "stat", "-c", "%F", "/dev/fuse").stdout.strip() == "character special file"


@pytest.mark.parametrize("node", [n.name for n in NODES if n.memory_mb])
def test_memory_limit_applied(staged, node: str) -> None:
    cfg, _ = staged
    res = _exec(cfg, node, "sh", "-c",
                "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert int(res.stdout.strip()) == BY_NAME[node].memory_mb * 2**20


def test_fresh_node_runs_only_base_services(staged) -> None:
    """Pre-baked packages are installed but disabled: the roles decide what runs."""
    cfg, _ = staged
    node = NODES[0].name
    res = _exec(cfg, node, "systemctl", "is-enabled", "slurmd", "slurmctld", "munge", "mariadb")
    assert res.stdout.split() == ["disabled"] * 4
    assert _exec(cfg, node, "systemctl", "is-active", "ssh").stdout.strip() == "active"


def _address_on(cfg: StageConfig, node: str) -> str:
    out = _sh("podman", "inspect", container_name(cfg, node), "--format",
              "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}").stdout.split()
    return out[0] if out else ""


def test_every_node_has_its_fixed_address(staged) -> None:
    cfg, sc = staged
    assert set(sc.addresses) == set(BY_NAME)
    assert len(set(sc.addresses.values())) == len(NODES)
    for node, address in sc.addresses.items():
        assert _address_on(cfg, node) == address


def test_a_node_stopped_and_started_keeps_its_address_and_boots(staged) -> None:
    """A real node keeps its reserved address across a reboot; podman would otherwise lease a new one
    and every other node's /etc/hosts (and slurmctld's view) would point at nobody."""
    cfg, sc = staged
    node = NODES[-1].name
    _sh("podman", "stop", "-t", "5", container_name(cfg, node))
    _sh("podman", "start", container_name(cfg, node))
    assert _address_on(cfg, node) == sc.addresses[node]
    res = _settled_state(cfg, node)
    assert res.stdout.strip() in ("running", "degraded"), res.stdout + res.stderr


def test_second_up_changes_nothing(staged) -> None:
    cfg, sc = staged
    before = {s.name: (s.container_id, s.port) for s in status(cfg)}
    files = {p: p.read_bytes() for p in (sc.ssh_key, sc.known_hosts, sc.ssh_config)}
    again = up(cfg, NODES)
    after = {s.name: (s.container_id, s.port) for s in status(cfg)}
    assert after == before
    assert again == sc
    assert {p: p.read_bytes() for p in files} == files


def test_down_leaves_nothing(tmp_path: Path) -> None:
    _require_podman()
    cfg = StageConfig(cluster=_cluster_name(), state_dir=tmp_path / "state")
    try:
        sc = up(cfg, [StageNode("node01")])
        assert sc.nodes["node01"][0] == "127.0.0.1"
        # what other layers keep in the state directory (the CLI's per-cluster secrets) goes too
        (cfg.state_dir / "secrets").mkdir(mode=0o700)
        (cfg.state_dir / "secrets" / "munge.key").write_bytes(b"x" * 32)
    finally:
        down(cfg)
    leftover = _sh("podman", "ps", "-a", "-q", "--filter", f"label=gpucluster.state={state_hash(cfg)}")
    assert leftover.stdout.strip() == ""
    assert _sh("podman", "network", "exists", network_name(cfg)).returncode != 0
    assert not cfg.state_dir.exists()
    down(cfg)  # a second down() on nothing is fine
    assert not cfg.state_dir.exists()


def test_down_leaves_the_volumes_of_another_cluster_of_the_same_name(tmp_path: Path) -> None:
    """Two staged clusters of one spec (a demo left up while the tests run) share the cluster label; down() of
    one removes only its own volumes (podman 4.3 ORs `volume ls` label filters: it once listed the other's)."""
    _require_podman()
    name = _cluster_name()
    mine, theirs = (StageConfig(cluster=name, state_dir=tmp_path / d) for d in ("mine", "theirs"))
    vols = {}
    for cfg in (mine, theirs):
        vols[cfg] = volume_name(cfg, "nfs01", "/export/home")
        _sh("podman", "volume", "create", "--label", f"gpucluster.cluster={name}",
            "--label", f"gpucluster.state={state_hash(cfg)}", vols[cfg])
    try:
        down(mine, log=lambda _m: None)
        assert _sh("podman", "volume", "exists", vols[mine]).returncode != 0
        assert _sh("podman", "volume", "exists", vols[theirs]).returncode == 0, "down() took theirs"
    finally:
        _sh("podman", "volume", "rm", "-f", *vols.values())


def test_down_keeps_a_directory_it_did_not_create(tmp_path: Path) -> None:
    """A state_dir that held files before up() is never deleted whole: only up()'s files go."""
    _require_podman()
    state = tmp_path / "existing"
    state.mkdir()
    (state / "notes.txt").write_text("mine\n")
    cfg = StageConfig(cluster=_cluster_name(), state_dir=state)
    try:
        sc = up(cfg, [])  # no nodes: network and key pair only
        assert sc.nodes == {} and sc.ssh_key.exists()
    finally:
        down(cfg)
    assert sorted(p.name for p in state.iterdir()) == ["notes.txt"]
    assert _sh("podman", "network", "exists", network_name(cfg)).returncode != 0
