"""enroot's and pyxis's pins against a real apt, on a local repository of stand-in packages.

NVIDIA's enroot releases and a site's own pyxis build are not reachable from here, so the test builds a repository
of STAND-INS: empty packages made with dpkg-deb (the helpers of tests/test_gpu_repo.py) whose names, versions and
dependencies copy the real packaging:
- enroot and enroot+caps (NVIDIA/enroot pkg/deb/control): enroot depends on bash (>= 4.2), curl, gawk | mawk,
  jq (>= 1.5), parallel, passwd, squashfs-tools, zstd, bsdmainutils and recommends pigz; enroot+caps depends on
  enroot (= its own version) and libcap2-bin; the hardened flavor (enroot-hardened, enroot-hardened+caps) replaces
  and conflicts with enroot (pkg/deb/rules);
- nvslurm-plugin-pyxis, the package a site builds from NVIDIA/pyxis's debian/ folder (NVIDIA ships no binary
  package): depends on enroot (>= 3.1.0) | enroot-hardened (>= 3.1.0);
- each at three versions: an earlier release (enroot 3.5.0-1, pyxis 0.20.0-1, both real), the lock's, and a newer
  one that does not exist (the lock's minor version plus one), standing for the next release on the mirror;
- Debian 12's packages they depend on, at Debian 12's versions.

apt-get runs on a private configuration (tests/test_gpu_repo.py's Apt: sources, state, cache, preferences and a
dpkg database in tmp_path, nothing of the host's apt read or written) through the pins gpucluster renders
(render/containers.py, from catalog.CONTAINER_STACK), and installs for real into a target root with dpkg --root.
Not run: NVIDIA's real packages, enroot's setcap maintainer script (enroot+caps), a pyxis build against Slurm.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_gpu_repo import Apt, _build_repo

from gpucluster.catalog import CONTAINER_STACK
from gpucluster.render.containers import APT_PINS, apt_preferences

pytestmark = pytest.mark.skipif(not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("dpkg")),
                                reason="needs apt-get, dpkg and dpkg-deb (Debian)")

ENROOT = CONTAINER_STACK.enroot.version
PYXIS = CONTAINER_STACK.pyxis.version
EARLIER = {"enroot": "3.5.0-1", "pyxis": "0.20.0-1"}  # NVIDIA/enroot v3.5.0, NVIDIA/pyxis v0.20.0


def _next_minor(version: str) -> str:
    """A version after the lock's that no release has: the stand-in for the next one on the mirror."""
    major, minor, _rest = version.split(".", 2)
    return f"{major}.{int(minor) + 1}.0-1"


NEWER = {"enroot": _next_minor(ENROOT), "pyxis": _next_minor(PYXIS)}
LOCKED = {"enroot": ENROOT, "enroot+caps": ENROOT, "nvslurm-plugin-pyxis": PYXIS}
# Debian 12's versions of what enroot and enroot+caps depend on.
DEBIAN = {"bash": "5.2.15-2+b7", "curl": "7.88.1-10+deb12u15", "mawk": "1.3.4.20200120-3.1", "jq": "1.6-2.1+deb12u3",
          "parallel": "20221122+ds-2", "passwd": "1:4.13+dfsg1-1+deb12u2", "squashfs-tools": "1:4.5.1-1",
          "zstd": "1.5.4+dfsg2-5", "bsdmainutils": "12.1.8", "libcap2-bin": "1:2.66-4+deb12u3+b1", "pigz": "2.6-1"}
ENROOT_DEPENDS = ("bash (>= 4.2), curl, gawk | mawk, jq (>= 1.5), parallel, passwd, squashfs-tools, zstd, "
                  "bsdmainutils")


def _stanzas() -> list[dict[str, str]]:
    out = [{"Package": p, "Version": v, "Depends": ""} for p, v in DEBIAN.items()]
    for v in (EARLIER["enroot"], ENROOT, NEWER["enroot"]):
        out += [{"Package": "enroot", "Version": v, "Depends": ENROOT_DEPENDS, "Recommends": "pigz"},
                {"Package": "enroot+caps", "Version": v, "Depends": f"enroot (= {v}), libcap2-bin"}]
    out += [{"Package": "enroot-hardened", "Version": ENROOT, "Depends": ENROOT_DEPENDS, "Replaces": "enroot",
             "Conflicts": "enroot"},
            {"Package": "enroot-hardened+caps", "Version": ENROOT, "Depends": f"enroot-hardened (= {ENROOT}), "
             "libcap2-bin"}]
    out += [{"Package": "nvslurm-plugin-pyxis", "Version": v,
             "Depends": "enroot (>= 3.1.0) | enroot-hardened (>= 3.1.0)"}
            for v in (EARLIER["pyxis"], PYXIS, NEWER["pyxis"])]
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return _build_repo(tmp_path_factory.mktemp("containers-repo"), _stanzas())


@pytest.fixture
def apt(tmp_path, repo) -> Apt:
    """A fresh private apt (its own dpkg database in a target root) with the pins gpucluster renders."""
    a = Apt(tmp_path, repo)
    a.pins({APT_PINS: apt_preferences("test")})
    return a


def _installed(apt: Apt) -> dict[str, str]:
    out = apt.run("dpkg-query", f"--admindir={apt.admindir}", "-W", "-f", "${Package} ${Version}\\n").stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def test_without_the_pins_apt_takes_the_newest(apt: Apt) -> None:
    """The repository carries a version after the lock's, so the tests below prove something."""
    apt.pins({})
    rc, inst, said = apt.simulate("install", *LOCKED)
    assert rc == 0 and inst["enroot"] == NEWER["enroot"] and inst["nvslurm-plugin-pyxis"] == NEWER["pyxis"], said


def test_the_pinned_versions_install(apt: Apt) -> None:
    """Asked for by name only (as a role or an operator would), with a newer version beside them: the lock's."""
    rc, inst, said = apt.simulate("install", *LOCKED)
    assert rc == 0, said
    assert {p: inst[p] for p in LOCKED} == LOCKED, said


def test_pyxis_alone_brings_the_locked_enroot(apt: Apt) -> None:
    """pyxis accepts any enroot from 3.1.0 or either flavor: the pins choose the locked standard one."""
    rc, inst, said = apt.simulate("install", "nvslurm-plugin-pyxis")
    assert rc == 0 and inst.get("enroot") == ENROOT and "enroot-hardened" not in inst, said


@pytest.mark.parametrize("asked", [f"enroot+caps={NEWER['enroot']}", f"enroot+caps={EARLIER['enroot']}",
                                   "enroot-hardened", "enroot-hardened+caps"])
def test_another_version_is_refused(apt: Apt, asked: str) -> None:
    """Another version that would come in as a dependency (enroot+caps needs enroot at its own version), or the
    other flavor: refused."""
    rc, inst, said = apt.simulate("install", asked)
    assert rc != 0 and not inst, said


HOLD = [f"enroot={EARLIER['enroot']}", f"enroot={NEWER['enroot']}", f"nvslurm-plugin-pyxis={EARLIER['pyxis']}",
        f"nvslurm-plugin-pyxis={NEWER['pyxis']}"]


@pytest.mark.parametrize("asked", HOLD)
def test_an_explicit_version_passes_the_pins_and_a_hold_stops_it(apt: Apt, asked: str) -> None:
    """apt's own rule: `apt-get install PACKAGE=VERSION` overrides any pin. So the pins alone do not refuse an
    explicit version: a dpkg hold on what was installed does (the second layer the driver roles use as well)."""
    rc, _inst, said = apt.simulate("install", asked)
    assert rc == 0, said  # the pins alone let it through
    apt.run("apt-get", "install", "-y", *LOCKED)
    subprocess.run(["dpkg", f"--admindir={apt.admindir}", "--set-selections"], check=True, text=True,
                   input="".join(f"{p} hold\n" for p in LOCKED), capture_output=True)
    rc, inst, said = apt.simulate("install", asked)
    assert rc != 0 and not inst and "held packages" in said, said


@pytest.mark.parametrize("package", ["enroot", "enroot+caps", "nvslurm-plugin-pyxis"])
def test_apt_gives_the_lock_1001_and_every_other_version_minus_1(apt: Apt, package: str) -> None:
    import re

    policy = apt.run("apt-cache", "policy", package).stdout
    table = dict(re.findall(r"^ {5}(\S+) (-?\d+)$", policy.replace(" *** ", "     "), re.M))
    assert table == {v: ("1001" if v == LOCKED[package] else "-1") for v in table} and len(table) == 3, policy


def test_the_locked_versions_survive_a_dist_upgrade(apt: Apt) -> None:
    """A real install (apt-get and dpkg unpack the stand-ins into a target root), then the newer versions on the
    mirror and a real dist-upgrade: nothing moves."""
    apt.run("apt-get", "install", "-y", *LOCKED)
    before = _installed(apt)
    assert {p: before[p] for p in LOCKED} == LOCKED, before
    said = apt.run("apt-get", "dist-upgrade", "-y").stdout
    assert _installed(apt) == before, said
    assert "0 upgraded" in said, said


def test_an_upgrade_from_an_earlier_release_stops_at_the_lock(apt: Apt) -> None:
    """A node that had an earlier enroot and pyxis (installed before the pins): a real dist-upgrade takes them to
    the lock's versions, not to the newer ones on the mirror."""
    earlier = {"enroot": EARLIER["enroot"], "enroot+caps": EARLIER["enroot"], "nvslurm-plugin-pyxis": EARLIER["pyxis"]}
    apt.run("apt-get", "install", "-y", *(f"{p}={v}" for p, v in earlier.items()))
    assert {p: _installed(apt)[p] for p in earlier} == earlier
    said = apt.run("apt-get", "dist-upgrade", "-y").stdout
    assert {p: _installed(apt)[p] for p in LOCKED} == LOCKED, said
