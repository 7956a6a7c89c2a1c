"""The storage tiers' files: MooseFS configs for the flash tier, NFS-Ganesha's config per server group, and
one systemd mount unit per client mount.

Names (docs/storage.md, "Rendered files"): each file is named as it is installed on the node, so
`diff out/mfshdd.cfg /etc/mfs/mfshdd.cfg` compares like with like. The MooseFS files already carry the
`mfs` prefix; a mount unit is named by its systemd unit name (mnt-flash.mount); ganesha.conf takes a
`.<group>` infix only when server groups differ. The facts (`storage_files`) say which node group takes
which file, so roles look the name up instead of recomputing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.cluster import Cluster
from gpucluster.render.naming import one_or_per_group
from gpucluster.render.templating import environment

MOOSEFS = {  # role on the flash tier -> its config files, in the order the role installs them
    "moosefs_master": ("mfsmaster.cfg", "mfsexports.cfg"),
    "moosefs_metalogger": ("mfsmetalogger.cfg",),
    "moosefs_chunkserver": ("mfschunkserver.cfg", "mfshdd.cfg"),
}
GANESHA = "ganesha.conf"


@dataclass(frozen=True)
class StorageFiles:
    """Every storage file by name, and which node group takes which (plain data, for facts.json)."""

    texts: dict[str, str] = field(default_factory=dict)
    groups: dict[str, dict] = field(default_factory=dict)


def flash_context(cluster: Cluster) -> dict:
    """What the MooseFS templates read: the tier (facts) and its storage.flash.moosefs settings."""
    tier = cluster.storage["flash"]
    m = cluster.spec.storage.flash.moosefs
    return {
        "cluster": cluster.name,
        "flash": {"name": tier["name"], "master": tier["master"], "mount": tier["mount"]},
        "data_path": m.data_path, "ports": m.ports.model_dump(), "networks": list(m.client_networks),
        "root_squash": m.root_squash, "admin": m.admin, "dirs": [d.model_dump() for d in m.chunk_dirs],
        "leave_space": m.leave_space,
        "options": list(m.mount_options), "timeout": m.mount_timeout,
        "master_extra": dict(m.master_extra), "chunkserver_extra": dict(m.chunkserver_extra),
    }


def _flash(cluster: Cluster, out: StorageFiles) -> None:
    tier = cluster.storage["flash"]
    if tier is None:
        return
    env, ctx = environment(), flash_context(cluster)
    for names in MOOSEFS.values():
        for name in names:
            out.texts[name] = env.get_template(f"storage/{name}.j2").render(ctx)
    out.texts[tier["unit"]] = env.get_template("storage/flash-client.mount.j2").render(ctx)
    meta = out.groups[tier["metadata_group"]]
    meta["moosefs_master"] = list(MOOSEFS["moosefs_master"])
    meta["moosefs_metalogger"] = list(MOOSEFS["moosefs_metalogger"])
    out.groups[tier["chunk_group"]]["moosefs_chunkserver"] = list(MOOSEFS["moosefs_chunkserver"])
    for group in tier["client_groups"]:
        out.groups[group]["flash_mount"] = tier["unit"]


def ganesha_context(cluster: Cluster, group: str) -> dict:
    """ganesha.conf of one server group: its tiers' exports, each with the tier's settings. Grace and lease
    are the server's (a rule of meaning makes a group's tiers agree); it listens for every protocol asked."""
    tiers = [(t, spec) for t, spec in zip(cluster.storage["nfs"], cluster.spec.storage.nfs, strict=True)
             if t["server_group"] == group]
    settings = [spec.ganesha for _t, spec in tiers]
    return {
        "cluster": cluster.name, "group": group,
        "tiers": [{**t, "ganesha": spec.ganesha.model_dump()} for t, spec in tiers],
        "protocols": sorted({p for s in settings for p in s.protocols}),
        "grace_period": settings[0].grace_period, "lease_lifetime": settings[0].lease_lifetime,
        "allow_set_io_flusher_fail": any(s.allow_set_io_flusher_fail for s in settings),
    }


def _nfs(cluster: Cluster, out: StorageFiles) -> None:
    env = environment()
    servers = list(dict.fromkeys(t["server_group"] for t in cluster.storage["nfs"]))
    template = env.get_template(f"storage/{GANESHA}.j2")
    texts = {group: template.render(ganesha_context(cluster, group)) for group in servers}
    for group, name in one_or_per_group(texts, GANESHA).items():
        out.texts[name] = texts[group]
        out.groups[group]["ganesha"] = name
    timeouts = {t.name: t.ganesha.mount_timeout for t in cluster.spec.storage.nfs}
    unit = env.get_template("storage/nfs-client.mount.j2")
    for m in cluster.storage["nfs_mounts"]:
        out.texts[m["unit"]] = unit.render(cluster=cluster.name, m=m, timeout=timeouts[m["tier"]])
        for group in m["client_groups"]:
            out.groups[group].setdefault("nfs_mounts", []).append(m["unit"])


def storage_files(cluster: Cluster) -> StorageFiles:
    """The storage tiers' rendered files, and per node group (every group, maybe with nothing) the names
    it takes: moosefs_master / moosefs_metalogger / moosefs_chunkserver (lists), flash_mount, ganesha,
    nfs_mounts (list)."""
    out = StorageFiles(groups={g.name: {} for g in cluster.spec.node_groups})
    _flash(cluster, out)
    _nfs(cluster, out)
    return out


def render_storage(cluster: Cluster) -> dict[str, str]:
    return storage_files(cluster).texts
