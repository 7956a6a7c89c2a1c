"""The dynamic providers without machines: serialisation the way the engine needs it, diff and check
rules, and secret generation.

The engine never imports the program's modules into its provider process by name: each resource
carries its provider pickled (dill, base64) in `__provider`, and `python -m pulumi.dynamic` unpickles
it. These tests take the serialized providers a mock run of the program produced and hand them to
that very process over gRPC.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import example_path
from pulumi_harness import ENROLLMENT, SECRET, run_program, stack_config, unwrap

from gpucluster.configure.secrets import is_signing_key
from gpucluster.deploy.provider import EnrollmentProvider, SecretProvider

KEY = "~/.ssh/gpucluster_ed25519"


@pytest.fixture(scope="module")
def mock_run():
    return run_program(stack_config(example_path("meta-rsc-phase1"), sshKeyPath=KEY), stack="serialise")


def _inputs(run, typ: str, name: str | None = None) -> dict:
    return unwrap(next(r for r in run.resources if r.type == typ and name in (None, r.name)).inputs)


def test_providers_pickle_by_reference_and_small(mock_run) -> None:
    # One serialized form per provider class, whatever the resource: no per-resource state inside.
    assert len(mock_run.serialized_providers) == 2
    for text in mock_run.serialized_providers:
        raw = base64.b64decode(text)
        assert len(raw) < 200, len(raw)
        assert b"gpucluster.deploy.provider" in raw  # by reference to the module, not by value


def _serialize(props: dict):
    from pulumi.runtime import rpc

    loop = asyncio.new_event_loop()  # its own loop: asyncio.run would unset the thread's, which pulumi uses
    try:
        return loop.run_until_complete(rpc.serialize_properties(props, {}))
    finally:
        loop.close()


def test_the_dynamic_provider_process_serves_them_over_grpc(mock_run) -> None:
    """Start `python -m pulumi.dynamic` (what the engine starts for dynamic resources: a fresh interpreter that
    imports gpucluster only by unpickling `__provider`) and call Check, Create and Diff on it with the
    properties the program registered."""
    import grpc
    from pulumi.runtime import rpc
    from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

    proc = subprocess.Popen([sys.executable, "-u", "-m", "pulumi.dynamic"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PULUMI_PROJECT": "gpucluster"})
    try:
        port = int(proc.stdout.readline().strip())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = provider_pb2_grpc.ResourceProviderStub(channel)
        stub.Configure(provider_pb2.ConfigureRequest(args=_serialize({})), timeout=60)

        secret = _inputs(mock_run, SECRET, "munge-key")
        urn = "urn:pulumi:serialise::gpucluster::pulumi-python:dynamic/gpucluster:ClusterSecret::munge-key"
        checked = stub.Check(provider_pb2.CheckRequest(urn=urn, olds=_serialize({}), news=_serialize(secret)),
                             timeout=60)
        assert list(checked.failures) == []
        created = stub.Create(provider_pb2.CreateRequest(urn=urn, properties=checked.inputs), timeout=60)
        outs = rpc.deserialize_properties(created.properties)
        assert len(base64.b64decode(outs["value"])) == 1024
        assert outs["__provider"] == secret["__provider"]
        same = stub.Diff(provider_pb2.DiffRequest(id=created.id, urn=urn, olds=created.properties,
                                                  news=checked.inputs), timeout=60)
        assert same.changes == provider_pb2.DiffResponse.DIFF_NONE

        # the bundle-signing key is drawn in that process too (cryptography importable there)
        signing = _inputs(mock_run, SECRET, "bundle-signing-key")
        urn = "urn:pulumi:serialise::gpucluster::pulumi-python:dynamic/gpucluster:ClusterSecret::bundle-signing-key"
        checked = stub.Check(provider_pb2.CheckRequest(urn=urn, olds=_serialize({}), news=_serialize(signing)),
                             timeout=60)
        assert list(checked.failures) == []
        created = stub.Create(provider_pb2.CreateRequest(urn=urn, properties=checked.inputs), timeout=60)
        assert is_signing_key(rpc.deserialize_properties(created.properties)["value"])
        same = stub.Diff(provider_pb2.DiffRequest(id=created.id, urn=urn, olds=created.properties,
                                                  news=checked.inputs), timeout=60)
        assert same.changes == provider_pb2.DiffResponse.DIFF_NONE

        enrollment = _inputs(mock_run, ENROLLMENT)
        urn = "urn:pulumi:serialise::gpucluster::pulumi-python:dynamic/gpucluster:NodeEnrollment::x"
        checked = stub.Check(provider_pb2.CheckRequest(urn=urn, olds=_serialize({}), news=_serialize(enrollment)),
                             timeout=60)
        assert list(checked.failures) == []
        moved = {**enrollment, "expect": {**enrollment["expect"], "gpus": 4}}
        diff = stub.Diff(provider_pb2.DiffRequest(id="x", urn=urn, olds=_serialize(enrollment),
                                                  news=_serialize(moved)), timeout=60)
        assert diff.changes == provider_pb2.DiffResponse.DIFF_SOME
        assert list(diff.replaces) == []
        channel.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)


# ---------------------------------------------------------------- diff and check rules


def _props(mock_run) -> dict:
    return _inputs(mock_run, ENROLLMENT)


def test_diff_ignores_spec_line_numbers_and_parallelism(mock_run) -> None:
    olds = _props(mock_run)
    news = {**olds, "parallel": 7, "expect": {**olds["expect"], "where": {"gpus_per_node": "elsewhere.yaml:99"}}}
    assert EnrollmentProvider().diff("id", olds, news).changes is False


@pytest.mark.parametrize(("change", "replaces"), [
    ({"nodes": ["x 10.0.0.1:22"]}, []),
    ({"ssh": {"user": "ops", "known_hosts": "/k", "key_path": "/p", "timeout": 15}}, []),
    ({"group": "other"}, ["group"]),
    ({"owner": {"project": "gpucluster", "stack": "other"}}, ["owner"]),
])
def test_diff_rechecks_or_replaces(mock_run, change: dict, replaces: list) -> None:
    olds = _props(mock_run)
    result = EnrollmentProvider().diff("id", olds, {**olds, **change})
    assert result.changes is True
    assert result.replaces == replaces


def test_check_reports_a_missing_key(mock_run) -> None:
    props = _props(mock_run)
    props["ssh"] = {"user": "root", "known_hosts": "/k"}
    failures = EnrollmentProvider().check({}, props).failures
    assert [(f.property, "gpucluster:sshKeyPath" in f.reason) for f in failures] == [("ssh", True)]


def test_secrets_are_drawn_once_and_kept() -> None:
    prov = SecretProvider()
    a = prov.create({"kind": "munge-key", "length": 1024})
    b = prov.create({"kind": "munge-key", "length": 1024})
    assert len(base64.b64decode(a.outs["value"])) == 1024
    assert a.outs["value"] != b.outs["value"]
    assert prov.read(a.id, a.outs).outs["value"] == a.outs["value"]
    assert prov.diff(a.id, a.outs, {"kind": "munge-key", "length": 1024}).changes is False
    changed = prov.diff(a.id, a.outs, {"kind": "munge-key", "length": 512})
    assert (changed.changes, changed.replaces) == (True, ["length"])
    pw = prov.create({"kind": "password", "length": 32}).outs["value"]
    assert len(pw) >= 32 and pw.isascii()
    assert [f.property for f in prov.check({}, {"kind": "pin", "length": 4}).failures] == ["kind", "length"]


def test_the_signing_key_is_drawn_once_and_kept(tmp_path: Path) -> None:
    """kind ssh-ed25519: an unencrypted OpenSSH ed25519 key file as base64, which ssh-keygen reads; kept by
    read and by a diff with the same inputs, drawn anew only on replacement."""
    prov = SecretProvider()
    props = {"kind": "ssh-ed25519", "length": 32}
    assert prov.check({}, props).failures == []
    a, b = prov.create(props), prov.create(props)
    assert a.outs["value"] != b.outs["value"]
    assert is_signing_key(a.outs["value"]) and a.id.startswith("ssh-ed25519-")
    key = tmp_path / "signing.key"
    key.write_bytes(base64.b64decode(a.outs["value"]))
    key.chmod(0o600)
    res = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, timeout=60,
                         check=False, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and res.stdout.startswith("ssh-ed25519 "), res.stderr
    assert prov.read(a.id, a.outs).outs["value"] == a.outs["value"]
    assert prov.diff(a.id, a.outs, props).changes is False
    assert [f.property for f in prov.check({}, {**props, "length": 64}).failures] == ["length"]


@pytest.mark.parametrize("value", ["", "a2V5", "not base64!",
                                   base64.b64encode(b"-----BEGIN OPENSSH PRIVATE KEY-----\n").decode()])
def test_what_is_not_a_signing_key(value: str) -> None:
    assert is_signing_key(value) is False


def test_secrets_are_never_written_to_the_repository() -> None:
    """No stack config or tracked file carries a secret in clear (values under `secure:` are ciphertext)."""
    root = Path(__file__).resolve().parent.parent
    for path in (root / "stacks").glob("Pulumi.*.yaml"):
        import yaml

        config = (yaml.safe_load(path.read_text()) or {}).get("config", {})
        for key in ("gpucluster:mungeKey", "gpucluster:slurmdbdPassword", "gpucluster:sshPrivateKey",
                    "gpucluster:pullRunnerSigningKey"):
            value = config.get(key)
            assert value is None or (isinstance(value, dict) and set(value) == {"secure"}), (path, key)
