"""The pull timer (docs/roles.md "Converging a fleet", "The timer"): the operator signs a pointer
{bundle, serial} with the cluster's key; a node's tick verifies it against allowed_signers and runs the bundle only
for a pointer newer than the one it converged to; its result goes back to the bundle server, which takes a result
only from an address of the host it names. Real ssh-keygen signatures, a real HTTP server on loopback and real
ansible-playbook runs of the tiny playbook of tests/test_pull_manifest.py; no cluster."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_pull_manifest import H1, node  # noqa: F401 (the node fixture: the script, its folder, a tiny bundle)

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="not run: ssh-keygen is missing")


def _key(folder: Path, name: str) -> Path:
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key


def _signers(folder: Path, key: Path) -> Path:
    path = folder / "allowed_signers"
    path.write_text(f'gpucluster-bundle namespaces="gpucluster-bundle" {Path(f"{key}.pub").read_text()}')
    return path


CLUSTER = "c1"


def _envelope(key: Path, work: Path, serial: int, bundle: str = H1, **extra) -> bytes:
    """A signed pointer as publish_pointer writes it (for every host named node1 or node7 unless told)."""
    import time

    from gpucluster.configure.pull import sign_pointer

    pointer = {"version": 2, "bundle": bundle, "serial": serial, "full": False, "cluster": CLUSTER,
               "published": int(time.time()), "expires": int(time.time()) + 3600, "hosts": ["node1", "node7"],
               **extra}
    return sign_pointer(key, pointer, work)


def _host_key(folder: Path, name: str = "host.key") -> Path:
    """A node's SSH host key (ssh_host_ed25519_key) stand-in."""
    return _key(folder, name)


@pytest.fixture
def keys(tmp_path):
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    good, other = _key(folder, "cluster.key"), _key(folder, "other.key")
    return good, other, _signers(folder, good)


@pytest.fixture
def server(tmp_path, node):  # noqa: F811 (the imported fixture)
    """The bundle server of the node script on 127.0.0.1, serving tmp_path/published, results in tmp_path/results."""
    published, results = tmp_path / "published", tmp_path / "results"
    published.mkdir()
    results.mkdir()
    httpd = node.make_server(0, str(published), str(results), bind="127.0.0.1")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", published, results
    httpd.shutdown()
    httpd.server_close()


def test_a_pointer_verifies_only_with_the_clusters_key_and_unaltered(node, keys, tmp_path):  # noqa: F811
    good, other, signers = keys
    pointer = node.verify_pointer(_envelope(good, tmp_path / "w", 7), str(signers), CLUSTER)
    assert pointer["bundle"] == H1 and pointer["serial"] == 7

    forged = _envelope(other, tmp_path / "w", 8)
    with pytest.raises(node.Refused, match="does not verify"):
        node.verify_pointer(forged, str(signers), CLUSTER)
    altered = json.loads(_envelope(good, tmp_path / "w", 9))
    altered["pointer"] = altered["pointer"].replace('"serial": 9', '"serial": 99')
    with pytest.raises(node.Refused, match="does not verify"):
        node.verify_pointer(json.dumps(altered).encode(), str(signers), CLUSTER)
    with pytest.raises(node.Refused, match="not JSON"):
        node.verify_pointer(b"not json", str(signers), CLUSTER)
    with pytest.raises(node.Refused, match="missing"):
        node.verify_pointer(_envelope(good, tmp_path / "w", 10), str(tmp_path / "no-such-file"), CLUSTER)
    with pytest.raises(node.Refused, match="not a sha256"):
        node.verify_pointer(_envelope(good, tmp_path / "w", 11, bundle="../../etc"), str(signers), CLUSTER)


def test_a_key_for_another_namespace_is_refused(node, keys, tmp_path):  # noqa: F811
    good, _other, signers = keys
    signers.write_text(signers.read_text().replace('namespaces="gpucluster-bundle"', 'namespaces="file"'))
    with pytest.raises(node.Refused, match="does not verify"):
        node.verify_pointer(_envelope(good, tmp_path / "w", 7), str(signers), CLUSTER)


def _tick(node, url: str, signers: Path, host: str = "node1"):  # noqa: F811
    args = argparse.Namespace(url=url, host=host, signers=str(signers), cluster=CLUSTER)
    return node.timer(args, folder=node.test_paths[0])


def test_a_tick_runs_a_new_pointer_once_and_refuses_forged_and_replayed_ones(node, keys, server, tmp_path):  # noqa: F811
    good, other, signers = keys
    url, published, _results = server
    work = tmp_path / "w"
    assert _tick(node, url, signers) is None, "no pointer published: nothing to do"

    (published / node.POINTER).write_bytes(_envelope(good, work, 10))
    first = _tick(node, url, signers)
    assert first["rc"] == 0 and first["failed"] == 0 and first["changed"] >= 1, first
    assert first["serial"] == 10 and first["bundle"] == H1 and first["trigger"] == "timer"
    log = Path(node.WORK) / "last.log"
    ran_at = log.stat().st_mtime_ns
    assert _tick(node, url, signers) is None, "the same pointer again: an idle tick"
    assert log.stat().st_mtime_ns == ran_at

    (published / node.POINTER).write_bytes(_envelope(other, work, 20))
    forged = _tick(node, url, signers)
    assert forged["failed"] == 1 and "does not verify" in forged["error"] and log.stat().st_mtime_ns == ran_at
    assert forged["serial"] == 20, "the refusal is filed under the serial it claims, where the operator looks"

    (published / node.POINTER).write_bytes(_envelope(good, work, 30, hosts=["node7"]))
    assert _tick(node, url, signers) is None, "a pointer for other hosts"
    (published / node.POINTER).write_bytes(_envelope(good, work, 25))
    replayed = _tick(node, url, signers)
    assert replayed["failed"] == 1 and "older than 30" in replayed["error"], replayed
    assert log.stat().st_mtime_ns == ran_at

    (published / node.POINTER).write_bytes(_envelope(good, work, 40, hosts=["node1"]))
    again = _tick(node, url, signers)
    assert again["unchanged"] is True and again["serial"] == 40, "the same bundle: the manifest verifies"


def test_a_failed_run_is_tried_again_only_after_a_pause(node, keys, server, tmp_path, monkeypatch):  # noqa: F811
    good, _other, signers = keys
    url, published, _results = server
    (published / node.POINTER).write_bytes(_envelope(good, tmp_path / "w", 10))
    calls = []

    def failing(args, folder=None):
        calls.append(args.hash)
        return {"host": args.host, "bundle": args.hash, "changed": 0, "failed": 1, "rc": 2, "error": "broken"}

    monkeypatch.setattr(node, "run", failing)
    assert _tick(node, url, signers)["failed"] == 1
    assert _tick(node, url, signers) is None and len(calls) == 1
    monkeypatch.setattr(node, "RETRY_AFTER", 0)
    assert _tick(node, url, signers)["failed"] == 1 and len(calls) == 2


def _put(url: str, host: str, body: bytes) -> int:
    req = urllib.request.Request(f"{url}/results/{host}", data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_server_takes_a_result_only_from_the_hosts_own_address(node, keys, server, tmp_path, capsys):  # noqa: F811
    good, _other, _signers = keys
    url, published, results = server
    (published / node.POINTER).write_bytes(_envelope(good, tmp_path / "w", 5, hosts=["localhost", "gpu01.invalid"]))
    host_key = _host_key(tmp_path / "keys", "localhost-host.key")
    body = node.sign_result({"host": "localhost", "serial": 5, "bundle": H1, "failed": 0}, str(host_key), CLUSTER)
    assert node.report(url, "localhost", body) == ""
    record = json.loads((results / "localhost.json").read_text())
    assert json.loads(record["result"])["serial"] == 5 and record["signature"].startswith("-----BEGIN SSH SIGNATURE")

    def signed(host: str) -> bytes:
        return json.dumps({"result": json.dumps({"host": host}), "signature": "x"}).encode()

    assert _put(url, "gpu01.invalid", signed("gpu01.invalid")) == 403  # not an address of that name
    assert _put(url, "gpu02", signed("gpu02")) == 404                  # not a host of the published pointer
    assert _put(url, "localhost", signed("gpu01")) == 400              # the body names another host
    assert _put(url, "localhost", b'{"host": "localhost"}') == 400     # not a signed envelope
    assert _put(url, "localhost", b"[1]") == 400
    assert _put(url, "..", b"{}") == 404
    assert _put(url, "localhost", b"x" * (node.MAX_RESULT + 1)) == 413
    assert sorted(p.name for p in results.iterdir()) == ["localhost.json"]

    node.main(["results", "--results", str(results), "--serial", "5"])
    assert json.loads(capsys.readouterr().out)["host"] == "localhost"
    node.main(["results", "--results", str(results), "--serial", "6"])
    assert capsys.readouterr().out == ""


def test_the_server_publishes_a_pointer_only_signed_newer_and_for_a_stored_bundle(node, keys, tmp_path,  # noqa: F811
                                                                                   monkeypatch, capsys):
    good, other, signers = keys
    published = tmp_path / "srv"
    monkeypatch.setattr(node, "PUBLISHED", str(published))
    published.mkdir()

    def store(envelope: bytes) -> int:
        monkeypatch.setattr("sys.stdin", argparse.Namespace(buffer=__import__("io").BytesIO(envelope)))
        return node.store_pointer(argparse.Namespace(signers=str(signers), cluster=CLUSTER))

    assert store(_envelope(good, tmp_path / "w", 10)) == 1
    assert "not stored here" in capsys.readouterr().err
    (published / f"{H1}.tar.gz").write_bytes(b"stored")
    assert store(_envelope(other, tmp_path / "w", 10)) == 1 and "does not verify" in capsys.readouterr().err
    assert store(_envelope(good, tmp_path / "w", 10)) == 0
    assert store(_envelope(good, tmp_path / "w", 9)) == 1 and "not newer" in capsys.readouterr().err
    assert node.verify_pointer((published / node.POINTER).read_bytes(), str(signers), CLUSTER)["serial"] == 10
    assert store(_envelope(good, tmp_path / "w", 11, cluster="other")) == 1 and "cluster 'other'" in \
        capsys.readouterr().err
    assert store(_envelope(good, tmp_path / "w", 12, expires=1000)) == 1 and "expired" in capsys.readouterr().err


def test_the_timer_trigger_converges_the_whole_bundle_and_needs_the_clusters_key(tmp_path):
    from gpucluster.configure.pull import publish_pointer, pull
    from gpucluster.errors import UsageError

    for kwargs in ({"tags": "nccl"}, {"check": True}, {"diff": True}, {"wait": -1}, {"trigger": "cron"}):
        with pytest.raises(UsageError):
            pull(tmp_path / "no-inventory", **{"trigger": "timer", **kwargs})
    inv = argparse.Namespace(vars={"gpucluster_cluster": CLUSTER}, group=lambda name: ["ctl01"], path=tmp_path)
    with pytest.raises(UsageError, match="--push --tags pull"):
        publish_pointer(inv, H1, ["gpu01"], False, tmp_path, tmp_path / "w", print)
    with pytest.raises(UsageError, match="not a cluster name"):
        publish_pointer(argparse.Namespace(vars={}, path=tmp_path), H1, ["gpu01"], False, tmp_path, tmp_path, print)


def test_the_operators_key_signs_from_a_private_copy_that_is_removed(node, tmp_path, monkeypatch):  # noqa: F811
    """--secrets FILE with pull_runner_signing_key_b64: the pointer is signed with that key (what push installed
    from the same file), from a 0600 copy in a 0700 folder, gone once signed; no key in the secrets folder."""
    import base64
    import stat

    from gpucluster.configure import pull as pull_mod
    from gpucluster.configure.secrets import generate

    key_b64 = generate()["pull_runner_signing_key_b64"]
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    key = folder / "operator.key"
    key.write_bytes(base64.b64decode(key_b64))
    key.chmod(0o600)
    public = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True).stdout
    signers = folder / "allowed_signers"
    signers.write_text(f'gpucluster-bundle namespaces="gpucluster-bundle" {public}')
    sent, modes = [], []

    def store(inv, command, data, what):
        work = tmp_path / "w"
        modes.append(stat.S_IMODE(work.stat().st_mode))
        sent.append((command, data, sorted(p.name for p in work.iterdir())))

    monkeypatch.setattr(pull_mod, "_store", store)
    inv = argparse.Namespace(vars={"gpucluster_cluster": CLUSTER}, group=lambda name: ["ctl01"], path=tmp_path)
    serial = pull_mod.publish_pointer(inv, H1, ["gpu01"], False, tmp_path / "no-secrets-folder", tmp_path / "w",
                                      print, key_b64)
    (command, envelope, left), = sent
    assert command == f"gpucluster-pull store-pointer --cluster {CLUSTER}" and modes == [0o700] and left == []
    pointer = node.verify_pointer(envelope, str(signers), CLUSTER)
    assert pointer["serial"] == serial and pointer["bundle"] == H1 and pointer["hosts"] == ["gpu01"]
