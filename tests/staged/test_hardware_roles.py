"""Hardware roles on staged nodes: nvidia_gpu, amd_gpu, rdma, nccl (playbooks/hardware.yml).

Staged nodes have no GPU and no HCA: their /dev/nvidiaN are /dev/null stand-ins. The roles must find
that out themselves (PCI bus, /sys/class/infiniband), skip what needs hardware and say why, and still
install the configuration files that do not: /etc/nccl.conf (byte-identical to `gpucluster render`),
the NCCL env script and the RoCE settings. On a node with the hardware the same tests expect the
hardware path instead (driver loaded, no skip record).

The cluster is conftest's staged_cluster, through test_storage.converged_cluster (once per session).
"""

from __future__ import annotations

import base64
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_storage import (
    REPO,
    SKIP_DIR,
    SPEC,
    Converged,
    assert_second_run_changes_nothing,
    converged_cluster,
    expected_groups,
    filters,
    state_of,
)

GPU_NVIDIA = expected_groups()["gpu_nvidia"]
GPU_AMD = expected_groups()["gpu_amd"]
FABRIC = expected_groups()["fabric_roce"] + expected_groups()["fabric_ib"]
SCRIPT = REPO / "src/gpucluster/node/roceqos.py"  # installed as gpucluster-roce-qos by the rdma role


def stack_filters():
    """The driver-stack filter plugin the GPU roles call (spec + version lock -> what each group installs)."""
    path = REPO / "plugins/filter/gpucluster_stacks.py"
    spec = importlib.util.spec_from_file_location("gpucluster_stacks_filter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def group_of(node: str) -> str:
    return next(g.removeprefix("nodegroup_") for g, hosts in expected_groups().items()
                if g.startswith("nodegroup_") and node in hosts)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Converged:
    return converged_cluster(request)


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `gpucluster render` writes for the staging spec (the real CLI, in a fresh process)."""
    out = tmp_path_factory.mktemp("rendered")
    subprocess.run([sys.executable, "-m", "gpucluster.cli", "render", str(SPEC), "-o", str(out), "--no-cabling"],
                   check=True, capture_output=True, text=True, cwd=REPO)
    return out


def pci_has(host, vendor: str, classes: tuple[str, ...]) -> bool:
    """The roles' own test, run independently: a PCI function of that vendor with a GPU class."""
    script = ("for d in /sys/bus/pci/devices/*; do [ -r $d/vendor ] || continue; "
              'echo "$(cat $d/vendor) $(cat $d/class)"; done')
    for line in host.check_output(script).splitlines():
        vendor_id, _, cls = line.partition(" ")
        if vendor_id == vendor and cls.startswith(classes):
            return True
    return False


def has_hca(host) -> bool:
    return host.run("ls -A /sys/class/infiniband 2>/dev/null").stdout.strip() != ""


# ---------------------------------------------------------------- GPU drivers


# vendor -> (skip record, PCI vendor, GPU classes, package only a GPU node gets, tool that sees the GPUs)
VENDORS = {
    "nvidia": ("nvidia_gpu", "0x10de", ("0x0300", "0x0302"), "nvidia-driver", "nvidia-smi -L"),
    "amd": ("amd_gpu", "0x1002", ("0x0300", "0x0302", "0x0380", "0x1200"), "rocm-smi", "rocm-smi --showproductname"),
}
GPU_NODES = [(n, "nvidia") for n in GPU_NVIDIA] + [(n, "amd") for n in GPU_AMD]


@pytest.mark.staged
@pytest.mark.parametrize(("node", "vendor"), GPU_NODES, ids=[f"{n}-{v}" for n, v in GPU_NODES])
def test_gpu_driver_only_with_a_gpu(cluster: Converged, node: str, vendor: str) -> None:
    role, pci_vendor, classes, package, tool = VENDORS[vendor]
    host = cluster.host(node)
    record = host.file(f"{SKIP_DIR}/{role}")
    if pci_has(host, pci_vendor, classes):
        assert not record.exists
        assert host.run(tool).rc == 0, f"{node}: {tool}"
        return
    assert record.exists, f"{node}: no record of why the {role} driver steps were skipped"
    assert record.content_string.startswith(f"no {vendor.upper()} GPU on {node} (PCI scan"), record.content_string
    assert not host.package(package).is_installed, f"{package} was installed without a GPU"
    run = cluster.rerun("hardware.yml")
    assert f"no {vendor.upper()} GPU on {node} (PCI scan" in run.output, f"the run does not say so ({run.where})"


@pytest.mark.staged
@pytest.mark.parametrize("node", GPU_NVIDIA)
def test_stand_in_device_files_did_not_count(cluster: Converged, node: str) -> None:
    """Staged GPU nodes carry /dev/nvidiaN (/dev/null, character device 1:3): present, yet the driver steps
    were skipped, and the role says, from the device numbers (not from a flag), that they are stand-ins."""
    host = cluster.host(node)
    if pci_has(host, "0x10de", ("0x0300", "0x0302")):
        return  # a real GPU: test_gpu_driver_only_with_a_gpu covers it
    assert host.file("/dev/nvidia0").exists
    assert host.check_output("stat -c %t:%T /dev/nvidia0") == "1:3"
    record = host.file(f"{SKIP_DIR}/nvidia_gpu").content_string
    assert "/dev/nvidia0" in record and "are stand-ins (character device 1:3" in record, record


@pytest.mark.staged
@pytest.mark.parametrize("node", GPU_NVIDIA)
def test_nvidia_driver_stack_is_pinned_as_the_lock_says(cluster: Converged, node: str) -> None:
    """The pins file holds every package of the group's stack at the version lock's version (written also
    where the driver itself waits for a GPU), and nothing was installed from NVIDIA's repository."""
    stack = stack_filters().driver_stack(state_of(SPEC), group_of(node))
    prefs = cluster.host(node).file("/etc/apt/preferences.d/gpucluster-nvidia").content_string
    for part in ("driver", "fabric_manager", "dcgm"):
        pin = stack["pins"].get(part)
        if pin is None:
            continue
        assert f"\nPackage: {' '.join(pin['packages'])}\nPin: version {pin['version']}\nPin-Priority: 1001\n" in prefs
    assert re.search(r"^Package: .*\bnvidia-driver\b", prefs, re.M)
    host = cluster.host(node)
    if not pci_has(host, "0x10de", ("0x0300", "0x0302")):
        assert not host.file("/etc/apt/sources.list.d/gpucluster-nvidia.sources").exists


# ---------------------------------------------------------------- RDMA


def roce_expected() -> dict[str, str]:
    roce = filters().fabric_facts(state_of(SPEC))["roce"]
    return {"ROCE_DSCP": str(roce["dscp"]), "ROCE_TOS": str(roce["dscp"] * 4),
            "ROCE_PFC_PRIORITY": str(roce["pfc_priority"]), "ROCE_CNP_DSCP": str(roce["cnp_dscp"]),
            "ROCE_CNP_PRIORITY": str(roce["cnp_priority"]), "ROCE_ECN": "1" if roce["ecn"] else "0",
            "ROCE_LINK_MTU": str(roce["link_mtu"]), "ROCE_MTU": str(roce["mtu"])}


@pytest.mark.staged
@pytest.mark.parametrize("node", FABRIC)
def test_rdma_user_space_installed(cluster: Converged, node: str) -> None:
    host = cluster.host(node)
    for pkg in ("rdma-core", "ibverbs-utils", "infiniband-diags", "perftest"):
        assert host.package(pkg).is_installed, f"{node}: {pkg}"


@pytest.mark.staged
@pytest.mark.parametrize("node", expected_groups()["fabric_roce"])
def test_roce_settings_from_the_spec(cluster: Converged, node: str) -> None:
    host = cluster.host(node)
    conf = host.file("/etc/gpucluster/roce-qos.conf").content_string
    got = dict(re.findall(r"^(ROCE_[A-Z_]+)=(.*)$", conf, re.M))
    want = roce_expected()
    assert {k: got.get(k) for k in want} == want
    record = host.file(f"{SKIP_DIR}/rdma-roce-qos")
    unit = host.service("gpucluster-roce-qos.service")
    if has_hca(host):
        assert unit.is_enabled and not record.exists
        return
    assert not unit.is_enabled, "RoCE settings enabled on a host without an HCA"
    assert record.exists and record.content_string.startswith(f"no HCA on {node} (/sys/class/infiniband")


def test_roce_script_against_a_fake_device_tree(tmp_path: Path) -> None:
    """The apply script's decisions, without an HCA: a fake sysfs tree and --check (prints, changes nothing)."""
    ib = tmp_path / "ib/mlx5_0/ports/1"
    (ib / "gid_attrs/ndevs").mkdir(parents=True)
    (ib / "link_layer").write_text("Ethernet\n")
    (ib / "gid_attrs/ndevs/0").write_text("ens1\n")
    for side in ("roce_np", "roce_rp"):
        (tmp_path / f"net/ens1/ecn/{side}/enable").mkdir(parents=True)
        (tmp_path / f"net/ens1/ecn/{side}/enable/3").write_text("0\n")
    facts = filters().fabric_facts(state_of(SPEC))
    conf = tmp_path / "roce-qos.conf"
    staged = (Path(state_of(SPEC)) / "compiled" / "rendered" / "roce-qos.conf").read_text()  # what the role copies
    conf.write_text(re.sub(r"(?m)^ROCE_DEVICES=.*$", 'ROCE_DEVICES="mlx5_0"', staged))  # the fake tree's device
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "ROCE_SYSFS": str(tmp_path / "ib"),
           "ROCE_NET_SYSFS": str(tmp_path / "net"), "ROCE_CM_CONFIGFS": str(tmp_path / "cm")}
    res = subprocess.run([sys.executable, str(SCRIPT), "--check", str(conf)], env=env, capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    roce = facts["roce"]
    assert f"+ ip link set dev ens1 mtu {roce['link_mtu']}" in res.stdout
    dcb = " ".join(f"{p}:{'on' if p == roce['pfc_priority'] else 'off'}" for p in range(8))
    assert f"prio-pfc {dcb}" in res.stdout or f"--pfc {roce['pfc_map']}" in res.stdout
    assert f"echo 1 > {tmp_path}/net/ens1/ecn/roce_np/enable/{roce['pfc_priority']}" in res.stdout
    assert (tmp_path / "net/ens1/ecn/roce_np/enable/3").read_text() == "0\n", "--check changed a setting"
    res = subprocess.run([sys.executable, str(SCRIPT), "--check", str(conf)],
                         env={**env, "ROCE_SYSFS": str(tmp_path / "none")}, capture_output=True, text=True, check=False)
    assert res.returncode == 0 and "nothing to apply" in res.stdout


# ---------------------------------------------------------------- NCCL


@pytest.mark.staged
@pytest.mark.parametrize("node", GPU_NVIDIA + GPU_AMD)
def test_nccl_conf_is_the_rendered_file(cluster: Converged, rendered: Path, node: str) -> None:
    host = cluster.host(node)
    group = next(g for g in filters().nccl_files(state_of(SPEC)) if node in expected_groups()[f"nodegroup_{g}"])
    files = filters().nccl_files(state_of(SPEC))[group]
    wanted = ((files["conf_name"], "/etc/nccl.conf"), (files["env_name"], "/etc/profile.d/gpucluster-nccl.sh"))
    for name, dest in wanted:
        want = (rendered / name).read_bytes()
        got = host.run(f"base64 -w0 {dest}").stdout
        assert base64.b64decode(got) == want, f"{node}:{dest} differs from gpucluster render's {name}"


@pytest.mark.staged
@pytest.mark.parametrize("node", GPU_NVIDIA + GPU_AMD)
def test_nccl_library_only_with_a_gpu(cluster: Converged, node: str) -> None:
    host = cluster.host(node)
    gpu = pci_has(host, "0x10de", ("0x0300", "0x0302")) or pci_has(host, "0x1002", ("0x0300", "0x0302", "0x0380"))
    for name in ("nccl-packages", "nccl-tests"):
        record = host.file(f"{SKIP_DIR}/{name}")
        if gpu:
            assert not record.exists
        else:
            assert record.exists and "PCI scan" in record.content_string, f"{node}: {name}"
    if not gpu:
        assert not host.package("libnccl2").is_installed


@pytest.mark.staged
@pytest.mark.parametrize("node", FABRIC)
def test_run_reports_no_hca(cluster: Converged, node: str) -> None:
    host = cluster.host(node)
    if has_hca(host):
        return  # a real HCA: test_roce_settings_from_the_spec checks the applied path
    run = cluster.rerun("hardware.yml")
    assert f"no HCA on {node} (/sys/class/infiniband" in run.output, f"the run does not say so ({run.where})"


@pytest.mark.staged
def test_hardware_playbook_second_run_changes_nothing(cluster: Converged) -> None:
    assert_second_run_changes_nothing(cluster, "hardware.yml")
