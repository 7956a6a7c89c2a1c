"""The arm64 (Grace: GB200/GB300 trays) install path of the nvidia_gpu and nccl roles, against a real apt resolving
for arm64, on a local repository of stand-in packages.

NVIDIA's repository is not reachable from here, so the test builds the two trees of its Debian 12 repository the
lock names (catalog.REPOSITORIES_BY_ARCH), under the same paths, on a local folder: the sbsa tree with
`Architecture: arm64` STAND-INS (empty packages made with dpkg-deb, the helpers of tests/test_gpu_repo.py) and the
x86_64 tree with amd64 ones. They copy the structure of NVIDIA's packages as tests/test_gpu_repo.py describes
(exact-version dependencies within a driver version, "this branch or later" ones, nvidia-imex-<branch> before 580,
the plain names from 580), at these versions:
- the driver of the lock's 570 row (GB200's default) and of its 580 row (GB300's), a later point release of each
  branch that is not in the lock (570.181.01-1, 580.105.08-1) and a newer branch that is in no row (590.44.01-1);
- DCGM, the CUDA toolkit and NCCL at each row's versions, and a newer NCCL of each CUDA line (not in the lock);
- Debian's own packages the driver needs (dkms, nvidia-support, an X server), built as arm64 here: in Debian they
  are `Architecture: all`, which dpkg counts as its native architecture, and this machine's dpkg is amd64, on which
  an arm64 package's dependency is met only by an arm64 one (or Multi-Arch: foreign); on an arm64 node `all` is
  the native architecture, so arm64 stand-ins resolve as Debian's would there.

apt runs as an arm64 node's would: APT::Architecture (and APT::Architectures) arm64 on a private configuration
(sources, state, cache, preferences in tmp_path), reading the deb822 sources the role itself writes for the node's
architecture fact (the role's own preflight and install expressions, evaluated with the project's filters; the
lock's URL prefix mapped onto the local folder, its Signed-By onto `Trusted: yes`). The real install unpacks into a
target root with this machine's dpkg (amd64) on a private database to which arm64 was added as a foreign
architecture (dpkg --add-architecture): dpkg checks and unpacks the arm64 packages and their dependencies, and
keeps their holds, as on an arm64 node. Nothing is emulated: no arm64 binary runs (the stand-ins hold no files or
maintainer scripts), and no qemu is used. Not run: NVIDIA's real sbsa packages, a driver's DKMS build on an arm64
kernel, an arm64 dpkg.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import ROOT, example_path, example_text, line_of
from test_gpu_repo import ROLE, ROLE_VARS, Apt, _build_repo, _driver_set, _task, filters, role_eval, role_pins_of

from gpucluster.catalog import RELEASES, REPOSITORIES_BY_ARCH

pytestmark = pytest.mark.skipif(not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("dpkg")),
                                reason="needs apt-get, dpkg and dpkg-deb (Debian)")

EXAMPLES = {"gb200-superpod": "gb200", "gb300-nvl72": "gb300"}  # example -> its GPU group
NEWER_POINT = {"570": "570.181.01-1", "580": "580.105.08-1"}  # a later release of each branch, in no row
NEWER_BRANCH = "590.44.01-1"  # a branch in no row of the lock
OWN_VERSION = {"570": "570.124.06-1", "580": "580.65.06-1", "590": "590.44.01-1"}  # nvidia-modprobe's own
NEWER_NCCL = {"12.8": "2.27.7-1+cuda12.8", "13.0": "2.29.2-1+cuda13.0"}
FACT = {"arm64": "aarch64", "x86_64": "x86_64"}  # the lock's architecture -> ansible_facts['architecture']
NCCL_PARTS = yaml.safe_load((ROOT / "roles" / "nccl" / "vars" / "Debian.yml").read_text())["__nccl_parts"]["nvidia"]


@cache
def _compiled(example: str) -> tuple[str, dict]:
    """The example compiled into a private folder as configure's compile play leaves it, and its GPU group's
    stack as the role reads it (gpucluster_driver_stack)."""
    import atexit
    import tempfile

    from gpucluster.cluster import load_cluster
    from gpucluster.compiled import compile_to

    top = tempfile.mkdtemp(prefix="gpc-arm64-repo-")
    atexit.register(shutil.rmtree, top, True)
    state = Path(top) / "state"
    compile_to(load_cluster(example_path(example)), state)
    return str(state), filters.driver_stack(str(state), EXAMPLES[example])


# ---------------------------------------------------------------- the stand-in repository


def _driver_stanzas(version: str) -> list[dict[str, str]]:
    out = []
    for name, depends in _driver_set(version).items():
        extra = {}
        if name.startswith(("nvidia-fabricmanager-", "libnvidia-nscq-", "nvidia-imex-")):
            plain = name.rsplit("-", 1)[0]
            extra = {"Provides": plain, "Conflicts": plain, "Replaces": plain}
        out.append({"Package": name, "Version": version, "Depends": depends, **extra})
    return out


def _stanzas() -> list[dict[str, str]]:
    """The sbsa tree: both rows' closures, the later point releases and the newer branch."""
    rows = [RELEASES["nvidia"][b] for b in ("570", "580")]
    out = []
    for v in (*(r.driver.version for r in rows), *NEWER_POINT.values(), NEWER_BRANCH):
        out += _driver_stanzas(v)
    for branch, own in OWN_VERSION.items():
        out += [{"Package": "nvidia-modprobe", "Version": own, "Depends": ""},
                {"Package": f"nvidia-driver-pinning-{branch}", "Version": f"{branch}-1", "Depends": ""}]
    for row in rows:
        out += [{"Package": p, "Version": row.dcgm.version, "Depends": ""} for p in row.dcgm.packages]
        toolkit = row.runtime.version.replace("*", "2-1")  # 12.8.* -> 12.8.2-1
        out += [{"Package": p, "Version": toolkit, "Depends": ""} for p in row.runtime.packages]
        for v in (row.collective.version, NEWER_NCCL[row.toolkit]):
            out += [{"Package": "libnccl2", "Version": v, "Depends": ""},
                    {"Package": "libnccl-dev", "Version": v, "Depends": f"libnccl2 (= {v})"}]
    return [dict(s) for s in {tuple(sorted(s.items())): s for s in out}.values()]  # once each (shared DCGM core)


DEBIAN = [{"Package": p, "Version": v, "Depends": ""} for p, v in
          (("dkms", "3.0.10-8"), ("nvidia-support", "20240109+1"), ("xserver-xorg-core", "2:21.1.7-3"))]


def _tree(arch: str) -> str:
    """The lock's repository path for an architecture (the CUDA repository's single tree)."""
    (repo,) = REPOSITORIES_BY_ARCH[arch]["cuda-repo"]
    return urlsplit(repo.uri).path


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A folder serving the lock's two trees at their own paths: sbsa (arm64 stand-ins) and x86_64 (amd64 ones)."""
    root = tmp_path_factory.mktemp("nvidia-mirror")
    srv = root / "srv"
    _build_repo(root / "build-arm64", _stanzas() + DEBIAN, arch="arm64", repo=srv / _tree("arm64").strip("/"))
    x86 = RELEASES["nvidia"]["570"].driver.version
    _build_repo(root / "build-amd64", _driver_stanzas(x86), arch="amd64", repo=srv / _tree("x86_64").strip("/"))
    return srv


# ---------------------------------------------------------------- the role's own expressions, for a node's fact


def role_variables(example: str, architecture: str) -> dict:
    """The role's vars and defaults, and this host's stack as preflight sets it from the node's facts."""
    state, stack = _compiled(example)
    variables = {**yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()), **ROLE_VARS,
                 "gpucluster_state_dir": state, "ansible_facts": {"architecture": architecture}}
    task = _task(ROLE / "tasks" / "preflight.yml",
                 lambda t: "__nvidia_gpu_stack" in (t.get("ansible.builtin.set_fact") or {}))
    variables["__nvidia_gpu_stack"] = role_eval(task["ansible.builtin.set_fact"]["__nvidia_gpu_stack"], {
        **variables, "__nvidia_gpu_stacks": {stack["group"]: stack}, "gpucluster_node_group": stack["group"]})
    return variables


def _install(variables: dict) -> tuple[list[dict], dict]:
    """install.yml's block and its variables: the files with the node's URIs (its first set_fact, as the role
    runs it with no Debian mirror needed: source cuda-repo), then the block's own vars."""
    variables = dict(variables)
    files = _task(ROLE / "tasks" / "install.yml",
                  lambda t: "__nvidia_gpu_files" in (t.get("ansible.builtin.set_fact") or {}))
    variables["__nvidia_gpu_files"] = role_eval(files["ansible.builtin.set_fact"]["__nvidia_gpu_files"],
                                                {**variables, "__nvidia_gpu_apt_texts": {"results": []}})
    block = _task(ROLE / "tasks" / "install.yml", lambda t: "block" in t)
    for name, expr in block.get("vars", {}).items():
        variables[name] = role_eval(expr, variables)
    return block["block"], variables


def role_sources(variables: dict, served: Path) -> str:
    """The deb822 sources install.yml writes, the lock's URL prefix mapped onto the local folder."""
    _block, variables = _install(variables)
    text = variables["__nvidia_gpu_files"]["sources"]
    for arch in REPOSITORIES_BY_ARCH:
        (repo,) = REPOSITORIES_BY_ARCH[arch]["cuda-repo"]
        base = urlsplit(repo.uri)
        text = text.replace(f"{base.scheme}://{base.netloc}", f"file:{served}")
    return re.sub(r"^Signed-By: .*$", "Trusted: yes", text, flags=re.M)


def role_pins(variables: dict) -> dict[str, str]:
    """The preferences files the nvidia_gpu role (part pins, branch lock) and the nccl role write."""
    stack = variables["__nvidia_gpu_stack"]
    return {**role_pins_of(variables),
            "gpucluster-nccl": filters.driver_files(variables["gpucluster_state_dir"], stack, "nccl")["pins"]}


def role_install(variables: dict) -> list[str]:
    """NAME=VERSION of everything the roles install on a tray: nvidia_gpu's driver and DCGM, its IMEX, and the
    nccl role's CUDA toolkit and NCCL (gpucluster_pinned of its parts)."""
    block, ivars = _install(variables)
    task = next(t for t in block if "driver" in t["name"] and "gpucluster_apt" in t)
    names = list(role_eval(task["gpucluster_apt"]["name"], ivars))
    imex = _task(ROLE / "tasks" / "imex.yml", lambda t: "block" in t)
    ivars.update({k: role_eval(v, ivars) for k, v in imex["vars"].items()})
    names += list(role_eval(next(t for t in imex["block"] if "gpucluster_apt" in t)["gpucluster_apt"]["name"], ivars))
    return names + [f"{p}={v}" for p, v in filters.pinned(variables["__nvidia_gpu_stack"], NCCL_PARTS).items()]


def role_hold(variables: dict) -> tuple[list[str], str]:
    block, ivars = _install(variables)
    task = next(t for t in block if "ansible.builtin.dpkg_selections" in t)
    return list(role_eval(task["loop"], ivars)), task["ansible.builtin.dpkg_selections"]["selection"]


def _arm64_apt(root: Path, served: Path, example: str, architecture: str = "aarch64") -> tuple[Apt, dict]:
    variables = role_variables(example, architecture)
    apt = Apt(root, served, arch="arm64", sources=role_sources(variables, served))
    apt.pins(role_pins(variables))
    return apt, variables


def _installed(apt: Apt) -> dict[str, tuple[str, str]]:
    out = apt.run("dpkg-query", f"--admindir={apt.admindir}", "-W", "-f", "${Package} ${Version} ${Architecture}\\n")
    return {p: (v, a) for p, v, a in (line.split(" ") for line in out.stdout.splitlines() if line)}


def _driver_shaped(version: str) -> bool:
    return bool(re.match(filters.DRIVER_SHAPED.strip("/"), version))


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize(("lock_arch", "other"), [("arm64", "x86_64"), ("x86_64", "arm64")])
def test_the_role_takes_the_tree_of_the_nodes_architecture_fact(example: str, lock_arch: str, other: str) -> None:
    """The role's own preflight and install expressions: the sources and the signing key of the fact's tree."""
    variables = role_variables(example, FACT[lock_arch])
    _block, ivars = _install(variables)
    uris = re.findall(r"^URIs: (.*)$", ivars["__nvidia_gpu_files"]["sources"], re.M)
    assert [urlsplit(u).path for u in uris] == [_tree(lock_arch)]
    assert [r["key"] for r in variables["__nvidia_gpu_stack"]["repositories"]] == \
        [REPOSITORIES_BY_ARCH[lock_arch]["cuda-repo"][0].key]
    assert ivars["__nvidia_gpu_files"]["probes"] == [uris[0].rstrip("/") + "/Release"]
    assert _tree(other) not in ivars["__nvidia_gpu_files"]["sources"]


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize(("architecture", "refused"), [("aarch64", ""), ("x86_64", "x86_64"), ("ppc64le", "ppc64le")])
def test_preflight_refuses_a_host_of_another_architecture(example: str, architecture: str, refused: str) -> None:
    """The role's own assert, evaluated: a GB200/GB300 group's host reporting anything but aarch64 is refused with
    the fix; an aarch64 one passes, and so does the Debian 12 release assert before it."""
    variables = role_variables(example, architecture)
    release = _task(ROLE / "tasks" / "main.yml", lambda t: "gpucluster_release_refusal" in str(t.get("vars")))
    on_release = {**variables, **{k: role_eval(v, variables) for k, v in release["vars"].items()}}
    assert all(role_eval(c, on_release) for c in release["ansible.builtin.assert"]["that"])
    task = _task(ROLE / "tasks" / "main.yml", lambda t: "gpucluster_arch_refusal" in str(t.get("vars")))
    variables.update({k: role_eval(v, variables) for k, v in task["vars"].items()})
    passed = all(role_eval(c, variables) for c in task["ansible.builtin.assert"]["that"])
    assert passed is not bool(refused)
    assert role_eval(task["when"], {**variables, "__nvidia_gpu_present": True}) is True
    message = str(role_eval(task["ansible.builtin.assert"]["fail_msg"], {**variables, "inventory_hostname": "gb01"}))
    if refused:
        assert message.startswith(f"gb01: node group '{EXAMPLES[example]}' has {EXAMPLES[example]} GPUs, whose "
                                  f"hosts are arm64 (the catalog's host_arch), and this host reports {refused}: "), \
            message


def test_preflight_refuses_an_architecture_the_lock_has_no_repository_for() -> None:
    """A stack whose source the lock has no arm64 build of (the spec refuses it first: ROCm on arm64), on an
    aarch64 host of its own architecture: refused, naming the source."""
    variables = role_variables("gb200-superpod", "aarch64")
    stack = {**variables["__nvidia_gpu_stack"], "source": "rocm-repo"}
    stack["arch_repositories"] = {"x86_64": stack["arch_repositories"]["x86_64"]}
    task = _task(ROLE / "tasks" / "main.yml", lambda t: "gpucluster_arch_refusal" in str(t.get("vars")))
    refusal = role_eval(task["vars"]["__nvidia_gpu_arch_refusal"], {**variables, "__nvidia_gpu_stack": stack})
    assert refusal == ("node group 'gb200' takes gb200 drivers from rocm-repo, for which the version lock has no "
                       "arm64 repository: use x86_64 hosts for it, or drivers source: debian")


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_locked_closure_installs_for_arm64_and_the_pins_survive_a_dist_upgrade(tmp_path: Path, served: Path,
                                                                                   example: str) -> None:
    """A real install of everything the roles install on a tray, resolved by apt as arm64 from the sbsa tree the
    role chose; then, with the pins in place, a dist-upgrade (the later point release, the newer branch and a newer
    NCCL are there) moves nothing; with the preferences gone, the role's holds keep every package it installed."""
    apt, variables = _arm64_apt(tmp_path, served, example)
    stack = variables["__nvidia_gpu_stack"]
    locked, branch = stack["pins"]["driver"]["version"], stack["branch"]
    said = apt.run("apt-get", "install", "-y", *role_install(variables)).stdout
    installed = _installed(apt)
    assert {p: va for p, va in installed.items() if va[1] not in ("arm64", "all")} == {}, said
    assert {p: v for p, (v, _a) in installed.items()
            if _driver_shaped(v) and v not in (locked, OWN_VERSION[branch])} == {}, said
    for part in ("dcgm", "collective"):
        for package in stack["pins"][part]["packages"]:
            assert installed[package][0] == stack["pins"][part]["version"], said
    (toolkit,) = stack["pins"]["runtime"]["packages"]
    assert installed[toolkit][0].startswith(stack["toolkit"] + "."), said
    imex = "nvidia-imex" if int(branch) >= 580 else f"nvidia-imex-{branch}"
    assert installed[imex] == (locked, "arm64") and installed["nvidia-driver-cuda"] == (locked, "arm64"), said
    assert "nvidia-driver" not in installed and "xserver-xorg-core" not in installed, said
    rc, moved, said = apt.simulate("dist-upgrade")
    assert rc == 0 and moved == {}, said
    held, selection = role_hold(variables)
    subprocess.run(["dpkg", f"--admindir={apt.admindir}", "--set-selections"], check=True, text=True,
                   input="".join(f"{p} {selection}\n" for p in held), capture_output=True)
    apt.pins({})
    said = apt.run("apt-get", "dist-upgrade", "-y").stdout
    after = _installed(apt)
    assert {p: after[p] for p in held if after[p] != installed[p]} == {}, said


@pytest.mark.parametrize("example", EXAMPLES)
def test_another_branch_is_refused_on_arm64(tmp_path: Path, served: Path, example: str) -> None:
    """Asked for without a version, the locked version; asked for another branch's by version (the other row's, the
    newer branch's), refused; apt-cache policy gives every version of another branch -1."""
    apt, variables = _arm64_apt(tmp_path, served, example)
    stack = variables["__nvidia_gpu_stack"]
    locked = stack["pins"]["driver"]["version"]
    rc, inst, said = apt.simulate("install", "libcuda1", "nvidia-driver-cuda")
    assert rc == 0 and inst == {**inst, "libcuda1": locked, "nvidia-driver-cuda": locked}, said
    served_versions = (*(RELEASES["nvidia"][b].driver.version for b in ("570", "580")), *NEWER_POINT.values(),
                       NEWER_BRANCH)
    others = [v for v in served_versions if v.split(".")[0] != stack["branch"]]
    for other in others:
        rc, _inst, said = apt.simulate("install", f"libcuda1={other}")
        assert rc != 0, said
    policy = apt.run("apt-cache", "policy", "libcuda1").stdout
    table = dict(re.findall(r"^ {5}(\S+) (-?\d+)$", policy.replace(" *** ", "     "), re.M))
    assert {v: p for v, p in table.items() if not v.startswith(stack["branch"] + ".")} == {v: "-1" for v in others}
    assert table[locked] == "1001", policy


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_x86_64_tree_installs_nothing_on_arm64(tmp_path: Path, served: Path, example: str) -> None:
    """The choice matters: the sources the role writes for an x86_64 fact give an arm64 apt no candidate."""
    apt, variables = _arm64_apt(tmp_path, served, example, architecture="x86_64")
    rc, _inst, said = apt.simulate("install", *role_install(variables))
    assert rc != 0 and re.search(r"has no installation candidate|Unable to locate package", said), said


# ---------------------------------------------------------------- the spec: what has no arm64 path is refused


def _findings(write_spec, text: str) -> list:
    from gpucluster.cluster import check_file

    path = write_spec(text)
    _loaded, found = check_file(path)
    return [f for f in found if f.rule == "host-arch"]


def test_a_gb200_declared_x86_64_is_refused_at_its_line(write_spec) -> None:
    text = example_text("gb200-superpod") + (
        "catalog:\n  gpus:\n    gb200:\n      vendor: nvidia\n      name: NVIDIA GB200\n      memory_gb: 186\n"
        "      slurm_type: gb200\n      allowed_per_node: [4]\n      host_arch: x86_64\n      rack_units: 1\n")
    (f,) = _findings(write_spec, text)
    at = line_of(text, "      host_arch: x86_64")
    assert (f.level, f.line, f.field) == ("error", at, "catalog.gpus.gb200.host_arch")
    assert "Grace part, whose trays are arm64" in f.message and f.fix.startswith("set host_arch: arm64")


def test_an_arm64_group_with_an_x86_64_only_ofed_is_refused(write_spec) -> None:
    text = example_text("gb200-superpod") + "drivers:\n  ofed: doca\n"
    (f,) = _findings(write_spec, text)
    assert (f.level, f.line, f.field) == ("error", line_of(text, "  ofed: doca"), "drivers.ofed")
    assert "DOCA-host repository is the x86_64 build" in f.message and "ofed: inbox" in f.fix


def test_an_arm64_group_on_a_source_without_an_arm64_build_is_refused(write_spec) -> None:
    """An AMD GPU the spec's catalog declares arm64: the lock's ROCm repositories are x86_64 builds."""
    text = example_text("frontier-mi250x-roce") + (
        "catalog:\n  gpus:\n    mi250x:\n      vendor: amd\n      name: AMD Instinct MI250X (GCD)\n"
        "      memory_gb: 64\n      slurm_type: mi250x\n      allowed_per_node: [2, 4, 6, 8]\n"
        "      devices_per_card: 2\n      host_arch: arm64\n      rack_units: 2\n")
    found = _findings(write_spec, text)
    assert [(f.level, f.field) for f in found if "rocm-repo" in f.message] == [
        ("error", f"node_groups[{i}].gpu") for i, g in enumerate(yaml.safe_load(text)["node_groups"])
        if g.get("gpu") == "mi250x"], found
    assert all(f.fix == "use x86_64 hosts for it, or drivers source: debian" for f in found), found
