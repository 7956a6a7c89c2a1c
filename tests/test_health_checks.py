"""Every node check against a fake host: a /sys, /dev and mountinfo tree under GPC_HEALTH_ROOT, and fake
nvidia-smi / rocm-smi / systemctl / munge on PATH that print what the real tools print (the formats in
tests/data/health/, captured on an H100 and from Slurm). One case passes, the others each break one thing.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucluster.node import checks

DATA = Path(__file__).resolve().parent / "data" / "health"
CHECKS_PY = Path(checks.__file__)
# HGX H100 bus IDs, put into the captured line's format for an 8-GPU board.
BUS_IDS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0", "00000000:9A:00.0",
           "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]


def smi_lines(name: str, count: int) -> str:
    """The captured one-GPU line of nvidia-smi, repeated for `count` GPUs (index and bus ID changed)."""
    line = (DATA / name).read_text().splitlines()[0]
    fields = [f.strip() for f in line.split(",")]
    out = []
    for i in range(count):
        row = [str(i), *fields[1:]]
        row = [BUS_IDS[i] if f == "00000000:00:06.0" else f for f in row]
        out.append(", ".join(row))
    return "\n".join(out) + "\n"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake host: root tree and a bin folder first on PATH; returns helpers to fill them."""
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    root.mkdir()
    bin_dir.mkdir()
    monkeypatch.setenv("GPC_HEALTH_ROOT", str(root))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    class Host:
        def __init__(self) -> None:
            self.root, self.bin = root, bin_dir

        def tool(self, name: str, script: str) -> None:
            path = bin_dir / name
            path.write_text("#!/bin/sh\n" + script)
            path.chmod(0o755)

        def prints(self, name: str, text: str, rc: int = 0, when: str = "*") -> None:
            """A tool that prints `text` (for argument lists matching `when`), else fails."""
            data = bin_dir / f"{name}.{abs(hash(when))}.out"
            data.write_text(text)
            cases = getattr(self, "_cases", {})
            cases.setdefault(name, []).append(f'  {when}) cat "{data}"; exit {rc};;')
            self._cases = cases
            fallback = '\n  *) echo "unexpected: $*" >&2; exit 99;;\nesac\n'
            self.tool(name, 'case "$*" in\n' + "\n".join(cases[name]) + fallback)

        def file(self, rel: str, text: str) -> Path:
            path = root / rel.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return path

    return Host()


# ---------------------------------------------------------------- GPU count and model


def nvidia_count(count=8, model="h100"):
    return {"name": "gpu-count", "kind": "gpu-count", "vendor": "nvidia", "count": count, "model": model,
            "devices": r"/dev/nvidia\d+", "device_prefix": "nvidia", "device_first": 0, "timeout": 5}


def test_gpu_count_nvidia_all_there(host) -> None:
    host.prints("nvidia-smi", smi_lines("nvidia-smi-gpus-h100.csv", 8))
    ok, msg = checks.run_check(nvidia_count())
    assert ok, msg
    assert msg == "8 of 8 GPUs (nvidia-smi: NVIDIA H100 80GB HBM3)"


def test_gpu_count_nvidia_one_fallen_off_the_bus(host) -> None:
    host.prints("nvidia-smi", smi_lines("nvidia-smi-gpus-h100.csv", 7))
    assert checks.run_check(nvidia_count()) == (False, "7 of 8 GPUs (nvidia-smi)")


def test_gpu_count_wrong_model(host) -> None:
    host.prints("nvidia-smi", smi_lines("nvidia-smi-gpus-h100.csv", 8))
    ok, msg = checks.run_check(nvidia_count(model="h200"))
    assert not ok and msg == "GPU 0 is 'NVIDIA H100 80GB HBM3', not h200 (nvidia-smi)"


def test_gpu_count_driver_gone(host) -> None:
    host.prints("nvidia-smi", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
                "sure that the latest NVIDIA driver is installed and running.\n", rc=9)
    ok, msg = checks.run_check(nvidia_count())
    assert not ok and msg.startswith("nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate")


def _mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("creating device nodes needs CAP_MKNOD (root)")


def test_gpu_count_device_files_where_no_driver(host) -> None:
    """No nvidia-smi (staged nodes): the device files Slurm's gres.conf names are counted; 1:3 is a stand-in."""
    for i in range(4):
        _mknod(host.root / f"dev/nvidia{i}", 1, 3)
    _mknod(host.root / "dev/nvidiactl", 195, 255)  # not a GPU
    ok, msg = checks.run_check(nvidia_count(count=4))
    assert ok and msg == "4 of 4 GPUs (device files, no vendor tool; 4 stand-ins (character device 1:3), not GPUs)"
    (host.root / "dev/nvidia2").unlink()
    ok, msg = checks.run_check(nvidia_count(count=4))
    assert not ok and msg.startswith("3 of 4 GPUs (/dev/nvidia2 missing; 3 stand-ins")


def test_gpu_count_device_file_that_is_not_a_character_device(host) -> None:
    host.file("dev/nvidia0", "")  # a plain file left behind is no GPU
    assert checks.run_check(nvidia_count(count=1))[0] is False


def rocm_csv(count: int, name: str = "AMD Instinct MI250X / MI250") -> str:
    header = (DATA / "rocm-smi-productname-header.txt").read_text()
    rows = [f"card{i},{name},0x740c,Advanced Micro Devices Inc. [AMD/ATI],D65209,0x0b0c,0x01,{i + 2},"
            f"{1000 + i},gfx90a" for i in range(count)]
    banner = "=" * 28
    return (f"\n{banner} ROCm System Management Interface {banner}\n" + header + "\n".join(rows)
            + f"\n{banner} End of ROCm SMI Log {banner}\n")


def amd_count(count=8, model="mi250x"):
    return {"name": "gpu-count", "kind": "gpu-count", "vendor": "amd", "count": count, "model": model,
            "devices": r"/dev/dri/renderD\d+", "device_prefix": "renderD", "device_first": 128, "timeout": 5}


def test_gpu_count_amd_rocm_smi(host) -> None:
    host.prints("rocm-smi", rocm_csv(8))
    assert checks.run_check(amd_count())[0] is True
    host._cases = {}
    host.prints("rocm-smi", rocm_csv(7))
    assert checks.run_check(amd_count()) == (False, "7 of 8 GPUs (rocm-smi)")
    host._cases = {}
    host.prints("rocm-smi", rocm_csv(8, "AMD Instinct MI300X"))
    assert checks.run_check(amd_count())[1].startswith("GPU 0 is 'card0,AMD Instinct MI300X")


def test_gpu_count_amd_device_files_name_the_missing_one(host) -> None:
    for i in range(8):
        _mknod(host.root / f"dev/dri/renderD{128 + i}", 226, 128 + i)
    assert checks.run_check(amd_count())[0] is True
    (host.root / "dev/dri/renderD133").unlink()
    assert checks.run_check(amd_count()) == (False, "7 of 8 GPUs (/dev/dri/renderD133 missing)")


# ---------------------------------------------------------------- ECC


def ecc(vendor="nvidia"):
    return {"name": "gpu-ecc", "kind": "gpu-ecc", "vendor": vendor, "max_uncorrected": 0, "timeout": 5}


def ecc_with(field: int, value: str, gpu: int = 3) -> str:
    lines = smi_lines("nvidia-smi-ecc-h100.csv", 8).splitlines()
    row = [f.strip() for f in lines[gpu].split(",")]
    row[field] = value
    lines[gpu] = ", ".join(row)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("field", "value", "message"), [
    (2, "2", "GPU 3: 2 uncorrected ECC errors since the driver loaded"),
    (4, "Yes", "GPU 3: row remapping failed (replace the GPU)"),
    (3, "Yes", "GPU 3: row remapping pending (reset the GPU)"),
    (1, "Disabled", "GPU 3: ECC is disabled"),
])
def test_ecc_nvidia(host, field: int, value: str, message: str) -> None:
    host.prints("nvidia-smi", smi_lines("nvidia-smi-ecc-h100.csv", 8))
    assert checks.run_check(ecc()) == (True, "no uncorrected ECC errors on 8 GPUs")
    host._cases = {}
    host.prints("nvidia-smi", ecc_with(field, value))
    assert checks.run_check(ecc()) == (False, message)


def test_ecc_fails_when_nvidia_smi_lists_no_gpu(host) -> None:
    """nvidia-smi answering with no row (every GPU off the bus) is no evidence of healthy ECC."""
    host.prints("nvidia-smi", "")
    assert checks.run_check(ecc()) == (False, "nvidia-smi listed no GPU")
    host._cases = {}
    host.prints("nvidia-smi", "No devices were found\n")  # what it prints with the driver loaded and no GPU
    assert checks.run_check(ecc()) == (False, "nvidia-smi listed no GPU")


def test_ecc_not_available_is_not_an_error(host) -> None:
    host.prints("nvidia-smi", ecc_with(2, "[N/A]"))
    assert checks.run_check(ecc())[0] is True


def test_ecc_without_nvidia_smi_says_so(host) -> None:
    assert checks.run_check(ecc()) == (True, "not checked: nvidia-smi is not installed (no NVIDIA driver)")


def test_ecc_amd_ras_counters(host) -> None:
    for card in range(2):
        host.file(f"sys/class/drm/card{card}/device/ras/umc_err_count", "ue: 0\nce: 12\n")
        host.file(f"sys/class/drm/card{card}/device/ras/gfx_err_count", "ue: 0\nce: 0\n")
    assert checks.run_check(ecc("amd")) == (True, "no uncorrected ECC errors on 2 GPUs")
    host.file("sys/class/drm/card1/device/ras/umc_err_count", "ue: 3\nce: 12\n")
    assert checks.run_check(ecc("amd")) == (False, "card1: 3 uncorrected ECC errors")


# ---------------------------------------------------------------- Fabric Manager


FM = {"name": "fabric-manager", "kind": "service", "unit": "nvidia-fabricmanager.service", "timeout": 5}


def test_fabric_manager_running(host) -> None:
    host.prints("systemctl", "active\n")
    host.prints("nvidia-smi", smi_lines("nvidia-smi-fabric-h100.csv", 8))
    assert checks.run_check(FM) == (True, "nvidia-fabricmanager.service active")


def test_fabric_manager_stopped(host) -> None:
    host.prints("systemctl", "inactive\n", rc=3)
    assert checks.run_check(FM) == (False, "nvidia-fabricmanager.service is inactive")


def test_fabric_not_trained_yet(host) -> None:
    host.prints("systemctl", "active\n")
    lines = smi_lines("nvidia-smi-fabric-h100.csv", 8).replace("N/A, N/A", "In Progress, N/A", 1)
    host.prints("nvidia-smi", lines)
    assert checks.run_check(FM) == (False, "GPU 0: NVLink fabric In Progress (N/A)")


# ---------------------------------------------------------------- HCAs and link flaps


def hca(host, name: str, state: str = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)", downed: int = 0) -> None:
    base = f"sys/class/infiniband/{name}/ports/1"
    host.file(f"{base}/state", state + "\n")
    host.file(f"{base}/rate", rate + "\n")
    host.file(f"{base}/phys_state", "5: LinkUp\n")
    host.file(f"{base}/counters/link_downed", f"{downed}\n")


HCAS = {"name": "hca-ports", "kind": "hca-ports", "hcas": ["mlx5_0", "mlx5_1"], "rate_gbps": 400, "timeout": 5}


def test_hca_ports_active_at_the_planned_rate(host) -> None:
    hca(host, "mlx5_0")
    hca(host, "mlx5_1")
    assert checks.run_check(HCAS) == (True, "2 HCAs ACTIVE at 400 Gb/sec or more")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"state": "1: DOWN"}, "mlx5_1/1 is DOWN"),
    ({"state": "2: INIT"}, "mlx5_1/1 is INIT"),
    ({"rate": "200 Gb/sec (4X HDR)"}, "mlx5_1/1 at 200 Gb/sec (4X HDR), planned 400 Gb/sec"),
])
def test_hca_port_down_or_slow(host, kwargs: dict, message: str) -> None:
    hca(host, "mlx5_0")
    hca(host, "mlx5_1", **kwargs)
    assert checks.run_check(HCAS) == (False, message)


def test_hca_missing(host) -> None:
    hca(host, "mlx5_0")
    missing = "mlx5_1 missing from /sys/class/infiniband (HCA gone or driver not loaded)"
    assert checks.run_check(HCAS) == (False, missing)


def test_link_flap_counts_rises_since_the_last_run(host, tmp_path: Path) -> None:
    flap = {"name": "link-flap", "kind": "link-flap", "hcas": ["mlx5_0"], "max_increase": 0, "timeout": 5,
            "state_dir": str(tmp_path)}
    hca(host, "mlx5_0", downed=3)
    assert checks.run_check(flap) == (True, "baseline of 1 ports recorded")
    assert checks.run_check(flap) == (True, "no link went down on 1 ports since the last run")
    hca(host, "mlx5_0", downed=5)
    assert checks.run_check(flap) == (False, "mlx5_0/1: link_downed 3 -> 5 (+2 since the last run)")
    assert checks.run_check(flap)[0] is True  # stable again at 5: the next run passes


# ---------------------------------------------------------------- mounts


MOUNTINFO = (
    "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro\n"
    "98 22 0:52 / {flash} rw,nosuid,nodev,relatime shared:50 - fuse.mfs mfs#flash01:9421 rw,user_id=0\n"
)


def mount_check(path: str, fstype: str = "fuse", record: str = "") -> dict:
    return {"name": "mount-flash", "kind": "mount", "path": path, "fstype": fstype, "stat_timeout": 5,
            "timeout": 10, "skip_record": record}


def test_mount_answers(host) -> None:
    flash = host.root / "mnt/flash"
    flash.mkdir(parents=True)
    host.file("proc/self/mountinfo", MOUNTINFO.format(flash="/mnt/flash"))
    assert checks.run_check(mount_check("/mnt/flash")) == (True, "/mnt/flash (fuse.mfs) answers")
    assert checks.run_check(mount_check("/mnt/flash", "nfs")) == (False, "/mnt/flash is fuse.mfs, not nfs")


def test_mount_gone(host) -> None:
    host.file("proc/self/mountinfo", MOUNTINFO.format(flash="/mnt/other"))
    assert checks.run_check(mount_check("/mnt/flash")) == (False, "/mnt/flash not mounted")


def test_mount_skipped_by_the_role_is_reported_not_failed(host) -> None:
    """Where the kernel has no NFS client the nfs role skips the mount and records why (from the host)."""
    host.file("proc/self/mountinfo", MOUNTINFO.format(flash="/mnt/flash"))
    record = "/var/lib/gpucluster/skipped/nfs-mount-home-shared.mount"
    host.file(record, "kernel NFS mount of nfs01:/export/home on /home/shared skipped: no nfs4 in /proc/filesystems\n")
    ok, msg = checks.run_check(mount_check("/home/shared", "nfs", record))
    assert ok and msg.startswith("not mounted, as the role recorded: kernel NFS mount of nfs01")


def test_mount_that_hangs_fails_at_its_budget(host, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead server hangs stat in the kernel: the probe is given up after stat_timeout."""
    flash = host.root / "mnt/flash"
    flash.mkdir(parents=True)
    host.file("proc/self/mountinfo", MOUNTINFO.format(flash="/mnt/flash"))
    real_run = checks.run
    monkeypatch.setattr(checks, "run", lambda argv, timeout: real_run(["sleep", "30"], 0.5))
    ok, msg = checks.run_check({**mount_check("/mnt/flash"), "stat_timeout": 0.5})
    assert (ok, msg) == (False, "/mnt/flash (fuse.mfs) did not answer within 0.5s")


def test_run_kills_the_whole_group_of_an_overrunning_tool(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    with pytest.raises(checks.CheckError, match=r"sh did not answer within 0.5s"):
        checks.run(["sh", "-c", script], 0.5)
    child = int(pid_file.read_text())

    def gone() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
        except OSError:
            return True

    deadline = time.monotonic() + 30  # SIGKILL is delivered at once, but a loaded machine schedules the exit late
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(), f"the tool's child {child} outlived the kill of its group"


# ---------------------------------------------------------------- munge and disks


MUNGE = {"name": "munge", "kind": "munge", "timeout": 5}


def test_munge_round_trip(host) -> None:
    host.prints("munge", "MUNGE:AwQFAAB...:\n")
    host.prints("unmunge", "STATUS:          Success (0)\n")
    assert checks.run_check(MUNGE) == (True, "munge -n | unmunge: Success")


def test_munged_stopped(host) -> None:
    host.tool("munge", 'echo \'munge: Error: Failed to access "/run/munge/munge.socket.2": No such file or '
                       'directory\' >&2; exit 6\n')
    host.prints("unmunge", "STATUS:          Success (0)\n")
    ok, msg = checks.run_check(MUNGE)
    assert not ok and msg == ('munge -n failed: munge: Error: Failed to access "/run/munge/munge.socket.2": '
                              'No such file or directory')


def test_unmunge_rejects_the_credential(host) -> None:
    host.prints("munge", "MUNGE:AwQFAAB...:\n")
    host.tool("unmunge", "echo 'unmunge: Error: Invalid credential' >&2; exit 15\n")
    assert checks.run_check(MUNGE) == (False, "unmunge failed: unmunge: Error: Invalid credential")


def test_disk_free_space_against_the_threshold(host) -> None:
    spool = host.root / "var/lib/slurm/slurmd"
    spool.mkdir(parents=True)
    st = os.statvfs(spool)
    pct = 100.0 * st.f_bavail / st.f_blocks
    check = {"name": "disk-spool", "kind": "disk", "path": "/var/lib/slurm/slurmd", "timeout": 5}
    ok, msg = checks.run_check({**check, "min_free_pct": max(0.0, pct - 1)})
    assert ok and msg.startswith(f"/var/lib/slurm/slurmd {pct:.1f}% free (")
    ok, msg = checks.run_check({**check, "min_free_pct": min(99.9, pct + 1)})
    assert not ok and msg.endswith(f"< {min(99.9, pct + 1):g}%")


def test_disk_missing_folder(host) -> None:
    check = {"name": "disk-tmp", "kind": "disk", "path": "/tmp", "min_free_pct": 5, "timeout": 5}
    assert checks.run_check(check) == (False, "/tmp: No such file or directory")


# ---------------------------------------------------------------- the program


def test_the_program_prints_one_json_line_and_exits_1_on_failure(host, tmp_path: Path) -> None:
    host.prints("nvidia-smi", smi_lines("nvidia-smi-gpus-h100.csv", 7))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path), "checks": [nvidia_count()]}))
    res = subprocess.run([sys.executable, str(CHECKS_PY), "--config", str(config), "--check", "gpu-count"],
                         capture_output=True, text=True, env=os.environ.copy(), check=False)
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert (out["ok"], out["message"]) == (False, "7 of 8 GPUs (nvidia-smi)")
    res = subprocess.run([sys.executable, str(CHECKS_PY), "--config", str(config), "--check", "nope"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 1 and "no check named nope" in json.loads(res.stdout)["message"]
