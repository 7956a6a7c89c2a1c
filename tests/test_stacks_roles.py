"""The driver-stack roles (nvidia_gpu, amd_gpu, rdma, nccl) and slurm_health without nodes: the house
layout (docs/roles.md), decisions from what a host has (never a staged flag), the filters they call as
plain Python, the playbooks' syntax, and ansible-lint's production profile.

What ran on nodes: the hardware playbook and health.yml in check mode against this (GPU-less) machine,
and the nvidia_gpu role for real on an H100 host with no route to NVIDIA's repository (docs/drivers.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import LINTED_BY_THE_PHASE, ROOT, ansible_lint, example_path, load_file

ROLES = ("nvidia_gpu", "amd_gpu", "rdma", "nccl", "slurm_health")


def _load(path: Path, name: str):
    return load_file(path, name)


filters = _load(ROOT / "plugins" / "filter" / "gpucluster_stacks.py", "gpucluster_stacks_filters_roles")


def _yaml(path: Path):
    return yaml.safe_load(path.read_text()) if path.exists() else None


def _task_files(role: str) -> list[Path]:
    return sorted(p for p in (ROOT / "roles" / role).glob("*/*.yml") if p.parent.name in ("tasks", "handlers"))


def _tasks(role: str):
    def walk(tasks):
        for task in tasks or []:
            yield task
            yield from walk(task.get("block"))

    for path in _task_files(role):
        for task in walk(_yaml(path)):
            yield path, task


@pytest.mark.parametrize("role", ROLES)
def test_house_layout(role: str) -> None:
    base = ROOT / "roles" / role
    for rel in ("meta/argument_specs.yml", "meta/main.yml", "defaults/main.yml", "vars/Debian.yml",
                "tasks/main.yml", "tasks/preflight.yml"):
        assert (base / rel).is_file(), f"roles/{role}/{rel} is missing"
    assert _yaml(base / "tasks" / "main.yml")[0].get("ansible.builtin.import_tasks") == "preflight.yml"


@pytest.mark.parametrize("role", ROLES)
def test_defaults_documented_prefixed_and_in_the_argument_spec(role: str) -> None:
    base = ROOT / "roles" / role
    defaults = _yaml(base / "defaults" / "main.yml") or {}
    lines = (base / "defaults" / "main.yml").read_text().splitlines()
    for var in defaults:
        assert var.startswith(f"{role}_"), f"{role}: {var} lacks the prefix {role}_"
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{var}:"))
        assert lines[at - 1].lstrip().startswith("#"), f"{role}: {var} has no comment above it"
    options = _yaml(base / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(options) - {"gpucluster_spec"} == set(defaults), role
    for var, value in defaults.items():
        if not (isinstance(value, str) and "{{" in value):
            assert options[var].get("default") == value, f"{role}: {var}"


@pytest.mark.parametrize("role", ROLES)
def test_internal_names_and_commands(role: str) -> None:
    for path in (ROOT / "roles" / role / "vars").glob("*.yml"):
        for var in _yaml(path) or {}:
            assert var.startswith(f"__{role}_"), f"{path}: {var}"
    for path, task in _tasks(role):
        if "register" in task:
            assert task["register"].startswith(f"__{role}_"), f"{path}: {task['register']}"
        if any(k in task for k in ("ansible.builtin.command", "ansible.builtin.shell")):
            assert "changed_when" in task, f"{path}: {task.get('name')!r} has no changed_when"


@pytest.mark.parametrize("role", ROLES)
def test_roles_decide_from_the_host_not_from_a_staged_flag(role: str) -> None:
    for path in (ROOT / "roles" / role).rglob("*"):
        if path.is_file():
            assert "gpucluster_staged" not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("role", ["nvidia_gpu", "amd_gpu", "rdma"])
def test_a_source_is_asked_before_it_is_written(role: str) -> None:
    """An unreachable vendor source would break every later apt update: the role probes it first and
    writes the source only inside the block that runs when every probe answered."""
    name = "install.yml" if role != "rdma" else "ofed.yml"
    tasks = _yaml(ROOT / "roles" / role / "tasks" / name)
    probe = next(i for i, t in enumerate(tasks) if "ansible.builtin.uri" in t)
    block = next(i for i, t in enumerate(tasks) if "block" in t)
    assert probe < block
    assert "length == 0" in str(tasks[block]["when"])
    writes = [t for t in tasks[block]["block"] if "ansible.builtin.copy" in t and "sources" in str(t)]
    assert writes, "the source file is written inside the guarded block"
    assert not [t for t in tasks[:block] if "ansible.builtin.copy" in t and "sources" in str(t)]


# ---------------------------------------------------------------- the filters


def test_stand_in_device_files_are_told_from_their_numbers() -> None:
    lines = ["/dev/nvidia0 character special file 1:3", "/dev/nvidia1 character special file c3:1",
             "/dev/nvidia2 regular empty file 0:0"]
    assert filters.device_files(lines) == {"devices": ["/dev/nvidia1"], "stand_ins": ["/dev/nvidia0"]}


def test_probe_report() -> None:
    ok = [{"item": "https://r.example/Release", "status": 200}]
    assert filters.probe_report(ok) == ""
    bad = [*ok, {"item": "https://m.example/x/Release", "status": -1,
                 "msg": "Request failed: <urlopen error [Errno -3] Temporary failure in name resolution>"}]
    assert filters.probe_report(bad) == ("repository not reachable: https://m.example/x/Release (Request failed: "
                                         "<urlopen error [Errno -3] Temporary failure in name resolution>)")
    assert filters.probe_report([{"item": "", "status": -1}]) == (
        "repository not reachable: the node's apt sources name no Debian bookworm mirror")


def test_debian_mirror_from_a_nodes_sources() -> None:
    deb822 = ("Types: deb\nURIs: http://mirror.site.example/debian\nSuites: bookworm bookworm-updates\n"
              "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    one_line = "deb [arch=amd64] http://old.site.example/debian bookworm main\n"
    assert filters.debian_mirror({"/etc/apt/sources.list.d/debian.sources": deb822}) == \
        "http://mirror.site.example/debian"
    assert filters.debian_mirror({"/etc/apt/sources.list": one_line}) == "http://old.site.example/debian"
    assert filters.debian_mirror({"/etc/apt/sources.list": "# nothing\n"}) == ""


def test_library_skip_says_which_of_the_three_is_missing() -> None:
    base = {"host": "gpu01", "vendor": "nvidia", "library": "NCCL", "pci_vendor": "0x10de", "gpus": 1,
            "source_file": "/etc/apt/sources.list.d/gpucluster-nvidia.sources", "source_exists": True,
            "skip_dir": "/var/lib/gpucluster/skipped", "stack": {"source": "cuda-repo", "pins": {"collective": {}}}}
    assert filters.library_skip(base) == ""
    assert filters.library_skip({**base, "gpus": 0}).startswith("no NVIDIA GPU on gpu01 (PCI scan")
    assert "the GPU role skipped the driver, see /var/lib/gpucluster/skipped/nvidia_gpu" in filters.library_skip(
        {**base, "source_exists": False})
    assert filters.library_skip({**base, "stack": {"source": "debian", "pins": {}}}).startswith(
        "the version lock has no NCCL for source debian")


def test_pinned_takes_only_the_roles_parts() -> None:
    stack = {"pins": {"driver": {"packages": ["a", "b"], "version": "1"}, "collective": {"packages": ["c"],
                                                                                          "version": "2"}}}
    assert filters.pinned(stack, ["driver", "dcgm"]) == {"a": "1", "b": "1"}


# ---------------------------------------------------------------- Debian releases and the repository's names


def _release(role: str, major: int) -> dict:
    """The role's data for one Debian release: vars/Debian.yml, overridden by vars/Debian-<major>.yml."""
    base = _yaml(ROOT / "roles" / role / "vars" / "Debian.yml")
    return {**base, **(_yaml(ROOT / "roles" / role / "vars" / f"Debian-{major}.yml") or {})}[f"__{role}_release"]


def _nvidia_stack(**kw) -> dict:
    stack = {"group": "h100", "vendor": "nvidia", "source": "cuda-repo", "branch": "570", "repositories": [
        {"name": "gpucluster-cuda", "uri": "https://dl.example/compute/cuda/repos/debian12/x86_64/",
         "key": "https://dl.example/compute/cuda/repos/debian12/x86_64/k.pub",
         "probe": "https://dl.example/compute/cuda/repos/debian12/x86_64/Release"}],
        "pins": {"driver": {"packages": ["nvidia-driver", "libcuda1"], "version": "570.172.08-1"},
                 "fabric_manager": {"packages": ["nvidia-fabricmanager", "libnvidia-nscq"],
                                    "version": "570.172.08-1"}}}
    return {**stack, **kw}


@pytest.mark.parametrize("role", ["nvidia_gpu", "amd_gpu"])
def test_every_release_the_role_claims_has_its_data(role: str) -> None:
    majors = {"bookworm": 12, "trixie": 13}
    platforms = _yaml(ROOT / "roles" / role / "meta" / "main.yml")["galaxy_info"]["platforms"][0]["versions"]
    assert set(platforms) == set(majors)
    for name, major in majors.items():
        assert _release(role, major)["name"] == f"Debian {major}", name


def test_debian_12_takes_every_row_of_the_lock() -> None:
    assert filters.release_refusal(_nvidia_stack(), _release("nvidia_gpu", 12)) == ""
    assert filters.release_refusal(_nvidia_stack(source="debian", branch="535"), _release("nvidia_gpu", 12)) == ""
    assert filters.release_refusal({"vendor": "amd", "source": "rocm-repo", "branch": "6.3.3"},
                                   _release("amd_gpu", 12)) == ""


def test_debian_13_refuses_what_nvidia_does_not_publish_for_it() -> None:
    why = filters.release_refusal(_nvidia_stack(), _release("nvidia_gpu", 13))
    assert why.startswith("node group 'h100' is locked to driver branch 570, and the vendor repository for "
                          "Debian 13 starts at 590"), why
    assert "run these nodes on Debian 12, or add a 590+ row to the version lock" in why
    assert filters.release_refusal(_nvidia_stack(branch="590"), _release("nvidia_gpu", 13)) == ""
    assert "Debian 12 only" in filters.release_refusal(_nvidia_stack(source="debian", branch="535"),
                                                       _release("nvidia_gpu", 13))
    amd = filters.release_refusal({"group": "mi", "vendor": "amd", "source": "rocm-repo", "branch": "6.3.3"},
                                  _release("amd_gpu", 13))
    assert "ROCm 6.3.3" in amd and "run these nodes on Debian 12" in amd


def test_the_repository_path_follows_the_release() -> None:
    stack = filters.for_release(_nvidia_stack(), _release("nvidia_gpu", 13))
    repo = stack["repositories"][0]
    assert [repo[k].count("/debian13/") for k in ("uri", "key", "probe")] == [1, 1, 1]
    assert filters.for_release(_nvidia_stack(), _release("nvidia_gpu", 12)) == _nvidia_stack()


def test_the_repository_names_of_the_driver_and_fabric_manager() -> None:
    names = _yaml(ROOT / "roles" / "nvidia_gpu" / "vars" / "Debian.yml")["__nvidia_gpu_names"]
    parts = ["driver", "fabric_manager"]
    assert filters.nvidia_packages(_nvidia_stack(), parts, names) == {
        "nvidia-driver-cuda": "570.172.08-1", "libcuda1": "570.172.08-1",
        "nvidia-fabricmanager-570": "570.172.08-1", "libnvidia-nscq-570": "570.172.08-1"}
    assert set(filters.nvidia_packages(_nvidia_stack(branch="580"), parts, names)) == {
        "nvidia-driver-cuda", "libcuda1", "nvidia-fabricmanager", "libnvidia-nscq"}
    assert set(filters.nvidia_packages(_nvidia_stack(), parts, names, False)) >= {"nvidia-driver"}
    assert set(filters.nvidia_packages(_nvidia_stack(source="debian"), ["driver"], names)) == {"libcuda1"}


def test_the_branch_lock_pins_only_driver_shaped_versions() -> None:
    text = filters.branch_lock(_nvidia_stack(), ["*nvidia*", "libcuda*"])
    records = [r for r in text.split("\n\n") if r.startswith("Package:")]
    assert records == ["Package: *nvidia* libcuda*\nPin: version 570.172.08-1\nPin-Priority: 1001",
                       "Package: *nvidia* libcuda*\nPin: version /^570\\./\nPin-Priority: 500",
                       "Package: *nvidia* libcuda*\nPin: version /^[0-9]{3}\\.[0-9]+/\nPin-Priority: -1\n"]
    assert filters.branch_lock({"vendor": "amd", "pins": {"driver": {"version": "1"}}}, ["*"]) == ""


@pytest.mark.parametrize("role", ["nvidia_gpu", "amd_gpu"])
def test_what_a_gpu_role_installs_at_a_locked_version_it_holds(role: str) -> None:
    """The apt task installs {package: version} through gpucluster_apt_names; the dpkg task holds exactly those
    packages (tests/test_gpu_repo.py shows, with real dpkg and apt, what a hold keeps for nvidia_gpu)."""
    block = next(t for t in _yaml(ROOT / "roles" / role / "tasks" / "install.yml") if "block" in t)["block"]
    installs = [t["gpucluster_apt"]["name"] for t in block
                if "gpucluster_apt_names" in str((t.get("gpucluster_apt") or {}).get("name"))]
    assert len(installs) == 1, installs
    pinned = re.fullmatch(r"\{\{ (\w+) \| gpucluster_apt_names \}\}", installs[0]).group(1)
    holds = [t for t in block if "ansible.builtin.dpkg_selections" in t]
    assert [(t["ansible.builtin.dpkg_selections"], t["loop"]) for t in holds] == [
        ({"name": "{{ item }}", "selection": "hold"}, f"{{{{ {pinned}.keys() | list }}}}")]


def test_health_filter_is_the_health_package(tmp_path: Path) -> None:
    """The role's health data is what gpucluster.render.health compiled (never the spec parsed again)."""
    from gpucluster.cluster import load_cluster
    from gpucluster.compiled import compile_to

    compile_to(load_cluster(example_path("staging")), tmp_path / "state")
    data = filters.health(str(tmp_path / "state"))
    assert set(data) == {"enabled", "paths", "scripts_dir", "scripts", "wrapper", "configs", "units", "slurm_conf",
                         "active", "domain_guard"}
    assert list(data["configs"]) == ["gpu"]
    assert not data["domain_guard"]  # staging has no NVLink domain: no guard to install
    assert filters.driver_stack(str(tmp_path / "state"), "gpu")["group"] == "gpu"


# ---------------------------------------------------------------- Ansible itself


def _inventory(tmp_path: Path) -> Path:
    from gpucluster.cluster import load_cluster
    from gpucluster.inventory import write_inventory

    cluster = load_cluster(example_path("staging"))
    return write_inventory(tmp_path, cluster, extra_vars={
        "gpucluster_spec": str(example_path("staging")), "gpucluster_state_dir": str(tmp_path / "state"),
        "gpucluster_secrets_dir": str(tmp_path / "state" / "secrets")})


@pytest.mark.parametrize("playbook", ["hardware.yml", "health.yml"])
def test_playbook_syntax(tmp_path: Path, playbook: str) -> None:
    exe = Path(sys.executable).parent / "ansible-playbook"
    if not exe.exists():
        pytest.skip("ansible-playbook is not installed here (pip install -e '.[ops]')")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    res = subprocess.run([str(exe), "-i", str(_inventory(tmp_path)), f"playbooks/{playbook}", "--syntax-check"],
                         cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0, res.stderr + res.stdout


def test_health_playbook_tags_the_role() -> None:
    play = next(p for p in _yaml(ROOT / "playbooks" / "health.yml") if "roles" in p)
    assert set(play["hosts"].split(":")) == {"slurm_compute", "slurm_controller"}
    assert play["roles"][0] == {"role": "slurm_health", "tags": ["slurm", "health"]}


def test_ansible_lint_production_profile() -> None:
    res = ansible_lint([f"roles/{r}" for r in ROLES] + ["playbooks/hardware.yml", "playbooks/health.yml"], offline=True)
    if res is None:
        pytest.skip(LINTED_BY_THE_PHASE)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert not re.search(r"^\S+:\d+", res.stdout, re.M)
