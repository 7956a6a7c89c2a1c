"""Hardware facts and the comparison rules, from recorded outputs of the facts script (no machine needed).

The script itself runs against real staged nodes in test_pulumi_provider_staged.py; here every rule of
`compare` is held against the spec values it comes from.
"""

from __future__ import annotations

import subprocess

import pytest
from conftest import compiled, loaded_example

from gpucluster.deploy.facts import FACTS_SCRIPT, Facts, FactsError, compare, drift, parse_facts
from gpucluster.deploy.nodes import batch_size, batches, expectation


def _cpu_lines(sockets: int, cores: int, threads: int) -> list[str]:
    out, n = [], 0
    for _thread in range(threads):  # Linux numbers the first thread of every core first
        for s in range(sockets):
            for c in range(cores):
                out.append(f"cpu{n} {s} {c}")
                n += 1
    return out


def _output(*, host="gtt0001", sockets=2, cores=52, threads=2, mem_kb=2_063_000_000, smi=(), rocm=(), dev=(),
            net=("eth0 1",), ib=(), end=True) -> str:
    parts = ["@hostname", host, "@cpu", *_cpu_lines(sockets, cores, threads), "@meminfo",
             f"MemTotal:       {mem_kb} kB", "@nvidia-smi", *smi, "@rocm-smi", *rocm, "@dev", *dev,
             "@net", "lo 772", *net, "@ib", *ib]
    if end:
        parts.append("@end")
    return "\n".join(parts) + "\n"


H100 = tuple(["NVIDIA H100 80GB HBM3"] * 8)
ROCE_HCAS = tuple(f"mlx5_{i} Ethernet" for i in range(8))


def _meta():
    loaded, plan = loaded_example("meta-24k-roce")
    group = loaded.spec.group("h100")
    return loaded, plan, group


def test_parse_a_grand_teton_node() -> None:
    facts = parse_facts(_output(smi=H100, ib=ROCE_HCAS))
    assert (facts.sockets, facts.cores_per_socket, facts.threads_per_core, facts.cpus) == (2, 52, 2, 208)
    assert facts.memory_mb == 2_063_000_000 // 1024
    assert (facts.gpus, facts.gpu_source) == (8, "nvidia-smi")
    assert facts.hcas == {f"mlx5_{i}": "Ethernet" for i in range(8)}
    assert facts.nics == ("eth0",)
    assert Facts.from_text(facts.to_text()) == facts


def test_parse_amd_from_rocm_smi_and_device_files() -> None:
    rocm = ["device,Card series,Card model,Card vendor,Card SKU",
            *[f"card{i},AMD Instinct MI250X,0x740c,Advanced Micro Devices,D65209" for i in range(8)]]
    facts = parse_facts(_output(rocm=rocm))
    assert (facts.gpus, facts.gpu_source, facts.gpu_names[0]) == (8, "rocm-smi", "AMD Instinct MI250X")
    files = parse_facts(_output(dev=tuple(f"/dev/dri/renderD{128 + i}" for i in range(8))))
    assert (files.gpus, files.gpu_source) == (8, "device files")


def test_device_files_are_counted_in_natural_order() -> None:
    dev = tuple(f"/dev/nvidia{i}" for i in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9))
    facts = parse_facts(_output(dev=dev))
    assert facts.gpus == 11
    assert facts.gpu_devices[:3] == ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2")


def test_nvidia_smi_that_failed_falls_back_to_device_files() -> None:
    smi = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",)
    facts = parse_facts(_output(smi=smi, dev=tuple(f"/dev/nvidia{i}" for i in range(8))))
    assert (facts.gpus, facts.gpu_source) == (8, "device files")


def test_an_unfinished_script_is_an_error() -> None:
    with pytest.raises(FactsError, match="did not finish"):
        parse_facts(_output(end=False))


def test_the_script_runs_under_sh_here() -> None:
    """The script on this machine: POSIX sh, /sys and /proc only, whatever tools are missing."""
    res = subprocess.run(["/bin/sh", "-c", FACTS_SCRIPT], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    facts = parse_facts(res.stdout)
    assert facts.cpus >= 1 and facts.memory_mb > 0 and facts.hostname


def test_a_matching_node_has_no_mismatch() -> None:
    loaded, _plan, group = _meta()
    bad, notes = compare(expectation(compiled(loaded.spec), group, "on-prem"),
                         parse_facts(_output(smi=H100, ib=ROCE_HCAS)), "gtt0001")
    assert bad == [] and notes == []


@pytest.mark.parametrize(("change", "field", "spec", "node"), [
    ({"smi": H100[:4]}, "node_groups[2].gpus_per_node", "8", "4"),
    ({"smi": ("NVIDIA A100-SXM4-80GB",) * 8}, "node_groups[2].gpu", "GPUs of type h100", "NVIDIA A100-SXM4-80GB"),
    ({"sockets": 1}, "node_groups[2].cpu.sockets", "2", "1"),
    ({"threads": 1}, "node_groups[2].cpu.threads_per_core", "2", "1"),
    ({"mem_kb": 1_000_000_000}, "node_groups[2].memory_gb", "1900 GB (1945600 MiB)", "976562 MiB"),
    ({"ib": ROCE_HCAS[:7]}, "node_groups[2].nic", "mlx5_0, mlx5_1", "RDMA devices mlx5_0"),
    ({"ib": tuple(f"mlx5_{i} InfiniBand" for i in range(8))}, "fabric.type", "link layer Ethernet", "mlx5_0: Inf"),
    ({"host": "gtt0002"}, "hostname", "gtt0001", "gtt0002"),
])
def test_each_mismatch_names_its_spec_field(change: dict, field: str, spec: str, node: str) -> None:
    loaded, _plan, group = _meta()
    kw = {"smi": H100, "ib": ROCE_HCAS, **change}
    bad, _notes = compare(expectation(compiled(loaded.spec), group, "on-prem"), parse_facts(_output(**kw)), "gtt0001")
    assert [m.field for m in bad] == [field]
    assert bad[0].spec.startswith(spec) and bad[0].node.startswith(node)
    assert bad[0].render().startswith(f"{field}: the spec says {bad[0].spec}, the node has {bad[0].node}")


def test_more_than_the_spec_is_a_note_not_a_mismatch() -> None:
    loaded, _plan, group = _meta()
    bad, notes = compare(expectation(compiled(loaded.spec), group, "on-prem"),
                         parse_facts(_output(cores=64, mem_kb=4_000_000_000, smi=H100, ib=ROCE_HCAS)), "gtt0001")
    assert bad == []
    assert notes == ["node_groups[2].cpu.cores_per_socket: the node has 64, the spec 52; Slurm schedules the spec's"]


def test_staged_nodes_count_interfaces_instead_of_hcas() -> None:
    loaded, _plan = loaded_example("staging")
    group = loaded.spec.group("gpu")
    expect = expectation(compiled(loaded.spec), group, "staging")
    staged = _output(host="gpu01", sockets=1, cores=2, threads=1, mem_kb=24_000_000,
                     dev=tuple(f"/dev/nvidia{i}" for i in range(4)))
    bad, notes = compare(expect, parse_facts(staged), "gpu01")
    assert bad == []
    assert any("HCAs were not checked" in n for n in notes)
    assert any("model was not checked" in n for n in notes)
    bad, _ = compare(expect, parse_facts(staged.replace("eth0 1\n", "")), "gpu01")
    assert [m.field for m in bad] == ["node_groups[1].nics_per_node"]


def test_drift_lists_changed_fields() -> None:
    before = parse_facts(_output(smi=H100, ib=ROCE_HCAS)).as_dict()
    after = parse_facts(_output(smi=H100[:7], ib=ROCE_HCAS)).as_dict()
    name = before["gpu_names"][0]
    assert drift(before, after) == [f"gpu_names: [{name} … {name}] (8) -> [{name} … {name}] (7)", "gpus: 8 -> 7"]
    assert drift(before, before) == []


# ---------------------------------------------------------------- batches


@pytest.mark.parametrize(("requested", "per_rack", "size"), [(64, 2, 64), (64, 6, 60), (1, 2, 1), (5, 16, 5)])
def test_batch_size_keeps_racks_whole(requested: int, per_rack: int, size: int) -> None:
    loaded, _plan = loaded_example("meta-24k-roce")
    group = loaded.spec.group("h100").model_copy(update={"nodes_per_rack": per_rack})
    assert batch_size(group, requested) == size


def test_batches_cover_a_group_in_order() -> None:
    loaded, _plan = loaded_example("meta-24k-roce")
    group = loaded.spec.group("h100")
    bs = batches(group, 64)
    assert [h for b in bs for h in b.hosts] == group.hosts
    assert [b.name for b in bs[:2]] == ["h100-0000", "h100-0001"]
    assert len(bs) == group.count // 64
