"""The current generation in the catalog, and a catalog a spec can complete on its own.

Figures are the published ones named beside each entry in src/gpucluster/catalog.py; a spec-level GPU
with its own version lock row passes every driver rule without touching code.
"""

from __future__ import annotations

import pytest
from conftest import example_data, spec_from_data

from gpucluster.catalog import GPUS, NICS, STACKS, SWITCHES
from gpucluster.spec import stacks

# (key, memory GB, GPUs per node, GPUs of one NVLink domain or None)
PUBLISHED_GPUS = [
    ("b200-sxm-180g", 180, 8, None),   # DGX B200: 1,440 GB over 8 GPUs
    ("b300-sxm-288g", 288, 8, None),   # HGX B300: 288 GB HBM3e per GPU
    ("gb200", 186, 4, 72),             # GB200 NVL72: 18 trays x 4 GPUs
    ("gb300", 279, 4, 72),             # GB300 NVL72: 20 TB / 72 GPUs
    ("mi325x", 256, 8, None),          # MI325X: 256 GB HBM3E
    ("mi355x", 288, 8, None),          # MI355X: 288 GB HBM3E
]


@pytest.mark.parametrize(("key", "memory", "per_node", "domain"), PUBLISHED_GPUS, ids=[g[0] for g in PUBLISHED_GPUS])
def test_gpu_figures(key: str, memory: int, per_node: int, domain: int | None) -> None:
    gpu = GPUS[key]
    assert gpu.memory_gb == memory
    assert per_node in gpu.allowed_per_node
    assert (gpu.nvlink_domain.gpus if gpu.nvlink_domain else None) == domain


@pytest.mark.parametrize("key", ["gb200", "gb300"])
def test_nvl72_rack(key: str) -> None:
    """DGX SuperPOD GB200 RA: 18 compute trays, 9 NVLink switch trays of 2 chips, 18 NVLink links a GPU
    (one to each chip)."""
    rack = GPUS[key].nvlink_domain
    assert (rack.compute_trays, rack.gpus_per_tray, rack.switch_trays) == (18, 4, 9)
    assert rack.switch_trays * rack.switch_chips_per_tray == rack.links_per_gpu == 18


def test_800g_parts() -> None:
    assert NICS["cx8-xdr-800g"].speed_gbps == NICS["cx8-800gbe"].speed_gbps == 800
    assert SWITCHES["q3400"].radix(800) == 144  # Quantum-X800 Q3400
    assert SWITCHES["sn5600"].radix(800) == 64  # Spectrum-X800-class SN5600


def _spec_with_gpu(catalog: dict, sku: str = "acme-x1"):
    data = example_data("staging")
    group = next(g for g in data["node_groups"] if g["name"] == "gpu")
    group["gpu"] = sku
    group["gpus_per_node"] = 8
    data["catalog"] = catalog
    return spec_from_data(data)


ACME = {"vendor": "amd", "name": "ACME X1", "memory_gb": 96, "slurm_type": "x1", "allowed_per_node": [8]}
ROW = {"vendor": "amd", "branch": "7.2.2", "toolkit": "7.2.2",
       "driver": {"packages": ["amdgpu-dkms"], "version": "1:*.70202-*"},
       "runtime": {"packages": ["rocm-hip-runtime"], "version": "*.70202-*"},
       "collective": {"packages": ["rccl"], "version": "2.27.7.70202-*"}}


def _errors(spec) -> list[str]:
    return [f.rule for f in stacks.check(spec) if f.level == "error"]


def test_spec_level_gpu_without_lock_is_refused_with_the_fix() -> None:
    spec = _spec_with_gpu({"gpus": {"acme-x1": ACME}})
    found = [f for f in stacks.check(spec) if f.level == "error"]
    assert [f.rule for f in found] == ["version-lock"]
    assert "catalog.stacks.acme-x1" in found[0].fix


def test_spec_level_gpu_with_its_own_lock_row_passes() -> None:
    """The whole lock in the spec: a SKU, its stack, and a release row the built-in lock lacks."""
    stack = {"acme-x1": {"default": "7.2.2", "releases": ["7.2.2"]}}
    spec = _spec_with_gpu({"gpus": {"acme-x1": ACME}, "stacks": stack, "releases": {"amd": {"7.2.2": ROW}}})
    assert _errors(spec) == []
    stack = stacks.driver_stack(spec, "gpu")
    assert stack["branch"] == "7.2.2"
    assert stack["pins"]["collective"]["version"] == "2.27.7.70202-*"


def test_spec_level_stack_naming_a_missing_row_is_refused() -> None:
    stack = {"acme-x1": {"default": "7.2.2", "releases": ["7.2.2"]}}
    assert _errors(_spec_with_gpu({"gpus": {"acme-x1": ACME}, "stacks": stack})) == ["version-lock"]


def test_builtin_lock_covers_its_stacks() -> None:
    assert set(STACKS) <= set(GPUS)
    assert "mi355x" not in STACKS  # ROCm 7 has no built-in row: a spec brings it (examples/mi355x-800g-roce.yaml)


HOSTILE = [
    ("a package name that starts a new apt stanza", ["driver", "packages"], ["amdgpu-dkms\nPin-Priority: 1001"]),
    ("a version with a newline", ["driver", "version"], "1:*\nPackage: *"),
    ("an OFED release that rewrites the repository URL", ["ofed"], {"doca": "../../evil"}),
    ("a toolkit that is not a release", ["toolkit"], "7.2; rm -rf /"),
    ("a row under another branch than its own", ["branch"], "7.2.3"),
]


@pytest.mark.parametrize(("why", "path", "value"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_spec_level_lock_rows_are_data(why: str, path: list, value) -> None:
    """Every field of a spec's own lock row lands in apt preferences, deb822 sources or a URL: a value
    that could start a new line, stanza or path is refused by the schema."""
    import copy

    from gpucluster.errors import SpecError

    row = copy.deepcopy(ROW)
    target = row
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    stack = {"acme-x1": {"default": "7.2.2", "releases": ["7.2.2"]}}
    with pytest.raises(SpecError) as err:
        _spec_with_gpu({"gpus": {"acme-x1": ACME}, "stacks": stack, "releases": {"amd": {"7.2.2": row}}})
    assert "releases" in str(err.value)
