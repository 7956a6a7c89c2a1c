"""The validation suite without a cluster: inventory reading, expectations from the plan, parametrization
by (group, host, item), the helpers the checks use on nodes, thresholds, JUnit merge, summary and HTML,
and the --via-slurm bundle (run with the system's python3, as a node would)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import hostlist
import pytest
import yaml
from conftest import cluster_example, example_path, loaded_example, skip_or_fail

from gpucluster.errors import UsageError
from gpucluster.inventory.reader import load_inventory
from gpucluster.inventory.writer import inventory_data
from gpucluster.render import nccl_file_for, render_all
from gpucluster.render.fileset import profile_differences
from gpucluster.render.topology import slurm_switches
from gpucluster.validate import expect, report, viaslurm
from gpucluster.validate.suite import CHECKS_DIR, default_workers, pytest_command
from gpucluster.validate.thresholds import DEFAULTS, load_thresholds, threshold_for


def _load_checklib():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpc_checklib", CHECKS_DIR / "gpc_checklib.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpc_checklib", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


lib = _load_checklib()


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def staging_inventory(tmp_path_factory) -> Path:
    """The inventory `stage up` writes for examples/staging.yaml (connection vars included), plus a
    secrets dir holding a munge key (random bytes made here: never a real secret)."""
    tmp_path = tmp_path_factory.mktemp("inventory")
    spec = cluster_example("staging").spec
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "munge.key").write_bytes(os.urandom(1024))
    conn = {h: {"ansible_host": "127.0.0.1", "ansible_port": 40000 + i, "ansible_user": "root",
                "ansible_ssh_private_key_file": str(tmp_path / "id"),
                "ansible_ssh_common_args": f"-o UserKnownHostsFile={tmp_path}/kh -o StrictHostKeyChecking=yes "
                                           "-o ControlMaster=auto -o ControlPersist=60s"}
            for i, h in enumerate(h for g in spec.node_groups for h in g.hosts)}
    data = inventory_data(cluster_example("staging"), conn, extra_vars={
        "gpucluster_spec": str(example_path("staging").resolve()),
        "gpucluster_secrets_dir": str(secrets), "gpucluster_state_dir": str(tmp_path)})
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    return inv


@pytest.fixture(scope="module")
def _doc(staging_inventory) -> dict:
    inv = load_inventory(staging_inventory)
    return expect.build(inv, expect.Options(thresholds=load_thresholds(None), run_id="test-run"))


@pytest.fixture
def doc(_doc) -> dict:
    return json.loads(json.dumps(_doc))  # a fresh copy: tests may change it


# ------------------------------------------------------------------ inventory


def test_inventory_groups_and_host_vars(staging_inventory):
    inv = load_inventory(staging_inventory)
    loaded, plan = loaded_example("staging")
    spec = loaded.spec
    assert sorted(inv.hosts) == sorted(h for g in spec.node_groups for h in g.hosts)
    assert inv.group("slurm_compute") == spec.group("gpu").hosts
    assert inv.group("slurm_controller") == spec.group("ctl").hosts
    for h in spec.group("gpu").hosts:
        host = inv.hosts[h]
        assert host.vars["gpucluster_leaf"] == plan.unit_of_host[h].name
        assert host.vars["gpucluster_cluster"] == spec.name  # all-vars reach every host
        assert "slurm_compute" in host.groups and "nodegroup_gpu" in host.groups
        ssh = host.ssh()
        assert ssh["host"] == "127.0.0.1" and ssh["user"] == "root"
        assert "StrictHostKeyChecking=yes" in ssh["extra_args"]  # strict host keys are kept


@pytest.mark.parametrize(("limit", "want"), [
    (None, None),
    ("slurm_compute", ["gpu01", "gpu02", "gpu03", "gpu04"]),
    ("gpu02", ["gpu02"]),
    ("gpu0*", ["gpu01", "gpu02", "gpu03", "gpu04"]),
    ("slurm_compute:!gpu03", ["gpu01", "gpu02", "gpu04"]),
    ("slurm_compute,ctl01", ["gpu01", "gpu02", "gpu03", "gpu04", "ctl01"]),
    ("flash_client:&nodegroup_gpu", ["gpu01", "gpu02", "gpu03", "gpu04"]),
    ("!slurm_compute", ["ctl01", "flash01", "nfs01"]),
])
def test_limit_patterns(staging_inventory, limit, want):
    inv = load_inventory(staging_inventory)
    got = inv.select(limit)
    assert got == (list(inv.hosts) if want is None else [h for h in inv.hosts if h in want] if limit and
                   limit.startswith("!") else want)


def test_limit_matching_nothing_names_the_groups(staging_inventory):
    with pytest.raises(UsageError, match=r"matches no host or group.*slurm_compute"):
        load_inventory(staging_inventory).select("nosuchgroup")


def test_missing_inventory_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"no hosts\.yml"):
        load_inventory(tmp_path)


# ------------------------------------------------------------------ expectations


def test_expectations_come_from_plan_and_renderer(doc):
    loaded, plan = loaded_example("staging")
    spec = loaded.spec
    rendered = render_all(cluster_example("staging"), cabling=False)
    for name in ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf"):
        assert doc["slurm"]["files"][name]["sha256"] == hashlib.sha256(rendered[name].encode()).hexdigest()
    # topology: every plan switch, with its nodes expanded
    assert [s["name"] for s in doc["slurm"]["switches"]] == [s.name for s in slurm_switches(plan)]
    for sw, want in zip(doc["slurm"]["switches"], slurm_switches(plan), strict=True):
        assert sw["level"] == want.level
        assert sw["nodes"] == sorted(n for e in want.nodes for n in hostlist.expand_hostlist(e))
    g = spec.group("gpu")
    gpu = spec.parts.gpus[g.gpu]
    for h in g.hosts:
        assert doc["slurm"]["nodes"][h]["gres"] == f"gpu:{gpu.slurm_type}:{g.gpus_per_node}"
        assert doc["hosts"][h]["gpu"]["count"] == g.gpus_per_node
        assert doc["hosts"][h]["hcas"] == plan.hcas(g)
    conf_name, _ = nccl_file_for(cluster_example("staging"), g)
    assert doc["nccl"]["gpu"]["conf"]["sha256"] == hashlib.sha256(rendered[conf_name].encode()).hexdigest()
    assert doc["flash"]["mount"] == spec.storage.flash.mount
    assert doc["nfs"][0]["exports"][0]["options"] == spec.storage.nfs[0].exports[0].options
    assert doc["fabric"]["roce"]["pfc_priority"] == spec.fabric.roce.pfc_priority


def test_expectations_carry_the_munge_key_hash_never_the_key(staging_inventory, doc):
    inv = load_inventory(staging_inventory)
    key = (Path(inv.vars["gpucluster_secrets_dir"]) / "munge.key").read_bytes()
    assert doc["munge"]["key_sha256"] == hashlib.sha256(key).hexdigest()
    text = json.dumps(doc)
    assert key.hex() not in text and key[:64].decode("latin-1") not in text


def test_staging_profile_differences_are_listed(doc):
    diffs = {d["key"]: d for d in doc["slurm"]["profile_differences"]}
    assert diffs["ProctrackType"] == {"key": "ProctrackType", "production": "proctrack/cgroup",
                                      "rendered": "proctrack/linuxproc"}
    assert diffs["TaskPlugin"]["production"] == "task/cgroup,task/affinity"


def test_production_profile_has_no_differences():
    assert profile_differences(cluster_example("meta-24k-roce")) == []


def test_pins_and_sysctls_come_from_role_defaults(doc):
    roles = Path(__file__).resolve().parent.parent / "roles"
    if not (roles / "slurm_common" / "defaults" / "main.yml").exists():
        pytest.skip("roles/ not in this checkout")
    # the default is the node's Debian release's (vars/Debian-<major>.yml): one pin per release
    slurm = {path.stem.removeprefix("Debian-"): yaml.safe_load(path.read_text())["__slurm_common_default_version"]
             for path in (roles / "slurm_common" / "vars").glob("Debian-*.yml")}
    common = yaml.safe_load((roles / "common" / "defaults" / "main.yml").read_text())["common_sysctls"]
    assert set(slurm) >= {"12", "13"}
    assert doc["packages"]["slurm_compute"]["slurmd"] == slurm
    assert doc["sysctls"]["all"] == {k: str(v) for k, v in common.items()}


def test_inventory_overrides_a_pin(staging_inventory):
    inv = load_inventory(staging_inventory)
    inv.vars["munge_version"] = "9.9-override"
    d = expect.build(inv, expect.Options(thresholds=load_thresholds(None)))
    assert d["packages"]["slurm_compute"]["munge"] == "9.9-override"


# ------------------------------------------------------------------ parametrization


def _collect(doc: dict, tmp_path: Path, *args: str) -> list[str]:
    p = tmp_path / "exp.json"
    p.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-m", "pytest", str(CHECKS_DIR), "-c", str(CHECKS_DIR / "pytest.ini"),
                          f"--rootdir={CHECKS_DIR}", f"--gpc-expect={p}", "--collect-only", "-q", "-p", "no:xdist",
                          *args], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_one_test_per_item_grouped_by_inventory_group(doc, tmp_path):
    ids = _collect(doc, tmp_path)
    assert "test_slurm.py::test_node_gres[slurm_compute:gpu02]" in ids
    assert "test_common.py::test_service_active[slurm_compute:gpu02:slurmd]" in ids
    assert "test_common.py::test_service_active[slurm_controller:ctl01:slurmctld]" in ids
    assert "test_common.py::test_service_active[slurm_dbd:ctl01:slurmdbd]" in ids
    assert "test_security.py::test_slurmdbd_password_file_private[slurm_dbd:ctl01]" in ids
    # topology: one test per plan switch
    _loaded, plan = loaded_example("staging")
    for sw in slurm_switches(plan):
        assert f"test_slurm.py::test_topology_switch[slurm_controller:ctl01:{sw.name}]" in ids
    # config files: one per (Slurm host, file)
    for host in ("ctl01", "gpu01"):
        assert any(i.endswith(f":{host}:slurm.conf]") for i in ids)
    assert not any(":flash01:slurm.conf]" in i for i in ids)  # storage nodes carry no Slurm config
    # NCCL all_reduce: once per node group, on its first node
    assert [i for i in ids if "test_nccl_all_reduce_busbw" in i] == [
        "test_hardware.py::test_nccl_all_reduce_busbw[gpu_nvidia:gpu01:all_reduce]"]
    # every id names group and host
    assert all(lib.Target is not None and "[" in i and ":" in i.split("[")[1] for i in ids)


def test_hosts_option_limits_collection(doc, tmp_path):
    ids = _collect(doc, tmp_path, "--gpc-hosts=gpu03")
    assert ids and all(":gpu03" in i for i in ids)
    assert "test_hardware.py::test_nccl_all_reduce_busbw[gpu_nvidia:gpu03:all_reduce]" in ids


def test_local_mode_collects_only_this_node(doc, tmp_path):
    ids = _collect(doc, tmp_path, "--gpc-mode=local", "--gpc-me=gpu02", "--gpc-hosts=gpu02",
                   "--gpc-peers=gpu01,gpu02,gpu03,gpu04")
    assert ids and all(":gpu02" in i for i in ids)
    assert not any("test_nccl_all_reduce_busbw" in i for i in ids)  # gpu01 runs it for the group


def test_pytest_command_uses_xdist_by_host_only_when_parallel(tmp_path):
    one = pytest_command(tmp_path / "e.json", ["a", "b"], 1, tmp_path / "j.xml", "/tmp/x")
    four = pytest_command(tmp_path / "e.json", ["a", "b"], 4, tmp_path / "j.xml", "/tmp/x")
    assert "no:xdist" in one and "-n" not in one
    assert four[four.index("-n") + 1] == "4" and four[four.index("--dist") + 1] == "loadscope"
    assert default_workers(1) == 1 and 1 <= default_workers(100) <= 32


# ------------------------------------------------------------------ helpers that run on nodes


@pytest.mark.parametrize("expr", ["gpu[01-04]", "gpu01", "gpu[01-02,07],ctl01", "r[1-2]n[01-03]",
                                  "leaf[00001-00002]", "a[8-11]"])
def test_hostlist_expansion_matches_python_hostlist(expr):
    assert lib.expand_hostlist(expr) == hostlist.expand_hostlist(expr)


def test_host_facts_parsing():
    text = ("@@units\nId=ssh.service\nActiveState=active\nSubState=running\nUnitFileState=enabled\n"
            "LoadState=loaded\n\nId=slurmd.service\nActiveState=inactive\nSubState=dead\n"
            "UnitFileState=enabled\nLoadState=loaded\n"
            "@@packages\nmunge ii  0.5.15-2+deb12u1\nslurmd rc  22.05.8-4+deb12u3\n"
            "@@sysctls\nfs.file-max\tro\t2466170 \nnet.core.somaxconn\trw\t4096 \n"
            "net.core.netdev_max_backlog\tmissing\t\n"
            "@@sysctl_file\n# Managed by Ansible\nfs.file-max = 1048576\n@@container\npodman\n@@release\n13\n")
    f = lib.parse_facts(text)
    assert f["units"]["ssh"]["ActiveState"] == "active" and f["units"]["slurmd"]["SubState"] == "dead"
    assert f["packages"] == {"munge": "0.5.15-2+deb12u1"}  # 'rc' (removed, config left) is not installed
    assert f["sysctls"]["fs.file-max"] == {"access": "ro", "value": "2466170"}
    assert f["sysctls"]["net.core.netdev_max_backlog"]["access"] == "missing"
    assert f["sysctl_file"] == {"fs.file-max": "1048576"} and f["container"] == "podman"
    assert f["release"] == "13"  # the Debian major a per-release pin is chosen by
    assert lib.parse_facts("@@container\nnone\n")["container"] is None


def test_workers_are_scoped_by_host():
    assert lib.host_of_nodeid("test_common.py::test_service_active[slurm_compute:gpu02:slurmd]") == "gpu02"
    assert lib.host_of_nodeid("test_slurm.py::test_node_gres[slurm_compute:gpu0001]") == "gpu0001"
    assert lib.host_of_nodeid("test_x.py::test_plain") is None


def test_scontrol_records_and_states():
    text = ("NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 Gres=gpu:h100:4(S:0) State=IDLE ThreadsPerCore=1\n"
            "NodeName=gpu02 Arch=x86_64 Gres=gpu:h100:4 State=DOWN* "
            "Reason=Not responding [slurm@2026-01-01T00:00:00]\n")
    recs = {r["NodeName"]: r for r in lib.parse_scontrol_records(text)}
    assert lib.parse_gres(recs["gpu01"]["Gres"]) == ["gpu:h100:4"]
    assert recs["gpu02"]["Reason"].startswith("Not responding")
    assert lib.node_state_ok("IDLE")[0] and lib.node_state_ok("ALLOCATED")[0] and lib.node_state_ok("MIXED")[0]
    for bad in ("DOWN*", "IDLE*", "IDLE+DRAIN", "DOWN", "ALLOCATED+DRAIN", "UNKNOWN*", "IDLE+NOT_RESPONDING"):
        assert not lib.node_state_ok(bad)[0], bad
    topo = ("SwitchName=leaf00001 Level=0 LinkSpeed=1 Nodes=gpu[01-02]\n"
            "SwitchName=spine Level=1 LinkSpeed=1 Switches=leaf[00001-00002]\n")
    sw = {r["SwitchName"]: r for r in lib.parse_scontrol_records(topo)}
    assert lib.expand_hostlist(sw["spine"]["Switches"]) == ["leaf00001", "leaf00002"]
    conf = lib.parse_show_config("ProctrackType           = proctrack/linuxproc\nPrologFlags             = (null)\n")
    assert conf == {"ProctrackType": "proctrack/linuxproc"}


def test_ssh_options_from_the_inventory_keep_host_key_checking():
    opts = lib._ssh_options("-o UserKnownHostsFile=/s/known_hosts -o StrictHostKeyChecking=yes "
                            "-o ControlMaster=auto -oControlPersist=60s")
    assert opts == {"userknownhostsfile": "/s/known_hosts", "stricthostkeychecking": "yes",
                    "controlmaster": "auto", "controlpersist": "60s"}
    assert lib._paramiko_ok({"extra_args": "-o StrictHostKeyChecking=yes"})
    assert not lib._paramiko_ok({"extra_args": "-o ProxyJump=bastion"})  # OpenSSH handles those


def test_busbw_parsing():
    out = ("#       size         count      type   redop    root     time   algbw   busbw #wrong ...\n"
           "  8589934592    2147483648     float     sum      -1    37012  232.08  406.14      0 ...\n"
           "# Avg bus bandwidth    : 406.14\n")
    assert lib.max_busbw(out) == pytest.approx(406.14)
    assert lib.parse_busbw(out) == pytest.approx(406.14)


# ------------------------------------------------------------------ GPU checks against fake vendor tools

_FAKE_SMI = """#!/bin/sh
# nvidia-smi --query-gpu=index,name,ecc.mode.current,persistence_mode --format=csv,noheader
i=0
while [ $i -lt 8 ]; do
  ecc=Enabled; [ "$i" = "$BAD_ECC_GPU" ] && ecc=Disabled
  echo "$i, NVIDIA H100 80GB HBM3, $ecc, Enabled"
  i=$((i+1))
done
"""

_FAKE_ALL_REDUCE = """#!/bin/sh
echo "#       size         count      type   redop    root     time   algbw   busbw #wrong"
echo "  8589934592    2147483648     float     sum      -1    37012  $ALGBW  $BUSBW      0"
echo "# Avg bus bandwidth    : $BUSBW"
"""


def _gpu_run(doc: dict, tmp_path: Path, busbw: str, bad_ecc: str = "") -> dict[str, str]:
    """The GPU checks in local mode on this machine, with nvidia-smi and all_reduce_perf faked on PATH
    (this machine has no /dev/nvidia0, so no stand-in is detected and the vendor tool is asked)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("nvidia-smi", _FAKE_SMI), ("all_reduce_perf", _FAKE_ALL_REDUCE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    gpu = {**doc["hosts"]["gpu01"]["gpu"], "count": 8,
           "threshold": {"gpu": "h100-sxm5-80g", "fabric": "*", "gpus": 8, "busbw": 460.0}}
    doc = {**doc, "hosts": {**doc["hosts"], "thisnode": {"groups": ["gpu_nvidia"], "node_group": "gpu",
                                                         "hcas": [], "gpu": gpu}},
           "nccl_test": {"bytes": "8G", "binary": "all_reduce_perf"}}
    exp = tmp_path / "exp.json"
    exp.write_text(json.dumps(doc))
    junit = tmp_path / f"gpu-{busbw}-{bad_ecc}.xml"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BUSBW": busbw, "ALGBW": "250.00",
           "BAD_ECC_GPU": bad_ecc}
    subprocess.run([sys.executable, "-m", "pytest", str(CHECKS_DIR), "-c", str(CHECKS_DIR / "pytest.ini"),
                    f"--rootdir={CHECKS_DIR}", f"--gpc-expect={exp}", "--gpc-mode=local", "--gpc-me=thisnode",
                    "--gpc-hosts=thisnode", "--gpc-peers=thisnode", f"--junitxml={junit}", "-p", "no:xdist",
                    "-k", "test_gpu_ or test_nccl_all_reduce"], capture_output=True, env=env, check=False,
                   cwd=tmp_path, timeout=300)
    return {r.name: r.outcome for r in report.parse_junit(junit)}


def test_gpu_checks_read_the_vendor_tool_and_can_fail(doc, tmp_path):
    if Path("/dev/nvidia0").exists():
        pytest.skip("this machine has /dev/nvidia0: the fake nvidia-smi would not be the only GPU source")
    good = _gpu_run(doc, tmp_path, busbw="471.20")
    assert good["test_gpu_count_and_model"] == "passed"
    assert good["test_nccl_all_reduce_busbw[all_reduce]"] == "passed"
    assert {good[f"test_gpu_ecc_enabled[gpu{i}]"] for i in range(8)} == {"passed"}
    assert {good[f"test_gpu_persistence_mode[gpu{i}]"] for i in range(8)} == {"passed"}
    bad = _gpu_run(doc, tmp_path, busbw="301.50", bad_ecc="5")
    assert bad["test_nccl_all_reduce_busbw[all_reduce]"] == "failed"  # 301.5 < 460 GB/s
    assert bad["test_gpu_ecc_enabled[gpu5]"] == "failed"
    assert bad["test_gpu_ecc_enabled[gpu4]"] == "passed"


def test_unreachable_host_fails_each_check_at_once_naming_it(doc, tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    doc["hosts"]["gpu02"]["ssh"].update(host="127.0.0.1", port=port)
    exp = tmp_path / "exp.json"
    exp.write_text(json.dumps(doc))
    junit = tmp_path / "u.xml"
    subprocess.run([sys.executable, "-m", "pytest", str(CHECKS_DIR), "-c", str(CHECKS_DIR / "pytest.ini"),
                    f"--rootdir={CHECKS_DIR}", f"--gpc-expect={exp}", "--gpc-hosts=gpu02", f"--junitxml={junit}",
                    "-p", "no:xdist", "-k", "test_time_sync or test_munge_key_mode or test_service_active"],
                   capture_output=True, check=False, cwd=tmp_path, timeout=300)
    results = report.parse_junit(junit)
    assert len(results) >= 4
    for r in results:
        assert r.outcome == "failed", (r.name, r.message)
        assert r.message.startswith("gpu02: unreachable after 3 attempt(s) ("), (r.name, r.message)


# ------------------------------------------------------------------ thresholds


def test_threshold_table_defaults_and_override(tmp_path):
    table = load_thresholds(None)
    assert threshold_for(table, "h100-sxm5-80g", "infiniband", 8).busbw == 460
    assert threshold_for(table, "h200-sxm-141g", "roce", 8).busbw == 431
    assert threshold_for(table, "mi300x", "roce", 8).busbw == 314
    assert threshold_for(table, "h100-sxm5-80g", "roce", 4) is None
    f = tmp_path / "t.yaml"
    f.write_text("nccl_busbw_gbps:\n  - {gpu: h100-sxm5-80g, fabric: roce, gpus: 8, busbw: 400}\n"
                 "  - {gpu: h100-sxm5-80g, gpus: 4, busbw: 200}\n")
    table = load_thresholds(f)
    assert threshold_for(table, "h100-sxm5-80g", "roce", 8).busbw == 400  # exact fabric beats '*'
    assert threshold_for(table, "h100-sxm5-80g", "infiniband", 8).busbw == 460
    assert threshold_for(table, "h100-sxm5-80g", "infiniband", 4).busbw == 200
    assert len(DEFAULTS) == 3


@pytest.mark.parametrize("text", ["nope: 1\n", "nccl_busbw_gbps:\n  - {gpu: x}\n",
                                  "nccl_busbw_gbps:\n  - {gpu: x, gpus: 8, busbw: 1, fabric: ethernet}\n"])
def test_bad_threshold_file_is_a_usage_error(tmp_path, text):
    f = tmp_path / "t.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match="nccl_busbw_gbps"):
        load_thresholds(f)


# ------------------------------------------------------------------ reports


_FAKE_SUITE = '''
import pytest

@pytest.mark.parametrize("t", ["slurm_compute:gpu01:slurmd", "slurm_compute:gpu02:slurmd"])
def test_service_active(t):
    if "gpu02" in t:
        pytest.fail("gpu02: service slurmd is inactive, expected active\\nlast 25 journal lines of slurmd: ...",
                    pytrace=False)

@pytest.mark.parametrize("t", ["gpu_nvidia:gpu01", "gpu_nvidia:gpu02"])
def test_gpu_count_and_model(t):
    pytest.skip(t.split(":")[1] + ": no GPU: /dev/nvidia0 is a stand-in")

@pytest.mark.parametrize("t", ["slurm_controller:ctl01:ProctrackType"])
def test_production_profile(t):
    pytest.xfail("staging profile: ProctrackType=proctrack/linuxproc, production has proctrack/cgroup")

@pytest.mark.parametrize("t", ["all:ctl01:ssh", "all:flash01:ssh"])
def test_ssh(t):
    pass
'''


@pytest.fixture(scope="module")
def junit(tmp_path_factory) -> Path:
    tmp_path = tmp_path_factory.mktemp("junit")
    (tmp_path / "test_fake.py").write_text(_FAKE_SUITE)
    out = tmp_path / "fake.xml"
    subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "test_fake.py"), f"--junitxml={out}", "-q",
                    "-p", "no:cacheprovider", "-p", "no:xdist", f"--rootdir={tmp_path}", "-c", os.devnull],
                   capture_output=True, check=False, cwd=tmp_path)
    return out


def test_junit_parsed_into_group_host_outcome(junit):
    results = report.parse_junit(junit, "ssh")
    by = {(r.test, r.host): r for r in results}
    assert by[("test_service_active", "gpu02")].outcome == "failed"
    assert by[("test_service_active", "gpu02")].group == "slurm_compute"
    assert "journal" in by[("test_service_active", "gpu02")].message
    assert by[("test_gpu_count_and_model", "gpu01")].outcome == "skipped"
    assert by[("test_production_profile", "ctl01")].outcome == "differs"
    assert by[("test_ssh", "flash01")].outcome == "passed"


def test_summary_puts_failing_hosts_first_and_lists_skip_reasons(junit):
    rep = report.Report(results=report.parse_junit(junit), seconds=1.5, title="gpucluster validate staging")
    text = report.summary_text(rep)
    lines = text.splitlines()
    assert lines[0].startswith("gpucluster validate staging: 7 checks on 4 hosts")
    assert "FAILING HOSTS (1):" in text and "  gpu02: 1 failed" in text
    assert text.index("gpu02: 1 failed") < text.index("group")
    # one skip reason covering both hosts, with the host name taken out
    assert "2 x no GPU: /dev/nvidia0 is a stand-in  (gpu01, gpu02)" in text
    assert "differs from production" in text and "ProctrackType=proctrack/linuxproc" in text
    assert lines[-1].startswith("FAILED: 1 failed check(s) on 1 host(s)")
    assert len(lines) < 40  # one screen


def test_summary_of_a_fleet_stays_on_one_screen():
    bad = [report.Result("test_slurmd_answers", "slurm_compute", f"gpu{i:04d}", None, "failed",
                         f"gpu{i:04d}: slurmd does not answer") for i in range(1, 301)]
    good = [report.Result("test_service_active", "all", f"gpu{i:04d}", "ssh", "passed") for i in range(1, 1001)]
    text = report.summary_text(report.Report(results=bad + good, seconds=9.0, title="fleet"))
    assert len(text.splitlines()) < 40
    assert "292 more failing hosts: gpu[0009-0300]" in text
    assert "test_slurmd_answers: 300 host(s) gpu[0001-0300]" in text


def test_html_report_is_self_contained_and_escaped(junit):
    results = report.parse_junit(junit)
    results[0].message = "<script>alert(1)</script>"
    rep = report.Report(results=results, seconds=1.0, title="t")
    html = report.render_html(rep).lower()
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "http://" not in html and "https://" not in html  # nothing fetched from elsewhere
    assert html.index('id="host-gpu02"') < html.index('id="host-ctl01"')  # failing hosts first


def test_long_failure_messages_are_kept_whole():
    cut = "gpu02: service slurmd is inactive\nline 2\n[+4 more lines; full report in element text]"
    whole = "gpu02: service slurmd is inactive\nline 2\nline 3\nline 4\nline 5\nline 6"
    assert report._failure_text(cut, whole) == whole
    assert report._failure_text("AssertionError: gpu02: x\nassert 1 == 2", "") == "gpu02: x"


def test_multi_line_assertion_messages_come_back_whole(tmp_path):
    (tmp_path / "test_long.py").write_text(
        "def test_slurmd_answers():\n"
        "    assert 1 == 0, 'gpu02: slurmd does not answer\\n' + '\\n'.join(f'journal {i}' for i in range(30))\n")
    out = tmp_path / "long.xml"
    subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "test_long.py"), f"--junitxml={out}", "-q",
                    "--tb=short", "-p", "no:cacheprovider", "-p", "no:xdist", f"--rootdir={tmp_path}", "-c",
                    os.devnull], capture_output=True, check=False, cwd=tmp_path)
    (r,) = report.parse_junit(out)
    assert r.message.startswith("gpu02: slurmd does not answer\njournal 0\n"), r.message
    assert r.message.rstrip().endswith("journal 29"), r.message


def test_merge_junit_sums_suites(junit, tmp_path):
    out = report.merge_junit([(junit, "ssh"), (junit, "slurm:gpu01")], tmp_path / "merged.xml")
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites" and int(root.get("tests")) == 14 and int(root.get("failures")) == 2
    assert [s.get("name") for s in root.iter("testsuite")] == ["ssh", "slurm:gpu01"]
    merged = report.parse_junit(out)
    assert len(merged) == 14 and {r.source for r in merged} == {"ssh", "slurm:gpu01"}  # where each ran


def test_missing_node_result_becomes_a_failure_naming_the_host(tmp_path):
    p = tmp_path / "gpu03.xml"
    viaslurm._missing_result(p, "gpu03", "no result from the Slurm job(s) 12")
    (r,) = report.parse_junit(p)
    assert (r.host, r.outcome) == ("gpu03", "failed") and "gpu03" in r.message


# ------------------------------------------------------------------ --via-slurm pieces


def test_slurm_time_and_states():
    assert viaslurm._seconds("20:00") == 1200 and viaslurm._seconds("1-00:00:00") == 86400
    assert viaslurm._seconds("5") == 300
    assert viaslurm.usable("idle") and viaslurm.usable("mix") and viaslurm.usable("alloc")
    assert not viaslurm.usable("down*") and not viaslurm.usable("drain") and not viaslurm.usable("idle*")


def test_bundle_has_the_suite_and_no_connection_details(doc):
    data = viaslurm.bundle_bytes(doc)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        shipped = json.loads(tar.extractfile("expectations.json").read())
    assert "checks/conftest.py" in names and "checks/gpc_node.py" in names and "checks/pytest.ini" in names
    assert any(n.startswith("site/_pytest/") for n in names) and any(n.startswith("site/testinfra/") for n in names)
    assert not any("__pycache__" in n for n in names)
    assert all("ssh" not in h for h in shipped["hosts"].values())
    assert len(data) < 8 * 1024 * 1024


def test_bundle_runs_with_the_system_python(doc, tmp_path):
    """What a node does in the Slurm job: plain python3 (no venv), the bundle's own pytest + testinfra,
    the local backend. Here this machine plays a node in no group but 'all'."""
    py = shutil.which("python3", path="/usr/bin")
    if not py:
        skip_or_fail("no /usr/bin/python3 on this machine (the nodes' interpreter)")
    doc = {**doc, "hosts": {**doc["hosts"], "thisnode": {"groups": [], "node_group": None, "hcas": []}},
           "selected": ["thisnode"]}
    with tarfile.open(fileobj=io.BytesIO(viaslurm.bundle_bytes(doc))) as tar:
        tar.extractall(tmp_path / "b", filter="data")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURMD_NODENAME": "thisnode"}
    out = subprocess.run([py, "-I", "-S", str(tmp_path / "b/checks/gpc_node.py"), str(tmp_path / "b"), "thisnode",
                          "-k", "test_time_sync"], capture_output=True, text=True, env=env, check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    (r,) = report.parse_junit(tmp_path / "b/results/thisnode.xml")
    assert (r.test, r.host, r.group) == ("test_time_sync", "thisnode", "all")
    assert r.outcome in ("passed", "skipped", "failed")  # it ran; the verdict depends on this machine's clock
    assert not list((tmp_path / "b").rglob("__pycache__"))  # nothing written into the shared tier but results


# ------------------------------------------------------------------ CLI


def test_cli_usage_errors_exit_2(tmp_path, staging_inventory, capsys):
    from gpucluster.cli import main

    assert main(["validate", str(tmp_path / "nope")]) == 2
    assert "no such inventory" in capsys.readouterr().err
    assert main(["validate", str(staging_inventory), "--limit", "nosuch"]) == 2
    assert "matches no host or group" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["validate", str(staging_inventory), "-n", "0"])


def test_the_live_counter_reads_what_the_checks_report(tmp_path):
    """The checks' controller process appends one line per finished check; validate counts them live."""
    from gpucluster.validate.suite import counts_of

    f = tmp_path / "progress"
    f.write_text("passed a::x[gpu01]\nfailed a::y[gpu02]\nskipped a::z[gpu01]\npassed b::x[gpu02]\n")
    assert counts_of(f) == {"passed": 2, "failed": 1, "skipped": 1}
    assert counts_of(tmp_path / "none") == {"passed": 0, "failed": 0, "skipped": 0}
