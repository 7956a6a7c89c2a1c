"""The driver-stack files the roles install, rendered statically for every GPU SKU of the catalog.

NVIDIA's and AMD's repositories are not reachable here and there is no GPU, so the sources, apt pins,
module list and slurmd drop-in are checked as files: golden copies under tests/golden/drivers/<case>/
(regenerate with GPUCLUSTER_UPDATE_GOLDEN=1 and review the diff), and, independently of the goldens,
that what they pin is exactly the version lock's row for the SKU (src/gpucluster/catalog.py).

The files come from the renderer `render_all` uses (gpucluster.render.drivers), with the parts each role
installs read from the role's own vars/Debian.yml (held equal to render.driver_render.ROLE_PARTS below), and the
node's URIs filled in by the filter the roles call (plugins/filter/gpucluster_stacks.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import GOLDEN_DIR, ROOT, example_data, load_file, skip_or_fail, spec_from_data

from gpucluster.catalog import GPUS, RELEASES, STACKS, rocm_build
from gpucluster.render import drivers as driver_render
from gpucluster.spec import stacks

GOLDEN = GOLDEN_DIR / "drivers"


filters = load_file(ROOT / "plugins" / "filter" / "gpucluster_stacks.py", "gpucluster_stacks_filters")


def role_parts(role: str, vendor: str) -> list[str]:
    data = yaml.safe_load((ROOT / "roles" / role / "vars" / "Debian.yml").read_text())
    parts = data[f"__{role}_parts"]
    return parts[vendor] if isinstance(parts, dict) else parts


def spec_for(sku: str, *, drivers: dict | None = None, count: int | None = None, nic: str | None = None):
    """The staging example with its GPU group turned into `count` x `sku` (default: the largest board)."""
    data = example_data("staging")
    group = next(g for g in data["node_groups"] if g["name"] == "gpu")
    group["gpu"] = sku
    group["gpus_per_node"] = count or max(GPUS[sku].allowed_per_node)
    if nic:
        group["nic"] = nic
    if drivers:
        data["drivers"] = drivers
    spec = spec_from_data(data)
    errors = [f.render() for f in stacks.check(spec) if f.level == "error"]
    assert not errors, errors
    return spec


# case name -> (sku, drivers section, GPUs per node, NIC)
CASES = {sku: (sku, None, None, None) for sku in GPUS if sku in STACKS}  # a SKU without a built-in lock row: spec-level
CASES |= {
    # The PCIe option: Debian's driver on a board without NVSwitch.
    "h100-sxm5-80g-4gpu-debian": ("h100-sxm5-80g", {"source": "debian"}, 4, None),
    # DOCA-host on the fabric: nvidia-peermem joins the stack.
    "h100-sxm5-80g-doca": ("h100-sxm5-80g", {"ofed": "doca"}, None, None),
    # A mirror of the vendor repositories, and the other tested branch.
    "h200-sxm-141g-580-mirror": ("h200-sxm-141g", {"source": "local-mirror", "branch": "580",
                                                   "mirror": "http://mirror.site.example/vendor"}, None, None),
    "mi300x-6.2.4-mlnx-ofed": ("mi300x", {"branch": "6.2.4", "ofed": "mlnx-ofed"}, None, None),
}


def rendered(case: str) -> dict[str, str]:
    """{file name: text} of every role's files for the case's GPU group ('' files left out)."""
    sku, drivers, count, nic = CASES[case]
    stack = stacks.driver_stack(spec_for(sku, drivers=drivers, count=count, nic=nic), "gpu")
    vendor = stack["vendor"]
    roles = ["nvidia_gpu" if vendor == "nvidia" else "amd_gpu", "nccl", "rdma"]
    mirror = "http://deb.mirror.example/debian" if stack["source"] == "debian" else ""
    out = {}
    for role in roles:
        parts = [] if role == "rdma" else role_parts(role, vendor)
        for name, text in driver_render.driver_files(stack, role, parts).items():
            if name == "sources" and text:  # the node's Debian mirror, as the role fills it in
                kind = "ofed" if role == "rdma" else "driver"
                text = filters._node_uris(text, [r["uri"] for r in filters.repositories(stack, kind, mirror)])
            if text:
                out[f"{role}.{name}"] = text
    return out


@pytest.mark.parametrize("role", sorted(driver_render.ROLE_PARTS))
def test_the_renderer_pins_the_parts_each_role_installs(role: str) -> None:
    """render.driver_render.ROLE_PARTS (what the rendered pins cover) is what the role's vars install."""
    path = ROOT / "roles" / role / "vars" / "Debian.yml"
    parts = yaml.safe_load(path.read_text()).get(f"__{role}_parts", []) if path.exists() else []
    want = {v: parts for v in ("nvidia", "amd")} if isinstance(parts, list) else parts
    got = {v: p for v, p in driver_render.ROLE_PARTS[role].items() if v}
    assert got == {v: want.get(v, []) for v in got}


GOLDEN_CASES = [(case, name) for case in CASES for name in sorted(rendered(case))]


@pytest.mark.parametrize(("case", "name"), GOLDEN_CASES, ids=[f"{c}/{n}" for c, n in GOLDEN_CASES])
def test_golden(case: str, name: str) -> None:
    got = rendered(case)[name]
    path = GOLDEN / case / name
    if os.environ.get("GPUCLUSTER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"{path} missing: run with GPUCLUSTER_UPDATE_GOLDEN=1 to create it"
    assert got == path.read_text(), f"{name} differs from {path}; if intended, GPUCLUSTER_UPDATE_GOLDEN=1"


def test_golden_set_is_complete() -> None:
    """Every golden file is still rendered (a renamed output must not leave a stale golden behind)."""
    on_disk = {(p.parent.name, p.name) for p in GOLDEN.glob("*/*")}
    assert on_disk == set(GOLDEN_CASES)


# ---------------------------------------------------------------- the files match the version lock


def pins_of(text: str) -> dict[str, str]:
    """{package: version} of an apt preferences text."""
    out = {}
    for stanza in text.split("\n\n"):
        pkgs = re.search(r"^Package: (.+)$", stanza, re.M)
        version = re.search(r"^Pin: version (\S+)$", stanza, re.M)
        if pkgs and version:
            assert re.search(r"^Pin-Priority: 1001$", stanza, re.M), stanza
            out.update(dict.fromkeys(pkgs[1].split(), version[1]))
    return out


@pytest.mark.parametrize("sku", sorted(STACKS))
def test_default_stack_pins_the_locks_row(sku: str) -> None:
    """With no drivers: section, every part each role pins is the lock's default row for the SKU."""
    files = rendered(sku)
    row = RELEASES[GPUS[sku].vendor][STACKS[sku].default]
    want = {}
    for part in ("driver", "fabric_manager", "dcgm", "runtime", "collective"):
        pin = getattr(row, part)
        if pin is not None and (part != "fabric_manager" or 8 in GPUS[sku].nvswitch_at):
            want |= dict.fromkeys(pin.packages, pin.version)
    got = {}
    for name, text in files.items():
        if name.endswith(".pins"):
            got |= pins_of(text)
    assert got == want


@pytest.mark.parametrize("sku", sorted(s for s in STACKS if GPUS[s].vendor == "nvidia" and GPUS[s].nvswitch_at))
def test_driver_and_fabric_manager_share_one_version(sku: str) -> None:
    pins = pins_of(rendered(sku)["nvidia_gpu.pins"])
    assert pins["nvidia-fabricmanager"] == pins["nvidia-driver"] == pins["libnvidia-nscq"]
    assert pins["nvidia-driver"].startswith(f"{STACKS[sku].default}.")


@pytest.mark.parametrize("sku", sorted(s for s in STACKS if GPUS[s].vendor == "amd"))
def test_rocm_sources_and_pins_are_one_release(sku: str) -> None:
    files = rendered(sku)
    release = STACKS[sku].default
    uris = re.findall(r"^URIs: (\S+)$", files["amd_gpu.sources"], re.M)
    assert uris and all(f"/{release}" in u for u in uris), uris
    for version in {**pins_of(files["amd_gpu.pins"]), **pins_of(files["nccl.pins"])}.values():
        assert f".{rocm_build(release)}-" in version


def test_the_lock_is_consistent() -> None:
    """Each NVIDIA row pins Fabric Manager at the driver's exact version, on its own branch; each AMD
    row pins every part to its ROCm build; every SKU's releases exist."""
    for branch, row in RELEASES["nvidia"].items():
        assert row.branch == branch and row.driver.version.startswith(f"{branch}.")
        assert row.fabric_manager is not None and row.fabric_manager.version == row.driver.version
        assert row.collective is not None and row.collective.version.endswith(f"+cuda{row.toolkit}")
    for release, row in RELEASES["amd"].items():
        for pin in (row.driver, row.runtime, row.collective):
            assert pin is not None and f".{rocm_build(release)}-" in pin.version
    for sku, stack in STACKS.items():
        assert sku in GPUS and stack.default in stack.releases
        assert set(stack.releases) <= set(RELEASES[GPUS[sku].vendor])


def test_nvswitch_board_orders_slurmd_after_fabric_manager() -> None:
    dropin = rendered("h100-sxm5-80g")["nvidia_gpu.slurmd_dropin"]
    assert "\nAfter=nvidia-persistenced.service nvidia-fabricmanager.service\n" in dropin
    assert "\nWants=nvidia-persistenced.service nvidia-fabricmanager.service\n" in dropin
    # A 4-GPU board has no NVSwitch: no Fabric Manager pin, no ordering on it.
    four = stacks.driver_stack(spec_for("h100-sxm5-80g", count=4), "gpu")
    assert not four["fabric_manager"] and "fabric_manager" not in four["pins"]
    assert "fabricmanager" not in driver_render.driver_files(four, "nvidia_gpu", role_parts("nvidia_gpu", "nvidia"))[
        "slurmd_dropin"]


def test_peermem_only_with_an_ofed_stack() -> None:
    assert "nvidia_gpu.peermem" not in rendered("h100-sxm5-80g")
    doca = rendered("h100-sxm5-80g-doca")
    assert doca["nvidia_gpu.peermem"].splitlines()[-1] == "nvidia-peermem"
    version = RELEASES["nvidia"][STACKS["h100-sxm5-80g"].default].ofed["doca"]
    assert f"/doca/{version}/" in doca["rdma.sources"]


def test_mirror_keeps_the_vendor_path() -> None:
    sources = rendered("h200-sxm-141g-580-mirror")["nvidia_gpu.sources"]
    assert "URIs: http://mirror.site.example/vendor/compute/cuda/repos/debian12/x86_64/\n" in sources
    stack = stacks.driver_stack(spec_for("h200-sxm-141g", drivers={
        "source": "local-mirror", "branch": "580", "mirror": "http://mirror.site.example/vendor"}), "gpu")
    assert stack["repositories"][0]["probe"] == "http://mirror.site.example/vendor/compute/cuda/repos/debian12/x86_64/Release"
    assert stack["repositories"][0]["key"].startswith("http://mirror.site.example/vendor/compute/")


# ---------------------------------------------------------------- apt reads them


def apt_policy(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    """`apt-cache policy` on only these preferences and sources: apt's own parser is the consumer."""
    prefs, sources = tmp_path / "preferences.d", tmp_path / "sources.list.d"
    prefs.mkdir()
    sources.mkdir()
    for name, text in files.items():
        folder = prefs if name.endswith(".pins") else sources
        (folder / (name.replace(".", "-") + (".sources" if folder is sources else ""))).write_text(text)
    opts = ["Dir::Etc::Preferences=/dev/null", f"Dir::Etc::PreferencesParts={prefs}",
            "Dir::Etc::SourceList=/dev/null", f"Dir::Etc::SourceParts={sources}",
            f"Dir::State::Lists={tmp_path / 'lists'}", f"Dir::Cache={tmp_path / 'cache'}"]
    argv = ["apt-cache"] + [a for o in opts for a in ("-o", o)] + ["policy"]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.parametrize("case", sorted(CASES))
def test_apt_reads_the_rendered_sources_and_pins(case: str, tmp_path: Path) -> None:
    if shutil.which("apt-cache") is None:
        skip_or_fail("apt-cache is not installed (a Debian machine runs this test)")
    files = {n: t for n, t in rendered(case).items() if n.endswith((".pins", ".sources"))}
    res = apt_policy(tmp_path, files)
    assert res.returncode == 0 and "E:" not in res.stderr and "W:" not in res.stderr, res.stderr


def test_apt_refuses_a_broken_pin(tmp_path: Path) -> None:
    """The check above can fail: a pin stanza without its Package line is an apt error."""
    if shutil.which("apt-cache") is None:
        skip_or_fail("apt-cache is not installed (a Debian machine runs this test)")
    text = rendered("h100-sxm5-80g")["nvidia_gpu.pins"].replace("Package: nvidia-driver", "Package nvidia-driver")
    res = apt_policy(tmp_path, {"nvidia_gpu.pins": text})
    assert "Invalid record in the preferences file" in res.stderr
