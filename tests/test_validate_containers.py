"""validate's container job (validate/checks/test_containers.py) without a cluster: the expectations per node group,
the verdict on recorded task output (one fault at a time), and the bundle the check makes, built here by its own
script from this machine's files and run by the real runc with the job's script, as slurmstepd would run it on two
nodes (each run here gets a host name of its own, which on a cluster the two nodes have). The whole check on a
cluster: tests/staged/test_validate.py (Slurm 22.05) and tests/staged/test_trixie.py (24.11)."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess

import pytest
from conftest import validate_checks
from test_validate_unit import _doc, staging_inventory  # noqa: F401 (fixtures)

from gpucluster.validate import expect

ct = validate_checks("test_containers.py", "gpc_checks_containers")
SHA = "a" * 64
GOOD = {"0": {"read": "job 7 written on gpu02", "node": "gpu01", "rss_kb": str(ct.MEM_MB * 1024),
              "nccl": f"{SHA}  -", "gpus": "8", "rdma": "4"},
        "1": {"read": "job 7 written on gpu01", "node": "gpu02", "rss_kb": str(ct.MEM_MB * 1024),
              "nccl": f"{SHA}  -", "gpus": "8", "rdma": "4"}}


def _problems(tasks):
    return ct.job_problems(tasks, mem_mb=ct.MEM_MB, nccl_sha256=SHA, devices={"gpus": 8, "rdma": 4})


# ---- expectations


def test_every_group_with_oci_is_expected_with_its_hosts_and_the_flash_folder(_doc):  # noqa: F811 (the fixture)
    assert _doc["containers"] == {"gpu": {"hosts": ["gpu01", "gpu02", "gpu03", "gpu04"],
                                         "flash_dir": "/mnt/flash/containers"}}


def test_a_group_with_a_node_off_the_flash_tier_has_no_flash_folder():
    facts = {"containers": {"flash_dir": "/f/containers", "groups": {"a": {"oci": True}, "b": {"oci": False},
                                                                      "c": {"oci": True}}}}
    hosts = {"a1": {"node_group": "a"}, "a2": {"node_group": "a"}, "b1": {"node_group": "b"},
             "c1": {"node_group": "c"}, "c2": {"node_group": "c"}}
    got = expect._containers(facts, hosts, ["a1", "a2", "b1", "c1", "c2"], ["a1", "a2", "b1", "c1"])
    assert got == {"a": {"hosts": ["a1", "a2"], "flash_dir": "/f/containers"},
                   "c": {"hosts": ["c1", "c2"], "flash_dir": None}}
    assert expect._containers(facts, hosts, ["a1"], ["a1"])["c"] == {"hosts": [], "flash_dir": None}


# ---- the verdict on the tasks' output


def test_the_job_that_did_everything_has_no_problem():
    assert _problems(GOOD) == []


@pytest.mark.parametrize(("task", "key", "value", "said"), [
    ("1", "read", "nothing", "task 1 on gpu02 read 'nothing' from the flash tier"),
    ("0", "read", "job 7 written on gpu01", "task 0 on gpu01 read 'job 7 written on gpu01'"),
    ("0", "node", "gpu02", "did not run on two nodes"),
    ("1", "rss_kb", "unlimited", "RSS limit 'unlimited' KiB in the container, not the 262144"),
    ("0", "nccl", f"{'b' * 64}  -", f"SHA-256 {'b' * 64}, not the rendered file's {SHA}"),
    ("1", "gpus", "0", "task 1 on gpu02: 0 gpus device files in the container, the node has 8"),
    ("0", "rdma", "3", "task 0 on gpu01: 3 rdma device files"),
])
def test_each_fault_is_named(task, key, value, said):
    tasks = copy.deepcopy(GOOD)
    tasks[task][key] = value
    problems = _problems(tasks)
    assert problems and any(said in p for p in problems), problems


def test_a_missing_task_is_named():
    assert _problems({"0": GOOD["0"]}) == ["expected the output of tasks 0 and 1, got tasks ['0']"]
    assert _problems({}) == ["expected the output of tasks 0 and 1, got tasks none"]


def test_srun_labels_and_device_lines_are_parsed():
    out = "0: node: gpu01\n  1: nccl: abc  -\nnoise\n1: read: job 3 written on gpu01\n"
    assert ct.parse_tasks(out) == {"0": {"node": "gpu01"}, "1": {"nccl": "abc  -", "read": "job 3 written on gpu01"}}
    stat = ("/dev/nvidia0 character special file c3 0\n/dev/nvidia1 character special file c3 1\n"
            "/dev/infiniband/uverbs0 character special file e7 c0\n/dev/nvidiactl character special file c3 ff\n"
            "/dev/dri/by-path directory 0 0\n/dev/sda block special file 8 0\n")
    assert ct.parse_devices(stat) == [("/dev/nvidia0", "c", 195, 0), ("/dev/nvidia1", "c", 195, 1),
                                      ("/dev/infiniband/uverbs0", "c", 231, 192), ("/dev/nvidiactl", "c", 195, 255),
                                      ("/dev/sda", "b", 8, 0)]


def test_the_config_binds_the_tiers_and_devices_and_keeps_the_hosts_namespaces():
    cfg = ct.config_json("/mnt/flash", "/etc/nccl.conf", [("/dev/nvidia0", "c", 195, 0)])
    binds = {m["destination"]: m for m in cfg["mounts"] if m["type"] == "none"}
    assert binds["/mnt/flash"]["options"] == ["rbind", "rw"] and binds["/etc/nccl.conf"]["options"] == ["bind", "ro"]
    assert "/dev/nvidia0" in binds
    spaces = {n["type"] for n in cfg["linux"]["namespaces"]}
    assert not spaces & {"uts", "network", "user"}  # the node's host name and network, root's ids
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"} in cfg["linux"]["resources"][
        "devices"]
    assert ct.config_json("/mnt/flash", None, [])["mounts"][-1]["destination"] == "/mnt/flash"


# ---- the bundle and the job, with the real runc


def _runc_or_skip():
    import os

    if shutil.which("runc") is None or os.geteuid() != 0:
        pytest.skip("not run: needs runc and root (CI has both: podman brings runc)")


def _bundle(tmp_path):
    """The check's bundle, made by its own script on this machine, for a flash tier at tmp_path/flash."""
    flash, nccl = tmp_path / "flash", tmp_path / "nccl.conf"
    flash.mkdir()
    nccl.write_text("NCCL_IB_QPS_PER_CONNECTION=1\n")
    devices = ct.parse_devices(subprocess.run(["stat", "-c", "%n %F %t %T", "/dev/null"], capture_output=True,
                                              text=True, check=True).stdout)
    cfg = ct.config_json(str(flash), str(nccl), devices)
    bundle = tmp_path / "bundle"
    dirs, files = ct.mount_points(str(flash), str(nccl))
    script = ct.ROOTFS.format(bundle=bundle, tools=" ".join(ct.TOOLS), dirs=" ".join(dirs), files=" ".join(files),
                              config=base64.b64encode(json.dumps(cfg).encode()).decode())
    made = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    assert made.returncode == 0 and made.stdout.strip() == "ok", made.stderr
    return bundle, flash, nccl


def test_the_root_file_system_holds_every_mount_point_before_a_container_starts(tmp_path):
    """Both nodes start from the one bundle on the flash tier at once; a mount point runc has to make collides
    between them (seen on 24.11 with Slurm's spool mount), so the script makes them all."""
    bundle, flash, nccl = _bundle(tmp_path)
    root = bundle / "rootfs"
    assert (root / "var/run/slurm").is_dir() and (root / str(flash).lstrip("/")).is_dir()
    assert (root / str(nccl).lstrip("/")).is_file()
    assert ct.mount_points("/mnt/flash", None) == (["/var/run/slurm", "/mnt/flash"], [])


def test_the_bundle_runs_the_job_on_two_hosts_and_the_verdict_is_clean(tmp_path):
    """As slurmstepd does: the job's command in place of the config's, one container per node (here a host name
    each, as two nodes have), both at once; then the check's own verdict on their output."""
    _runc_or_skip()
    bundle, flash, nccl = _bundle(tmp_path)
    handoff = flash / "handoff"
    handoff.mkdir()
    job = ct.JOB.format(handoff=handoff, nccl_conf=nccl).replace("$SLURM_JOB_ID", "7")
    base = json.loads((bundle / "config.json").read_text())
    procs = {}
    for task, host in (("0", "node-a"), ("1", "node-b")):
        b = tmp_path / f"task{task}"
        b.mkdir()
        cfg = copy.deepcopy(base)
        cfg["root"]["path"] = str(bundle / "rootfs")
        cfg["process"]["args"] = ["/usr/bin/sh", "-c", job]  # the path srun on a Debian 13 host sends
        cfg["hostname"] = host
        cfg["linux"]["namespaces"].append({"type": "uts"})  # here only: two "nodes" on one machine
        (b / "config.json").write_text(json.dumps(cfg))
        procs[task] = subprocess.Popen(["runc", "--root", str(tmp_path / "runc"), "run", "-b", str(b),
                                        f"gpc-test-{tmp_path.name}-{task}"], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    out = ""
    for task, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out += "".join(f"{task}: {line}\n" for line in stdout.splitlines())
    tasks = ct.parse_tasks(out)
    import hashlib

    sha = hashlib.sha256(nccl.read_bytes()).hexdigest()
    assert ct.job_problems(tasks, mem_mb=0, nccl_sha256=sha, devices={"gpus": 0, "rdma": 0}) == [
        f"task {t} on {h}: RSS limit 'unlimited' KiB in the container, not the 0 of srun --mem=0"
        for t, h in (("0", "node-a"), ("1", "node-b"))], out  # no srun here: no RSS limit was set
    assert tasks["0"]["read"] == "job 7 written on node-b" and tasks["1"]["read"] == "job 7 written on node-a"
