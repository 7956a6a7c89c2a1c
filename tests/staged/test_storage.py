"""Storage tiers on staged nodes: MooseFS flash tier (flash_storage role) and NFS-Ganesha (nfs role).

The staged tests converge examples/staging.yaml with playbooks/storage.yml and playbooks/hardware.yml
and check the result over SSH (testinfra). Expected values come from the spec and the inventory writer,
never from copies of rendered files. With CI set nothing here skips: a missing podman is a failure.

Set GPUCLUSTER_STAGED_INVENTORY to the hosts.yml of a staged cluster already converged with both
playbooks to reuse it (its state dir must hold ssh_config); otherwise the session stages its own
cluster (unique names), converges it, and removes it at the end.

The tests without the staged mark check the gpucluster_spec filter plugin and the storage templates
with plain Python (no cluster).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from gpucluster.fabric import plan_cluster
from gpucluster.inventory.writer import inventory_data
from gpucluster.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "staging.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SKIP_DIR = "/var/lib/gpucluster/skipped"
PLAYBOOKS = ("storage.yml", "hardware.yml")


# ---------------------------------------------------------------- expected values (spec + inventory)


@functools.cache
def _spec_and_plan(path: Path = SPEC):
    spec = load_spec(path).spec
    return spec, plan_cluster(spec)


@functools.cache
def expected_groups(path: Path = SPEC) -> dict[str, list[str]]:
    """Contract groups -> hosts, from the same writer that writes the staged inventory."""
    spec, plan = _spec_and_plan(path)
    children = inventory_data(spec, plan)["all"]["children"]
    return {name: list((g.get("hosts") or {}).keys()) for name, g in children.items()}


def spec_storage(path: Path = SPEC):
    return _spec_and_plan(path)[0].storage


@functools.cache
def filters():
    """The role's filter plugin, loaded as Ansible loads it (a file under plugins/filter)."""
    spec = importlib.util.spec_from_file_location("gpucluster_spec_filter", REPO / "plugins/filter/gpucluster_spec.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the converged staged cluster


@dataclass
class Converged:
    """A staged cluster converged with storage.yml and hardware.yml."""

    inventory: Path
    ssh_config: Path
    groups: dict[str, list[str]]
    logs: dict[str, str] = field(default_factory=dict)  # playbook -> output of the converge run

    def host(self, name: str):
        import testinfra

        return testinfra.get_host(f"ssh://{name}", ssh_config=str(self.ssh_config))

    def playbook(self, name: str, *args: str, env: dict | None = None, timeout: float = 1800):
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(self.inventory),
               str(REPO / "playbooks" / name), *args]
        full_env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0",
                    "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
                    **(env or {})}
        return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout,
                              check=False)


def _groups_of(inventory: Path) -> dict[str, list[str]]:
    children = yaml.safe_load(inventory.read_text())["all"]["children"]
    return {name: list((g.get("hosts") or {}).keys()) for name, g in children.items()}


def _require_staging() -> None:
    missing = [t for t in ("podman", "ssh") if shutil.which(t) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (scripts/stage-deps.sh installs the staging tools)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so this is a failure, not a skip")
        pytest.skip(reason)


_CLUSTER: dict[str, Converged] = {}


def converged_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Converged:
    """One converged staged cluster per test session, shared by test_storage and test_hardware_roles."""
    if "c" in _CLUSTER:
        return _CLUSTER["c"]
    given = os.environ.get("GPUCLUSTER_STAGED_INVENTORY")
    if given:
        inventory = Path(given)
        state = Path(yaml.safe_load(inventory.read_text())["all"]["vars"]["gpucluster_state_dir"])
        _CLUSTER["c"] = Converged(inventory, state / "ssh_config", _groups_of(inventory))
        return _CLUSTER["c"]
    _require_staging()
    from gpucluster.stage.cli import stage_up
    from gpucluster.stage.podman import StageConfig, down

    root = tmp_path_factory.mktemp(f"storage-{secrets.token_hex(3)}")
    state, inv_dir = root / "state", root / "inv"
    spec = load_spec(SPEC).spec
    # Registered before up(): a half-started cluster is removed too.
    request.session.addfinalizer(lambda: down(StageConfig(cluster=spec.name, state_dir=state), log=lambda _m: None))
    staged, inventory = stage_up(str(SPEC), state=str(state), inventory=str(inv_dir), log=lambda _m: None)
    cluster = Converged(Path(inventory), Path(staged.ssh_config), _groups_of(Path(inventory)))
    for name in PLAYBOOKS:
        started = time.monotonic()
        res = cluster.playbook(name)
        cluster.logs[name] = res.stdout + res.stderr
        assert res.returncode == 0, f"{name} failed after {time.monotonic() - started:.0f}s:\n{res.stdout[-6000:]}"
    _CLUSTER["c"] = cluster
    return cluster


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Converged:
    return converged_cluster(request, tmp_path_factory)


def journal(host, unit: str, lines: int = 30) -> str:
    return host.run(f"journalctl -u {unit} -n {lines} --no-pager").stdout


def recap_changes(output: str) -> dict[str, int]:
    """host -> changed count from an ansible-playbook PLAY RECAP."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M)}


# ---------------------------------------------------------------- the filter plugin and templates (no cluster)


@pytest.mark.parametrize("path", ["/home/shared", "/mnt/flash", "/mnt/my-data", "/srv/a.b/c_d", "/.hidden/x", "/"])
def test_unit_name_matches_systemd_escape(path: str) -> None:
    if shutil.which("systemd-escape") is None:
        pytest.skip("systemd-escape is not installed (systemd)")
    want = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert filters().unit_name(path) == want


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_storage_facts_follow_the_spec(example: Path) -> None:
    storage = spec_storage(example)
    spec = _spec_and_plan(example)[0]
    facts = filters().storage_facts(str(example))
    json.dumps(facts)  # plain data, as Ansible needs it
    if storage.flash:
        assert facts["flash"]["mount"] == storage.flash.mount
        assert facts["flash"]["replicas"] == storage.flash.replicas
        assert facts["flash"]["master"] == spec.group(storage.flash.metadata_group).host(0)
    else:
        assert facts["flash"] is None
    declared = [(n.name, e.path, e.mount, e.options) for n in storage.nfs for e in n.exports]
    got = [(m["tier"], m["path"], m["mount"], m["options"]) for m in facts["nfs_mounts"]]
    assert got == declared
    ids = [m["export_id"] for m in facts["nfs_mounts"]]
    assert len(set(ids)) == len(ids), "Ganesha needs a unique Export_Id per server"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_nfs_units_carry_the_declared_options(example: Path) -> None:
    facts = filters().storage_facts(str(example))
    for m in facts["nfs_mounts"]:
        text = filters().render({"cluster": facts["cluster"], "m": m, "timeout": 60}, "storage/nfs-client.mount.j2")
        assert f"\nOptions={m['options']}\n" in text
        assert f"\nWhat={m['server']}:{m['path']}\n" in text
        assert f"\nWhere={m['mount']}\n" in text


def test_ganesha_conf_exports_every_declared_path() -> None:
    facts = filters().storage_facts(str(SPEC))
    ctx = {"cluster": "staging", "host": "nfs01", "tiers": facts["nfs"], "protocols": [3, 4], "clients": ["*"],
           "squash": "Root_Squash", "grace_period": 90, "lease_lifetime": 60}
    text = filters().render(ctx, "storage/ganesha.conf.j2")
    for tier in spec_storage().nfs:
        for e in tier.exports:
            assert re.search(rf"Path = {re.escape(e.path)};\s*\n\s*Pseudo = {re.escape(e.path)};", text)
    assert text.count("Name = VFS;") == sum(len(t.exports) for t in spec_storage().nfs)


@pytest.mark.parametrize(("packages", "version", "want"), [
    (["moosefs-master", "moosefs-cli"], "3.0.117*", ["moosefs-master=3.0.117*", "moosefs-cli=3.0.117*"]),
    (["rccl"], "", ["rccl"]),
    ({"rdma-core": "44.0*", "perftest": ""}, "", ["rdma-core=44.0*", "perftest"]),
])
def test_apt_names(packages, version: str, want: list[str]) -> None:
    assert filters().apt_names(packages, version) == want


def test_apt_names_refuses_a_bad_version() -> None:
    with pytest.raises(ValueError, match="not a Debian version"):
        filters().apt_names(["x"], "1.0; rm -rf /")


# ---------------------------------------------------------------- flash tier on staged nodes

FLASH_CLIENTS = expected_groups()["flash_client"]
NFS_CLIENTS = expected_groups()["nfs_client"]
NFS_SERVERS = expected_groups()["nfs_server"]
NFS_MOUNTS = filters().storage_facts(str(SPEC))["nfs_mounts"]


@pytest.mark.staged
@pytest.mark.parametrize("service", ["moosefs-master", "moosefs-chunkserver"])
def test_moosefs_servers_run(cluster: Converged, service: str) -> None:
    group = "flash_meta" if service == "moosefs-master" else "flash_chunk"
    for name in cluster.groups[group]:
        host = cluster.host(name)
        svc = host.service(service)
        assert svc.is_running and svc.is_enabled, f"{name}: {service}\n{journal(host, service)}"


@pytest.mark.staged
@pytest.mark.parametrize("node", FLASH_CLIENTS)
def test_flash_tier_is_mounted_by_a_unit(cluster: Converged, node: str) -> None:
    flash = spec_storage().flash
    facts = filters().storage_facts(str(SPEC))["flash"]
    host = cluster.host(node)
    unit = facts["unit"]
    svc = host.service(unit)
    assert svc.is_running and svc.is_enabled, f"{node}: {unit}\n{journal(host, unit)}"
    mount = host.mount_point(flash.mount)
    assert mount.exists and mount.filesystem == "fuse", f"{node}: {flash.mount} is not a FUSE mount"
    device = mount.device.replace("\\043", "#")  # /proc/mounts escapes '#' as \043
    port = yaml.safe_load((REPO / "roles/flash_storage/defaults/main.yml").read_text())["flash_storage_ports"]["client"]
    assert device == f"mfs#{facts['master']}:{port}", device


@pytest.mark.staged
def test_goal_on_the_mount_root_is_the_spec_replicas(cluster: Converged) -> None:
    flash = spec_storage().flash
    out = cluster.host(FLASH_CLIENTS[0]).check_output(f"mfsgetgoal {flash.mount}")
    assert out.strip() == f"{flash.mount}: {flash.replicas}"


@pytest.fixture(scope="module")
def flash_file(cluster: Converged) -> tuple[str, str]:
    """4 MiB of random data written (and fsynced) on the flash mount by the first client: (path, sha256)."""
    flash = spec_storage().flash
    path = f"{flash.mount}/gpucluster-test-{secrets.token_hex(4)}.bin"
    writer = cluster.host(FLASH_CLIENTS[0])
    writer.check_output(f"head -c 4194304 /dev/urandom > {path} && sync {path}")
    digest = writer.check_output(f"sha256sum {path}").split()[0]
    yield path, digest
    writer.run(f"rm -f {path}")


@pytest.mark.staged
@pytest.mark.parametrize("reader", FLASH_CLIENTS[1:] or FLASH_CLIENTS)
def test_a_file_written_on_one_node_reads_back_on_another(cluster: Converged, flash_file, reader: str) -> None:
    path, digest = flash_file
    out = cluster.host(reader).check_output(f"sha256sum {path}")
    assert out.split()[0] == digest, f"{reader} reads different bytes from {path} than {FLASH_CLIENTS[0]} wrote"


# ---------------------------------------------------------------- NFS tiers on staged nodes


@pytest.mark.staged
@pytest.mark.parametrize("node", NFS_SERVERS)
def test_ganesha_runs(cluster: Converged, node: str) -> None:
    host = cluster.host(node)
    svc = host.service("nfs-ganesha")
    assert svc.is_running and svc.is_enabled, f"{node}: nfs-ganesha\n{journal(host, 'nfs-ganesha')}"


@pytest.mark.staged
@pytest.mark.parametrize("mount", NFS_MOUNTS, ids=lambda m: m["path"])
def test_nfs_export_answers(cluster: Converged, mount: dict) -> None:
    """A file put into the export on the server is listed by nfs-ls (user-space NFS) from a client."""
    name = f"gpucluster-test-{secrets.token_hex(4)}"
    server = cluster.host(mount["server"])
    server.check_output(f"touch {mount['path']}/{name}")
    try:
        client = cluster.host(NFS_CLIENTS[0])
        res = client.run(f"nfs-ls nfs://{mount['server']}{mount['path']}")
        assert res.rc == 0, f"nfs-ls failed: {res.stderr}\n{journal(server, 'nfs-ganesha')}"
        assert name in res.stdout
    finally:
        server.run(f"rm -f {mount['path']}/{name}")


@pytest.mark.staged
@pytest.mark.parametrize("node", NFS_CLIENTS)
@pytest.mark.parametrize("mount", NFS_MOUNTS, ids=lambda m: m["unit"])
def test_nfs_mount_units_carry_the_declared_options(cluster: Converged, node: str, mount: dict) -> None:
    host = cluster.host(node)
    shown = host.check_output(f"systemctl show -p What,Where,Type,Options {mount['unit']}")
    props = dict(line.split("=", 1) for line in shown.splitlines())
    assert props == {"What": f"{mount['server']}:{mount['path']}", "Where": mount["mount"], "Type": "nfs",
                     "Options": mount["options"]}


@pytest.mark.staged
@pytest.mark.parametrize("node", NFS_CLIENTS)
@pytest.mark.parametrize("mount", NFS_MOUNTS, ids=lambda m: m["unit"])
def test_kernel_nfs_mount_or_its_skip_reason(cluster: Converged, node: str, mount: dict) -> None:
    host = cluster.host(node)
    kernel_nfs = re.search(r"\tnfs4?\n", host.file("/proc/filesystems").content_string) is not None
    record = host.file(f"{SKIP_DIR}/nfs-mount-{mount['unit']}")
    if kernel_nfs:
        assert host.mount_point(mount["mount"]).exists, f"{node}: kernel has NFS, {mount['mount']} is not mounted"
        assert not record.exists
        return
    assert not host.service(mount["unit"]).is_running
    assert not host.service(mount["unit"]).is_enabled, "a unit the kernel cannot mount would fail every boot"
    assert record.exists, f"{node}: no record of why {mount['unit']} was not mounted"
    assert "/proc/filesystems" in record.content_string and "no NFS client" in record.content_string
    log = cluster.logs.get("storage.yml")
    if log is not None:  # this session converged: the run itself said so
        assert f"kernel NFS mount of {mount['server']}:{mount['path']} on {mount['mount']}" in log


@pytest.mark.staged
def test_storage_playbook_second_run_changes_nothing(cluster: Converged) -> None:
    res = cluster.playbook("storage.yml")
    assert res.returncode == 0, res.stdout[-4000:]
    changes = recap_changes(res.stdout)
    assert changes, res.stdout[-2000:]
    assert {h: n for h, n in changes.items() if n} == {}, res.stdout[-6000:]
