"""Ansible filters for the driver-stack roles (nvidia_gpu, amd_gpu, rdma, nccl) and slurm_health.

Why filters: what a node group installs is decided once, in Python, from the spec and the version lock
(`gpucluster.spec.stacks`), and the files the roles write come from gpucluster's own Jinja environment
(templates/drivers/, templates/health/), so the golden tests render exactly what a role installs.
The filters run on the Ansible controller, which needs the gpucluster package importable.

  gpucluster_driver_stack(state_dir, group=None)   driver_stack() of one group, or {group: stack} of all
  gpucluster_driver_files(stack, role, parts, mirror='')  {sources, pins, peermem, slurmd_dropin}: file texts
  gpucluster_pinned(stack, parts)                  {package: version} of the parts a role installs
  gpucluster_probe_report(uri_results)             '' or "repository not reachable: URL (why); ..."
  gpucluster_library_skip(facts)                   why the nccl role skips the library on a host ('' if not)
  gpucluster_debian_mirror(texts)                  the bookworm mirror a node's apt sources name ('' if none)
  gpucluster_device_files(stat_lines)              {devices, stand_ins}: `stat -c '%n %F %t:%T'` lines split
  gpucluster_health(state_dir)                     paths; the rendered file or node script that goes where

The spec's facts come from the compiled facts file (gpucluster.compiled), never from the spec itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KEYRING_DIR = "/etc/apt/keyrings"
# The roles that write a package source (nccl installs from the one its GPU role wrote).
SOURCE_ROLES = ("nvidia_gpu", "amd_gpu", "rdma")
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


def driver_files(stack: dict, role: str, parts: list[str], mirror: str = "") -> dict[str, str]:
    """The files a role installs for its part of the stack, rendered from templates/drivers/.
    '' for a file the stack does not need (the role removes it then)."""
    gc = _gpucluster()
    import gpucluster.render

    env = gpucluster.render.environment()
    stack = _plain(stack)
    kind = "ofed" if role == "rdma" else "driver"
    repos = repositories(stack, kind, mirror)
    pins = {p: stack["pins"][p] for p in parts if p in stack.get("pins", {})}
    ctx = {"stack": stack, "role": role, "repositories": repos, "pins": pins, "version": gc.__version__}
    out = {
        "sources": env.get_template("drivers/apt.sources.j2").render(ctx) if repos and role in SOURCE_ROLES else "",
        "pins": env.get_template("drivers/apt-pins.pref.j2").render(ctx) if pins else "",
        "peermem": "",
        "slurmd_dropin": "",
        # What the role asks before it writes a source: an unreachable one would break every apt update.
        "probes": [r["probe"] for r in repos],
    }
    if role == "nvidia_gpu":
        if stack.get("peermem"):
            out["peermem"] = env.get_template("drivers/nvidia-peermem.conf.j2").render(ctx)
        if stack.get("fabric_manager") or stack.get("persistenced"):
            out["slurmd_dropin"] = env.get_template("drivers/slurmd-nvidia.conf.j2").render(ctx)
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
    goes where (gpucluster.render.health.files.facts)."""
    return _compiled_facts(state_dir)["health"]


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
        }
