"""`gpucluster inventory SPEC -o DIR`: the Ansible inventory of a cluster (argument parsing and printing;
the work is in gpucluster.inventory)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpucluster.commands._flags import print_json, report_flags

EXAMPLES = """examples:
  gpucluster inventory examples/meta-24k-roce.yaml -o inventories/prod --ssh-config ~/.ssh/config
  gpucluster inventory --pulumi-stack meta-24k-roce -o inventories/prod
"""


def cmd_inventory(args: argparse.Namespace) -> int:
    from gpucluster.errors import UsageError

    if args.pulumi_stack:
        from gpucluster.deploy.stackoutputs import inventory_from_stack  # needs the Pulumi CLI

        path = inventory_from_stack(args.pulumi_stack, Path(args.output))
    else:
        if not args.spec:
            raise UsageError("give a SPEC, or --pulumi-stack NAME to read the inventory a stack exported")
        from gpucluster.cluster import load_cluster
        from gpucluster.inventory.build import build_inventory

        state = None
        if args.state_dir:  # 0700 and ours, checked before anything is written (as `stage up` makes its own)
            from gpucluster.paths import private_dir

            state = private_dir(Path(args.state_dir).expanduser().absolute())
        cluster = load_cluster(args.spec)  # the one parse and plan of the production path
        path = build_inventory(args.spec, args.output, ssh_config=args.ssh_config, hosts_file=args.hosts,
                               state_dir=state, cluster=cluster)
        if state is not None:
            from gpucluster.compiled import ensure_compiled

            # This load compiles: configure's compile play then finds the stamp unchanged and parses nothing.
            compiled, _now = ensure_compiled(cluster.source, state, cluster)
            print(f"compiled {cluster.spec.name} into {compiled}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print_json({"inventory": str(path), "group_vars": str(path.parent / "group_vars")})
        return 0
    print(f"wrote {path} (and {path.parent / 'group_vars'}/)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("inventory", help="write the Ansible inventory (groups: docs/inventory.md)", epilog=EXAMPLES,
                       description="Write the Ansible inventory of a cluster: its contract groups (docs/inventory.md) "
                                   "and how to reach each host, from an ssh_config, a hosts.csv or a Pulumi stack. "
                                   "Every value from those sources is checked and written as data "
                                   "(docs/security.md); the folder is written whole or not at all.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", help="the cluster spec (not with --pulumi-stack)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="inventory folder, e.g. inventories/prod")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ssh-config", metavar="FILE", help="how to reach each node, from an OpenSSH client config "
                     "(Host, HostName, Port, User, IdentityFile, UserKnownHostsFile, ProxyJump); every spec host "
                     "must match a Host block")
    src.add_argument("--hosts", metavar="FILE", help="how to reach each node, from a CSV file with the header "
                     "hostname,address[,port][,user]; one line per spec host")
    src.add_argument("--pulumi-stack", metavar="STACK", help="read the inventory a `pulumi up` of this stack exported")
    p.add_argument("--state-dir", metavar="DIR", help="record this private state folder in the inventory and compile "
                   "the spec into it (created 0700; configure then parses nothing; default: each operator's own, "
                   "$XDG_STATE_HOME/gpucluster/<cluster>, compiled by configure's first play)")
    report_flags(p, "what was written as JSON: inventory, group_vars")
    p.set_defaults(func=cmd_inventory)
