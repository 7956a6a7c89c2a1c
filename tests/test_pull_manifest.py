"""The node's fast no-op (gpucluster-pull): after a full run of a bundle it keeps a manifest of what that run
manages, listed by the run itself (the gpucluster_manifest callback); the same bundle again skips Ansible when
the manifest verifies, and runs the roles when a file, its mode or owner, or a service differs, when the bundle
is another, or with --full. Real ansible-playbook runs of a tiny local playbook, no cluster; systemd is the
one stand-in (this machine has no systemd as PID 1), for the service check only."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
H1, H2 = "a" * 64, "b" * 64

PLAYBOOK = """\
- name: A tiny site.yml that manages a file, a folder, an absent path and a loop of files
  hosts: all
  gather_facts: false
  tasks:
    - name: Managed | one file
      ansible.builtin.copy: {{dest: "{out}/managed.conf", content: "setting=1\\n", mode: "0640"}}
    - name: Managed | a folder
      ansible.builtin.file: {{path: "{out}/folder", state: directory, mode: "0750"}}
    - name: Managed | a path that must not exist
      ansible.builtin.file: {{path: "{out}/gone", state: absent}}
    - name: Managed | files of a loop
      ansible.builtin.copy: {{dest: "{out}/{{{{ item }}}}.conf", content: "{{{{ item }}}}\\n", mode: "0644"}}
      loop: [left, right]
    - name: Not a file task (the manifest lists only what file and service tasks name)
      ansible.builtin.command: "true"
      changed_when: false
"""


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The node program (gpucluster.node.pullrunner) with its working folder, an unpacked 'bundle' (the tiny
    playbook, the node's ansible.cfg, the manifest callback) and the folder its playbook manages, all under tmp_path."""
    from gpucluster.configure.bundle import NODE_ANSIBLE_CFG
    from gpucluster.node import pullrunner as module

    monkeypatch.setattr(module, "WORK", str(tmp_path / "work"))
    out, bundle = tmp_path / "managed", tmp_path / "bundle"
    out.mkdir()
    (bundle / "playbooks").mkdir(parents=True)
    (bundle / "inventory").mkdir()
    (bundle / "playbooks" / "site.yml").write_text(PLAYBOOK.format(out=out))
    (bundle / "inventory" / "hosts.yml").write_text("all:\n  hosts:\n    node1: {}\n")
    (bundle / "ansible.cfg").write_text(NODE_ANSIBLE_CFG)
    callbacks = bundle / module.CALLBACK_DIR
    callbacks.parent.mkdir(parents=True)
    callbacks.symlink_to(ROOT / module.CALLBACK_DIR)
    (out / "gone").write_text("removed by the first run\n")
    module.test_paths = (str(bundle), out)
    return module


def _run(node, want: str = H1, **flags) -> dict:
    args = argparse.Namespace(hash=want, url="http://127.0.0.1:9", host="node1", tags="", skip_tags="",
                              check=False, diff=False, full=False)
    for key, value in flags.items():
        setattr(args, key, value)
    return node.run(args, folder=node.test_paths[0])


def _manifest(node) -> dict:
    return json.loads((Path(node.WORK) / node.APPLIED).read_text())


def test_a_full_run_records_what_it_manages_the_same_bundle_skips_and_drift_runs_the_roles(node):
    """One node's life: full run (records), no-op (skips Ansible), hand edits (the roles run and restore them),
    no-op again, --full (Ansible runs anyway). Two real playbook runs and a short third."""
    out = node.test_paths[1]
    first = _run(node)
    assert first["rc"] == 0 and first["failed"] == 0 and not first.get("unchanged"), first
    assert first["recorded"] == {"files": 5, "services": 0}
    files = _manifest(node)["files"]
    assert sorted(files) == sorted(str(out / n) for n in ("managed.conf", "folder", "gone", "left.conf", "right.conf"))
    assert files[str(out / "managed.conf")]["sha256"] == hashlib.sha256(b"setting=1\n").hexdigest()
    assert files[str(out / "managed.conf")]["mode"] == "0o640" and files[str(out / "gone")]["kind"] == "absent"
    assert files[str(out / "folder")]["kind"] == "dir" and files[str(out / "folder")]["uid"] == os.getuid()
    assert files[str(out / "managed.conf")]["task"] == "Managed | one file"
    log_before = (Path(node.WORK) / "last.log").stat().st_mtime_ns

    again = _run(node)
    assert again["unchanged"] is True and again["verified"] == {"files": 5, "services": 0}, again
    assert again["changed"] == 0 and again["failed"] == 0 and again["rc"] == 0
    assert (Path(node.WORK) / "last.log").stat().st_mtime_ns == log_before, "Ansible ran on a verified node"
    assert again["seconds"] < 2

    (out / "managed.conf").write_text("setting=2\n")  # hand edits
    (out / "left.conf").chmod(0o600)
    (out / "gone").write_text("back\n")
    fixed = _run(node)
    assert not fixed.get("unchanged") and fixed["rc"] == 0, fixed
    drift = " ".join(fixed["drift"])
    assert "managed.conf: sha256" in drift and "left.conf: mode" in drift and "gone: kind" in drift, drift
    assert fixed["changed"] >= 3 and "Managed | one file" in fixed["changes"]
    assert (out / "managed.conf").read_text() == "setting=1\n" and not (out / "gone").exists()
    assert stat.S_IMODE((out / "left.conf").stat().st_mode) == 0o644
    assert _run(node).get("unchanged") is True

    forced = _run(node, full=True, tags="nothing-has-this-tag")  # no task has the tag: a short run
    assert not forced.get("unchanged") and forced["drift"] == ["--full"] and forced["rc"] == 0, forced


def test_another_bundle_or_host_never_skips_and_a_partial_run_forgets_the_manifest(node):
    out = node.test_paths[1]
    listing = Path(node.WORK) / "listing.json"
    os.makedirs(node.WORK, mode=0o700)
    (out / "managed.conf").write_text("setting=1\n")
    listing.write_text(json.dumps({"files": {str(out / "managed.conf"): "t"}, "services": {}}))
    node.record_manifest("node1", H1, str(listing))
    assert node.verify_manifest("node1", H1) == ({"files": 1, "services": 0}, [])
    verified, why = node.verify_manifest("node1", H2)
    assert verified is None and "new bundle" in why[0]
    verified, why = node.verify_manifest("node2", H1)
    assert verified is None and "node1" in why[0]
    partial = _run(node, H2, tags="nothing-has-this-tag")
    assert not partial.get("unchanged") and partial["rc"] == 0 and "recorded" not in partial
    assert not (Path(node.WORK) / node.APPLIED).exists(), "a partial run of another bundle kept the manifest"
    verified, why = node.verify_manifest("node1", H1)
    assert verified is None and why == ["no manifest (no full run recorded here)"]


def test_a_service_the_roles_keep_running_must_be_active(node, tmp_path, monkeypatch):
    """systemctl is a stand-in here (no systemd as PID 1 on this machine): it answers as systemd does."""
    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\nshift 2\nfor u in \"$@\"; do\n  case $u in slurmd) echo inactive;; *) echo active;; "
                    "esac\ndone\n")
    fake.chmod(0o755)
    monkeypatch.setattr(node, "SYSTEMCTL", str(fake))
    os.makedirs(node.WORK, mode=0o700)
    node._write_private(os.path.join(node.WORK, node.APPLIED), {
        "version": node.MANIFEST_VERSION, "host": "node1", "bundle": H1, "files": {},
        "services": {"munge": "task", "nvidia-persistenced": "task"}})
    assert node.verify_manifest("node1", H1) == ({"files": 0, "services": 2}, [])
    manifest = _manifest(node)
    manifest["services"]["slurmd"] = "task"
    node._write_private(os.path.join(node.WORK, node.APPLIED), manifest)
    assert node.verify_manifest("node1", H1) == (None, ["service slurmd (inactive)"])
