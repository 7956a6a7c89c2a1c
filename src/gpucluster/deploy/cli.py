"""`gpucluster secrets --pulumi-stack NAME`: the stack's cluster secrets as an Ansible extra-vars file.

Written with mode 0600 outside any checkout (default under $XDG_RUNTIME_DIR, else ~/.config), for
`ansible-playbook -e @FILE`. Needs the Pulumi CLI, not the SDK.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_secrets(args: argparse.Namespace) -> int:
    from gpucluster.deploy.outputs import secrets_from_stack

    path = secrets_from_stack(args.pulumi_stack, Path(args.output) if args.output else None)
    print(f"wrote {path} (mode 0600): pass it to Ansible with -e @{path}, and remove it when done")
    return 0


def register(sub) -> None:
    p = sub.add_parser("secrets", help="write a Pulumi stack's cluster secrets (munge key, slurmdbd password) "
                                       "to a 0600 extra-vars file outside the checkout")
    p.add_argument("--pulumi-stack", required=True, help="the stack whose ansibleSecrets output to read")
    p.add_argument("-o", "--output", help="file to write (default: $XDG_RUNTIME_DIR/gpucluster/secrets/STACK.json, "
                                          "else ~/.config/gpucluster/secrets/STACK.json)")
    p.set_defaults(func=cmd_secrets)
