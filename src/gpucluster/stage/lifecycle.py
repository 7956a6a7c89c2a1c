"""Bring a spec's staged cluster up, down, or report it: the library behind `gpucluster stage`.

The node names, groups, leaves and racks come from the compiled cluster, so the staged cluster has
the shape of the real one; the inventory is written by the same writer real clusters use. The nodes
run the Debian release whose Slurm the spec renders for (22.05: Debian 12, 24.11: Debian 13), and a
spec on the production profile gets compute nodes where Slurm's cgroup plugins work.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from gpucluster.cluster import Cluster, load_cluster
from gpucluster.errors import UsageError

MAX_STAGED_NODES = 32


def state_dir_for(cluster: str, base: str | None = None) -> Path:
    return (Path(base) if base else Path.cwd() / ".state" / "stage" / cluster).resolve()


def stage_nodes(cluster: Cluster) -> list:
    """StageNodes for every node of the cluster. GPU device files are staging stand-ins.

    On the production profile (proctrack/cgroup, task/cgroup with ConstrainDevices) slurmd creates job
    cgroups, so its nodes get writable cgroups and stand-ins Slurm can tell apart; the staging profile
    swaps those plugins for ones that need neither."""
    from gpucluster.stage.podman import StageNode

    spec = cluster.spec
    production = spec.slurm.profile == "production"
    nodes = []
    for group in spec.node_groups:
        member_of = cluster.memberships(group)
        cgroups = production and "slurm_compute" in member_of
        fuse = bool({"flash_client", "flash_chunk", "flash_meta"} & set(member_of))
        # NFS-Ganesha's VFS FSAL exports through file handles: open_by_handle_at needs DAC_READ_SEARCH,
        # and the container's overlayfs root gives no handles, so each export path is a volume of the node's
        # own on the host's file system (Ganesha 6 skips tmpfs: "Ignoring /export/home because type tmpfs").
        # (Ganesha 6 also wants SYS_RESOURCE for prctl(PR_SET_IO_FLUSHER); these hosts' root lacks it in its own
        # bounding set, so no container can have it: the spec's ganesha.allow_set_io_flusher_fail lets it start.)
        nfs_exports = tuple(e.path for n in spec.storage.nfs if n.server_group == group.name for e in n.exports)
        caps = ("DAC_READ_SEARCH",) if nfs_exports else ()
        # task/affinity (the production profile) sets each task's CPU mask from root's slurmstepd for the job's
        # user: sched_setaffinity on another user's process needs CAP_SYS_NICE, which a real node's root has and a
        # podman container's lacks by default ("task_g_set_affinity: Operation not permitted" for every step of a
        # user other than root).
        caps += ("SYS_NICE",) if cgroups else ()
        for host in group.hosts:
            nodes.append(StageNode(name=host, groups=member_of, gpu_devices=cluster.gpu_devices(group), fuse=fuse,
                                   caps=caps, volumes=nfs_exports, cgroups=cgroups,
                                   unmask="slurm_compute" in member_of))
    return nodes


def node_suite(cluster: Cluster, spec_path: str) -> str:
    """The Debian suite of the staged nodes: the one that ships the spec's Slurm release."""
    from gpucluster.stage.image import suite_for

    line = cluster.loaded.line(("slurm", "version"))
    return suite_for(cluster.spec.slurm.version, f"{spec_path}:{line}" if line else str(spec_path))


def connection_vars(staged) -> dict[str, dict]:
    """How Ansible reaches each staged node (loopback, its published port, the cluster's key)."""
    common = (f"-o UserKnownHostsFile={staged.known_hosts} -o StrictHostKeyChecking=yes "
              "-o ControlMaster=auto -o ControlPersist=60s")
    return {
        name: {"ansible_host": host, "ansible_port": port, "ansible_user": staged.ssh_user,
               "ansible_ssh_private_key_file": str(staged.ssh_key), "ansible_ssh_common_args": common}
        for name, (host, port) in staged.nodes.items()
    }


def inventory_dir_for(spec, given: str | None) -> Path:
    return Path(given) if given else Path.cwd() / "inventories" / spec.name


def stage_up(spec_path: str, *, state: str | None = None, inventory: str | None = None,
             runtime: str | None = None, ulimits: list[str] | None = None, log=print,
             cluster: Cluster | None = None):
    """Bring the staged cluster up (idempotent) and write its inventory the way an operator writes one for a
    real fleet: `gpucluster inventory --ssh-config` on the ssh_config the stage wrote. The state folder is
    the stage's own (keys, known_hosts, the compiled spec). Returns (staged, inventory path)."""
    from gpucluster.compiled import compile_to
    from gpucluster.inventory.build import build_inventory
    from gpucluster.stage.podman import StageConfig, up

    cluster = cluster or load_cluster(spec_path)
    spec = cluster.spec
    if cluster.plan.nodes > MAX_STAGED_NODES:
        raise UsageError(f"{spec_path}: {cluster.plan.nodes} nodes is too many to stage on one machine "
                         f"(at most {MAX_STAGED_NODES}); stage a scaled-down spec such as examples/staging.yaml")
    cfg_kwargs = {"cluster": spec.name, "state_dir": state_dir_for(spec.name, state),
                  "suite": node_suite(cluster, spec_path)}
    if runtime:
        cfg_kwargs["runtime"] = runtime
    if ulimits:
        cfg_kwargs["ulimits"] = tuple(ulimits)
    cfg = StageConfig(**cfg_kwargs)
    staged = up(cfg, stage_nodes(cluster), log=log)
    path = build_inventory(spec_path, inventory_dir_for(spec, inventory), ssh_config=staged.ssh_config,
                           state_dir=cfg.state_dir, cluster=cluster)
    compile_to(cluster, cfg.state_dir)  # this load's compile: configure and validate then parse nothing
    return staged, path


def stage_down(spec_path: str, *, state: str | None = None, inventory: str | None = None, log=print) -> str:
    """Remove the staged cluster's containers, network, keys and inventory; returns the cluster's name."""
    from gpucluster.stage.podman import StageConfig, down

    spec = load_cluster(spec_path).spec
    down(StageConfig(cluster=spec.name, state_dir=state_dir_for(spec.name, state)), log=log)
    inv = inventory_dir_for(spec, inventory) / "hosts.yml"
    if inv.exists():
        inv.unlink()
        with contextlib.suppress(OSError):
            inv.parent.rmdir()
    return spec.name


def stage_status(spec_path: str, *, state: str | None = None) -> tuple[str, list]:
    """(cluster name, NodeStatus rows) of the staged cluster."""
    from gpucluster.stage.podman import StageConfig, status

    spec = load_cluster(spec_path).spec
    return spec.name, status(StageConfig(cluster=spec.name, state_dir=state_dir_for(spec.name, state)))
