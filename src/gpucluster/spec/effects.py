"""Settings that change nothing where they are written: one warning each, never an error.

Why warnings: the spec is still right, but its author believes something that is not so (NICs on a
storage group that no cable, switch port or NCCL setting comes from; a RoCE section on an InfiniBand
fabric). A value equal to its default is never reported, so `gpucluster expand`'s output, which writes
every default out, draws no warning its source did not. Each rule has a name of its own for
`--suppress`, and each finding names the field, so `--suppress node_groups[2].nics_per_node` works too.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel

from gpucluster.errors import Finding
from gpucluster.spec.model import ClusterSpec

# A group of at least this many nodes with nodes_per_rack left at 1 counts one rack per server: a floor
# plan no cluster has (8-GPU air-cooled servers go 2 to 4 a rack, NVL72 18 trays, storage servers 8 to 16).
RACK_DEFAULT_NODES = 32


def _changed(model: BaseModel, name: str) -> bool:
    """The field holds something other than its default (written or not)."""
    info = type(model).model_fields[name]
    return getattr(model, name) != info.get_default(call_default_factory=True)


def no_effect(spec: ClusterSpec) -> Iterator[Finding]:
    """Every setting of `spec` that has no effect where it is written."""
    yield from _groups(spec)
    yield from _fabric(spec)
    yield from _slurm(spec)
    yield from _health(spec)


def _groups(spec: ClusterSpec) -> Iterator[Finding]:
    for i, g in enumerate(spec.node_groups):
        at = ("node_groups", i)
        if g.role != "compute" and (g.nic or g.nics_per_node):
            field = "nics_per_node" if g.nics_per_node else "nic"
            rule = "nic-on-storage" if g.role == "storage" else "nic-on-service"
            yield Finding(at + (field,), f"NICs on a {g.role} group are not on the GPU fabric: no switch port, "
                          "cable, topology or NCCL setting comes from them (only bom.csv counts them)",
                          "remove nic and nics_per_node, or make the group role: compute", rule, level="warning")
        if g.role != "compute" and g.features:
            yield Finding(at + ("features",), f"features of a {g.role} group go nowhere: only compute groups are "
                          "Slurm nodes (slurm.conf Feature=)", "remove features from this group", "features-off-slurm",
                          level="warning")
        if _changed(g, "gres_detect") and not (g.gpu and g.gpus_per_node):
            yield Finding(at + ("gres_detect",), f"gres_detect: {g.gres_detect} on a group without GPUs: gres.conf "
                          "has no line for it", "remove gres_detect, or give the group gpu and gpus_per_node",
                          "gres-without-gpus", level="warning")
        if g.count >= RACK_DEFAULT_NODES and "nodes_per_rack" not in g.model_fields_set:
            yield Finding(at + ("nodes_per_rack",), f"nodes_per_rack is not set, so it is 1: the plan counts "
                          f"{g.count:,} racks of one server each for group '{g.name}'", "set nodes_per_rack to the "
                          "servers one of your racks holds (e.g. 4 air-cooled 8-GPU servers, 8 to 16 storage servers)",
                          "rack-default", level="warning")


def _fabric(spec: ClusterSpec) -> Iterator[Finding]:
    fab = spec.fabric
    if fab.type == "infiniband" and _changed(fab, "roce"):
        yield Finding(("fabric", "roce"), "RoCE settings on an InfiniBand fabric: the rdma role applies them only "
                      "on RoCE", "remove fabric.roce, or set fabric.type: roce", "roce-on-infiniband", level="warning")
    if fab.type == "roce" and _changed(fab, "infiniband"):
        yield Finding(("fabric", "infiniband"), "InfiniBand settings on a RoCE fabric: no subnet manager, SHARP or "
                      "service level is set on Ethernet", "remove fabric.infiniband, or set fabric.type: infiniband",
                      "infiniband-on-roce", level="warning")


def _slurm(spec: ClusterSpec) -> Iterator[Finding]:
    slurm = spec.slurm
    if not slurm.accounting and slurm.accounting_purge_after is not None:
        yield Finding(("slurm", "accounting_purge_after"), "accounting is off, so there is no slurmdbd to purge "
                      "records", "remove accounting_purge_after, or set accounting: true", "purge-without-accounting",
                      level="warning")


def _health(spec: ClusterSpec) -> Iterator[Finding]:
    health = spec.health
    if not health.enabled:
        changed = [name for name in type(health).model_fields if name != "enabled" and _changed(health, name)]
        if changed:
            yield Finding(("health", changed[0]), f"health checks are off (health.enabled: false), so "
                          f"{', '.join(changed)} change{'s' if len(changed) == 1 else ''} nothing",
                          "remove them, or set health.enabled: true", "health-disabled", level="warning")
        return
    active = health.active
    if not active.checks:
        changed = [name for name in type(active).model_fields if name != "checks" and _changed(active, name)]
        if changed:
            yield Finding(("health", "active", changed[0]), f"no active check is listed (health.active.checks), so "
                          f"{', '.join(changed)} change{'s' if len(changed) == 1 else ''} nothing",
                          "list the active checks to run, or remove these settings", "active-unused",
                          level="warning")


__all__ = ["RACK_DEFAULT_NODES", "no_effect"]
