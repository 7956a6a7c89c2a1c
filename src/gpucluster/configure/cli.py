"""`gpucluster configure INVENTORY`: run playbooks/site.yml on a cluster, with progress and a summary.

Exit 0 when every host converged, 1 with the failing hosts and their messages otherwise, 2 for
bad input (no such inventory or playbook).
"""

from __future__ import annotations

import argparse


def cmd_configure(args: argparse.Namespace) -> int:
    from gpucluster.configure.runner import configure, summary

    def log(text: str) -> None:
        print(text, flush=True)

    result = configure(args.inventory, playbook=args.playbook, limit=args.limit, tags=args.tags,
                       project=args.project_dir, verbose=args.verbose, log=log)
    print(summary(result), flush=True)
    return 0 if result.ok else 1


def register(sub) -> None:
    p = sub.add_parser("configure", help="converge a cluster with the Ansible roles (playbooks/site.yml) "
                                         "through ansible-runner")
    p.add_argument("inventory", help="inventory folder (e.g. inventories/staging) or its hosts.yml")
    p.add_argument("--playbook", default="site.yml", help="playbook under playbooks/ (default site.yml)")
    p.add_argument("--limit", help="only these hosts or groups (Ansible --limit pattern)")
    p.add_argument("--tags", help="only tasks with these tags (Ansible --tags)")
    p.add_argument("--project-dir", help="folder with ansible.cfg, playbooks/, roles/ (default: the checkout)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print Ansible's own output")
    p.set_defaults(func=cmd_configure)
