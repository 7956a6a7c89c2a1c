"""The enrollment provider's create/read/delete, called directly against real staged nodes over SSH.

The nodes are podman containers from `gpucluster.stage` (systemd, sshd, the cluster's own key pair and
known_hosts, four stand-in /dev/nvidiaN device files each). The provider is called exactly as the
engine's dynamic-provider process calls it, with the properties the program builds for the staging
example. Outside CI a missing podman skips; with CI set it fails.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import cluster_example, example_data, example_path, loaded_example, skip_or_fail

from gpucluster.cluster import load_cluster
from gpucluster.deploy.enroll import MARKER, node_entry
from gpucluster.deploy.nodes import expectation
from gpucluster.deploy.provider import EnrollmentProvider

pytestmark = pytest.mark.staged

GPUS = 4  # stand-in device files per staged node
NODES = ("gpu01", "gpu02", "gpu03")


@pytest.fixture(scope="module")
def staged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """examples/staging.yaml staged the way `gpucluster stage up` stages it (its StageNodes), under a
    cluster name and state directory of this test run only."""
    if shutil.which("podman") is None:
        skip_or_fail("podman is not installed (scripts/stage-deps.sh installs it)")
    from gpucluster.stage.lifecycle import stage_nodes
    from gpucluster.stage.podman import StageConfig, down, up

    cfg = StageConfig(cluster=f"pp{os.getpid()}-{secrets.token_hex(3)}",
                      state_dir=tmp_path_factory.mktemp("stage") / "state")
    request.addfinalizer(lambda: down(cfg, log=lambda _m: None))  # first: runs even if up() fails half-way
    nodes = stage_nodes(cluster_example("staging"))
    assert {n.name: len(n.gpu_devices) for n in nodes if n.name in NODES} == dict.fromkeys(NODES, GPUS)
    t0 = time.monotonic()
    sc = up(cfg, nodes, log=lambda _m: None)
    print(f"staged {len(nodes)} nodes in {time.monotonic() - t0:.1f}s")
    return cfg, sc


def _spec(tmp_path: Path, gpus_per_node: int):
    data = example_data("staging")
    gpu = next(g for g in data["node_groups"] if g["name"] == "gpu")
    gpu["gpus_per_node"] = gpus_per_node
    if gpus_per_node not in (4, 8):  # the catalog's H100 platforms have 4 or 8
        raise ValueError(gpus_per_node)
    import yaml

    path = tmp_path / f"staging-{gpus_per_node}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_cluster(path)


def _props(staged, tmp_path: Path, hosts: tuple[str, ...], *, gpus_per_node: int = GPUS, stack: str = "pytest",
           known_hosts: Path | None = None) -> dict:
    _cfg, sc = staged
    cluster = _spec(tmp_path, gpus_per_node)
    loaded = cluster.loaded
    group = loaded.spec.group("gpu")
    return {
        "cluster": loaded.spec.name, "group": "gpu", "target": "staging", "spec": str(loaded.source),
        "owner": {"project": "gpucluster", "stack": stack},
        "expect": expectation(cluster, group, "staging").as_dict(),
        "nodes": [node_entry(h, *sc.nodes[h]) for h in hosts],
        "ssh": {"user": sc.ssh_user, "known_hosts": str(known_hosts or sc.known_hosts), "key_path": str(sc.ssh_key),
                "timeout": 15},
        "parallel": 4,
    }


def _exec(staged, node: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    cfg, _sc = staged
    from gpucluster.stage.podman import container_name

    return subprocess.run(["podman", "exec", container_name(cfg, node), *cmd], capture_output=True, text=True,
                          timeout=60, check=False)


def _marker(staged, node: str) -> dict | None:
    res = _exec(staged, node, "cat", MARKER)
    return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else None


def test_matching_node_enrolls_and_is_released(staged, tmp_path: Path) -> None:
    props = _props(staged, tmp_path, ("gpu01",))
    prov = EnrollmentProvider()
    t0 = time.monotonic()
    created = prov.create(props)
    took = time.monotonic() - t0
    print(f"create of 1 staged node: {took:.2f}s")
    facts = json.loads(created.outs["facts"]["gpu01"])
    assert (created.outs["enrolled"], facts["gpus"], facts["gpu_source"]) == (1, GPUS, "device files")
    assert facts["gpu_devices"] == [f"/dev/nvidia{i}" for i in range(GPUS)]
    assert facts["hostname"] == "gpu01"
    assert created.outs["drift"] == {}
    assert created.id == "pytest/gpu/gpu01"
    marker = _marker(staged, "gpu01")
    assert marker is not None
    assert {k: marker[k] for k in ("project", "stack", "cluster", "group")} == {
        "project": "gpucluster", "stack": "pytest", "cluster": "staging", "group": "gpu"}

    prov.delete(created.id, created.outs)
    assert _marker(staged, "gpu01") is None
    assert _exec(staged, "gpu01", "test", "-e", "/dev/nvidia0").returncode == 0  # nothing else touched


def test_eight_gpus_declared_four_device_files_fails_naming_the_field(staged, tmp_path: Path) -> None:
    props = _props(staged, tmp_path, ("gpu01",), gpus_per_node=8)
    with pytest.raises(Exception) as err:
        EnrollmentProvider().create(props)
    text = str(err.value)
    print(text)
    assert "gpu01" in text
    assert "node_groups[1].gpus_per_node: the spec says 8, the node has 4" in text
    assert "device files /dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3" in text
    assert "staging-8.yaml:" in text  # the spec file and line to change
    assert "Traceback" not in text
    assert _marker(staged, "gpu01") is None  # a failed batch leaves no trace on the machine


def test_changed_node_shows_drift_on_read(staged, tmp_path: Path) -> None:
    props = _props(staged, tmp_path, ("gpu02", "gpu03"))
    prov = EnrollmentProvider()
    t0 = time.monotonic()
    created = prov.create(props)
    print(f"create of 2 staged nodes: {time.monotonic() - t0:.2f}s")
    try:
        unchanged = prov.read(created.id, created.outs)
        assert unchanged.outs["drift"] == {}
        assert unchanged.outs["facts"] == created.outs["facts"]

        # a GPU falls off the bus (moved aside: a device node cannot be made again inside the container)
        assert _exec(staged, "gpu02", "mv", "/dev/nvidia3", "/dev/gone-nvidia3").returncode == 0
        read = prov.read(created.id, created.outs)
        assert set(read.outs["drift"]) == {"gpu02"}
        lines = read.outs["drift"]["gpu02"]
        assert "gpus: 4 -> 3" in lines
        assert any(line.startswith("no longer matches the spec: node_groups[1].gpus_per_node") for line in lines)
        assert json.loads(read.outs["facts"]["gpu02"])["gpus"] == 3
        assert read.id == created.id
    finally:
        _exec(staged, "gpu02", "mv", "/dev/gone-nvidia3", "/dev/nvidia3")
        prov.delete(created.id, created.outs)
    assert _exec(staged, "gpu02", "test", "-c", "/dev/nvidia3").returncode == 0


def test_marker_of_another_stack_is_refused_and_left_alone(staged, tmp_path: Path) -> None:
    prov = EnrollmentProvider()
    ours = prov.create(_props(staged, tmp_path, ("gpu03",), stack="first"))
    try:
        with pytest.raises(Exception, match=r"already enrolled by project gpucluster, stack first"):
            prov.create(_props(staged, tmp_path, ("gpu03",), stack="second"))
        prov.delete("x", _props(staged, tmp_path, ("gpu03",), stack="second"))  # not its marker: kept
        assert _marker(staged, "gpu03")["stack"] == "first"
    finally:
        prov.delete(ours.id, ours.outs)
    assert _marker(staged, "gpu03") is None


@pytest.mark.parametrize("entry", ["other-node-key", "no-entry"])
def test_wrong_host_key_is_refused(staged, tmp_path: Path, entry: str) -> None:
    _cfg, sc = staged
    keys = dict(line.split(" ", 1) for line in sc.known_hosts.read_text().splitlines())
    target = f"[127.0.0.1]:{sc.nodes['gpu01'][1]}"
    other = f"[127.0.0.1]:{sc.nodes['gpu02'][1]}"
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{target} {keys[other]}\n" if entry == "other-node-key" else f"{other} {keys[other]}\n")
    props = _props(staged, tmp_path, ("gpu01",), known_hosts=wrong)
    with pytest.raises(Exception) as err:
        EnrollmentProvider().create(props)
    text = str(err.value)
    print(text)
    assert f"host key refused: {target}" in text
    assert ("offered ssh-ed25519" in text) if entry == "other-node-key" else ("is not in" in text)
    assert _marker(staged, "gpu01") is None
    assert wrong.read_text().count("\n") == 1  # nothing was added to known_hosts


def test_delete_of_an_unreachable_node_does_not_fail(staged, tmp_path: Path) -> None:
    props = _props(staged, tmp_path, ("gpu01",))
    props["nodes"] = [node_entry("gpu01", "127.0.0.1", 9)]  # discard port: nothing listens
    props["ssh"]["timeout"] = 3
    EnrollmentProvider().delete("pytest/gpu/gpu01", props)


def test_the_staging_stack_enrolls_the_staged_cluster(staged) -> None:
    """The program as `pulumi up` runs it for stacks/Pulumi.staging.yaml, with the engine replaced by mocks
    that call the real provider: every staged node is reached with the key, ports and known_hosts of the
    stage directory, checked and enrolled; the inventory is exported; then everything is released."""
    from pulumi_harness import ClusterMocks, run_program, stack_config

    cfg, sc = staged
    mocks = ClusterMocks(enroll=True)
    t0 = time.monotonic()
    try:
        run = run_program(stack_config(example_path("staging"), target="staging", stageDir=cfg.state_dir),
                          stack=f"staged-{cfg.cluster}", mocks=mocks)
        took = time.monotonic() - t0
        loaded, _plan = loaded_example("staging")
        print(f"program with real enrollment of {len(sc.nodes)} staged nodes: {took:.1f}s")
        assert run.stack_outputs["enrollment"] == {g.name: g.count for g in loaded.spec.node_groups}
        facts = {h: json.loads(f) for _id, outs in mocks.created for h, f in outs["facts"].items()}
        assert sorted(facts) == sorted(sc.nodes)
        assert {h: f["gpus"] for h, f in facts.items() if h.startswith("gpu")} == dict.fromkeys(
            loaded.spec.group("gpu").hosts, GPUS)
        inventory = json.loads(run.stack_outputs["inventory"])
        hosts = inventory["all"]["children"]["nodegroup_gpu"]["hosts"]
        assert hosts["gpu01"]["ansible_port"] == sc.nodes["gpu01"][1]
        assert all(_marker(staged, n) is not None for n in sc.nodes)
    finally:
        for id_, outs in mocks.created:
            EnrollmentProvider().delete(id_, outs)
    assert all(_marker(staged, n) is None for n in sc.nodes)
