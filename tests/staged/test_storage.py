"""Storage tiers on staged nodes: MooseFS flash tier (flash_storage role) and NFS-Ganesha (nfs role).

The staged tests use conftest's staged_cluster (examples/staging.yaml, staged and configured once per
session; site.yml imports storage.yml and hardware.yml) and check the result over SSH (testinfra).
Expected values come from the spec and the inventory writer, never from copies of rendered files.
With CI set nothing here skips: a missing podman is a failure (conftest).

GPUCLUSTER_STAGED_INVENTORY=<hosts.yml> reuses a developer's staged cluster already converged with
storage.yml and hardware.yml instead (its state folder must hold ssh_config).

The tests without the staged mark check the gpucluster_facts filter plugin and the storage templates
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
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "staging.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SKIP_DIR = "/var/lib/gpucluster/skipped"


# ---------------------------------------------------------------- expected values (spec + inventory)


@functools.cache
def _spec_and_plan(path: Path = SPEC):
    cluster = load_cluster(path)
    return cluster.spec, cluster.plan


@functools.cache
def expected_groups(path: Path = SPEC) -> dict[str, list[str]]:
    """Contract groups (and nodegroup_<name>) -> hosts, from the compiled cluster the inventory writer reads."""
    cluster = load_cluster(path)
    groups = {f"nodegroup_{g.name.replace('-', '_')}": list(g.hosts) for g in cluster.spec.node_groups}
    return {**groups, **cluster.contract_groups}


def spec_storage(path: Path = SPEC):
    return _spec_and_plan(path)[0].storage


@functools.cache
def state_of(spec: Path = SPEC) -> str:
    """A private state folder holding `spec` compiled (what playbooks/compile.yml leaves for the roles'
    filters), one per spec per session."""
    import tempfile

    from gpucluster.compiled import compile_to

    state = Path(tempfile.mkdtemp(prefix="gpc-compiled-")) / "state"
    compile_to(load_cluster(spec), state)
    return str(state)


@functools.cache
def filters():
    """The role's filter plugin, loaded as Ansible loads it (a file under plugins/filter)."""
    spec = importlib.util.spec_from_file_location("gpucluster_facts", REPO / "plugins/filter/gpucluster_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the converged staged cluster


@dataclass
class Converged:
    """The staged cluster after configure (site.yml imports storage.yml and hardware.yml)."""

    inventory: Path
    ssh_config: Path
    groups: dict[str, list[str]]
    handle: object = None  # conftest's StagedHandle; None for a cluster named by GPUCLUSTER_STAGED_INVENTORY
    reruns: dict[str, Rerun] = field(default_factory=dict)

    def host(self, name: str):
        import testinfra

        # A generous connect timeout: on a 2-core machine running several staged clusters, sshd can take
        # well over testinfra's default 10 s to send its banner.
        return testinfra.get_host(f"ssh://{name}", ssh_config=str(self.ssh_config), timeout=120)

    def rerun(self, playbook: str) -> Rerun:
        """Run one of this role owner's playbooks again (once per session): the idempotence check, and
        a fresh ansible output to read the roles' skip messages from."""
        if playbook not in self.reruns:
            self.reruns[playbook] = _rerun(self, playbook)
        return self.reruns[playbook]


@dataclass
class Rerun:
    ok: bool
    changes: dict[str, list[str]]  # host -> tasks that reported a change
    output: str  # ansible-playbook's stdout
    where: str  # for failure messages


def _rerun(cluster: Converged, playbook: str) -> Rerun:
    if cluster.handle is not None:
        result = cluster.handle.configure(playbook=playbook)
        stdout = result.artifacts / "stdout" if result.artifacts else None
        output = stdout.read_text(errors="replace") if stdout and stdout.exists() else ""
        changes = {h: list(t) for h, t in result.changes.items() if t}
        for h, s in result.hosts.items():
            if s.changed and h not in changes:
                changes[h] = [f"{s.changed} change(s)"]
        return Rerun(result.ok, changes, output, f"log {result.log_path}")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(cluster.inventory),
           str(REPO / "playbooks" / playbook)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    counts = {m.group(1): int(m.group(2))
              for m in re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", res.stdout, re.M)}
    ok = res.returncode == 0 and bool(counts)
    return Rerun(ok, {h: [f"{n} change(s)"] for h, n in counts.items() if n}, res.stdout, res.stdout[-3000:])


def _groups_of(inventory: Path) -> dict[str, list[str]]:
    from gpucluster.inventory.reader import load_inventory

    return {name: sorted(hosts) for name, hosts in load_inventory(inventory).groups.items()}


_CLUSTER: dict[str, Converged] = {}


def converged_cluster(request: pytest.FixtureRequest) -> Converged:
    """conftest's staged_cluster (staged and configured once per session), shared by test_storage and
    test_hardware_roles. GPUCLUSTER_STAGED_INVENTORY=<hosts.yml of a converged staged cluster> reuses a
    developer's own cluster instead (with GPUCLUSTER_STAGED_SSH_CONFIG=<the stage's ssh_config>)."""
    if "c" in _CLUSTER:
        return _CLUSTER["c"]
    given = os.environ.get("GPUCLUSTER_STAGED_INVENTORY")
    if given:
        inventory = Path(given)
        ssh_config = Path(os.environ.get("GPUCLUSTER_STAGED_SSH_CONFIG", inventory.parent / "ssh_config"))
        _CLUSTER["c"] = Converged(inventory, ssh_config, _groups_of(inventory))
        return _CLUSTER["c"]
    handle = request.getfixturevalue("staged_cluster")
    if not handle.first_configure.ok:
        pytest.fail(f"the first configure did not converge (log {handle.first_configure.log_path})", pytrace=False)
    inventory = Path(handle.inventory)
    _CLUSTER["c"] = Converged(inventory, Path(handle.staged.ssh_config), _groups_of(inventory), handle)
    return _CLUSTER["c"]


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Converged:
    return converged_cluster(request)


def journal(host, unit: str, lines: int = 30) -> str:
    return host.run(f"journalctl -u {unit} -n {lines} --no-pager").stdout


def assert_second_run_changes_nothing(cluster: Converged, playbook: str) -> None:
    run = cluster.rerun(playbook)
    assert run.ok, f"{playbook} failed on the second run ({run.where})"
    assert run.changes == {}, f"{playbook} changed things on the second run: {run.changes} ({run.where})"


# ---------------------------------------------------------------- the filter plugin and templates (no cluster)


@pytest.mark.parametrize("path", ["/home/shared", "/mnt/flash", "/mnt/my-data", "/srv/a.b/c_d", "/.hidden/x", "/"])
def test_unit_name_matches_systemd_escape(path: str) -> None:
    if shutil.which("systemd-escape") is None:
        pytest.skip("systemd-escape is not installed (systemd)")
    want = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True,
                          check=True).stdout.strip()
    from gpucluster.cluster.unitnames import unit_name

    assert unit_name(path) == want


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_storage_facts_follow_the_spec(example: Path) -> None:
    storage = spec_storage(example)
    spec = _spec_and_plan(example)[0]
    facts = filters().storage_facts(state_of(example))
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


def rendered_file(name: str, spec: Path = SPEC) -> str:
    """A file of the compiled rendered/ folder: what the roles copy, byte for byte."""
    return (Path(state_of(spec)) / "compiled" / "rendered" / name).read_text()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_nfs_units_carry_the_declared_options(example: Path) -> None:
    facts = filters().storage_facts(state_of(example))
    for m in facts["nfs_mounts"]:
        text = rendered_file(m["unit"], example)
        assert f"\nOptions={m['options']}\n" in text
        assert f"\nWhat={m['server']}:{m['path']}\n" in text
        assert f"\nWhere={m['mount']}\n" in text


def test_ganesha_conf_exports_every_declared_path() -> None:
    files = filters().facts(state_of(SPEC), "files")
    servers = dict.fromkeys(t.server_group for t in spec_storage().nfs)
    text = "".join(rendered_file(files[group]["ganesha"]) for group in servers)
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
NFS_MOUNTS = filters().storage_facts(state_of(SPEC))["nfs_mounts"]


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
    facts = filters().storage_facts(state_of(SPEC))["flash"]
    host = cluster.host(node)
    unit = facts["unit"]
    svc = host.service(unit)
    assert svc.is_running and svc.is_enabled, f"{node}: {unit}\n{journal(host, unit)}"
    mount = host.mount_point(flash.mount)
    assert mount.exists and mount.filesystem == "fuse", f"{node}: {flash.mount} is not a FUSE mount"
    device = mount.device.replace("\\043", "#")  # /proc/mounts escapes '#' as \043
    port = facts["moosefs"]["ports"]["client"]
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
    said = f"kernel NFS mount of {mount['server']}:{mount['path']} on {mount['mount']} ({mount['unit']}) skipped"
    run = cluster.rerun("storage.yml")
    assert said in run.output, f"the storage.yml run does not say why {mount['unit']} is not mounted ({run.where})"


@pytest.mark.staged
def test_storage_playbook_second_run_changes_nothing(cluster: Converged) -> None:
    assert_second_run_changes_nothing(cluster, "storage.yml")
