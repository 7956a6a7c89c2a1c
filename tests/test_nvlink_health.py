"""The `nvlink-fabric` check of a GB200/GB300 NVL72 tray against a fake host: nvidia-smi and systemctl on PATH
print the files of tests/data/nvidia-smi/ (hand-written in the documented format: this project has no GB200
hardware; their README says what each holds). The healthy tray passes and names its clique and cluster; each
fault fails with a message of its own that names the GPU and the value seen.

What the check expects (4 GPUs, 18 links at 53125 MB/s) comes from the rendered health config of the GB200
example, so the catalog's figures are what is tested, not a copy of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compiled, example_data, spec_from_data
from test_health_checks import host  # noqa: F401  (host is a fixture)

from gpucluster.catalog import GPUS
from gpucluster.node import checks
from gpucluster.render.health.config import node_config

DATA = Path(__file__).resolve().parent / "data" / "nvidia-smi"
QUERY = "-q"  # the fake's case patterns: the argument lists the check gives nvidia-smi
LINKS = "nvlink*-s"
CLUSTER = "7a3c1f52-9b1e-4d8a-a0c5-2f6e8d41b937"


def _config(example: str, group: str) -> dict:
    cfg = node_config(compiled(spec_from_data(example_data(example))), group)
    return {c["name"]: c for c in cfg["checks"]}


GB200_CHECK = _config("gb200-superpod", "gb200")["nvlink-fabric"]

# case id -> (nvidia-smi -q file, nvidia-smi nvlink -s file, the check's result)
CASES = {
    "healthy": ("q-healthy.txt", "nvlink-healthy.txt",
                (True, f"4 GPUs in clique 32766 of cluster {CLUSTER}: fabric Completed / Success, "
                       "18 NVLinks each at 53.125 GB/s")),
    "state-in-progress": ("q-state-in-progress.txt", "nvlink-healthy.txt",
                          (False, "GPU 1: fabric State In Progress, not Completed")),
    "status-insufficient-resources": ("q-status-insufficient-resources.txt", "nvlink-healthy.txt",
                                      (False, "GPU 2: fabric Status Insufficient Resources, not Success "
                                              "(CliqueId 0)")),
    "clique-zero": ("q-clique-zero.txt", "nvlink-healthy.txt", (False, "GPU 3: CliqueId 0 (in no clique)")),
    "clique-differs": ("q-clique-differs.txt", "nvlink-healthy.txt",
                       (False, "GPU 1: CliqueId 32767, GPU 0 has 32766")),
    "cluster-differs": ("q-cluster-differs.txt", "nvlink-healthy.txt",
                        (False, f"GPU 3: ClusterUUID c41e9b07-2d6a-4f13-8b5e-9a0d7c3f1e28, GPU 0 has {CLUSTER}")),
    "cluster-missing": ("q-cluster-missing.txt", "nvlink-healthy.txt", (False, "GPU 0: ClusterUUID missing (N/A)")),
    "link-inactive": ("q-healthy.txt", "nvlink-link-inactive.txt",
                      (False, "GPU 1: 17 of 18 NVLinks up (link 7: <inactive>)")),
    "link-slow": ("q-healthy.txt", "nvlink-link-slow.txt",
                  (False, "GPU 2: link 4 at 26.562 GB/s, catalog 53.125 GB/s")),
    "gpu-missing-from-q": ("q-gpu-missing.txt", "nvlink-healthy.txt",
                           (False, "nvidia-smi -q lists 3 of 4 GPUs (Attached GPUs: 3; /dev/nvidia2 not among them)")),
    "gpu-missing-from-nvlink": ("q-healthy.txt", "nvlink-gpu-missing.txt",
                                (False, "GPU 3: GPU-d2e6f813-4a5c-4b77-a1d9-8f3b2c5e6a73 not in nvidia-smi nvlink -s")),
}


def fake_tray(host, query: str, links: str, rc: int = 0, links_rc: int = 0) -> None:  # noqa: F811
    host.prints("systemctl", "active\n")
    host.prints("nvidia-smi", (DATA / query).read_text(), rc=rc, when=QUERY)
    host.prints("nvidia-smi", (DATA / links).read_text(), rc=links_rc, when=LINKS)


@pytest.mark.parametrize("case", list(CASES))
def test_each_fault_fails_with_its_own_message(host, case: str) -> None:  # noqa: F811
    query, links, want = CASES[case]
    fake_tray(host, query, links)
    assert checks.run_check(GB200_CHECK) == want


def test_an_empty_nvlink_listing(host) -> None:  # noqa: F811
    host.prints("systemctl", "active\n")
    host.prints("nvidia-smi", (DATA / "q-healthy.txt").read_text(), when=QUERY)
    host.prints("nvidia-smi", "\n", when=LINKS)
    assert checks.run_check(GB200_CHECK) == (False, "nvidia-smi nvlink -s lists no GPU")


def test_the_messages_differ() -> None:
    """One message per failure class: a drain reason tells them apart."""
    messages = [want[1] for _q, _l, want in CASES.values()]
    assert len(set(messages)) == len(messages)


def test_nvidia_smi_failing(host) -> None:  # noqa: F811
    fake_tray(host, "smi-driver-gone.txt", "nvlink-healthy.txt", rc=9)
    ok, msg = checks.run_check(GB200_CHECK)
    assert not ok and msg.startswith("nvidia-smi -q failed: NVIDIA-SMI has failed because it couldn't communicate")


def test_nvlink_listing_failing(host) -> None:  # noqa: F811
    fake_tray(host, "q-healthy.txt", "smi-driver-gone.txt", links_rc=9)
    ok, msg = checks.run_check(GB200_CHECK)
    assert not ok and msg.startswith("nvidia-smi nvlink -s failed: NVIDIA-SMI has failed")


def test_nvidia_smi_hanging_is_killed_at_its_budget(host, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A wedged nvidia-smi: the check's own runner kills its process group at the budget and fails. The budget
    is cut to 0.2 s here (the fake would sleep 30 s), so the test takes no longer than that."""
    host.prints("systemctl", "active\n")
    host.tool("nvidia-smi", "exec sleep 30\n")
    real_run = checks.run
    monkeypatch.setattr(checks, "run", lambda argv, timeout: real_run(argv, min(timeout, 0.2)))
    assert checks.run_check(GB200_CHECK) == (False, "nvidia-smi did not answer within 0.2s")


def test_imex_stopped(host) -> None:  # noqa: F811
    fake_tray(host, "q-healthy.txt", "nvlink-healthy.txt")
    host.prints("systemctl", "failed\n", rc=3)
    assert checks.run_check(GB200_CHECK) == (False, "nvidia-imex.service is failed")


def test_no_nvidia_smi(host) -> None:  # noqa: F811
    host.prints("systemctl", "active\n")
    ok, msg = checks.run_check(GB200_CHECK)
    assert not ok and msg.startswith("nvidia-smi not found")


def test_a_whole_tray_out_is_said_once(host) -> None:  # noqa: F811
    """Every GPU with the same fault: one clause naming them all, so the drain reason stays short."""
    text = (DATA / "q-healthy.txt").read_text().replace(": Completed", ": In Progress")
    host.prints("systemctl", "active\n")
    host.prints("nvidia-smi", text, when=QUERY)
    host.prints("nvidia-smi", (DATA / "nvlink-healthy.txt").read_text(), when=LINKS)
    assert checks.run_check(GB200_CHECK) == (False, "GPU 0, 1, 2, 3: fabric State In Progress, not Completed")


def test_through_the_script(host, tmp_path: Path) -> None:  # noqa: F811
    """As the runner calls it: its own process, the rendered config, one JSON line, exit 0."""
    import json
    import subprocess
    import sys

    fake_tray(host, "q-healthy.txt", "nvlink-healthy.txt")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"checks": [GB200_CHECK]}))
    proc = subprocess.run([sys.executable, checks.__file__, "--config", str(cfg), "--check", "nvlink-fabric"],
                          capture_output=True, text=True, timeout=30)
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["ok"] and f"cluster {CLUSTER}" in result["message"]


# ---------------------------------------------------------------- parsing


def test_query_parser_reads_nested_sections() -> None:
    gpus, attached = checks.parse_smi_query((DATA / "q-healthy.txt").read_text())
    assert attached == "4" and len(gpus) == 4
    assert gpus[2]["_bus"] == "00000018:01:00.0" and gpus[2]["Minor Number"] == "2"
    assert gpus[2]["Fabric"]["CliqueId"] == "32766" and gpus[2]["Fabric"]["Health"]["Bandwidth"] == "Full"
    assert gpus[2]["PCI"]["Bus Id"] == "00000018:01:00.0"  # a value with colons in it
    assert gpus[2]["Processes"] == "None"  # back out of Fabric > Health to the GPU's own fields


def test_query_parser_takes_tabs_and_crlf() -> None:
    text = (DATA / "q-healthy.txt").read_text().replace("    ", "\t").replace("\n", "\r\n")
    gpus, _attached = checks.parse_smi_query(text)
    assert [g["Fabric"]["State"] for g in gpus] == ["Completed"] * 4


def test_nvlink_parser() -> None:
    status = checks.parse_nvlink_status((DATA / "nvlink-link-inactive.txt").read_text())
    index, links = status["GPU-5a8e7d61-2c3b-4f90-8e14-6b9d0a1f2e51"]
    assert index == 1 and len(links) == 18 and links[7] == "<inactive>"
    assert checks.link_mbytes("53.125 GB/s") == 53125 and checks.link_mbytes("<inactive>") is None


# ---------------------------------------------------------------- catalog and wiring


@pytest.mark.parametrize("key", ["gb200", "gb300"])
def test_catalog_links_with_their_source(key: str) -> None:
    """NVIDIA Health Validation's nvlink_bandwidth_count_speed: 18 links at 53125 MB/s on GB200 and GB300; the
    NVLink page: 18 links of 100 GB/s (both directions), 1.8 TB/s a GPU."""
    rack = GPUS[key].nvlink_domain
    assert (rack.links_per_gpu, rack.link_mbytes_per_s) == (18, 53125)
    assert "Health Validation" in rack.links_source and "1.8 TB/s" in rack.links_source


def test_rendered_check_carries_the_catalog_figures() -> None:
    rack = GPUS["gb200"].nvlink_domain
    want = {"name": "nvlink-fabric", "kind": "nvlink-fabric", "unit": "nvidia-imex.service", "count": 4,
            "links": rack.links_per_gpu, "link_mbytes_per_s": rack.link_mbytes_per_s, "timeout": GB200_CHECK["timeout"]}
    assert want == GB200_CHECK


@pytest.mark.parametrize(("example", "group"), [("staging", "gpu"), ("colossus-200k", "h100"),
                                                ("b300-xdr-superpod", "b300")])
def test_groups_without_nvlink_domains_get_no_nvlink_check(example: str, group: str) -> None:
    cfg = _config(example, group)
    assert "nvlink-fabric" not in cfg and all(c["kind"] != "nvlink-fabric" for c in cfg.values())


def test_catalog_without_link_figures_checks_registration_only(host) -> None:  # noqa: F811
    """A spec's own NVL rack entry without links_per_gpu: the fabric registration is still checked."""
    check = {k: v for k, v in GB200_CHECK.items() if k not in ("links", "link_mbytes_per_s")}
    host.prints("systemctl", "active\n")
    host.prints("nvidia-smi", (DATA / "q-healthy.txt").read_text(), when=QUERY)
    assert checks.run_check(check) == (True, f"4 GPUs in clique 32766 of cluster {CLUSTER}: fabric Completed / "
                                             "Success")
