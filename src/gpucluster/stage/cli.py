"""`gpucluster stage up|down|status SPEC`: a scaled-down copy of a cluster as local containers.

The node names, groups, leaves and racks come from the plan of the spec, so the staged cluster has
the shape of the real one; the inventory is written by the same writer real clusters use.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from gpucluster.errors import UsageError

MAX_STAGED_NODES = 32


def state_dir_for(cluster: str, base: str | None = None) -> Path:
    return (Path(base) if base else Path.cwd() / ".state" / "stage" / cluster).resolve()


def stage_nodes(spec, plan) -> list:
    """StageNodes for every node of the spec. GPU device files are staging stand-ins."""
    from gpucluster.inventory.writer import memberships
    from gpucluster.stage.podman import StageNode

    nodes = []
    for group in spec.node_groups:
        member_of = tuple(memberships(spec, group))
        devices: tuple[str, ...] = ()
        if group.gpu and group.gpus_per_node:
            if spec.parts.gpus[group.gpu].vendor == "amd":
                devices = tuple(f"/dev/dri/renderD{128 + i}" for i in range(group.gpus_per_node))
            else:
                devices = tuple(f"/dev/nvidia{i}" for i in range(group.gpus_per_node))
        fuse = "flash_client" in member_of or "flash_chunk" in member_of or "flash_meta" in member_of
        # NFS-Ganesha's VFS FSAL exports through file handles: open_by_handle_at needs DAC_READ_SEARCH,
        # and the container's overlayfs root gives no handles, so each export path is a tmpfs here.
        nfs_exports = tuple(e.path for n in spec.storage.nfs if n.server_group == group.name for e in n.exports)
        caps = ("DAC_READ_SEARCH",) if nfs_exports else ()
        for host in group.hosts:
            nodes.append(StageNode(name=host, groups=member_of, gpu_devices=devices, fuse=fuse,
                                   caps=caps, tmpfs=nfs_exports))
    return nodes


def connection_vars(staged) -> dict[str, dict]:
    common = (f"-o UserKnownHostsFile={staged.known_hosts} -o StrictHostKeyChecking=yes "
              "-o ControlMaster=auto -o ControlPersist=60s")
    out = {
        name: {"ansible_host": host, "ansible_port": port, "ansible_user": staged.ssh_user,
               "ansible_ssh_private_key_file": str(staged.ssh_key), "ansible_ssh_common_args": common}
        for name, (host, port) in staged.nodes.items()
    }
    # The node's fixed address on the cluster network: what /etc/hosts gives it (role common).
    for name, address in staged.addresses.items():
        if name in out:
            out[name]["gpucluster_address"] = address
    return out


def inventory_dir_for(spec, given: str | None) -> Path:
    return Path(given) if given else Path.cwd() / "inventories" / spec.name


def stage_up(spec_path: str, *, state: str | None = None, inventory: str | None = None,
             runtime: str | None = None, ulimits: list[str] | None = None, log=print):
    """Bring the staged cluster up (idempotent) and write its inventory. Returns (staged, inventory path)."""
    from gpucluster.cli import _load
    from gpucluster.inventory import write_inventory
    from gpucluster.stage.podman import StageConfig, up

    loaded, plan = _load(spec_path)
    spec = loaded.spec
    if plan.nodes > MAX_STAGED_NODES:
        raise UsageError(f"{spec_path}: {plan.nodes} nodes is too many to stage on one machine "
                         f"(at most {MAX_STAGED_NODES}); stage a scaled-down spec such as examples/staging.yaml")
    cfg_kwargs = {"cluster": spec.name, "state_dir": state_dir_for(spec.name, state)}
    if runtime:
        cfg_kwargs["runtime"] = runtime
    if ulimits:
        cfg_kwargs["ulimits"] = tuple(ulimits)
    cfg = StageConfig(**cfg_kwargs)
    staged = up(cfg, stage_nodes(spec, plan), log=log)
    secrets = cfg.state_dir / "secrets"
    secrets.mkdir(mode=0o700, exist_ok=True)
    path = write_inventory(
        inventory_dir_for(spec, inventory), spec, plan, connection_vars(staged),
        extra_vars={"gpucluster_spec": str(Path(spec_path).resolve()), "gpucluster_staged": True,
                    "gpucluster_secrets_dir": str(secrets), "gpucluster_state_dir": str(cfg.state_dir)},
    )
    return staged, path


def cmd_up(args: argparse.Namespace) -> int:
    staged, path = stage_up(args.spec, state=args.state_dir, inventory=args.inventory, runtime=args.runtime,
                            ulimits=args.ulimit)
    print(f"staged {len(staged.nodes)} nodes on podman network {staged.network}; inventory: {path}")
    for name, (host, port) in sorted(staged.nodes.items()):
        print(f"  {name:12s} ssh -F {staged.ssh_config} {name}   ({host}:{port})")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from gpucluster.spec import load_spec
    from gpucluster.stage.podman import StageConfig, down

    spec = load_spec(args.spec).spec
    down(StageConfig(cluster=spec.name, state_dir=state_dir_for(spec.name, args.state_dir)))
    inv = inventory_dir_for(spec, args.inventory) / "hosts.yml"
    if inv.exists():
        inv.unlink()
        with contextlib.suppress(OSError):
            inv.parent.rmdir()
    print(f"staged cluster {spec.name} removed")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from gpucluster.spec import load_spec
    from gpucluster.stage.podman import StageConfig, status

    spec = load_spec(args.spec).spec
    rows = status(StageConfig(cluster=spec.name, state_dir=state_dir_for(spec.name, args.state_dir)))
    if not rows:
        print(f"{spec.name}: not staged")
    for r in rows:
        print(f"  {r.name:12s} {r.state:10s} systemd={r.systemd or '-':10s} port={r.port}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("stage", help="staged nodes: a scaled-down copy of the cluster as local containers")
    ssub = p.add_subparsers(dest="stage_command", required=True, metavar="ACTION")
    for name, func, text in (("up", cmd_up, "start (or keep) the staged nodes and write the inventory"),
                             ("down", cmd_down, "remove containers, network, keys and inventory"),
                             ("status", cmd_status, "show the staged nodes")):
        q = ssub.add_parser(name, help=text)
        q.add_argument("spec")
        q.add_argument("--state-dir", help="keys and ports (default .state/stage/<cluster>)")
        q.add_argument("--inventory", help="inventory folder (default inventories/<cluster>)")
        if name == "up":
            q.add_argument("--runtime", help="OCI runtime for podman (default /usr/sbin/runc)")
            q.add_argument("--ulimit", action="append", help="container ulimit, e.g. nofile=1024:4096 (repeat)")
        q.set_defaults(func=func)
