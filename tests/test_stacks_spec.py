"""The spec's drivers: and health: sections: every rule refuses its mix with a located error
(file:line, field, rule, fix), and driver_stack() hands the roles what the version lock says.

Each case starts from an example that loads as shipped and adds one thing, so the finding is caused
by that change; its line is found by searching the mutated text, not typed in.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from conftest import ROOT, example_path, example_text, findings_of, line_of, mutate

from gpucluster.catalog import DEBIAN_RELEASES, GPUS, RELEASES, STACKS
from gpucluster.errors import Finding
from gpucluster.spec import load_spec
from gpucluster.spec.stacks import HEALTH_CHECKS, driver_stack, driver_stacks

RENDERED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): (?P<field>\S+): (?P<msg>.+); (?P<fix>.+) \[(?P<rule>[\w-]+)\]$")


@dataclass(frozen=True)
class Case:
    example: str
    old: str
    new: str
    field: str
    rule: str
    anchor: str  # the finding's line holds this text
    fix: str = ""
    message: str = ""


def drivers(body: str) -> str:
    """A drivers: section written in front of the fabric: section (YAML, indented body)."""
    return f"drivers:\n{body}fabric:\n"


CASES = {
    "Debian's driver on an NVSwitch board": Case(
        "meta-24k-ib", "fabric:\n", drivers("  source: debian\n"), "drivers.source", "fabric-manager",
        "  source: debian", fix="source: cuda-repo", message="8 x h100-sxm5-80g"),
    "Fabric Manager of another branch than the driver": Case(
        "meta-24k-ib", "fabric:\n", drivers('  fabric_manager_branch: "580"\n'), "drivers.fabric_manager_branch",
        "version-mix", "  fabric_manager_branch:", fix="set it to 570", message="driver branch 570"),
    "the same mix on one group": Case(
        "meta-24k-ib", "fabric:\n", drivers("  branch: 580\n  groups:\n    h100: {fabric_manager_branch: 570}\n"),
        "drivers.groups.h100.fabric_manager_branch", "version-mix", "    h100:", fix="set it to 580"),
    "MLNX_OFED with a branch it was never released for": Case(
        "meta-24k-ib", "fabric:\n", drivers("  branch: 580\n  ofed: mlnx-ofed\n"), "drivers.ofed", "version-mix",
        "  ofed: mlnx-ofed", fix="use ofed: doca", message="MLNX_OFED"),
    "NVIDIA's repository for AMD GPUs": Case(
        "frontier-mi250x-roce", "fabric:\n", drivers("  source: cuda-repo\n"), "drivers.source", "driver-source",
        "  source: cuda-repo", fix="use source: rocm-repo"),
    "a branch the lock does not have": Case(
        "meta-24k-ib", "fabric:\n", drivers("  branch: 550\n"), "drivers.branch", "version-lock", "  branch: 550",
        fix="use one of " + ", ".join(STACKS["h100-sxm5-80g"].releases)),
    "a ROCm release the lock does not have": Case(
        "frontier-mi250x-roce", "fabric:\n", drivers('  branch: "6.0"\n'), "drivers.branch", "version-lock",
        "  branch:", message="ROCm release 6.0"),
    "Debian's driver at another branch than Debian ships": Case(
        "staging", "fabric:\n", drivers("  source: debian\n  branch: 570\n"), "drivers.branch", "version-lock",
        "  branch: 570", fix=f"set it to {DEBIAN_RELEASES['nvidia'].branch}"),
    "a group the spec does not have": Case(
        "staging", "fabric:\n", drivers("  groups:\n    gpus: {source: debian}\n"), "drivers.groups.gpus",
        "drivers", "    gpus:", fix="did you mean 'gpu'?"),
    "a local mirror without its URL": Case(
        "staging", "fabric:\n", drivers("  source: local-mirror\n"), "drivers.source", "driver-source",
        "  source: local-mirror", fix="set drivers.mirror"),
    "Fabric Manager for AMD GPUs": Case(
        "frontier-mi250x-roce", "fabric:\n", drivers('  fabric_manager_branch: "6.2.4"\n'),
        "drivers.fabric_manager_branch", "drivers", "  fabric_manager_branch:", fix="drop fabric_manager_branch"),
    "a driver source for a group without GPUs": Case(
        "staging", "fabric:\n", drivers("  groups:\n    ctl: {source: debian}\n"), "drivers.groups.ctl.source",
        "drivers", "    ctl:", fix="only ofed applies"),
    "a GPU the lock does not know, from the vendor repository": Case(
        "staging", "    gpu: h100-sxm5-80g\n", "    gpu: l40s\n", "node_groups[1].gpu", "version-lock",
        "    gpu: l40s", fix="source: debian"),
    # staging.yaml has a health: section of its own (interval: 30): these add to it or change it.
    "an unknown health check to skip": Case(
        "staging", "\nhealth:\n", "\nhealth:\n  skip: [gpu-cnt]\n", "health.skip[0]", "health",
        "  skip:", fix="did you mean 'gpu-count'?"),
    "an interval shorter than a run": Case(
        "staging", "\n  interval: 30\n", "\n  interval: 10\n", "health.interval", "health",
        "  interval: 10", fix="at least 30"),
    "active checks in a partition that does not exist": Case(
        "staging", "\nhealth:\n", "\nhealth:\n  active: {checks: [dcgm-diag], partition: gpus}\n",
        "health.active.partition", "health", "  active:", fix="did you mean 'gpu'?"),
}

USER_GPU = ("catalog:\n  gpus:\n    l40s: {vendor: nvidia, name: NVIDIA L40S, memory_gb: 48, slurm_type: l40s,"
            " allowed_per_node: [4, 8]}\n")


def one(findings: list[Finding], field: str, rule: str) -> Finding:
    hits = [f for f in findings if f.field == field and f.rule == rule]
    assert len(hits) == 1, f"expected one {rule} finding at {field}, got:\n" + "\n".join(f.render() for f in findings)
    return hits[0]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rule_refuses_with_location_and_fix(case: Case, write_spec) -> None:
    text, _ = mutate(example_text(case.example), case.old, case.new)
    if "l40s" in case.new:
        text += USER_GPU
    path = write_spec(text)
    f = one(findings_of(path), case.field, case.rule)
    assert f.level == "error"
    line = line_of(text, case.anchor)
    m = RENDERED.match(f.render())
    assert m, f.render()
    assert (m["file"], int(m["line"]), m["field"], m["rule"]) == (str(path), line, case.field, case.rule)
    assert case.fix in f.fix, f.render()
    assert case.message in f.message, f.render()


def test_the_examples_used_load_as_shipped() -> None:
    for name in {c.example for c in CASES.values()}:
        assert findings_of(example_path(name)) == []


def test_user_gpu_loads_with_debian_driver(write_spec) -> None:
    text = example_text("staging").replace("    gpu: h100-sxm5-80g\n", "    gpu: l40s\n") + USER_GPU
    assert findings_of(write_spec(text.replace("fabric:\n", drivers("  source: debian\n"), 1))) == []


def test_debian_is_fine_on_a_board_without_nvswitch(write_spec) -> None:
    """staging has 4 x H100 (direct NVLink, no NVSwitch): the PCIe-style Debian driver is allowed."""
    spec = load_spec(write_spec(example_text("staging").replace("fabric:\n", drivers("  source: debian\n"), 1))).spec
    stack = driver_stack(spec, "gpu")
    assert (stack["source"], stack["fabric_manager"], stack["dcgm"]) == ("debian", False, False)
    assert stack["pins"]["driver"]["version"] == DEBIAN_RELEASES["nvidia"].driver.version


def test_cli_check_exits_2_with_the_located_error(write_spec) -> None:
    text, _ = mutate(example_text("meta-24k-ib"), "fabric:\n", drivers('  fabric_manager_branch: "580"\n'))
    path = write_spec(text)
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    assert res.returncode == 2
    assert f"{path}:{line_of(text, '  fabric_manager_branch:')}: drivers.fabric_manager_branch:" in res.stderr
    assert "[version-mix]" in res.stderr and "Traceback" not in res.stderr


# ---------------------------------------------------------------- what the roles get


@pytest.mark.parametrize("name", ["meta-24k-ib", "frontier-mi250x-roce", "colossus-200k", "staging"])
def test_every_gpu_group_gets_the_locks_default_row(name: str) -> None:
    spec = load_spec(example_path(name)).spec
    stacks = driver_stacks(spec)
    for group in spec.gpu_groups:
        stack = stacks[group.name]
        model = GPUS[group.gpu]
        row = RELEASES[model.vendor][STACKS[group.gpu].default]
        assert (stack["vendor"], stack["branch"], stack["toolkit"]) == (model.vendor, row.branch, row.toolkit)
        assert stack["pins"]["driver"] == {"packages": list(row.driver.packages), "version": row.driver.version}
        assert stack["fabric_manager"] == (group.gpus_per_node in model.nvswitch_at)
        assert ("fabric_manager" in stack["pins"]) == stack["fabric_manager"]


def test_fabric_only_groups_get_the_ofed_default(write_spec) -> None:
    spec = load_spec(write_spec(example_text("meta-24k-ib").replace("fabric:\n", drivers("  ofed: doca\n"), 1))).spec
    stack = driver_stack(spec, "h100")
    assert stack["ofed"]["kind"] == "doca" and stack["peermem"]
    assert stack["ofed"]["version"] == RELEASES["nvidia"][STACKS["h100-sxm5-80g"].default].ofed["doca"]


def test_health_check_names_are_the_node_side_ones() -> None:
    """The spec refuses skip names the node runner would not know: both lists are one."""
    from gpucluster.node import checks

    assert set(HEALTH_CHECKS) == set(checks.BUILTIN)
