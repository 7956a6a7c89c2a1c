"""`gpucluster configure INVENTORY`: argument parsing and printing only (the work, push or pull included, is
gpucluster.configure.converge.converge).

configure exits 0 when every host converged (or, with --check, when the dry run ran), 1 with the
failing hosts and their messages otherwise, 2 for bad input (no such inventory, playbook or secrets file).
"""

from __future__ import annotations

import argparse
import sys

from gpucluster.commands._flags import print_json, report_flags

EXAMPLES = """examples:
  gpucluster configure inventories/prod --secrets ~/.config/gpucluster/secrets/prod.json --check --diff
  gpucluster configure inventories/prod --secrets secrets.json --pull --trigger timer --wait 900
"""


def cmd_configure(args: argparse.Namespace) -> int:
    from gpucluster.configure.converge import converge

    out = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the one JSON document

    def log(text: str) -> None:
        print(text, file=out, flush=True)

    result = converge(args.inventory, mode="pull" if args.pull else "push" if args.push else "auto",
                      playbook=args.playbook, limit=args.limit, tags=args.tags, project=args.project_dir,
                      secrets=args.secrets, check=args.check, diff=args.diff, batch=args.batch,
                      state_dir=args.state_dir, rotate=args.rotate, verbose=args.verbose, full=args.full,
                      concurrency=args.concurrency, trigger=args.trigger, wait=args.wait, log=log, live=None)
    if result.pull is not None:  # a pull's summary is progress: with --json it goes to stderr
        print(result.summary(), file=out, flush=True)
    if args.json:
        print_json(result.as_json())
    elif result.pull is None:
        print(result.summary(), flush=True)
    return 0 if result.ok else 1


def register(sub) -> None:
    p = sub.add_parser("configure", help="converge a cluster with the Ansible roles (playbooks/site.yml) "
                                         "through ansible-runner", epilog=EXAMPLES,
                       description="Converge the hosts of an inventory with gpucluster's Ansible roles: the compile "
                                   "play first (once per spec change), then common, hardware, storage, munge and "
                                   "Slurm. Ansible runs in a private folder with a minimal environment; the "
                                   "secrets reach it as a private copy. A second run reports no change.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="inventory folder (e.g. inventories/prod) or its hosts.yml")
    p.add_argument("--secrets", metavar="FILE", help="extra-vars file with munge_key_b64, slurm_dbd_password and "
                   "pull_runner_signing_key_b64 (`gpucluster secrets`); without it the cluster's secrets are "
                   "generated once on this machine")
    p.add_argument("--check", action="store_true", help="dry run: report what would change, change nothing")
    p.add_argument("--diff", action="store_true", help="show the changes to files (with --check: the changes "
                   "that would be made)")
    p.add_argument("--limit", metavar="PATTERN", help="only these hosts or groups (an Ansible pattern), e.g. "
                   "'gpu[001-064]'")
    p.add_argument("--tags", help="only these concerns: common, gpu, rdma, nccl, storage, munge, slurm (comma "
                   "separated)")
    p.add_argument("--batch", type=int, metavar="N", help="reconfigure the Slurm daemons N hosts at a time "
                   "(rolling; Ansible's serial), so a running cluster never loses every slurmd at once")
    p.add_argument("--state-dir", metavar="DIR", help="private state folder of this cluster (default "
                   "$XDG_STATE_HOME/gpucluster/<cluster> or ~/.local/state/gpucluster/<cluster>)")
    p.add_argument("--rotate", metavar="SECRET", help="replace these secrets on every host that holds them: munge, "
                   "slurmdbd, signing (comma separated), with the values --secrets or the state folder brings, else "
                   "new ones. Without it a run refuses to replace a secret a host holds (docs/security.md)")
    p.add_argument("--playbook", default="site.yml", help="playbook under playbooks/ (default site.yml)")
    p.add_argument("--project-dir", metavar="DIR", help="folder with ansible.cfg, playbooks/, roles/ (default: "
                   "$GPUCLUSTER_HOME or the checkout)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print Ansible's own output")
    report_flags(p, "the run's result as JSON: ok, hosts (per host counts), failures, role_times, changes, diffs "
                    "(progress lines go to stderr)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--pull", action="store_true", help="the fleet converges itself: each node fetches the compiled "
                      "bundle from the Slurm controller, checks its sha256 and runs the same roles locally; one line "
                      "per host (default from 64 fleet hosts up; docs/roles.md, 'Converging a fleet')")
    mode.add_argument("--push", action="store_true", help="Ansible on this machine reaches every host (default below "
                      "64 fleet hosts; always for the Slurm controller and slurmdbd, and to install the pull runner)")
    p.add_argument("--concurrency", type=int, default=64, metavar="N", help="with pull: nodes converging at once "
                   "(default 64)")
    p.add_argument("--full", action="store_true", help="with pull: every node runs the roles, even where its "
                   "manifest of this bundle verifies (a node skips Ansible when the bundle is the one it last applied "
                   "and every file and service it manages is as that run left it; run --full now and then for what "
                   "the manifest does not cover: packages, command tasks)")
    p.add_argument("--trigger", choices=("ssh", "timer"), default="ssh", help="with pull: how nodes learn of the "
                   "bundle. ssh (default): one ssh per node runs gpucluster-pull now. timer: sign and publish a "
                   "pointer to it; each node's gpucluster-pull.timer converges within its interval and reports "
                   "back to the Slurm controller, and this machine reads the results with one ssh per poll")
    p.add_argument("--wait", type=float, default=1800.0, metavar="SECONDS", help="with --trigger timer: how long to "
                   "wait for every node's result (default 1800; 0 publishes and returns)")
    p.set_defaults(func=cmd_configure)
