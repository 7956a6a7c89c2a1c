"""The stack program under `pulumi.runtime.set_mocks`, for every example spec.

Each example's program runs once per session, fresh (new mocks, monitor and root stack; the stack
config given as `pulumi config` holds it), through the same `program.main` the engine runs; the
assertions below read that one run, one aspect per test. Expected values come from the planner, the
inventory writer and the renderer called directly, never from copies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import subprocess
from functools import cache
from pathlib import Path

import pulumi
import pytest
from conftest import EXAMPLES, ROOT, cluster_example, example_path, loaded_example
from pulumi_harness import (
    ENROLLMENT,
    SECRET,
    ClusterMocks,
    ProgramRun,
    has_secret,
    run_program,
    stack_config,
    unwrap,
)

from gpucluster.deploy.provider import signing_key_b64
from gpucluster.fabric.summary import plan_summary
from gpucluster.inventory import inventory_data
from gpucluster.inventory.reader import expand_hosts

CLUSTER, NODEGROUP, FABRIC, STORAGE = (f"gpucluster:index:{t}" for t in ("Cluster", "NodeGroup", "Fabric",
                                                                         "StorageTier"))
KEY = "~/.ssh/gpucluster_ed25519"
KNOWN = "~/.ssh/known_hosts.test"
BATCH = 64


def _config(name: str, stage_dir: Path) -> dict[str, str]:
    if name == "staging":
        return stack_config(example_path(name), target="staging", stageDir=stage_dir)
    return stack_config(example_path(name), target="on-prem", sshUser="ops", sshKeyPath=KEY, knownHosts=KNOWN,
                        enrollBatch=BATCH)


@cache
def _stage_dir(tmp: str) -> Path:
    """A stage state directory as `gpucluster stage up` leaves it: ports.json, key, known_hosts."""
    loaded, _plan = loaded_example("staging")
    d = Path(tmp) / "stage"
    d.mkdir(parents=True, exist_ok=True)
    hosts = [h for g in loaded.spec.node_groups for h in g.hosts]
    (d / "ports.json").write_text(json.dumps({h: 40000 + i for i, h in enumerate(hosts)}))
    return d


_RUNS: dict[str, ProgramRun] = {}


def _run_of(name: str, tmp_path_factory) -> ProgramRun:
    """The example's program run: once per session, fresh mocks and monitor each."""
    if name not in _RUNS:
        stage = _stage_dir(str(tmp_path_factory.getbasetemp() / "pulumi-program"))
        _RUNS[name] = run_program(_config(name, stage), stack=name)
    return _RUNS[name]


@pytest.fixture
def run(request, tmp_path_factory) -> ProgramRun:
    return _run_of(request.param, tmp_path_factory)


def _examples():
    return pytest.mark.parametrize("run", EXAMPLES, indirect=True)


def _by_type(run: ProgramRun, typ: str):
    return run.of_type(typ)


def _outputs(run: ProgramRun, typ: str, name: str) -> dict:
    reg = next(r for r in run.of_type(typ) if r.name == name)
    return run.outputs[reg.urn]


def _expected_batches(count: int, per_rack: int, batch: int) -> int:
    size = batch // per_rack * per_rack if batch >= per_rack else batch
    return math.ceil(count / size)


def _stack_name(run: ProgramRun) -> str:
    return run.stack_urn.split("::")[0].removeprefix("urn:pulumi:")


# ---------------------------------------------------------------- the resource graph


@_examples()
def test_components_and_counts(run: ProgramRun) -> None:
    loaded, _plan = loaded_example(_stack_name(run))
    spec = loaded.spec
    assert [r.name for r in run.of_type(CLUSTER)] == [spec.name]
    assert sorted(r.name for r in run.of_type(NODEGROUP)) == sorted(g.name for g in spec.node_groups)
    assert len(run.of_type(FABRIC)) == 1
    tiers = ([f"flash-{spec.storage.flash.name}"] if spec.storage.flash else []) + [
        f"nfs-{n.name}" for n in spec.storage.nfs]
    assert sorted(r.name for r in run.of_type(STORAGE)) == sorted(tiers)
    assert sorted(r.name for r in run.of_type(SECRET)) == sorted(
        ["munge-key", "bundle-signing-key"] + (["slurmdbd-password"] if spec.slurm.accounting else []))
    batch = 64 if _stack_name(run) == "staging" else BATCH
    assert len(run.of_type(ENROLLMENT)) == sum(_expected_batches(g.count, g.nodes_per_rack, batch)
                                               for g in spec.node_groups)


@_examples()
def test_every_node_is_enrolled_exactly_once_in_its_group(run: ProgramRun) -> None:
    loaded, _plan = loaded_example(_stack_name(run))
    inv = inventory_data(cluster_example(_stack_name(run)))["all"]["children"]
    for group in loaded.spec.node_groups:
        ours = sorted((r for r in run.of_type(ENROLLMENT) if unwrap(r.inputs)["group"] == group.name),
                      key=lambda r: r.name)  # registration order is the event loop's, names are batch order
        batches = [unwrap(r.inputs) for r in ours]
        hosts = [n.split()[0] for b in batches for n in b["nodes"]]
        listed = inv[f"nodegroup_{group.name.replace('-', '_')}"]["hosts"]  # host ranges: gpu[0001:0064]
        assert hosts == [h for pattern in listed for h in expand_hosts(pattern)], group.name
        # a batch never splits a rack (when a batch holds at least one)
        if group.nodes_per_rack <= BATCH:
            for b in batches:
                first = group.hosts.index(b["nodes"][0].split()[0])
                assert first % group.nodes_per_rack == 0, (group.name, first)


@_examples()
def test_every_child_has_its_parent(run: ProgramRun) -> None:
    stack = run.stack_urn
    cluster = run.of_type(CLUSTER)[0]
    assert cluster.parent == stack
    for typ in (NODEGROUP, FABRIC, STORAGE, SECRET):
        for r in run.of_type(typ):
            assert r.parent == cluster.urn, (typ, r.name)
    groups = {r.name: r.urn for r in run.of_type(NODEGROUP)}
    for r in run.of_type(ENROLLMENT):
        assert r.parent == groups[unwrap(r.inputs)["group"]], r.name
    assert all(r.parent for r in run.resources)


# ---------------------------------------------------------------- outputs against the planner, writer, renderer


@_examples()
def test_plan_outputs_equal_the_planner(run: ProgramRun) -> None:
    _loaded, plan = loaded_example(_stack_name(run))
    expected = json.loads(json.dumps(plan_summary(plan)))
    assert run.stack_outputs["plan"] == expected
    fabric = run.outputs[run.of_type(FABRIC)[0].urn]
    assert fabric["switches"] == plan.switches
    assert fabric["links"] == plan.links
    assert fabric["oversubscription"] == plan.oversubscription
    assert fabric["bisectionTbps"] == plan.bisection_tbps
    assert fabric["tiers"] == plan.tiers


def _expected_connection(name: str, run: ProgramRun) -> tuple[dict, dict]:
    extra = {"gpucluster_spec": str(example_path(name).resolve()), "gpucluster_pulumi_stack": name}
    if name == "staging":
        from gpucluster.stage.lifecycle import connection_vars
        from gpucluster.stage.podman import StagedCluster

        stage = Path(unwrap(run.of_type(ENROLLMENT)[0].inputs)["ssh"]["known_hosts"]).parent
        ports = json.loads((stage / "ports.json").read_text())
        staged = StagedCluster(nodes={h: ("127.0.0.1", p) for h, p in ports.items()}, ssh_key=stage / "id_ed25519",
                               known_hosts=stage / "known_hosts", ssh_config=stage / "ssh_config", network="")
        extra.update({"gpucluster_secrets_dir": str(stage / "secrets"),
                      "gpucluster_state_dir": str(stage)})
        return connection_vars(staged), extra
    extra.update({"ansible_user": "ops", "ansible_ssh_private_key_file": KEY,
                  "ansible_ssh_common_args": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={KNOWN}"})
    return {}, extra


@_examples()
def test_inventory_output_equals_the_inventory_writer(run: ProgramRun) -> None:
    name = _stack_name(run)
    connection, extra = _expected_connection(name, run)
    assert json.loads(run.stack_outputs["inventory"]) == inventory_data(cluster_example(name), connection, extra)


@pytest.mark.parametrize("name", ["staging", "meta-24k-roce"])
def test_inventory_from_the_stack_is_byte_for_byte_the_writers_file(name: str, tmp_path: Path,
                                                                   tmp_path_factory) -> None:
    from gpucluster.deploy.stackoutputs import write_inventory_data
    from gpucluster.inventory import write_inventory

    result = _run_of(name, tmp_path_factory)
    connection, extra = _expected_connection(name, result)
    ours = write_inventory_data(tmp_path / "stack", json.loads(result.stack_outputs["inventory"]))
    theirs = write_inventory(tmp_path / "writer", cluster_example(name), connection, extra)
    assert ours.read_bytes() == theirs.read_bytes()
    assert ours.stat().st_mode & 0o777 == theirs.stat().st_mode & 0o777


@_examples()
def test_slurm_file_hashes_equal_the_renderer(run: ProgramRun) -> None:
    from gpucluster.render import render_all

    files = render_all(cluster_example(_stack_name(run)), cabling=False)
    digest = {n: "sha256:" + hashlib.sha256(v.encode()).hexdigest() for n, v in files.items()}
    assert run.stack_outputs["renderedFiles"] == digest
    slurm = {n: d for n, d in digest.items() if n in ("slurm.conf", "topology.conf", "gres.conf", "cgroup.conf")}
    assert "slurm.conf" in slurm
    assert run.stack_outputs["slurmFiles"] == slurm


@_examples()
def test_node_group_and_storage_outputs(run: ProgramRun) -> None:
    loaded, plan = loaded_example(_stack_name(run))
    spec = loaded.spec
    summary = plan_summary(plan)
    for g in spec.node_groups:
        out = _outputs(run, NODEGROUP, g.name)
        assert (out["count"], out["enrolled"], out["hostlist"], out["role"]) == (g.count, g.count, g.hostlist, g.role)
        assert out["hardware"]["gpus"] == (g.gpus_per_node if g.gpu else 0)
    assert run.stack_outputs["enrollment"] == {g.name: g.count for g in spec.node_groups}
    assert run.stack_outputs["drift"] == {}
    if spec.storage.flash:
        f = spec.storage.flash
        out = _outputs(run, STORAGE, f"flash-{f.name}")
        assert out["usable_tb"] == summary["storage"]["flash"]["usable_tb"]
        assert out["serversEnrolled"] == sum(spec.group(n).count for n in {f.metadata_group, f.chunk_group})
        assert out["mounts"] == [f.mount]
    for n in spec.storage.nfs:
        out = _outputs(run, STORAGE, f"nfs-{n.name}")
        assert out["servers"] == spec.group(n.server_group).count
        assert out["mounts"] == [e.mount for e in n.exports]


# ---------------------------------------------------------------- secrets


@_examples()
def test_secrets_are_marked_secret(run: ProgramRun) -> None:
    loaded, _plan = loaded_example(_stack_name(run))
    out = run.stack_outputs["ansibleSecrets"]
    assert has_secret(out) and not has_secret(unwrap(out))
    values = unwrap(out)
    assert set(values) == {"munge_key_b64", "pull_runner_signing_key_b64"} | (
        {"slurm_dbd_password"} if loaded.spec.slurm.accounting else set())
    assert len(base64.b64decode(values["munge_key_b64"])) == 1024
    for r in run.of_type(SECRET):
        assert r.secret_outputs == ("value",), r.name
    for r in run.of_type(ENROLLMENT):
        assert "ssh" in r.secret_outputs, r.name
    cluster = run.outputs[run.of_type(CLUSTER)[0].urn]
    assert has_secret(cluster["ansibleSecrets"])
    # no secret value anywhere outside a secret wrapper
    clear = json.dumps([run.stack_outputs[k] for k in run.stack_outputs if k != "ansibleSecrets"])
    for v in values.values():
        assert v not in clear


_CONFIG_SECRETS = ("gpucluster:sshPrivateKey", "gpucluster:mungeKey", "gpucluster:slurmdbdPassword",
                   "gpucluster:pullRunnerSigningKey")


def test_secrets_from_config_stay_secret_and_no_generation(tmp_path: Path) -> None:
    munge = "c2VjcmV0LW11bmdlLWtleS1mb3ItdGVzdHMtb25seS0xMjM0NTY3ODkw"
    key_text = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"
    signing = signing_key_b64()  # drawn for this test only, never stored
    cfg = stack_config(example_path("frontier-mi250x-roce"), sshPrivateKey=key_text, mungeKey=munge,
                       slurmdbdPassword="db-pass-for-tests", pullRunnerSigningKey=signing, knownHosts=KNOWN)
    run = run_program(cfg, stack="frontier-secrets", secret_keys=_CONFIG_SECRETS)
    assert run.of_type(SECRET) == []
    out = run.stack_outputs["ansibleSecrets"]
    assert has_secret(out)
    assert unwrap(out) == {"munge_key_b64": munge, "slurm_dbd_password": "db-pass-for-tests",
                           "pull_runner_signing_key_b64": signing}
    for r in run.of_type(ENROLLMENT):
        assert has_secret(r.inputs["ssh"]), r.name  # the key text travels as a secret input
        assert unwrap(r.inputs["ssh"])["key_text"] == key_text
    clear = json.dumps({k: v for k, v in run.stack_outputs.items() if k != "ansibleSecrets"})
    assert "not-a-real-key" not in clear and munge not in clear and signing not in clear


@pytest.mark.parametrize("bad", ["a2V5", "not base64!", "ecdsa"])
def test_a_signing_key_from_config_that_is_not_ed25519_ends_the_run(bad: str) -> None:
    if bad == "ecdsa":
        from cryptography.hazmat.primitives import serialization as ser
        from cryptography.hazmat.primitives.asymmetric import ec

        pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                                                    ser.NoEncryption())
        bad = base64.b64encode(pem).decode()
    cfg = stack_config(example_path("frontier-mi250x-roce"), sshKeyPath=KEY, knownHosts=KNOWN,
                       pullRunnerSigningKey=bad)
    with pytest.raises(pulumi.RunError) as exc:
        run_program(cfg, stack="frontier-bad-signing-key", secret_keys=_CONFIG_SECRETS)
    assert "gpucluster:pullRunnerSigningKey is not an OpenSSH ed25519 private key" in str(exc.value)
    assert bad not in str(exc.value)


# The signing key as every consumer reads it: the file `gpucluster secrets --pulumi-stack` writes, read back by
# checked_secrets (what `gpucluster configure --secrets` runs before Ansible), and OpenSSH's own ssh-keygen.


def _checked_signing_key(values: dict, folder: Path) -> str:
    from gpucluster.configure.secrets import checked_secrets, write_secrets_file

    path = write_secrets_file(values, folder / "private" / "secrets.json")
    read, _raw = checked_secrets(path)
    return read["pull_runner_signing_key_b64"]


def _ssh_public_key(key_b64: str, folder: Path) -> str:
    (folder / "private").mkdir(mode=0o700, exist_ok=True)
    key = folder / "private" / "signing.key"
    key.write_bytes(base64.b64decode(key_b64))
    key.chmod(0o600)
    res = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, timeout=60,
                         check=False, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@_examples()
def test_the_stack_holds_one_bundle_signing_key(run: ProgramRun, tmp_path: Path) -> None:
    values = unwrap(run.stack_outputs["ansibleSecrets"])
    assert _checked_signing_key(values, tmp_path) == values["pull_runner_signing_key_b64"]
    assert _ssh_public_key(values["pull_runner_signing_key_b64"], tmp_path).startswith("ssh-ed25519 ")
    [res] = [r for r in run.of_type(SECRET) if unwrap(r.inputs)["kind"] == "ssh-ed25519"]
    assert res.name == "bundle-signing-key" and res.secret_outputs == ("value",)
    assert unwrap(res.inputs).get("value") is None  # drawn by the provider, never an input


def test_a_second_run_on_the_same_state_keeps_every_secret(tmp_path: Path) -> None:
    """`pulumi up` twice: the engine diffs each stored secret against the program's inputs (the provider's own
    diff, in the mocks) and keeps it; a new stack draws new ones."""
    cfg = stack_config(example_path("meta-rsc-phase1"), sshKeyPath=KEY, knownHosts=KNOWN)
    first = ClusterMocks()
    one = unwrap(run_program(cfg, stack="rerun", mocks=first).stack_outputs["ansibleSecrets"])
    again = ClusterMocks(state=first.state)
    two = run_program(cfg, stack="rerun", mocks=again)
    assert has_secret(two.stack_outputs["ansibleSecrets"])
    assert unwrap(two.stack_outputs["ansibleSecrets"]) == one
    assert again.state == first.state
    other = unwrap(run_program(cfg, stack="other").stack_outputs["ansibleSecrets"])
    assert other.keys() == one.keys()
    assert all(other[k] != one[k] for k in one)
    assert _ssh_public_key(one["pull_runner_signing_key_b64"], tmp_path) != \
        _ssh_public_key(other["pull_runner_signing_key_b64"], tmp_path)


# ---------------------------------------------------------------- granularity and config


def test_enroll_batch_of_one_is_one_resource_per_node(tmp_path: Path) -> None:
    loaded, _plan = loaded_example("staging")
    stage = _stage_dir(str(tmp_path))
    run = run_program(stack_config(example_path("staging"), target="staging", stageDir=stage, enrollBatch=1),
                      stack="staging-per-node")
    nodes = [unwrap(r.inputs)["nodes"] for r in run.of_type(ENROLLMENT)]
    assert all(len(n) == 1 for n in nodes)
    assert len(nodes) == sum(g.count for g in loaded.spec.node_groups)


@pytest.mark.parametrize(("extra", "message"), [
    ({"target": "cloud"}, "gpucluster:target is 'cloud'; use one of on-prem, staging"),
    ({"target": "on-prem"}, "enrollment needs an SSH key: set gpucluster:sshKeyPath"),
    ({"target": "staging", "stageDir": "/nonexistent/stage"}, "/nonexistent/stage/ports.json does not exist: "
                                                              "stage the cluster first"),
    ({"sshKeyPath": KEY, "enrollBatch": "0"}, "gpucluster:enrollBatch is 0; use 1..65536"),
])
def test_config_errors_end_the_run_with_their_message(extra: dict, message: str) -> None:
    import pulumi

    with pytest.raises(pulumi.RunError) as err:
        run_program(stack_config(example_path("staging"), **extra), stack="bad")
    assert message in str(err.value)


def test_a_broken_spec_ends_the_run_with_its_findings(tmp_path: Path) -> None:
    import pulumi

    broken = tmp_path / "broken.yaml"
    broken.write_text(example_path("staging").read_text().replace("gpus_per_node: 4", "gpus_per_node: 5"))
    with pytest.raises(pulumi.RunError) as err:
        run_program(stack_config(broken, sshKeyPath=KEY), stack="broken")
    text = str(err.value)
    assert f"{broken}:" in text and "gpus_per_node" in text


def test_spec_paths_are_relative_to_the_project_root(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine may run the program from another folder
    run = run_program(stack_config("examples/meta-rsc-phase1.yaml", sshKeyPath=KEY), stack="rsc", root=ROOT)
    assert run.stack_outputs["cluster"] == loaded_example("meta-rsc-phase1")[0].spec.name
