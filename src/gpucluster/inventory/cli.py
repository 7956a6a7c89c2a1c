"""`gpucluster inventory SPEC -o DIR`: the Ansible inventory of a real cluster, from its spec."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_inventory(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.inventory import write_inventory

    if args.pulumi_stack:
        from gpucluster.deploy.outputs import inventory_from_stack  # needs the Pulumi CLI

        path = inventory_from_stack(args.pulumi_stack, Path(args.output))
    else:
        if not args.spec:
            from gpucluster.errors import UsageError

            raise UsageError("give a SPEC, or --pulumi-stack NAME to read the inventory a stack exported")
        path = write_inventory(Path(args.output), load_cluster(args.spec),
                               extra_vars={"gpucluster_spec": str(Path(args.spec).resolve())})
    print(f"wrote {path}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("inventory", help="write the Ansible inventory (groups: docs/inventory.md)")
    p.add_argument("spec", nargs="?")
    p.add_argument("-o", "--output", required=True, help="inventory folder, e.g. inventories/prod")
    p.add_argument("--pulumi-stack", help="read the inventory a `pulumi up` of this stack exported")
    p.set_defaults(func=cmd_inventory)
