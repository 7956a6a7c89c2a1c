"""The files behind jobs in containers, rendered from templates/containers/ with every other file (docs/containers.md):

    oci.conf                 Slurm's OCI support (srun --container=BUNDLE), when a compute group has oci
    plugstack.conf           Slurm's SPANK stack: includes each node's own /etc/slurm/plugstack.conf.d/
    pyxis.<arch>.conf        the pyxis line for that folder, per Debian architecture of the groups running pyxis
    enroot.conf              enroot's paths (/etc/enroot/enroot.conf) on the groups running pyxis
    apt-enroot-pyxis.pref    the apt pins of enroot and pyxis, from the version lock (catalog.CONTAINER_STACK)

One oci.conf and one plugstack.conf for the cluster: Slurm reads both beside slurm.conf, and configless Slurm
serves that one copy to every node. What differs per node group lives in files of the node's own (the pyxis line,
enroot.conf), which `group_files` names.
"""

from __future__ import annotations

from gpucluster.catalog import CONTAINER_STACK, ContainerStack
from gpucluster.cluster import Cluster
from gpucluster.render.templating import environment
from gpucluster.spec import jobcontainers
from gpucluster.spec.model import ClusterSpec, NodeGroup

PLUGSTACK_DIR = "/etc/slurm/plugstack.conf.d"
APT_PINS = "apt-enroot-pyxis.pref"
# The catalog's host architecture -> (Debian architecture, multiarch triplet of /usr/lib/<triplet>).
ARCHES = {"x86_64": ("amd64", "x86_64-linux-gnu"), "arm64": ("arm64", "aarch64-linux-gnu")}

# The oci.conf keys each Slurm release reads: the s_p_options table of src/slurmd/slurmstepd/read_oci_conf.c
# (22.05) and of src/common/oci_config.c (23.02 on), the same from 23.02 to 26.05 (SchedMD's tags slurm-22-05-8-1,
# slurm-23-02-0-1 .. slurm-26-05-0-1). slurmstepd parses the file strictly: a key its release lacks stops the step
# with "Could not parse oci.conf", so a key is written only where its release has it.
OCI_KEYS_2205 = frozenset({"ContainerPath", "CreateEnvFile", "RunTimeCreate", "RunTimeDelete", "RunTimeKill",
                           "RunTimeQuery", "RunTimeRun", "RunTimeStart"})
OCI_KEYS: dict[tuple[int, int], frozenset[str]] = {
    (22, 5): OCI_KEYS_2205,
    (23, 2): OCI_KEYS_2205 | {"DisableHooks", "EnvExclude", "MountSpoolDir", "RunTimeEnvExclude", "SrunPath",
                              "SrunArgs", "DisableCleanup", "StdIODebug", "SyslogDebug", "FileDebug", "DebugFlags",
                              "IgnoreFileConfigJson"},
}
# Slurm's containers guide: keep the client's Slurm configuration out of the container and out of the runtime.
ENV_EXCLUDE = "^(SLURM_CONF|SLURM_CONF_SERVER)="
# The RunTime* commands get slurmstepd's own environment, which holds systemd's NOTIFY_SOCKET where slurmd runs as a
# Type=notify unit (Debian 13's 24.11): runc then relays the socket into the container and, run in the foreground,
# waits for the container to send READY=1 before it reaps it, so the step never ends after its process exits.
RUNTIME_ENV_EXCLUDE = "^(SLURM_CONF|SLURM_CONF_SERVER|NOTIFY_SOCKET)="
# One container per node, user, job, step and task (Slurm's containers guide).
CONTAINER_ID = "%n.%u.%j.%s.%t"
# Where the runtime keeps its state (`--root`). From 23.02, a folder per user (%U, the numeric user id, came with
# 23.02) under OCI_STATE_DIR, which the slurm_compute role makes on every node with oci on (tmpfiles.d, again at each
# boot): mode 1777 and sticky, as /tmp, so runc, running as the user, makes the user's own folder (runc makes its
# root mode 0700) and no other user can remove or rename it. Slurm's guide writes /run/user/%U/, which exists only
# while the user has a systemd session on the node or lingering: a batch job opens none, so that guide's file fails
# every step of a user the site did not enable lingering for. 22.05 has no %U, and its guide's /tmp/ is shared by
# every user; its %b is the step's own spool folder, which slurmstepd makes for the user (mode 0750) and removes
# after the step, and which every RunTime* command of the step expands alike.
OCI_STATE_DIR = "/run/slurm-oci"
STATE = {(22, 5): ("%b", "the step's spool folder (%b: Slurm 22.05 has no %U for a per-user folder)"),
         (23, 2): (f"{OCI_STATE_DIR}/%U", f"{OCI_STATE_DIR}/%U (the user's own, under the sticky {OCI_STATE_DIR} "
                   "that slurm_compute makes at each boot)")}


def _at(table: dict[tuple[int, int], object], version: tuple[int, int]) -> object:
    """The entry of the newest release at or before `version`."""
    return table[max(v for v in table if v <= version)]


def oci_state_dir(spec: ClusterSpec) -> str | None:
    """The shared parent of the users' runtime state folders the role must make, or None where the state lives in
    a folder Slurm makes (22.05's %b)."""
    state, _why = _at(STATE, spec.slurm.version_tuple)
    return OCI_STATE_DIR if state.startswith(OCI_STATE_DIR + "/") else None


def oci_keys(version: str) -> frozenset[str]:
    major, minor = version.split(".")[:2]
    return _at(OCI_KEYS, (int(major), int(minor)))


def oci_settings(spec: ClusterSpec) -> list[tuple[str, str]]:
    """oci.conf's (key, value) lines for the spec's runtime and Slurm release, in the order Slurm's guide gives."""
    runtime = spec.containers.runtime
    state, _why = _at(STATE, spec.slurm.version_tuple)
    base = f"{runtime} --rootless=true --root={state}"
    run = f"{base} run {CONTAINER_ID} -b %b" if runtime == "runc" else f"{base} run --bundle %b {CONTAINER_ID}"
    settings = [("EnvExclude", ENV_EXCLUDE), ("RunTimeEnvExclude", RUNTIME_ENV_EXCLUDE),
                ("RunTimeQuery", f"{base} state {CONTAINER_ID}"), ("RunTimeKill", f"{base} kill -a {CONTAINER_ID}"),
                ("RunTimeDelete", f"{base} delete --force {CONTAINER_ID}"), ("RunTimeRun", run)]
    keys = oci_keys(spec.slurm.version)
    return [(k, v) for k, v in settings if k in keys]


def arch_of(spec: ClusterSpec, group: NodeGroup) -> str:
    """The group's Debian architecture: its GPU's host (Grace trays are arm64), else amd64."""
    model = spec.parts.gpus.get(group.gpu or "") if group.gpus_per_node else None
    return ARCHES[model.host_arch if model else "x86_64"][0]


def pyxis_file(arch: str) -> str:
    return f"pyxis.{arch}.conf"


def apt_preferences(cluster_name: str, stack: ContainerStack = CONTAINER_STACK) -> str:
    """The apt preferences that hold enroot and pyxis at the lock's versions: the one text the groups running
    pyxis install, and the stand-in repository test tries with a real apt."""
    return environment().get_template("containers/apt-enroot-pyxis.pref.j2").render(
        cluster=cluster_name, stack=stack, refused=list(stack.refused),
        every=[*stack.enroot.packages, *stack.pyxis.packages, *stack.refused])


def group_files(cluster: Cluster, group: NodeGroup) -> dict[str, str]:
    """{purpose: rendered file} a node of this group installs for containers: the pyxis line, enroot.conf and the
    apt pins where it runs pyxis. oci.conf and plugstack.conf are Slurm's, beside slurm.conf."""
    spec = cluster.spec
    if not jobcontainers.enroot_pyxis(spec, group):
        return {}
    return {"pyxis": pyxis_file(arch_of(spec, group)), "enroot_conf": "enroot.conf", "apt_pins": APT_PINS}


def role_facts(cluster: Cluster) -> dict:
    """What slurm_compute acts on (facts.json's `containers`): per node group whether it runs oci and pyxis, its
    Debian architecture and its files; the runtime package, the locked packages and enroot's folders. The role
    copies rendered files by these names and never derives one."""
    spec = cluster.spec
    # gpu_host: whether enroot and pyxis go only where an NVIDIA GPU is on the PCI bus (compute nodes, which run the
    # containers); a login node loads pyxis for srun's side of --container-image and needs no GPU.
    groups = {g.name: {"oci": jobcontainers.oci(spec, g), "enroot_pyxis": jobcontainers.enroot_pyxis(spec, g),
                       "gpu_host": g.role == "compute", "arch": arch_of(spec, g), "files": group_files(cluster, g)}
              for g in spec.node_groups}
    stack = CONTAINER_STACK
    return {"runtime": spec.containers.runtime, "oci_state_dir": oci_state_dir(spec), "groups": groups,
            "packages": [*stack.enroot.packages, *stack.pyxis.packages],
            "versions": {**{p: stack.enroot.version for p in stack.enroot.packages},
                         **{p: stack.pyxis.version for p in stack.pyxis.packages}},
            "pyxis_plugins": {arch: f"/usr/lib/{triplet}/slurm/spank_pyxis.so" for arch, triplet in ARCHES.values()},
            "plugstack_dir": PLUGSTACK_DIR, "image_cache": jobcontainers.image_cache(spec),
            "cache_dir": jobcontainers.cache_dir(spec), "flash_dir": jobcontainers.flash_dir(spec),
            "local_dir": spec.containers.local_dir, "runtime_dir": spec.containers.runtime_dir}


def _context(spec: ClusterSpec) -> dict:
    cache = jobcontainers.image_cache(spec)
    why = ("on the flash tier, shared by every node: one pull per user for the cluster" if cache == "flash"
           else "on the node's own disk (containers.image_cache: local)")
    return {"cluster": spec.name, "version": spec.slurm.version, "runtime": spec.containers.runtime,
            "settings": oci_settings(spec), "state_why": _at(STATE, spec.slurm.version_tuple)[1],
            "plugstack_dir": PLUGSTACK_DIR, "runtime_dir": spec.containers.runtime_dir,
            "local_dir": spec.containers.local_dir, "cache_dir": jobcontainers.cache_dir(spec), "cache_why": why}


def render_containers(cluster: Cluster) -> dict[str, str]:
    """Every container file the cluster needs, by name (for render_all); none for a cluster without containers."""
    spec = cluster.spec
    env = environment()
    ctx = _context(spec)
    out = {}
    if any(jobcontainers.oci(spec, g) for g in spec.groups_with_role("compute")):
        out["oci.conf"] = env.get_template("containers/oci.conf.j2").render(ctx)
    pyxis = [g for g in spec.node_groups if jobcontainers.enroot_pyxis(spec, g)]
    if pyxis:
        out["plugstack.conf"] = env.get_template("containers/plugstack.conf.j2").render(ctx)
        for arch in sorted({arch_of(spec, g) for g in pyxis}):
            triplet = next(t for a, t in ARCHES.values() if a == arch)
            out[pyxis_file(arch)] = env.get_template("containers/pyxis.conf.j2").render(
                ctx, arch=arch, triplet=triplet, pyxis_version=CONTAINER_STACK.pyxis.version)
        out["enroot.conf"] = env.get_template("containers/enroot.conf.j2").render(ctx)
        out[APT_PINS] = apt_preferences(spec.name)
    return out
