"""The driver-stack files the roles install (nvidia_gpu, amd_gpu, rdma, nccl), rendered from templates/drivers/
by `render_all` with every other file, so the CLI, the compiled rendered/ folder and the golden tests hold the
same bytes the roles copy.

Per node group with a stack (`spec.stacks.driver_stacks`) and per role that installs part of it:

    apt-<role>-<group>.sources    the stack's package sources (deb822), for the version lock's Debian release
    apt-<role>-<group>.pref       apt pins of the parts the role installs
    nvidia-peermem-<group>.conf   modules-load.d entry, where an OFED stack carries GPUDirect RDMA
    slurmd-nvidia-<group>.conf    slurmd's drop-in ordering it after persistenced / Fabric Manager

Two values are the node's, not the spec's: its Debian mirror (a stack from Debian's own archive names no URI)
and its Debian release (NVIDIA's repository path names it). The role fills them into the sources' `URIs:`
fields as data (plugins/filter/gpucluster_stacks.py, `driver_files`); nothing is rendered on the controller.
"""

from __future__ import annotations

from gpucluster import __version__
from gpucluster.cluster import Cluster
from gpucluster.render.templating import environment
from gpucluster.spec import stacks

KEYRING_DIR = "/etc/apt/keyrings"
# The roles that write a package source (nccl installs from the one its GPU role wrote).
SOURCE_ROLES = ("nvidia_gpu", "amd_gpu", "rdma")
# The parts of the version lock each role installs and pins, per vendor. The roles' vars/Debian.yml
# (`__<role>_parts`) name the same parts for apt (tests/test_stacks_golden.py holds them equal).
ROLE_PARTS: dict[str, dict[str, list[str]]] = {
    "nvidia_gpu": {"nvidia": ["driver", "fabric_manager", "dcgm"]},
    "amd_gpu": {"amd": ["driver", "runtime"]},
    "nccl": {"nvidia": ["runtime", "collective"], "amd": ["collective"]},
    "rdma": {"nvidia": [], "amd": [], None: []},
}
KINDS = ("sources", "pins", "peermem", "slurmd_dropin")


def keyring(repo: dict) -> str:
    key = str(repo.get("key") or "")
    return key if key.startswith("/") else f"{KEYRING_DIR}/{repo['name']}.asc"


def repositories(stack: dict, kind: str = "driver") -> list[dict]:
    """The stack's repositories (or its OFED's) with keyring paths; a Debian-archive repository keeps its
    empty URI (the node's mirror, filled in by the role)."""
    repos = stack.get("ofed", {}).get("repositories", []) if kind == "ofed" else stack.get("repositories", [])
    return [{**repo, "keyring": keyring(repo)} for repo in repos]


def driver_files(stack: dict, role: str, parts: list[str]) -> dict[str, str]:
    """{kind: text} of the files a role installs for its part of the stack; '' for a file the stack does not
    need (the role removes it then)."""
    env = environment()
    kind = "ofed" if role == "rdma" else "driver"
    repos = repositories(stack, kind)
    pins = {p: stack["pins"][p] for p in parts if p in stack.get("pins", {})}
    ctx = {"stack": stack, "role": role, "repositories": repos, "pins": pins, "version": __version__}
    out = {
        "sources": env.get_template("drivers/apt.sources.j2").render(ctx) if repos and role in SOURCE_ROLES else "",
        "pins": env.get_template("drivers/apt-pins.pref.j2").render(ctx) if pins else "",
        "peermem": "",
        "slurmd_dropin": "",
    }
    if role == "nvidia_gpu":
        if stack.get("peermem"):
            out["peermem"] = env.get_template("drivers/nvidia-peermem.conf.j2").render(ctx)
        if stack.get("fabric_manager") or stack.get("persistenced"):
            out["slurmd_dropin"] = env.get_template("drivers/slurmd-nvidia.conf.j2").render(ctx)
    return out


def roles_of(stack: dict) -> list[str]:
    """The roles that install part of a node group's stack."""
    vendor = stack.get("vendor")
    gpu = {"nvidia": ["nvidia_gpu", "nccl"], "amd": ["amd_gpu", "nccl"]}.get(vendor, [])
    return [*gpu, "rdma"]


def file_name(role: str, group: str, kind: str) -> str:
    return {"sources": f"apt-{role}-{group}.sources", "pins": f"apt-{role}-{group}.pref",
            "peermem": f"nvidia-peermem-{group}.conf", "slurmd_dropin": f"slurmd-nvidia-{group}.conf"}[kind]


def driver_texts(cluster: Cluster) -> dict[str, dict[str, dict[str, tuple[str, str]]]]:
    """{group: {role: {kind: (file name, text)}}} of every file a stack needs (empty texts left out)."""
    out: dict = {}
    for group, stack in stacks.driver_stacks(cluster.spec).items():
        for role in roles_of(stack):
            parts = ROLE_PARTS[role].get(stack.get("vendor"), [])
            files = {kind: (file_name(role, group, kind), text)
                     for kind, text in driver_files(stack, role, parts).items() if text}
            out.setdefault(group, {})[role] = files
    return out


def render_drivers(cluster: Cluster) -> dict[str, str]:
    """The driver files of every node group, by name (for render_all)."""
    return {name: text for roles in driver_texts(cluster).values() for files in roles.values()
            for name, text in files.values()}
