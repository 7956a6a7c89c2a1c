"""`gpucluster rollout INVENTORY|SPEC`: apply a change in waves that are whole topology units.

  --dry-run      print the waves, touch nothing
  --status       where the last rollout of this cluster stands (from its state file)
  --resume       continue it after Ctrl-C, a lost session or a crash

With an INVENTORY it runs from the operator's machine, as configure does: Slurm is reached on the inventory's
first controller over SSH, the controllers are converged first (slurmdbd, then slurmctld), a wave's nodes are
converged while out of service, and each node runs its health checks and a validate subset before it goes back.
With a SPEC it runs where the Slurm clients reach the cluster (a login node), with the commands you give.
Exit 0: finished; 1: halted (too many nodes of a wave failed, or Slurm failed): the state is kept for --resume;
2: bad input.
"""

from __future__ import annotations

import argparse
import sys

from gpucluster.commands._flags import print_json, report_flags
from gpucluster.slurmtext import printable
from gpucluster.words import plain

EXAMPLES = """examples:
  gpucluster rollout inventories/prod --change drain --by su --dry-run
  gpucluster rollout inventories/prod --status --json
"""


def cmd_rollout(args: argparse.Namespace) -> int:
    from gpucluster.rollout import actions

    def say(text: str) -> None:  # with --json, stdout holds the final state alone
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)

    target = actions.target(args.target, secrets=args.secrets, tags=args.tags, say=say)
    if args.resize:
        resized = actions.resize_to(target, args.resize, dry_run=args.dry_run, poll=args.poll, say=say)
        if resized.halted:
            print(f"halted: {printable(resized.halted)}; run the same command again once their jobs have ended",
                  file=sys.stderr)
            return 1
        for n, why in sorted(resized.errors.items()):
            print(f"  {n}: stays drained: {printable(why)}")
        return 1 if resized.errors else 0
    if args.status:
        _print_status(actions.status(target, state_dir=args.state_dir), args.json)
        return 0
    waves = dict(by=args.by, max_unavailable=args.max_unavailable)
    if args.dry_run:
        plan = actions.plan(target, change=args.change, **waves)
        if args.json:
            print_json(plan.as_json())
        else:
            print("\n".join(plan.lines()))
        return 0
    hooks = dict(apply_command=args.apply_command, check_command=args.check_command, state_dir=args.state_dir,
                 poll=args.poll, say=say)
    if args.resume:
        done = actions.resume(target, **waves, **hooks)
        if done.already_finished:
            print(f"rollout {done.state['id']} already finished; nothing to resume",
                  file=sys.stderr if args.json else None)
            if args.json:
                _print_status(done, True)
            return 0
    else:
        done = actions.start(target, change=args.change, halt_share=args.halt_share / 100, **waves, **hooks)
    if done.halted:
        print(f"halted: {printable(done.halted)}; fix the nodes, then --resume (state in {done.path})", file=sys.stderr)
    _print_status(done, args.json)
    return 1 if done.halted else 0


def _print_status(outcome, as_json: bool = False) -> None:
    if as_json:
        print_json(outcome.as_json())
    else:
        for line in outcome.lines():
            print(line)


def _percent(text: str) -> float:
    value = float(text.rstrip("%"))
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text}: a share from 0% to 100%")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="apply a change in waves of whole leaves, scalable units or blocks, "
                                       "without killing a job (reboot, drain or reconfigure)",
                       description=plain(__doc__), epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="INVENTORY|SPEC", help="the cluster's inventory folder, or its spec")
    p.add_argument("--change", choices=("reboot", "drain", "reconfigure"), default="reboot",
                   help="the change's class (from `gpucluster diff`): reboot (scontrol reboot ASAP), drain "
                        "(drain, apply, check, resume) or reconfigure (scontrol reconfigure; no waves)")
    p.add_argument("--by", choices=("leaf", "su", "block", "node"), default="leaf",
                   help="what a wave is made of: whole leaves (default), scalable units, blocks (pods), or nodes")
    p.add_argument("--max-unavailable", metavar="N|P%",
                   help="most nodes out at once (default 5%% of the nodes, at least one whole unit)")
    p.add_argument("--halt-share", type=_percent, default=10.0, metavar="P%",
                   help="halt once more than this share of a wave fails (default 10%%)")
    p.add_argument("--apply-command", metavar="CMD",
                   help="drain and reboot classes: what applies the change to a wave's nodes once their jobs have "
                        "ended; {nodes} is their hostlist, {node} runs it per node (default with an inventory: the "
                        "converge of those nodes)")
    p.add_argument("--check-command", metavar="CMD",
                   help="a node's checks before it goes back in service ({node} or {nodes}); a failure keeps the "
                        "node drained with a gpc: reason (default with an inventory: its health checks and a "
                        "validate subset)")
    p.add_argument("--secrets", metavar="FILE", help="with an INVENTORY: the extra-vars file its converges take "
                                                     "(as configure --secrets)")
    p.add_argument("--tags", help="with an INVENTORY: converge only these concerns (as configure --tags), e.g. gpu "
                                  "for a driver change, slurm for slurm.conf; a resize's new nodes take every role")
    p.add_argument("--state-dir", metavar="DIR", help="the cluster's private state folder (default: the inventory's, "
                                                       "else ~/.local/state/gpucluster/CLUSTER)")
    p.add_argument("--resize", metavar="NEW_SPEC",
                   help="grow or shrink to the node counts of NEW_SPEC (an INVENTORY written from it): new nodes "
                        "configured while drained, then checked; leaving nodes drained, their jobs waited for, then "
                        "removed; with --dry-run the plan")
    p.add_argument("--poll", type=float, default=5.0, help=argparse.SUPPRESS)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the waves; change nothing")
    mode.add_argument("--resume", action="store_true", help="continue the last rollout from its state file")
    mode.add_argument("--status", action="store_true", help="show where the last rollout stands")
    report_flags(p, "the rollout's state as JSON (with --dry-run: the waves); progress lines go to stderr")
    p.set_defaults(func=cmd_rollout)
