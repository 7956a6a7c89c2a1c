"""Ansible filters for the driver-stack roles (nvidia_gpu, amd_gpu, rdma, nccl) and slurm_health.

Why filters: what a node group installs is decided once, in Python, from the spec and the version lock
(`gpucluster.spec.stacks`, compiled into facts.json), and the files the roles write are files of the
compiled rendered/ folder (`render_all`, gpucluster.render.drivers), so the golden tests hold exactly what
a role installs. Nothing is rendered here. The filters run on the Ansible controller.

  gpucluster_driver_stack(state_dir, group=None)   driver_stack() of one group, or {group: stack} of all
  gpucluster_driver_files(state_dir, stack, role, mirror='')  {sources, pins, peermem, slurmd_dropin, probes}:
                                                   rendered/'s texts, the sources with the node's URIs
  gpucluster_pinned(stack, parts)                  {package: version} of the parts a role installs
  gpucluster_probe_report(uri_results)             '' or "repository not reachable: URL (why); ..."
  gpucluster_library_skip(facts)                   why the nccl role skips the library on a host ('' if not)
  gpucluster_debian_mirror(texts)                  the bookworm mirror a node's apt sources name ('' if none)
  gpucluster_device_files(stat_lines)              {devices, stand_ins}: `stat -c '%n %F %t:%T'` lines split
  gpucluster_health(state_dir)                     paths; the rendered file or node script that goes where
  gpucluster_for_release(stack, release)           the stack with the vendor repository of the host's Debian release
  gpucluster_release_refusal(stack, release)       '' or why this Debian release cannot take the stack (preflight)
  gpucluster_for_arch(stack, architecture)         the stack with the lock's repositories for the node's architecture
  gpucluster_arch_refusal(stack)                   '' or why this host's architecture cannot take the stack (preflight)
  gpucluster_nvidia_packages(stack, parts, names, headless)  {package: version} under the repository's names
  gpucluster_branch_lock(stack, closure)           apt preferences that keep the driver's whole closure on one version

The spec's facts come from the compiled facts file (gpucluster.compiled), never from the spec itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

KEYRING_DIR = "/etc/apt/keyrings"
# /dev/null: what `podman run --device /dev/null:/dev/nvidia0` puts at a GPU's path on staged nodes.
STAND_IN_DEVICE = "1:3"
# Staged nodes whose Slurm constrains devices get one number per GPU instead: major 120, reserved for local
# use, which no driver claims (gpucluster.stage.podman.STAND_IN_MAJOR).
STAND_IN_MAJOR = 120


def _gpucluster():
    """gpucluster itself: the controller runs Ansible from the environment gpucluster is installed in."""
    import gpucluster

    return gpucluster


def _compiled_facts(state_dir: str) -> dict:
    """The compiled facts (playbooks/compile.yml wrote them this run); never the spec itself."""
    path = Path(str(state_dir)) / "compiled" / "facts.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: run the whole of playbooks/site.yml (its first play compiles the "
                         "spec), e.g. through `gpucluster configure INVENTORY`")
    return json.loads(path.read_text())


def _plain(value: Any) -> Any:
    """Ansible hands filters lazy, tagged containers; templates and JSON want plain data."""
    return json.loads(json.dumps(value, default=str))


def driver_stack(state_dir: str, group: str | None = None) -> dict:
    """The driver stack of one node group, or {group: stack} of all, as the spec compiled them."""
    stacks = _compiled_facts(state_dir)["drivers"]
    return stacks[str(group)] if group else stacks


def _keyring(repo: dict) -> str:
    key = str(repo.get("key") or "")
    return key if key.startswith("/") else f"{KEYRING_DIR}/{repo['name']}.asc"


def repositories(stack: dict, kind: str = "driver", mirror: str = "") -> list[dict]:
    """The stack's repositories (or its OFED's) with keyring paths, the node's Debian mirror filled in."""
    repos = stack.get("ofed", {}).get("repositories", []) if kind == "ofed" else stack.get("repositories", [])
    out = []
    for repo in _plain(repos):
        if not repo["uri"]:
            repo["uri"] = str(mirror or "")
            repo["probe"] = f"{repo['uri'].rstrip('/')}/dists/{repo['suites'][0]}/Release" if repo["uri"] else ""
        repo["keyring"] = _keyring(repo)
        out.append(repo)
    return out


_URIS = re.compile(r"^URIs:.*$", re.MULTILINE)


def _node_uris(text: str, uris: list[str]) -> str:
    """The rendered sources with each stanza's `URIs:` the node's: its Debian mirror where the stack takes the
    Debian archive, NVIDIA's path for its Debian release (for_release). A deb822 field set as data, in order."""
    found = _URIS.findall(text)
    if len(found) != len(uris):
        raise ValueError(f"the rendered sources have {len(found)} stanzas, the stack {len(uris)} repositories: "
                         "recompile (playbooks/compile.yml)")
    values = iter(uris)
    return _URIS.sub(lambda _m: f"URIs: {next(values)}", text)


def driver_files(state_dir: str, stack: dict, role: str, mirror: str = "") -> dict:
    """{sources, pins, peermem, slurmd_dropin, probes} of a role's part of a node group's stack: the texts
    `render_all` wrote into rendered/ (gpucluster.render.drivers; facts.json's `driver_files` names them,
    `<role>_<kind>`), '' for a file the stack does not need (the role removes it then); the sources with the
    node's URIs; and the URLs the role asks before it writes a source (an unreachable one would break every
    apt update). Nothing is rendered here."""
    stack = _plain(stack or {})
    folder = Path(str(state_dir)) / "compiled"
    names = _compiled_facts(state_dir)["driver_files"].get(str(stack.get("group")), {})
    out: dict = {}
    for kind in ("sources", "pins", "peermem", "slurmd_dropin"):
        name = names.get(f"{role}_{kind}")
        out[kind] = (folder / "rendered" / name).read_text() if name else ""
    repos = repositories(stack, "ofed" if role == "rdma" else "driver", mirror)
    if out["sources"]:
        out["sources"] = _node_uris(out["sources"], [r["uri"] for r in repos])
    out["probes"] = [r["probe"] for r in repos]
    return out


def pinned(stack: dict, parts: list[str]) -> dict[str, str]:
    """{package: version} of the stack's parts a role installs (apt NAME=VERSION, then dpkg holds)."""
    pins = (stack or {}).get("pins", {})
    return {pkg: pins[p]["version"] for p in parts if p in pins for pkg in pins[p]["packages"]}


def probe_report(results: list[dict]) -> str:
    """'' when every package source answered (HTTP 200), else why not: the roles' skip reason."""
    bad = []
    for r in results or []:
        url = str(r.get("item") or "")
        if not url:
            bad.append("the node's apt sources name no Debian bookworm mirror")
        elif r.get("status") != 200:
            why = r.get("msg") or f"HTTP {r.get('status')}"
            bad.append(f"{url} ({' '.join(str(why).split())[:160]})")
    return f"repository not reachable: {'; '.join(bad)}" if bad else ""


def library_skip(facts: dict) -> str:
    """Why the nccl role cannot install NCCL/RCCL on a host ('' when it can): no GPU on the PCI bus, no
    package source from the GPU role (it skipped the driver), or no library in the lock for the source."""
    vendor = str(facts.get("vendor", "")).upper()
    host = facts.get("host", "?")
    if not facts.get("gpus"):
        return (f"no {vendor} GPU on {host} (PCI scan of /sys/bus/pci/devices found no vendor "
                f"{facts.get('pci_vendor')} GPU)")
    if not facts.get("source_exists"):
        return (f"no {vendor} package source on {host} ({facts.get('source_file')} is missing: the GPU role skipped "
                f"the driver, see {facts.get('skip_dir')}/{facts.get('vendor')!s}_gpu)")
    stack = facts.get("stack") or {}
    if "collective" not in stack.get("pins", {}):
        return (f"the version lock has no {facts.get('library')} for source {stack.get('source', '?')} (use the "
                "vendor repository: drivers source cuda-repo or rocm-repo)")
    return ""


def debian_mirror(texts: list[str] | dict[str, str]) -> str:
    """The first URI that serves bookworm in a node's apt sources (one-line or deb822 texts)."""
    _gpucluster()
    from gpucluster.aptsources import SUITE, _parse_deb822, _parse_one_line

    items = texts.items() if isinstance(texts, dict) else ((str(i), t) for i, t in enumerate(texts or []))
    for name, text in items:
        text = str(text or "")
        found = _parse_deb822(text) if name.endswith(".sources") or "URIs:" in text else _parse_one_line(text)
        for source in found:
            if SUITE in source.suites:
                return source.uri
    return ""


def device_files(stat_lines: list[str]) -> dict[str, list[str]]:
    """Split `stat -c '%n %F %t:%T' /dev/nvidia[0-9]*` output into real device nodes and stand-ins
    (character device 1:3, /dev/null mapped at the GPU's path, or 120:N). stat prints the numbers in hex."""
    devices, stand_ins = [], []
    for line in stat_lines or []:
        parts = str(line).rsplit(" ", 1)
        if len(parts) != 2 or "character special file" not in parts[0]:
            continue
        name = parts[0].split(" ", 1)[0]
        major, _, minor = parts[1].partition(":")
        try:
            numbers = f"{int(major, 16)}:{int(minor, 16)}"
        except ValueError:
            continue
        stand_in = numbers == STAND_IN_DEVICE or numbers.split(":")[0] == str(STAND_IN_MAJOR)
        (stand_ins if stand_in else devices).append(name)
    return {"devices": devices, "stand_ins": stand_ins}


def health(state_dir: str) -> dict:
    """The slurm_health role's data as the spec compiled it: paths, and which rendered file or node script
    goes where (gpucluster.render.health.rolefiles.facts)."""
    facts = _compiled_facts(state_dir)["health"]
    scripts = str(facts.get("scripts_dir") or "")
    # a node's bundle: gpucluster's code travels in it (gpucluster.configure.bundle)
    if scripts and not scripts.startswith("/"):
        facts = {**facts, "scripts_dir": str(Path(str(state_dir)) / scripts)}
    return facts


# ---------------------------------------------------------------- the driver branch, whole (docs/drivers.md)

# A version of the driver's shape (BRANCH.MINOR[.PATCH]-REV, e.g. 570.172.08-1, 535.309.01-0+deb12u1). Every
# package built from NVIDIA's driver sources carries the driver's own version; the packages that merely share
# the name (nvidia-container-toolkit 1.17.8-1, nvidia-support 20240109+1, nvidia-driver-pinning-580 580-1) do not.
DRIVER_SHAPED = r"/^[0-9]{3}\.[0-9]+/"
# The release the version lock's NVIDIA repository names (catalog.REPOSITORIES); the host's replaces it.
LOCK_DIST = "debian12"


def for_release(stack: dict, release: dict) -> dict:
    """The stack with NVIDIA's repository for the host's Debian release (debian12 -> debian13 in the URI, the key
    and the probe). The lock names Debian 12's; the role passes vars/Debian-<major>.yml's release."""
    stack = _plain(stack or {})
    dist = str((release or {}).get("repo_dist") or LOCK_DIST)
    if stack.get("vendor") != "nvidia" or dist == LOCK_DIST:
        return stack
    for repo in stack.get("repositories", []):
        for key in ("uri", "key", "probe"):
            repo[key] = str(repo.get(key) or "").replace(f"/{LOCK_DIST}/", f"/{dist}/")
    return stack


def release_refusal(stack: dict, release: dict) -> str:
    """'' when the host's Debian release can take the stack, else why not and what to change (preflight).
    release: the role's vars for this release: name, vendor_repo (whether the lock's vendor rows are known to
    install on it), first_branch (the first driver branch the vendor publishes for it; '' where every branch of
    the lock is), debian_source (whether the lock's Debian row is this release's), why."""
    stack, release = stack or {}, release or {}
    source, branch, name = stack.get("source"), str(stack.get("branch") or ""), release.get("name", "this Debian")
    group = stack.get("group", "?")
    if source == "debian":
        if release.get("debian_source", True):
            return ""
        return (f"node group '{group}' takes its {stack.get('vendor', '').upper()} driver from Debian ({branch}), "
                f"which the version lock knows for Debian 12 only, and this host runs {name}: use Debian 12 on "
                f"these nodes, or drivers source: {'cuda-repo' if stack.get('vendor') == 'nvidia' else 'rocm-repo'}")
    what = "driver branch" if stack.get("vendor") == "nvidia" else "ROCm"
    why = release.get("why", "earlier releases are not published for it")
    if not release.get("vendor_repo", True):
        return (f"node group '{group}' is locked to {what} {branch} from the vendor repository, which the version "
                f"lock knows for Debian 12 only, and this host runs {name} ({why}): run these nodes on Debian 12")
    first = str(release.get("first_branch") or "")
    if not first or _release_key(branch) >= _release_key(first):
        return ""
    return (f"node group '{group}' is locked to {what} {branch}, and the vendor repository for {name} starts at "
            f"{first} ({why}): run these nodes on Debian 12, or add a {first}+ row to the version lock "
            "(src/gpucluster/catalog.py) and choose it in the spec's drivers: section")


def _release_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text))) or (0,)


# ---------------------------------------------------------------- the host's architecture (docs/drivers.md, arm64)

# ansible_facts['architecture'] (the kernel's machine name) -> the lock's architecture (catalog host_arch).
LOCK_ARCH = {"x86_64": "x86_64", "aarch64": "arm64"}


def for_arch(stack: dict, architecture: str) -> dict:
    """The stack with the lock's repositories for the node's architecture fact (aarch64: NVIDIA's sbsa tree), and
    `arch`, the lock's name for it ('' where the lock has none). A stack compiled without per-architecture
    repositories is left as it is; an architecture the lock has no repository for keeps the GPU's own, and
    gpucluster_arch_refusal says why it cannot install."""
    stack = _plain(stack or {})
    arch = LOCK_ARCH.get(str(architecture or ""), "")
    stack["arch"] = arch
    stack["fact_arch"] = str(architecture or "")
    by_arch = stack.get("arch_repositories")
    if by_arch is not None and arch in by_arch:
        stack["repositories"] = by_arch[arch]
    return stack


def arch_refusal(stack: dict) -> str:
    """'' when the host's architecture (for_arch) can take the stack, else why not and what to change (preflight,
    where a GPU is present): a host of another architecture than its GPU's trays (a GB200 group's host reporting
    x86_64: an inventory that puts the host in the wrong group), or one the lock has no repository for."""
    stack = stack or {}
    if "arch_repositories" not in stack or not stack.get("vendor"):
        return ""
    group, gpu, fact = stack.get("group", "?"), stack.get("gpu", "?"), stack.get("fact_arch") or "?"
    want = stack.get("host_arch", "x86_64")
    if stack.get("arch") != want:
        return (f"node group '{group}' has {gpu} GPUs, whose hosts are {want} (the catalog's host_arch), and this "
                f"host reports {fact}: put the host in a group of its own hardware (gpucluster inventory), or give "
                f"the GPU the host_arch it is built with in the spec's catalog")
    if stack["arch"] not in stack["arch_repositories"]:
        return (f"node group '{group}' takes {gpu} drivers from {stack.get('source')}, for which the version lock "
                f"has no {stack['arch']} repository: use x86_64 hosts for it, or drivers source: debian")
    return ""


def nvidia_packages(stack: dict, parts: list[str], names: dict, headless: bool = True) -> dict[str, str]:
    """{package: version} the nvidia_gpu role installs and holds, under the names NVIDIA's repository uses:
    the compute-only driver (nvidia-driver-cuda: no X server) on headless nodes, and Fabric Manager / NSCQ with
    the branch in their names before the branch where NVIDIA dropped it (names: the role's vars)."""
    out: dict[str, str] = {}
    branch = _release_key(str((stack or {}).get("branch") or "0"))
    suffixed = branch < _release_key(str(names.get("unsuffixed_from", "0")))
    swap = (names.get("headless") or {}).get(str((stack or {}).get("source")), {}) if headless else {}
    for package, version in pinned(stack, parts).items():
        package = swap.get(package, package)
        if not package:
            continue  # the headless set has no such package (Debian's own driver: no nvidia-driver metapackage)
        if suffixed and package in names.get("branch_suffixed", []):
            package = f"{package}-{stack['branch']}"
        out[package] = version
    return out


def branch_lock(stack: dict, closure: list[str]) -> str:
    """apt preferences that keep the driver's whole dependency closure (closure: glob names, the role's vars) on
    the locked branch: the lock's exact version at 1001; other versions of the same branch at 500, for the
    packages versioned on their own within it (nvidia-modprobe, nvidia-settings, nvidia-persistenced have their
    own sources in Debian's archive), which the exact version then outranks wherever both exist; every other
    driver-shaped version (another branch) at -1, so a newer branch in the repository cannot come in through a
    dependency the lock does not name ('but 580 is to be installed', or a mixed set). apt takes the first
    matching record, hence the order. '' where the stack installs no NVIDIA driver."""
    stack = stack or {}
    pin = stack.get("pins", {}).get("driver")
    if stack.get("vendor") != "nvidia" or not pin or not closure:
        return ""
    names, version, branch = " ".join(closure), pin["version"], stack.get("branch")
    return (f"# The NVIDIA driver's whole dependency closure on branch {branch}, for node group "
            f"{stack.get('group')}: written by gpucluster (nvidia_gpu role).\n"
            "# The locked version first; the branch's other versions only where that one does not exist; no\n"
            "# version of another branch, not even as a dependency.\n"
            f"\nPackage: {names}\nPin: version {version}\nPin-Priority: 1001\n"
            f"\nPackage: {names}\nPin: version /^{branch}\\./\nPin-Priority: 500\n"
            f"\nPackage: {names}\nPin: version {DRIVER_SHAPED}\nPin-Priority: -1\n")


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpucluster_driver_stack": driver_stack,
            "gpucluster_driver_files": driver_files,
            "gpucluster_debian_mirror": debian_mirror,
            "gpucluster_probe_report": probe_report,
            "gpucluster_pinned": pinned,
            "gpucluster_library_skip": library_skip,
            "gpucluster_device_files": device_files,
            "gpucluster_health": health,
            "gpucluster_for_release": for_release,
            "gpucluster_release_refusal": release_refusal,
            "gpucluster_for_arch": for_arch,
            "gpucluster_arch_refusal": arch_refusal,
            "gpucluster_nvidia_packages": nvidia_packages,
            "gpucluster_branch_lock": branch_lock,
        }
