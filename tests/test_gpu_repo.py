"""The nvidia_gpu role's pins against a real apt, on a local repository of stand-in packages.

NVIDIA's repository is not reachable from here, so the test builds one: STAND-INS, empty packages made with
dpkg-deb whose names, versions and dependencies copy the structure of NVIDIA's Debian repository:
- two driver branches, the lock's (570.172.08-1) and the lock's newer row (580.95.05-1), plus a newer point
  release of the locked branch (570.181.01-1); nvidia-modprobe versioned on its own within each branch
  (570.124.06-1, 580.65.06-1), as Debian's archive has it; within a version, packages depend on exact
  versions of each other
  (libcuda1 on libnvidia-ptxjitcompiler1 (= V)), and a few on "at least this branch" (nvidia-kernel-support on
  nvidia-modprobe (>= 570)), which is how a newer branch leaks in;
- the full driver metapackage nvidia-driver, which pulls in an X server, beside the compute-only nvidia-driver-cuda;
- the branch-pinning package NVIDIA documents (nvidia-driver-pinning-<branch>, version <branch>-1);
- Fabric Manager and NSCQ under the repository's names (nvidia-fabricmanager-570 and libnvidia-nscq-570 before
  580, providing the plain names; plain names from 580), locked to the driver by an exact dependency on its
  nvidia-kernel-support (NVIDIA's own packages state that lock in cuda-drivers-fabricmanager-<branch>, (= V));
- DCGM at the lock's version, and Debian's own packages the driver needs (dkms, nvidia-support, X server);
- the IMEX daemon of GB200/GB300 trays under the same naming as Fabric Manager (nvidia-imex-570 before 580,
  providing nvidia-imex; plain from 580), built with the driver and so given the same exact-version lock on its
  nvidia-kernel-support (a stand-in assumption: IMEX refuses a driver of another version at start, IMEX guide).

apt-get runs with a private configuration (sources, state, cache and preferences in tmp_path; a trusted file:
source; no root state read or touched) through the role's OWN pins: the part pins the role writes
(gpucluster_driver_files) and its branch lock (gpucluster_branch_lock with the closure from the role's vars), and
installs what the role installs (gpucluster_nvidia_packages with the role's vars), so the role's data is what is
tried. The dpkg hold is applied as the role's task states it, with real dpkg on a private database.

One test installs for real: apt-get and dpkg unpack the stand-ins into a target root (dpkg --root, as any
user; the stand-ins have no files or maintainer scripts). Not run: anything on NVIDIA's real repository, a
driver's maintainer scripts or DKMS build (docs/drivers.md).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, example_path, load_file

pytestmark = pytest.mark.skipif(not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("dpkg")),
                                reason="needs apt-get, dpkg and dpkg-deb (Debian)")

ROLE = ROOT / "roles" / "nvidia_gpu"
NEWER_POINT = "570.181.01-1"  # a stand-in later release of the locked branch (not in the lock)
OWN_VERSION = {"570": "570.124.06-1", "580": "580.65.06-1"}  # nvidia-modprobe's own version in each branch


filters = load_file(ROOT / "plugins" / "filter" / "gpucluster_stacks.py", "gpucluster_stacks_filters_repo")
ROLE_VARS = yaml.safe_load((ROLE / "vars" / "Debian.yml").read_text())
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def _stack() -> dict:
    """The compiled stack of an 8 x H100 group (Fabric Manager on), as the role reads it."""
    from gpucluster.cluster import load_cluster
    from gpucluster.spec.stacks import driver_stack

    cluster = load_cluster(example_path("meta-24k-ib"))
    stack = driver_stack(getattr(cluster, "spec", cluster), "h100")
    assert stack["fabric_manager"] and stack["pins"]["driver"]["version"] == "570.172.08-1"
    return filters._plain(stack)


@cache
def _state_dir() -> str:
    """meta-24k-ib compiled into a private folder, as configure's compile play leaves it: the role reads its
    files (the part pins) from rendered/ there (gpucluster_driver_files)."""
    import atexit
    import shutil
    import tempfile

    from gpucluster.cluster import load_cluster
    from gpucluster.compiled import compile_to

    top = tempfile.mkdtemp(prefix="gpc-gpu-repo-")
    atexit.register(shutil.rmtree, top, True)
    state = Path(top) / "state"
    compile_to(load_cluster(example_path("meta-24k-ib")), state)
    return str(state)


def _newer_branch() -> str:
    from gpucluster.catalog import RELEASES

    return RELEASES["nvidia"]["580"].driver.version


# ---------------------------------------------------------------- the stand-in repository


def _driver_set(v: str) -> dict[str, str]:
    """{package: Depends} of one driver version, in the shape of NVIDIA's Debian packages (stand-ins)."""
    branch = v.split(".")[0]
    suffix = f"-{branch}" if int(branch) < 580 else ""
    return {
        "nvidia-driver": f"nvidia-driver-cuda (= {v}), nvidia-driver-libs (= {v}), xserver-xorg-video-nvidia (= {v})",
        "nvidia-driver-libs": "",
        "xserver-xorg-video-nvidia": "xserver-xorg-core",
        "nvidia-driver-cuda": f"nvidia-smi (= {v}), libcuda1 (= {v}), nvidia-persistenced (>= {branch})",
        "nvidia-kernel-open-dkms": f"nvidia-kernel-support (= {v}), firmware-nvidia-gsp (= {v}), dkms",
        "nvidia-kernel-support": f"nvidia-modprobe (>= {branch}), nvidia-support",
        "nvidia-smi": f"libnvidia-ml1 (= {v})",
        "libnvidia-ml1": "",
        "libcuda1": f"libnvidia-ptxjitcompiler1 (= {v}), nvidia-kernel-support (= {v})",
        "libnvidia-ptxjitcompiler1": "",
        "firmware-nvidia-gsp": "",
        "nvidia-persistenced": "",
        f"nvidia-fabricmanager{suffix}": f"nvidia-kernel-support (= {v})",
        f"libnvidia-nscq{suffix}": f"nvidia-kernel-support (= {v})",
        f"nvidia-imex{suffix}": f"nvidia-kernel-support (= {v})",
    }


def _stanzas(stack: dict) -> list[dict[str, str]]:
    out = []
    for v in (stack["pins"]["driver"]["version"], NEWER_POINT, _newer_branch()):
        branch = v.split(".")[0]
        for name, depends in _driver_set(v).items():
            extra = {}
            if name.startswith(("nvidia-fabricmanager-", "libnvidia-nscq-", "nvidia-imex-")):
                plain = name.rsplit("-", 1)[0]
                extra = {"Provides": plain, "Conflicts": plain, "Replaces": plain}
            out.append({"Package": name, "Version": v, "Depends": depends, **extra})
        # once per branch: the pinning package, and nvidia-modprobe, versioned on its own within the branch
        # (as in Debian's archive, where it has its own source)
        for own in ({"Package": f"nvidia-driver-pinning-{branch}", "Version": f"{branch}-1", "Depends": ""},
                    {"Package": "nvidia-modprobe", "Version": OWN_VERSION[branch], "Depends": ""}):
            if own not in out:
                out.append(own)
    dcgm = stack["pins"]["dcgm"]
    out += [{"Package": p, "Version": dcgm["version"], "Depends": ""} for p in dcgm["packages"]]
    out += [{"Package": p, "Version": v, "Depends": ""} for p, v in
            (("dkms", "3.0.10-8"), ("nvidia-support", "20240109+1"), ("xserver-xorg-core", "2:21.1.7-3"))]
    return out


def _build_repo(root: Path, stanzas: list[dict[str, str]], arch: str = "all", repo: Path | None = None) -> Path:
    """Empty .debs made with dpkg-deb and a Packages index over them (what dpkg-scanpackages writes), in `repo`
    (default root/repo); `arch`: their Architecture (tests/test_arm64_repo.py builds arm64 ones)."""
    repo = repo or root / "repo"
    repo.mkdir(parents=True)
    index = []
    for st in stanzas:
        build = root / "build" / f"{st['Package']}_{st['Version']}_{arch}"
        (build / "DEBIAN").mkdir(parents=True)
        fields = {"Package": st["Package"], "Version": st["Version"], "Architecture": arch,
                  "Maintainer": "gpucluster test <stand-in@example.invalid>",
                  **{k: v for k, v in st.items() if k not in ("Package", "Version") and v},
                  "Description": "stand-in of NVIDIA's package of this name (tests/test_gpu_repo.py)"}
        control = "".join(f"{k}: {v}\n" for k, v in fields.items())
        (build / "DEBIAN" / "control").write_text(control)
        deb = repo / f"{st['Package']}_{st['Version'].replace(':', '%3a')}_{arch}.deb"
        subprocess.run(["dpkg-deb", "-Zgzip", "-b", str(build), str(deb)], check=True, capture_output=True)
        data = deb.read_bytes()
        index.append(control + f"Filename: ./{deb.name}\nSize: {len(data)}\n"
                     f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    (repo / "Packages").write_text("\n".join(index))
    return repo


class Apt:
    """apt-get and apt-cache on a private configuration: nothing of the host's apt state is read or written.
    `arch`: apt's native architecture (APT::Architecture); one dpkg cannot run (arm64 here) is added to the private
    dpkg database as a foreign one, so a real install unpacks it. `sources`: deb822 text instead of the one
    trusted file: line for `repo`."""

    def __init__(self, root: Path, repo: Path, arch: str = "amd64", sources: str = "") -> None:
        self.root = root
        etc = root / "etc"
        # dpkg's database inside a target root: a real install (apt-get without -s) unpacks there, as any user
        # (dpkg --root --force-not-root; the stand-ins have no maintainer scripts).
        self.admindir = root / "target" / "var" / "lib" / "dpkg"
        for d in ("etc/preferences.d", "etc/apt.conf.d", "etc/sources.list.d", "state/lists/partial",
                  "cache/archives/partial", "log"):
            (root / d).mkdir(parents=True, exist_ok=True)
        for d in ("info", "updates"):
            (self.admindir / d).mkdir(parents=True, exist_ok=True)
        (self.admindir / "status").write_text("")
        (etc / "sources.list").write_text("" if sources else f"deb [trusted=yes] file:{repo} ./\n")
        if sources:
            (etc / "sources.list.d" / "gpucluster.sources").write_text(sources)
        native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
        if arch != native:
            subprocess.run(["dpkg", f"--admindir={self.admindir}", "--add-architecture", arch], check=True)
        self.conf = root / "apt.conf"
        self.conf.write_text("".join(f'{k} "{v}";\n' for k, v in {
            "Dir::Etc::sourcelist": etc / "sources.list", "Dir::Etc::sourceparts": etc / "sources.list.d",
            "Dir::Etc::preferences": etc / "preferences", "Dir::Etc::preferencesparts": etc / "preferences.d",
            "Dir::Etc::parts": etc / "apt.conf.d", "Dir::State": root / "state",
            "Dir::State::status": self.admindir / "status", "Dir::Cache": root / "cache",
            "Dir::Log": root / "log", "Debug::NoLocking": "true", "APT::Architecture": arch,
            "APT::Architectures": arch,
            "APT::Sandbox::User": "root" if os.geteuid() == 0 else os.environ.get("USER", ""),
        }.items()) + "DPkg::Options {" + " ".join(f'"{o}";' for o in (
            f"--root={root / 'target'}", f"--admindir={self.admindir}", "--force-not-root",
            "--force-script-chrootless")) + "};\n")
        self.run("apt-get", "update")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(argv, env={**os.environ, "APT_CONFIG": str(self.conf), "LC_ALL": "C"},
                             capture_output=True, text=True, timeout=120, check=False)
        if check:
            assert res.returncode == 0, res.stdout + res.stderr
        return res

    def pins(self, files: dict[str, str]) -> None:
        for old in (self.root / "etc" / "preferences.d").iterdir():
            old.unlink()
        for name, text in files.items():
            if text:
                (self.root / "etc" / "preferences.d" / name).write_text(text)

    def simulate(self, *args: str) -> tuple[int, dict[str, str], str]:
        """apt-get -s: its exit status, {package: version} it would install, and everything it said."""
        res = self.run("apt-get", "-s", "-y", *args, check=False)
        inst = dict(re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ", res.stdout, re.M))
        return res.returncode, inst, res.stdout + res.stderr


@pytest.fixture(scope="module")
def stack() -> dict:
    return _stack()


@pytest.fixture(scope="module")
def apt(tmp_path_factory, stack) -> Apt:
    root = tmp_path_factory.mktemp("apt")
    return Apt(root, _build_repo(root, _stanzas(stack)))


def _repo_of(apt: Apt) -> Path:
    return apt.root / "repo"


# ---------------------------------------------------------------- the role's own expressions


def _task(path: Path, pred) -> dict:
    def walk(tasks):
        for t in tasks or []:
            yield t
            yield from walk(t.get("block"))

    return next(t for t in walk(yaml.safe_load(path.read_text())) if pred(t))


def _jinja():
    import jinja2.nativetypes

    env = jinja2.nativetypes.NativeEnvironment()
    for plugin in ("gpucluster_stacks", "gpucluster_facts", "gpucluster_imex"):
        module = load_file(ROOT / "plugins" / "filter" / f"{plugin}.py", f"{plugin}_repo")
        env.filters.update(module.FilterModule().filters())
    # Ansible's own filter that the role's conditions use.
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).strip().lower() in ("1", "yes", "true", "on")
    return env


def role_eval(expr, variables: dict):
    """A task's Jinja expression (a string with {{ }}, or an assert's bare condition) evaluated the way
    Ansible would on these variables, with the project's filter plugins."""
    text = str(expr).strip()
    if "{{" not in text:
        text = "{{ " + text + " }}"
    return _jinja().from_string(text).render(**variables)


def role_variables(stack: dict, release: int = 12) -> dict:
    """The role's vars (vars/Debian.yml, then vars/Debian-<release>.yml), its defaults, and this host's stack
    as preflight sets it, on an x86_64 host (an H100 server; tests/test_arm64_repo.py has the arm64 trays)."""
    extra = ROLE / "vars" / f"Debian-{release}.yml"
    variables = {**DEFAULTS, **ROLE_VARS, **(yaml.safe_load(extra.read_text()) if extra.exists() else {}),
                 "gpucluster_state_dir": _state_dir(), "ansible_facts": {"architecture": "x86_64"}}
    preflight = _task(ROLE / "tasks" / "preflight.yml",
                      lambda t: "__nvidia_gpu_stack" in (t.get("ansible.builtin.set_fact") or {}))
    expr = preflight["ansible.builtin.set_fact"]["__nvidia_gpu_stack"]
    variables["__nvidia_gpu_stack"] = role_eval(expr, {**variables, "__nvidia_gpu_stacks": {"h100": stack},
                                                       "gpucluster_node_group": "h100"})
    return variables


def _role_pins(stack: dict) -> dict[str, str]:
    """The files main.yml writes to /etc/apt/preferences.d (apt reads them sorted by name), from its own tasks."""
    return role_pins_of(role_variables(stack))


def role_pins_of(variables: dict) -> dict[str, str]:
    """The part pins and the branch lock main.yml writes, evaluated from its own tasks with the role's variables."""
    main = ROLE / "tasks" / "main.yml"
    variables = dict(variables)
    files = _task(main, lambda t: "__nvidia_gpu_files" in (t.get("ansible.builtin.set_fact") or {}))
    variables["__nvidia_gpu_files"] = role_eval(files["ansible.builtin.set_fact"]["__nvidia_gpu_files"], variables)
    out = {}
    for var in ("__nvidia_gpu_apt_preferences", "__nvidia_gpu_branch_lock"):
        task = _task(main, lambda t, v=var: (t.get("ansible.builtin.copy") or {}).get("dest") == f"{{{{ {v} }}}}")
        out[Path(variables[var]).name] = str(role_eval(task["ansible.builtin.copy"]["content"], variables))
    return out


def _install_block(stack: dict) -> tuple[list[dict], dict]:
    variables = role_variables(stack)
    block_task = _task(ROLE / "tasks" / "install.yml", lambda t: "block" in t)
    for name, expr in block_task.get("vars", {}).items():
        variables[name] = role_eval(expr, variables)
    return block_task["block"], variables


def _role_install(stack: dict) -> list[str]:
    """NAME=VERSION as the role's install task asks apt for them."""
    block, variables = _install_block(stack)
    task = next(t for t in block if "driver" in t["name"] and "gpucluster_apt" in t)
    return list(role_eval(task["gpucluster_apt"]["name"], variables))


def _role_hold(stack: dict) -> tuple[list[str], str]:
    """The packages the role's hold task loops over, and the selection it sets."""
    block, variables = _install_block(stack)
    task = next(t for t in block if "ansible.builtin.dpkg_selections" in t)
    return list(role_eval(task["loop"], variables)), task["ansible.builtin.dpkg_selections"]["selection"]


def _role_packages(stack: dict) -> dict[str, str]:
    return dict(p.split("=", 1) for p in _role_install(stack))


def _install_args(stack: dict) -> list[str]:
    return ["install", *_role_install(stack)]


def _driver_shaped(version: str) -> bool:
    return bool(re.match(filters.DRIVER_SHAPED.strip("/"), version))


# ---------------------------------------------------------------- the tests


def test_the_stand_in_repository_has_the_trap(apt: Apt, stack: dict) -> None:
    """Pins on the lock's top-level packages only (the role before the branch lock): the newer branch comes in
    through the dependencies the lock does not name, and the install breaks. Without this the tests below
    would prove nothing."""
    part_pins = Path(ROLE_VARS["__nvidia_gpu_apt_preferences"]).name
    apt.pins({part_pins: _role_pins(stack)[part_pins]})
    rc, inst, said = apt.simulate(*_install_args(stack))
    newer = _newer_branch()
    assert rc != 0 or newer in inst.values(), said
    assert f"but {newer} is to be installed" in said or newer in inst.values(), said


def test_the_pinned_branch_installs_whole(apt: Apt, stack: dict) -> None:
    apt.pins(_role_pins(stack))
    rc, inst, said = apt.simulate(*_install_args(stack))
    assert rc == 0, said
    locked = stack["pins"]["driver"]["version"]
    assert {p: v for p, v in inst.items() if _driver_shaped(v) and v not in (locked, OWN_VERSION["570"])} == {}, said
    # the whole closure came, at the locked version: the part the lock names and the part it does not
    for package in (*_role_packages(stack), "nvidia-kernel-support", "nvidia-modprobe", "libnvidia-ptxjitcompiler1",
                    "nvidia-persistenced"):
        assert package in inst, f"{package} is not installed: {said}"
    assert inst["nvidia-modprobe"] == OWN_VERSION["570"]
    assert "nvidia-fabricmanager-570" in inst and inst["nvidia-fabricmanager-570"] == locked
    assert inst["datacenter-gpu-manager-4-core"] == stack["pins"]["dcgm"]["version"]


def test_headless_nodes_get_no_x_server(apt: Apt, stack: dict) -> None:
    apt.pins(_role_pins(stack))
    _, inst, said = apt.simulate(*_install_args(stack))
    assert "nvidia-driver-cuda" in inst and "nvidia-driver" not in inst, said
    assert not [p for p in inst if p.startswith("xserver-")], said


@pytest.mark.parametrize("package", ["nvidia-modprobe", "nvidia-kernel-support", "libcuda1", "nvidia-driver-cuda",
                                     "nvidia-fabricmanager-570"])
def test_a_newer_branch_does_not_leak_in(apt: Apt, stack: dict, package: str) -> None:
    """Asked for without a version (a dependency, an operator, unattended-upgrades): the locked version; asked
    for the newer branch by version: refused."""
    apt.pins(_role_pins(stack))
    rc, inst, said = apt.simulate("install", package)
    expected = OWN_VERSION["570"] if package == "nvidia-modprobe" else stack["pins"]["driver"]["version"]
    assert rc == 0 and inst[package] == expected, said
    rc, inst, said = apt.simulate("install", f"libcuda1={_newer_branch()}")
    assert rc != 0, said


@pytest.mark.parametrize("package", ["nvidia-modprobe", "libcuda1", "nvidia-fabricmanager-570", "nvidia-driver"])
def test_no_version_of_another_branch_can_be_chosen(apt: Apt, stack: dict, package: str) -> None:
    """apt's own view of the pins: the locked version at 1001, the branch's other versions at 500 (below it), every
    version of another branch at -1 (never chosen: where a dependency exists only in another branch, the install
    fails instead of mixing branches)."""
    apt.pins(_role_pins(stack))
    policy = apt.run("apt-cache", "policy", package).stdout
    table = dict(re.findall(r"^ {5}(\S+) (-?\d+)$", policy.replace(" *** ", "     "), re.M))
    locked = stack["pins"]["driver"]["version"]
    want = {v: ("1001" if v == locked else "500" if v.startswith("570.") else "-1") for v in table}
    assert table == want, policy
    assert package == "nvidia-fabricmanager-570" or "-1" in table.values(), policy  # 580 names it without branch
    if package != "nvidia-modprobe":
        assert table[locked] == "1001" and table[NEWER_POINT] == "500", policy


def test_a_fabric_manager_of_another_version_is_refused(apt: Apt, stack: dict) -> None:
    apt.pins(_role_pins(stack))
    rc, _, said = apt.simulate(*_install_args(stack), f"nvidia-fabricmanager-570={NEWER_POINT}")
    assert rc != 0, said
    assert "nvidia-fabricmanager-570" in said and "nvidia-kernel-support" in said, said


def test_the_branch_pinning_package_is_left_installable(apt: Apt, stack: dict) -> None:
    """NVIDIA's own pinning package (version 570-1) is not of the driver's shape, so the lock leaves it alone."""
    apt.pins(_role_pins(stack))
    rc, inst, said = apt.simulate("install", "nvidia-driver-pinning-570")
    assert rc == 0 and inst == {"nvidia-driver-pinning-570": "570-1"}, said


def _installed(apt: Apt) -> dict[str, str]:
    out = apt.run("dpkg-query", f"--admindir={apt.admindir}", "-W", "-f", "${Package} ${Version}\\n").stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def test_a_real_install_and_the_hold_keep_the_driver_when_the_pins_are_gone(tmp_path: Path, stack: dict,
                                                                            apt: Apt) -> None:
    """A real install (apt-get and dpkg unpack the stand-ins into a target root) of what the role installs, the
    role's hold task applied with real dpkg, then the second layer: with the apt preferences lost (or
    overridden), a real dist-upgrade moves none of the held packages."""
    target = Apt(tmp_path, _repo_of(apt))
    target.pins(_role_pins(stack))
    target.run("apt-get", "install", "-y", *_install_args(stack)[1:])
    installed = _installed(target)
    locked = stack["pins"]["driver"]["version"]
    assert {p: v for p, v in installed.items() if _driver_shaped(v) and v not in (locked, OWN_VERSION["570"])} == {}
    assert set(_role_packages(stack)) <= set(installed), installed
    held, selection = _role_hold(stack)
    assert held, "the role holds nothing"
    subprocess.run(["dpkg", f"--admindir={target.admindir}", "--set-selections"], check=True, text=True,
                   input="".join(f"{p} {selection}\n" for p in held), capture_output=True)
    target.pins({})
    said = target.run("apt-get", "dist-upgrade", "-y").stdout
    moved = {p: v for p, v in _installed(target).items() if p in held and v != installed[p]}
    assert moved == {}, f"not held, moved by an upgrade: {moved}\n{said}"


@pytest.mark.parametrize(("release", "refused"), [(12, False), (13, True)])
def test_preflight_refuses_a_release_nvidia_publishes_no_locked_branch_for(stack: dict, release: int,
                                                                           refused: bool) -> None:
    """The role's own assert, evaluated: on Debian 13 the lock's 570 is refused with the fix; Debian 12 passes."""
    variables = role_variables(stack, release)
    task = _task(ROLE / "tasks" / "main.yml", lambda t: "gpucluster_release_refusal" in str(t.get("vars")))
    variables.update({k: role_eval(v, variables) for k, v in task["vars"].items()})
    passed = all(role_eval(cond, variables) for cond in task["ansible.builtin.assert"]["that"])
    assert passed is not refused
    message = str(role_eval(task["ansible.builtin.assert"]["fail_msg"], {**variables, "inventory_hostname": "gpu01"}))
    if refused:
        assert message.startswith("gpu01: node group 'h100' is locked to driver branch 570"), message
    assert role_eval(task["when"], {**variables, "__nvidia_gpu_present": True}) is True
    sources = variables["__nvidia_gpu_stack"]["repositories"][0]["uri"]
    assert f"/debian{release}/" in sources


# ---------------------------------------------------------------- IMEX (GB200/GB300 trays)


def _role_imex(stack: dict) -> list[str]:
    """NAME=VERSION as the role's IMEX install task (tasks/imex.yml) asks apt for them."""
    variables = role_variables(stack)
    block_task = _task(ROLE / "tasks" / "imex.yml", lambda t: "block" in t)
    for name, expr in block_task.get("vars", {}).items():
        variables[name] = role_eval(expr, variables)
    task = next(t for t in block_task["block"] if "gpucluster_apt" in t)
    return list(role_eval(task["gpucluster_apt"]["name"], variables))


def test_imex_installs_with_the_driver_at_the_locked_version(apt: Apt, stack: dict) -> None:
    apt.pins(_role_pins(stack))
    locked = stack["pins"]["driver"]["version"]
    assert _role_imex(stack) == [f"nvidia-imex-570={locked}"]
    rc, inst, said = apt.simulate(*_install_args(stack), *_role_imex(stack))
    assert rc == 0 and inst["nvidia-imex-570"] == locked, said


def test_imex_asked_for_without_a_version_stays_on_the_lock(apt: Apt, stack: dict) -> None:
    """An operator's `apt install nvidia-imex-570` (or a dependency) gets the locked version, not the newer point
    release of the branch; the newer branch's nvidia-imex is refused."""
    apt.pins(_role_pins(stack))
    rc, inst, said = apt.simulate("install", "nvidia-imex-570")
    assert rc == 0 and inst["nvidia-imex-570"] == stack["pins"]["driver"]["version"], said
    rc, _inst, said = apt.simulate("install", f"nvidia-imex={_newer_branch()}")
    assert rc != 0, said
