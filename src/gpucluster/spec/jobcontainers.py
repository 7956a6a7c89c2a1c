"""Jobs in containers: each node group's container settings with its defaults resolved, and the rules of the spec's
`containers:` sections (docs/containers.md).

Why the defaults follow the group: Slurm's own OCI support is read by slurmstepd from oci.conf, so it runs where
slurmd runs (compute groups). pyxis and enroot are NVIDIA's path (enroot's hooks bring the driver's libraries and
the GPUs into the container; pyxis is the SPANK plugin behind `srun --container-image`), so NVIDIA GPU compute
groups run them; a login group loads pyxis as well, because srun only accepts --container-image when pyxis is in
its own plugin stack. render/containers.py reads the resolved settings, never the raw fields.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpucluster.errors import Finding
from gpucluster.spec.model import ClusterSpec, NodeGroup

RULE = "containers"


def vendor(spec: ClusterSpec, group: NodeGroup) -> str | None:
    """The group's GPU vendor, None without GPUs (or with a GPU the catalog does not know)."""
    model = spec.parts.gpus.get(group.gpu or "") if group.gpus_per_node else None
    return model.vendor if model else None


def oci(spec: ClusterSpec, group: NodeGroup) -> bool:
    """Whether the group runs `srun --container` (oci.conf and an OCI runtime)."""
    chosen = group.containers.oci
    return group.role == "compute" if chosen is None else chosen


def _runs_pyxis(spec: ClusterSpec, group: NodeGroup) -> bool:
    """A compute group's own choice, else its default (NVIDIA GPUs)."""
    chosen = group.containers.enroot_pyxis
    return vendor(spec, group) == "nvidia" if chosen is None else chosen


def enroot_pyxis(spec: ClusterSpec, group: NodeGroup) -> bool:
    """Whether the group gets pyxis and enroot: compute groups that run containers with them, and login groups
    (srun's side of pyxis) while any compute group does."""
    chosen = group.containers.enroot_pyxis
    if group.role == "compute":
        return _runs_pyxis(spec, group)
    if group.role == "login":
        return any_pyxis_compute(spec) if chosen is None else chosen
    return False  # controllers and storage run no jobs (a choice of it there is refused)


def any_pyxis_compute(spec: ClusterSpec) -> bool:
    return any(_runs_pyxis(spec, g) for g in spec.groups_with_role("compute"))


def flash_clients(spec: ClusterSpec) -> list[str]:
    """The node groups that mount the flash tier: those it names, else every compute and login group."""
    flash = spec.storage.flash
    if flash is None:
        return []
    if flash.client_groups is not None:
        return list(flash.client_groups)
    return [g.name for g in spec.node_groups if g.role in ("compute", "login")]


def image_cache(spec: ClusterSpec) -> str:
    """flash or local: the spec's choice, else flash where every group running pyxis mounts the flash tier."""
    chosen = spec.containers.image_cache
    if chosen is not None:
        return chosen
    pyxis = [g.name for g in spec.node_groups if enroot_pyxis(spec, g)]
    clients = flash_clients(spec)
    return "flash" if spec.storage.flash is not None and set(pyxis) <= set(clients) else "local"


def flash_dir(spec: ClusterSpec) -> str | None:
    """The folder on the flash tier for container images (enroot's cache, OCI layouts, bundles); None without one."""
    flash = spec.storage.flash
    return None if flash is None else f"{flash.mount.rstrip('/')}/{spec.containers.flash_folder}"


def cache_dir(spec: ClusterSpec) -> str:
    """The folder enroot's per-user image caches go under."""
    if image_cache(spec) == "flash":
        return f"{flash_dir(spec)}/enroot-cache"
    return f"{spec.containers.local_dir}/cache"


# ---- the rules -------------------------------------------------------------------------------------------------

def check(spec: ClusterSpec) -> Iterator[Finding]:
    """Every finding about the containers: sections; spec/rules.py runs it with the other rules."""
    for i, group in enumerate(spec.node_groups):
        yield from _group_rules(spec, i, group)
    yield from _cache_rules(spec)
    yield from _mixed_oci(spec)


def _group_rules(spec: ClusterSpec, i: int, g: NodeGroup) -> Iterator[Finding]:
    at = ("node_groups", i, "containers")
    if g.containers.oci and g.role != "compute":
        yield Finding(at + ("oci",), f"group '{g.name}' is a {g.role} group: oci.conf is read by slurmstepd, which "
                      "runs only on compute nodes", "remove oci here; compute groups have it by default", RULE)
    if not g.containers.enroot_pyxis:
        return
    where = at + ("enroot_pyxis",)
    if g.role in ("controller", "storage"):
        yield Finding(where, f"group '{g.name}' is a {g.role} group: it neither runs jobs nor submits them, so "
                      "pyxis has nothing to do there", "remove enroot_pyxis here", RULE)
    elif g.role == "login" and not any_pyxis_compute(spec):
        yield Finding(where, f"no compute group runs pyxis, so srun --container-image from login group "
                      f"'{g.name}' would be accepted there and fail on every compute node",
                      "remove enroot_pyxis here, or turn it on for a compute group with NVIDIA GPUs", RULE)
    elif g.role == "compute":
        yield from _pyxis_gpu(spec, where, g)


def _pyxis_gpu(spec: ClusterSpec, where: tuple, g: NodeGroup) -> Iterator[Finding]:
    if g.gpu and g.gpus_per_node and g.gpu not in spec.parts.gpus:
        return  # the catalog rule reports the unknown GPU
    kind = vendor(spec, g)
    if kind == "amd":
        yield Finding(where, f"group '{g.name}' has AMD GPUs ({g.gpu}): enroot brings NVIDIA's driver libraries and "
                      "GPUs into a container (its nvidia hook, libnvidia-container), not AMD's",
                      "set enroot_pyxis: false and run ROCm containers with srun --container (oci)", RULE)
    elif kind is None:
        yield Finding(where, f"group '{g.name}' has no GPUs: pyxis and enroot are installed with the NVIDIA GPU "
                      "stack, for GPU jobs", "set enroot_pyxis: false; CPU jobs run containers with srun --container "
                      "(oci)", RULE)


def _cache_rules(spec: ClusterSpec) -> Iterator[Finding]:
    if spec.containers.image_cache != "flash":
        return
    at = ("containers", "image_cache")
    if spec.storage.flash is None:
        yield Finding(at, "image_cache: flash puts enroot's image layers on the flash tier, and the spec has none "
                      "(storage.flash)", "add storage.flash, or set image_cache: local", RULE)
        return
    missing = [g.name for g in spec.node_groups if enroot_pyxis(spec, g) and g.name not in flash_clients(spec)]
    if missing:
        many = len(missing) > 1
        yield Finding(at, f"{'groups' if many else 'group'} {', '.join(repr(m) for m in missing)} "
                      f"{'run' if many else 'runs'} pyxis but {'do' if many else 'does'} not mount the flash tier, "
                      "where image_cache: flash puts enroot's image layers",
                      f"add {'them' if many else 'it'} to storage.flash.client_groups, or set image_cache: local", RULE)


def _mixed_oci(spec: ClusterSpec) -> Iterator[Finding]:
    """Configless Slurm serves the one oci.conf to every slurmd: a compute group without oci still reads it."""
    compute = [(i, g) for i, g in enumerate(spec.node_groups) if g.role == "compute"]
    if not any(oci(spec, g) for _, g in compute):
        return
    for i, g in compute:
        if g.containers.oci is False:
            yield Finding(("node_groups", i, "containers", "oci"), f"oci is off for group '{g.name}' while other "
                          "compute groups have it: configless Slurm serves the one oci.conf to every node, so "
                          "srun --container on this group calls a runtime that is not installed and the step fails",
                          "keep oci on, or keep container jobs off this group (its partitions or a feature)",
                          "oci-partial", level="warning")
