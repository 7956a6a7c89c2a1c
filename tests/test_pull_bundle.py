"""Converging by pull, without a cluster: the bundle (reproducible name, manifest, no secrets), the node's
check of it (gpucluster-pull unpack_checked refuses any byte it was not promised), the fan-out's reading of
one result line per host, and which hosts pull. tests/staged/test_pull.py runs it on staged nodes."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpucluster.errors import UsageError
from gpucluster.node import pullrunner as node

ROOT = Path(__file__).resolve().parents[1]
# The node program (the pull_runner role installs this file as /usr/local/sbin/gpucluster-pull).
SCRIPT = Path(node.__file__)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A compiled staging cluster and its inventory (the real compile, no nodes)."""
    from gpucluster.cluster import load_cluster
    from gpucluster.compiled import ensure_compiled
    from gpucluster.inventory import write_inventory

    d = tmp_path_factory.mktemp("pull")
    d.chmod(0o700)
    spec = ROOT / "examples" / "staging.yaml"
    inv = write_inventory(d / "inv", load_cluster(spec), extra_vars={
        "gpucluster_spec": str(spec), "gpucluster_state_dir": str(d / "state"),
        "gpucluster_secrets_dir": str(d / "state" / "secrets")})
    folder, _ = ensure_compiled(spec, d / "state")
    return folder, inv, d


def _small(files: dict[str, bytes]) -> dict[str, bytes]:
    """The bundle less the bundled Python (fast to pack and check in a unit test)."""
    return {k: v for k, v in files.items() if not k.startswith("python/ansible/")}


def test_the_bundle_is_named_by_its_manifest_and_built_the_same_twice(compiled):
    from gpucluster.configure.bundle import build

    folder, inv, d = compiled
    one = build(folder, ROOT, inv, d / "state")
    two = build(folder, ROOT, inv, d / "state")
    assert one.hash == two.hash and one.path == two.path
    with tarfile.open(one.path) as tar:
        text = tar.extractfile("MANIFEST").read()
        names = sorted(m.name for m in tar.getmembers())
    assert hashlib.sha256(text).hexdigest() == one.hash
    for need in ("compiled/facts.json", "ansible.cfg", "inventory/hosts.yml", "playbooks/site.yml",
                 "roles/nccl/tasks/main.yml", "python/gpucluster/node/pullrunner.py",
                 "python/gpucluster/render/templating.py", "python/hostlist.py", "python/ansible/cli/playbook.py"):
        assert need in names, need
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert (one.path.parent.stat().st_mode & 0o777) == 0o700


def test_a_change_to_the_nccl_settings_gives_a_new_bundle(compiled):
    from gpucluster.configure.bundle import bundle_files, manifest

    folder, inv, _d = compiled
    files = bundle_files(folder, ROOT, inv)
    nccl = next(k for k in files if k.startswith("compiled/rendered/") and "nccl" in k)
    before = hashlib.sha256(manifest(files)).hexdigest()
    files[nccl] += b"NCCL_IB_TIMEOUT=23\n"
    assert hashlib.sha256(manifest(files)).hexdigest() != before


def test_a_bundle_holding_a_secret_is_refused(compiled):
    from gpucluster.configure.bundle import bundle_files, refuse_secrets

    folder, inv, _d = compiled
    files = bundle_files(folder, ROOT, inv)
    refuse_secrets(files, {"munge_key_b64": "c2VjcmV0LW11bmdlLWtleS12YWx1ZQ=="})  # not in it: fine
    files["inventory/group_vars/all.yml"] += b"oops: c2VjcmV0LW11bmdlLWtleS12YWx1ZQ==\n"
    with pytest.raises(UsageError, match="munge_key_b64"):
        refuse_secrets(files, {"munge_key_b64": "c2VjcmV0LW11bmdlLWtleS12YWx1ZQ=="})


def _packed(files: dict[str, bytes], extra: dict[str, bytes] | None = None, symlink: str = "") -> tuple[bytes, str]:
    from gpucluster.configure.bundle import manifest, pack

    text = manifest(files)
    data = pack({**files, **(extra or {}), "MANIFEST": text})
    if symlink:  # a tar with a link member (pack never writes one)
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, content in {**files, "MANIFEST": text}.items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            link = tarfile.TarInfo(symlink)
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
            tar.addfile(link)
        data = raw.getvalue()
    return data, hashlib.sha256(text).hexdigest()


FILES = {"compiled/facts.json": b"{}", "roles/x/tasks/main.yml": b"---\n", "playbooks/site.yml": b"---\n"}


def test_the_node_unpacks_exactly_the_bundle_it_was_promised(tmp_path):
    data, want = _packed(FILES)
    node.unpack_checked(data, want, str(tmp_path / "ok"))
    assert (tmp_path / "ok" / "roles/x/tasks/main.yml").read_bytes() == b"---\n"
    assert (tmp_path / "ok").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("how", ["wrong hash", "changed file", "extra file", "traversal", "link"])
def test_the_node_refuses_a_bundle_that_is_not_the_promised_one(tmp_path, how):
    data, want = _packed(FILES)
    if how == "wrong hash":
        want = "0" * 64
    elif how == "changed file":
        from gpucluster.configure.bundle import manifest, pack

        data = pack({**FILES, "compiled/facts.json": b'{"evil": 1}', "MANIFEST": manifest(FILES)})
    elif how == "extra file":
        data, want = _packed(FILES, {"roles/x/tasks/evil.yml": b"---\n"})
    elif how == "traversal":
        data, want = _packed(FILES, {"../outside": b"x"})
    elif how == "link":
        data, want = _packed(FILES, symlink="roles/x/link")
    with pytest.raises(node.Refused):
        node.unpack_checked(data, want, str(tmp_path / "dest"))
    assert not (tmp_path / "dest").exists()


def _proc(stdout: str, rc: int = 0, stderr: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], rc, stdout, stderr)


def test_one_line_per_host_carries_changed_failed_and_the_bundle():
    from gpucluster.configure.pull import _parse

    want = "a" * 64
    line = json.dumps({"bundle": want, "changed": 2, "failed": 0, "rc": 0, "seconds": 9.5,
                       "changes": ["nccl : Config"]})
    ok = _parse("gpu01", _proc(f"noise\n{line}\n"), want)
    assert (ok.changed, ok.failed, ok.bundle) == (2, 0, want)
    assert "gpu01  ok  changed=2 failed=0 bundle=aaaaaaaaaaaa" in ok.line() and "nccl : Config" in ok.line()
    stale = _parse("gpu02", _proc(json.dumps({"bundle": "b" * 64, "changed": 0, "failed": 0, "rc": 0}) + "\n"), want)
    assert stale.failed and "not aaaaaaaaaaaa" in stale.error
    missing = _parse("gpu03", _proc("", 127, "bash: gpucluster-pull: command not found"), want)
    assert missing.failed and "--push --tags pull" in missing.error
    silent = _parse("gpu04", _proc("", 255, "ssh: connect to host gpu04 port 22: Connection refused"), want)
    assert silent.failed and "Connection refused" in silent.error


def test_a_node_that_verified_its_manifest_says_unchanged_and_what_it_verified():
    from gpucluster.configure.pull import PullResult, _parse, summary

    want = "a" * 64
    fast = _parse("gpu01", _proc(json.dumps({"bundle": want, "changed": 0, "failed": 0, "rc": 0, "seconds": 0.08,
                                             "unchanged": True, "verified": {"files": 61, "services": 6}}) + "\n"),
                  want)
    assert fast.unchanged
    assert fast.line() == "gpu01  unchanged  bundle=aaaaaaaaaaaa  verified 61 files, 6 services  0.08s"
    ran = _parse("gpu02", _proc(json.dumps({"bundle": want, "changed": 1, "failed": 0, "rc": 0, "seconds": 40,
                                            "drift": ["/etc/nccl.conf: sha256 1 (was 2)"],
                                            "changes": ["nccl : Config"]}) + "\n"), want)
    assert not ran.unchanged and "ran the roles: /etc/nccl.conf: sha256" in ran.line()
    result = PullResult(bundle=want, hosts={"gpu01": fast, "gpu02": ran}, elapsed=41.0, push_hosts=[])
    assert result.unchanged == ["gpu01"] and "1 verified their manifest, no Ansible run" in summary(result)


def test_full_goes_with_pull_only(tmp_path):
    """--full forces the roles on nodes whose manifest verifies; a push has no fast path to force."""
    from gpucluster.cli import build_parser

    assert build_parser().parse_args(["configure", "inv", "--pull", "--full"]).full
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "configure", str(tmp_path), "--push", "--full"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "--full goes with --pull" in res.stderr and "Traceback" not in res.stderr


def test_controllers_and_slurmdbd_stay_push_and_the_fleet_pulls(compiled):
    from gpucluster.configure.pull import PULL_ABOVE, fleet, wants_pull
    from gpucluster.inventory.reader import load_inventory

    _folder, inv, _d = compiled
    pull, push = fleet(load_inventory(inv))
    assert push == ["ctl01"] and "ctl01" not in pull and {"gpu01", "gpu04"} <= set(pull)
    assert fleet(load_inventory(inv), "gpu01")[0] == ["gpu01"]
    assert len(pull) < PULL_ABOVE and not wants_pull(inv)


def test_pull_and_push_are_one_choice():
    from gpucluster.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["configure", "inv", "--pull", "--push"])
    args = build_parser().parse_args(["configure", "inv", "--pull", "--concurrency", "8"])
    assert args.pull and args.concurrency == 8


def test_the_node_script_needs_only_the_standard_library():
    """It runs before anything the bundle brings: no third-party import."""
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import runpy; runpy.run_path({str(SCRIPT)!r})"],
                         capture_output=True, text=True, check=False)
    assert "ModuleNotFoundError" not in out.stderr, out.stderr


def test_the_node_reads_gpuclusters_code_from_the_bundle_not_from_the_controllers_paths(compiled):
    """facts.json names the health scripts by their folder in gpucluster; on a node that folder is the bundle's."""
    import json

    import gpucluster
    from gpucluster.configure.bundle import bundle_files

    folder, inv, _d = compiled
    files = bundle_files(folder, ROOT, inv)
    text = files["compiled/facts.json"].decode()
    package = str(Path(gpucluster.__file__).resolve().parent)
    assert package not in text
    scripts = json.loads(text)["health"]["scripts_dir"]
    assert not scripts.startswith("/") and f"{scripts}/decide.py" in files
