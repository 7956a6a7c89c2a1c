"""`gpucluster inventory SPEC -o DIR`: the Ansible inventory of a cluster (argument parsing and printing;
the work is in gpucluster.inventory)."""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLES = """examples:
  gpucluster inventory examples/meta-24k-roce.yaml -o inventories/prod --ssh-config ~/.ssh/config
  gpucluster inventory examples/meta-24k-roce.yaml -o inventories/prod --hosts hosts.csv
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
        from gpucluster.inventory.build import build_inventory

        path = build_inventory(args.spec, args.output, ssh_config=args.ssh_config, hosts_file=args.hosts,
                               state_dir=args.state_dir)
    print(f"wrote {path} (and {path.parent / 'group_vars'}/)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("inventory", help="write the Ansible inventory (groups: docs/inventory.md)", epilog=EXAMPLES,
                       description="Write the Ansible inventory of a cluster: its contract groups (docs/inventory.md) "
                                   "and how to reach each host, from an ssh_config, a hosts.csv or a Pulumi stack. "
                                   "Every value from those sources is checked and written as data "
                                   "(docs/security.md); the folder is written whole or not at all.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", help="the cluster spec")
    p.add_argument("-o", "--output", required=True, help="inventory folder, e.g. inventories/prod")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ssh-config", metavar="FILE", help="how to reach each node, from an OpenSSH client config "
                     "(Host, HostName, Port, User, IdentityFile, UserKnownHostsFile, ProxyJump); every spec host "
                     "must match a Host block")
    src.add_argument("--hosts", metavar="FILE", help="how to reach each node, from a CSV file with the header "
                     "hostname,address[,port][,user]; one line per spec host")
    src.add_argument("--pulumi-stack", help="read the inventory a `pulumi up` of this stack exported")
    p.add_argument("--state-dir", help="record this private state folder in the inventory (default: each "
                   "operator's own, $XDG_STATE_HOME/gpucluster/<cluster>)")
    p.set_defaults(func=cmd_inventory)
