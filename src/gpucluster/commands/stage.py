"""`gpucluster stage up|down|status SPEC`: a scaled-down copy of a cluster as local containers
(argument parsing and printing; the work is in gpucluster.stage.lifecycle)."""

from __future__ import annotations

import argparse

from gpucluster.commands._flags import print_json, report_flags
from gpucluster.words import plural


def cmd_up(args: argparse.Namespace) -> int:
    from gpucluster.stage.lifecycle import stage_up

    staged, path = stage_up(args.spec, state=args.state_dir, inventory=args.inventory, runtime=args.runtime,
                            ulimits=args.ulimit)
    if args.json:
        print_json({"network": staged.network, "inventory": str(path), "ssh_config": str(staged.ssh_config),
                    "nodes": {name: {"host": host, "port": port}
                              for name, (host, port) in sorted(staged.nodes.items())}})
        return 0
    print(f"staged {plural(len(staged.nodes), 'node')} on podman network {staged.network}; inventory: {path}")
    for name, (host, port) in sorted(staged.nodes.items()):
        print(f"  {name:12s} ssh -F {staged.ssh_config} {name}   ({host}:{port})")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from gpucluster.stage.lifecycle import stage_down

    name = stage_down(args.spec, state=args.state_dir, inventory=args.inventory)
    if args.json:
        print_json({"removed": name})
        return 0
    print(f"staged cluster {name} removed")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from gpucluster.stage.lifecycle import stage_status

    name, rows = stage_status(args.spec, state=args.state_dir)
    if args.json:
        print_json({"cluster": name, "nodes": [{"name": r.name, "state": r.state, "systemd": r.systemd or None,
                                                "port": r.port} for r in rows]})
        return 0
    if not rows:
        print(f"{name}: not staged")
    for r in rows:
        print(f"  {r.name:12s} {r.state:10s} systemd={r.systemd or '-':10s} port={r.port}")
    return 0


JSON_HELP = {"up": "the staged nodes as JSON: network, inventory, ssh_config, nodes (name: host, port)",
             "down": "what was removed, as JSON: removed (the cluster's name)",
             "status": "the staged nodes as JSON: cluster, nodes (name, state, systemd, port)"}


def register(sub) -> None:
    p = sub.add_parser("stage", help="staged nodes: a scaled-down copy of the cluster as local containers",
                       description="Staged nodes: each host of the spec as a podman container with systemd, sshd and "
                                   "stand-in GPU device files, on a network of the cluster's own, reachable over "
                                   "SSH on loopback. The same inventory, roles and checks then run on them as on "
                                   "real nodes (docs/staging.md).")
    ssub = p.add_subparsers(dest="stage_command", required=True, metavar="ACTION")
    about = {
        "up": "Start the spec's staged nodes (or keep those already up, as they are), build the node image "
              "first if it is not cached, and write the inventory that reaches them. Safe to run again.",
        "down": "Remove the staged cluster's containers, network, volumes, key pair and inventory; files in "
                "the state folder that `stage up` did not write are kept.",
        "status": "One line per staged node: its container's state, its address and SSH port.",
    }
    for name, func, text in (("up", cmd_up, "start (or keep) the staged nodes and write the inventory"),
                             ("down", cmd_down, "remove containers, network, keys and inventory"),
                             ("status", cmd_status, "show the staged nodes")):
        q = ssub.add_parser(name, help=text, description=about[name],
                            epilog=f"example:\n  gpucluster stage {name} examples/staging.yaml",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        q.add_argument("spec", help="the cluster spec whose hosts are staged, e.g. examples/staging.yaml")
        q.add_argument("--state-dir", metavar="DIR", help="the staged cluster's private state folder: keys and "
                       "ports (default .state/stage/<cluster>)")
        q.add_argument("--inventory", metavar="DIR", help="inventory folder (default inventories/<cluster>)")
        if name == "up":
            q.add_argument("--runtime", help="OCI runtime for podman (default /usr/sbin/runc)")
            q.add_argument("--ulimit", action="append", help="container ulimit, e.g. nofile=1024:4096 (repeat)")
        report_flags(q, JSON_HELP[name])
        q.set_defaults(func=func)
