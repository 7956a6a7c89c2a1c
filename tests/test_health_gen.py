"""The passive checks on the current generation: GPU count, model and memory of GB200/GB300 trays,
B200/B300 and MI325X/MI355X nodes, and the NVLink fabric check on NVL72 trays, against a fake host (the
`host` fixture of test_health_checks: fake nvidia-smi / rocm-smi / systemctl answering per argument list).

Fake outputs follow the tools' formats: `nvidia-smi --query-gpu=... --format=csv,noheader[,nounits]` (one
line per GPU), `rocm-smi --showmeminfo vram --csv` (device, VRAM Total Memory (B), VRAM Total Used Memory (B)).
GB200 memory: 189,471 MiB, the 186 GB the catalog takes from a published GB200-NVL72 system description."""

from __future__ import annotations

import pytest
from conftest import compiled, example_data, spec_from_data
from test_health_checks import host, rocm_csv  # noqa: F401  (host is a fixture)

from gpucluster.node import checks

NAMES = "*index,name,pci.bus_id*"  # a case pattern of the argument list (no spaces)
MEMORY = "*index,memory.total*"
FABRIC = "*fabric.state,fabric.status*"


def count_check(model: str, gb: int, count: int = 4, vendor: str = "nvidia") -> dict:
    dev = (r"/dev/nvidia\d+", "nvidia", 0) if vendor == "nvidia" else (r"/dev/dri/renderD\d+", "renderD", 128)
    return {"name": "gpu-count", "kind": "gpu-count", "vendor": vendor, "count": count, "model": model,
            "memory_gb": gb, "devices": dev[0], "device_prefix": dev[1], "device_first": dev[2], "timeout": 5}


def smi(host, name: str, mib: list[int]) -> None:  # noqa: F811
    host.prints("nvidia-smi", "".join(f"{i}, {name}, 00000008:0{i}:00.0\n" for i in range(len(mib))), when=NAMES)
    host.prints("nvidia-smi", "".join(f"{i}, {m}\n" for i, m in enumerate(mib)), when=MEMORY)


def test_gb200_tray_with_its_four_gpus_and_their_memory(host) -> None:  # noqa: F811
    smi(host, "NVIDIA GB200", [189471] * 4)
    assert checks.run_check(count_check("gb200", 186)) == (True, "4 of 4 GPUs (nvidia-smi: NVIDIA GB200)")


def test_a_gpu_short_of_memory_fails_naming_it(host) -> None:  # noqa: F811
    smi(host, "NVIDIA GB200", [189471, 189471, 95000, 189471])
    ok, msg = checks.run_check(count_check("gb200", 186))
    assert not ok and msg.startswith("GPU 2: 95000 MiB, below 90% of the 186 GB gb200 has")


def test_an_h100_is_not_an_h200_by_memory_either(host) -> None:  # noqa: F811
    smi(host, "NVIDIA H200", [81559] * 8)  # a name that lies is still caught by its size
    assert checks.run_check(count_check("h200", 141, count=8))[0] is False


@pytest.mark.parametrize(("model", "name", "ok"), [("b200", "NVIDIA GB200", False), ("b200", "NVIDIA B200", True),
                                                   ("gb300", "NVIDIA GB300", True), ("b300", "NVIDIA GB300", False),
                                                   ("b300", "NVIDIA B300 SXM6 AC", True)])
def test_model_is_a_whole_word_of_the_name(host, model: str, name: str, ok: bool) -> None:  # noqa: F811
    """A GB200 tray is no B200 node, though 'b200' is inside 'GB200'."""
    smi(host, name, [300000] * 8)
    assert checks.run_check(count_check(model, 180, count=8))[0] is ok


def test_mi355x_count_model_and_memory(host) -> None:  # noqa: F811
    host.prints("rocm-smi", rocm_csv(8, "AMD Instinct MI355X"), when="*showproductname*")
    meminfo = "device,VRAM Total Memory (B),VRAM Total Used Memory (B)\n" + "".join(
        f"card{i},{309220868096 if i else 68719476736},283115520\n" for i in range(8))
    host.prints("rocm-smi", meminfo, when="*showmeminfo*")
    ok, msg = checks.run_check(count_check("mi355x", 288, count=8, vendor="amd"))
    assert not ok and msg.startswith("GPU 0: 65536 MiB, below 90% of the 288 GB")
    host._cases = {}
    host.prints("rocm-smi", rocm_csv(8, "AMD Instinct MI355X"), when="*showproductname*")
    host.prints("rocm-smi", meminfo.replace("68719476736", "309220868096"), when="*showmeminfo*")
    assert checks.run_check(count_check("mi355x", 288, count=8, vendor="amd"))[0] is True


NVL = {"name": "nvlink-fabric", "kind": "service", "unit": "nvidia-imex.service", "timeout": 5}


def test_nvlink_fabric_healthy_tray(host) -> None:  # noqa: F811
    host.prints("systemctl", "active\n")
    host.prints("nvidia-smi", "".join(f"{i}, Completed, Success\n" for i in range(4)), when=FABRIC)
    assert checks.run_check(NVL) == (True, "nvidia-imex.service active")


def test_nvlink_fabric_tray_out_of_its_domain(host) -> None:  # noqa: F811
    host.prints("systemctl", "active\n")
    host.prints("nvidia-smi", "0, Completed, Success\n1, In Progress, N/A\n2, Completed, Success\n"
                "3, Completed, Success\n", when=FABRIC)
    assert checks.run_check(NVL) == (False, "GPU 1: NVLink fabric In Progress (N/A)")


def test_nvlink_fabric_imex_stopped(host) -> None:  # noqa: F811
    host.prints("systemctl", "failed\n", rc=3)
    assert checks.run_check(NVL) == (False, "nvidia-imex.service is failed")


def test_config_knows_the_generation() -> None:
    from gpucluster.render.health.config import node_config

    gb = compiled(spec_from_data(example_data("gb200-superpod")))
    cfg = {c["name"]: c for c in node_config(gb, "gb200")["checks"]}
    assert cfg["gpu-count"]["count"] == 4 and cfg["gpu-count"]["model"] == "gb200"
    assert cfg["gpu-count"]["memory_gb"] == 186
    assert cfg["nvlink-fabric"]["unit"] == "nvidia-imex.service" and "fabric-manager" not in cfg
    b300 = compiled(spec_from_data(example_data("b300-xdr-superpod")))
    cfg = {c["name"]: c for c in node_config(b300, "b300")["checks"]}
    assert cfg["gpu-count"]["memory_gb"] == 288 and "nvlink-fabric" not in cfg
