"""The metrics role's dcgm-exporter pin against a real apt, on a local repository of stand-in packages.

NVIDIA's repository is not reachable from here, so the test builds one the way tests/test_gpu_repo.py does for the
driver: STAND-INS, empty packages made with dpkg-deb whose names and versions copy NVIDIA's CUDA repository:
- DCGM 4 (datacenter-gpu-manager-4-core) at the lock's 570 row (1:4.2.3-1) and its 580 row (1:4.4.1-1);
- datacenter-gpu-manager-exporter at the version the lock pairs with DCGM 4.2.3 (4.1.3-1) and a newer release
  (4.5.0-1, a stand-in), each depending on datacenter-gpu-manager-4-core (>= 1:4): the one dependency a packaging of
  the exporter's RPM declares, with no upper bound. Whether NVIDIA's Debian package states more is not confirmed
  here. With that dependency apt alone takes the newest exporter against any DCGM 4 (the trap below): only the pin
  keeps the exporter on the release built for the node's DCGM.

apt-get runs with a private configuration (test_gpu_repo.Apt: sources, state, cache and preferences in tmp_path, a
trusted file: source, dpkg on a private database) through the files the role writes: the exporter's pin rendered
for the group (render/metrics.py, the role copies it byte for byte) and the nvidia_gpu role's DCGM pin (rendered
beside it), and installs what the role's install task asks for, its expression evaluated on the rendered
prometheus-exporters.json. The dpkg hold is applied as the role's task states it, with real dpkg.

Not run: NVIDIA's real repository and package, the exporter's unit, its port or its metrics (no GPU here).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, cluster_example, compiled, example_data, spec_from_data
from test_gpu_repo import Apt, _build_repo, _installed, _task, role_eval

from gpucluster.catalog import RELEASES
from gpucluster.render.fileset import render_all
from gpucluster.render.metrics import EXPORTERS, dcgm_exporters

pytestmark = pytest.mark.skipif(not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("dpkg")),
                                reason="needs apt-get, dpkg and dpkg-deb (Debian)")

ROLE = ROOT / "roles" / "metrics"
EXAMPLE = "meta-24k-ib"  # NVIDIA H100 groups on the lock's default row (570)
GROUP = "h100"
EXPORTER = "datacenter-gpu-manager-exporter"
NEWER = "4.5.0-1"  # a stand-in later exporter release (not in the lock)
DCGM = "datacenter-gpu-manager-4-core"


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_all(cluster_example(EXAMPLE), cabling=False)


@pytest.fixture(scope="module")
def facts(rendered) -> dict:
    return json.loads(rendered[EXPORTERS])


@pytest.fixture(scope="module")
def locked(facts) -> str:
    return facts["dcgm_exporter"]["groups"][GROUP]["version"]


def _stanzas(locked: str) -> list[dict[str, str]]:
    dcgm_versions = [RELEASES["nvidia"][b].dcgm.version for b in ("570", "580")]
    out = [{"Package": DCGM, "Version": v, "Depends": ""} for v in dcgm_versions]
    out += [{"Package": EXPORTER, "Version": v, "Depends": f"{DCGM} (>= 1:4)"} for v in (locked, NEWER)]
    return out


@pytest.fixture(scope="module")
def apt(tmp_path_factory, locked) -> Apt:
    root = tmp_path_factory.mktemp("apt")
    return Apt(root, _build_repo(root, _stanzas(locked)))


def _role_pins(rendered: dict[str, str], facts: dict) -> dict[str, str]:
    """The preference files on a node of the group: the nvidia_gpu role's part pins (DCGM among them) and the
    metrics role's exporter pin, as rendered (the roles copy them as they are)."""
    exporter = facts["dcgm_exporter"]["groups"][GROUP]["pins"]
    return {"gpucluster-nvidia": rendered[f"apt-nvidia_gpu-{GROUP}.pref"],
            "gpucluster-dcgm-exporter": rendered[exporter]}


def _block() -> tuple[list[dict], dict]:
    """The role's install block and its vars (tasks/dcgm_exporter.yml)."""
    block = _task(ROLE / "tasks" / "dcgm_exporter.yml", lambda t: "block" in t)
    return block["block"], block["vars"]


def _role_install(facts: dict) -> list[str]:
    """NAME=VERSION as the role's install task asks apt for them, on the rendered facts."""
    block, block_vars = _block()
    variables = {"__metrics": facts, "gpucluster_node_group": GROUP}
    variables["__metrics_dcgm"] = role_eval(block_vars["__metrics_dcgm"], variables)
    task = next(t for t in block if "gpucluster_apt" in t)
    return list(role_eval(task["gpucluster_apt"]["name"], variables))


def _role_hold(facts: dict) -> tuple[list[str], str]:
    block, block_vars = _block()
    variables = {"__metrics": facts, "gpucluster_node_group": GROUP}
    variables["__metrics_dcgm"] = role_eval(block_vars["__metrics_dcgm"], variables)
    task = next(t for t in block if "ansible.builtin.dpkg_selections" in t)
    return list(role_eval(task["loop"], variables)), task["ansible.builtin.dpkg_selections"]["selection"]


def test_the_lock_pairs_the_exporter_with_the_groups_dcgm(facts, locked) -> None:
    exporter = facts["dcgm_exporter"]["groups"][GROUP]
    assert exporter["dcgm"] == RELEASES["nvidia"]["570"].dcgm.version
    assert exporter["packages"] == {EXPORTER: RELEASES["nvidia"]["570"].dcgm_exporter.version}
    assert _role_install(facts) == [f"{EXPORTER}={locked}"]


def test_the_stand_in_repository_has_the_trap(apt: Apt) -> None:
    """No pins: apt takes the newest exporter against the locked DCGM (the dependency allows any DCGM 4). Without
    this the tests below would prove nothing."""
    apt.pins({})
    rc, inst, said = apt.simulate("install", EXPORTER)
    assert rc == 0 and inst[EXPORTER] == NEWER, said


def test_the_locked_version_installs(apt: Apt, rendered, facts, locked) -> None:
    apt.pins(_role_pins(rendered, facts))
    rc, inst, said = apt.simulate("install", *_role_install(facts))
    assert rc == 0, said
    assert inst[EXPORTER] == locked and inst[DCGM] == RELEASES["nvidia"]["570"].dcgm.version, said


def test_asked_for_without_a_version_it_stays_on_the_lock(apt: Apt, rendered, facts, locked) -> None:
    """An operator's `apt install datacenter-gpu-manager-exporter`, or a dependency: the locked version."""
    apt.pins(_role_pins(rendered, facts))
    rc, inst, said = apt.simulate("install", EXPORTER)
    assert rc == 0 and inst[EXPORTER] == locked, said


def test_another_version_is_refused(tmp_path: Path, apt: Apt, rendered, facts, locked) -> None:
    """On a node the role installed, the newer release asked for by version is refused (the hold), and the exporter
    stays. (Before the install, apt takes a version named on its command line over any pin, -1 included: measured
    here with apt 2.6; the -1 keeps every other version out of upgrades and dependencies, the policy test below.)"""
    target = _installed_by_the_role(tmp_path, apt, rendered, facts)
    res = target.run("apt-get", "install", "-y", f"{EXPORTER}={NEWER}", check=False)
    assert res.returncode != 0 and "held" in (res.stdout + res.stderr).lower(), res.stdout + res.stderr
    assert _installed(target)[EXPORTER] == locked


def test_apt_sees_the_locked_version_at_1001_and_no_other(apt: Apt, rendered, facts, locked) -> None:
    apt.pins(_role_pins(rendered, facts))
    policy = apt.run("apt-cache", "policy", EXPORTER).stdout
    table = dict(re.findall(r"^ {5}(\S+) (-?\d+)$", policy.replace(" *** ", "     "), re.M))
    assert table == {locked: "1001", NEWER: "-1"}, policy


def _installed_by_the_role(tmp_path: Path, apt: Apt, rendered, facts, hold: bool = True) -> Apt:
    """A target root where apt-get and dpkg really installed what the role installs (the stand-ins unpack as any
    user), with the role's pins and its dpkg hold applied as its task states it."""
    target = Apt(tmp_path, apt.root / "repo")
    target.pins(_role_pins(rendered, facts))
    target.run("apt-get", "install", "-y", *_role_install(facts))
    held, selection = _role_hold(facts)
    assert held == [EXPORTER] and selection == "hold"
    if not hold:
        return target
    subprocess.run(["dpkg", f"--admindir={target.admindir}", "--set-selections"], check=True, text=True,
                   input="".join(f"{p} {selection}\n" for p in held), capture_output=True)
    return target


@pytest.mark.parametrize(("pins_kept", "held"), [(True, True), (True, False), (False, True)],
                         ids=["pins-and-hold", "the-pins-alone", "the-hold-alone"])
def test_the_pin_survives_a_dist_upgrade(tmp_path: Path, apt: Apt, rendered, facts, locked, pins_kept: bool,
                                         held: bool) -> None:
    """A real install (apt-get and dpkg unpack the stand-ins into a target root) of what the role installs, then a
    real dist-upgrade with the newer exporter in the repository: with the pins and the hold, with the pins alone,
    and with the pins lost (the hold alone), the exporter stays on the locked version."""
    target = _installed_by_the_role(tmp_path, apt, rendered, facts, hold=held)
    assert _installed(target)[EXPORTER] == locked
    if not pins_kept:
        target.pins({})
    said = target.run("apt-get", "dist-upgrade", "-y").stdout
    assert _installed(target)[EXPORTER] == locked, said


def test_a_group_whose_row_pairs_no_exporter_is_skipped_with_the_reason() -> None:
    """The 580 row pairs no exporter (none confirmed for DCGM 4.4.1): its groups get no pin, and the role's skip
    record says why."""
    data = example_data("staging")
    data["drivers"] = {"branch": "580"}
    found, skipped = dcgm_exporters(compiled(spec_from_data(data)))
    assert not found and skipped, (found, skipped)
    assert RELEASES["nvidia"]["580"].dcgm_exporter is None
    assert all("pairs no dcgm-exporter" in why and "catalog.releases" in why for why in skipped.values())
    main = yaml.safe_load((ROLE / "tasks" / "dcgm_exporter.yml").read_text())
    reason = next(t for t in main if "__metrics_dcgm_skipped" in (t.get("ansible.builtin.set_fact") or {}))
    group = next(iter(skipped))
    said = role_eval(reason["ansible.builtin.set_fact"]["__metrics_dcgm_skipped"],
                     {"__metrics": {"dcgm_exporter": {"skipped": skipped}}, "gpucluster_node_group": group})
    assert str(said).strip() == f"dcgm-exporter skipped: {skipped[group]}"
