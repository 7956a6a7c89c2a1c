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
import os
import sys
import time
from pathlib import Path

from gpucluster.commands._flags import print_json, report_flags
from gpucluster.errors import OperationError, UsageError
from gpucluster.words import plain

EXAMPLES = """examples:
  gpucluster rollout inventories/prod --change drain --by su --dry-run
  gpucluster rollout inventories/prod --status --json
"""


def _target(args: argparse.Namespace):
    """(cluster, inventory path or None, the loaded inventory or None, the inventory's state folder or None)."""
    from gpucluster.cluster import load_cluster

    p = Path(args.target)
    if p.is_dir() or p.name in ("hosts.yml", "hosts.yaml"):
        from gpucluster.inventory.reader import load_inventory

        inv = load_inventory(p)
        spec = inv.vars.get("gpucluster_spec")
        if not spec or not Path(spec).is_file():
            raise UsageError(f"{inv.path}: all.vars.gpucluster_spec is {spec or 'missing'}, not a spec file here; "
                             "rewrite the inventory with `gpucluster inventory SPEC`, or give the SPEC")
        return load_cluster(spec), p, inv, inv.vars.get("gpucluster_state_dir")
    if not p.is_file():
        raise UsageError(f"{args.target}: no such inventory folder or spec file; give one (e.g. inventories/prod)")
    return load_cluster(p), None, None, None


def _live(args: argparse.Namespace, cluster, inventory, inv, say):
    """The inventory-backed hooks (rollout/live.py), or None for a SPEC target."""
    if inv is None:
        for flag in ("secrets", "tags"):
            if getattr(args, flag):
                raise UsageError(f"--{flag}: only with an INVENTORY (the rollout converges through it)")
        return None
    from gpucluster.rollout.live import LiveCluster

    if args.secrets and not Path(args.secrets).is_file():
        raise UsageError(f"--secrets {args.secrets}: no such file; write one with `gpucluster secrets --generate -o "
                         "FILE`, or leave it out to use the cluster's own")
    return LiveCluster(Path(inventory), inv, secrets=args.secrets, tags=args.tags, health=cluster.spec.health.enabled,
                       say=say)


def _busy_last(units: list, nodes: dict) -> list:
    """Units with a job running on any of their nodes go last (stable): the idle ones are rolled while those jobs
    run, and a wave that must wait for a job waits as late as it can."""
    return sorted(units, key=lambda u: any(nodes[n].busy for n in u[1] if n in nodes))


def cmd_rollout(args: argparse.Namespace) -> int:
    from gpucluster.paths import state_dir
    from gpucluster.rollout import engine, hooks, state
    from gpucluster.rollout.slurmclient import Slurm, SlurmError
    from gpucluster.rollout.waves import WaveError, parse_max_unavailable, plan_waves, topology_units

    def say(text: str) -> None:  # with --json, stdout holds the final state alone
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)

    cluster, inventory, inv, inv_state = _target(args)
    live = _live(args, cluster, inventory, inv, say)
    if args.resize:
        return _resize(cluster, args, live, say)
    folder = state_dir(cluster.name, args.state_dir or inv_state)
    if args.status:
        path = folder / state.NAME
        s = _load(path, cluster.name)
        _print_status(s, path, args.json)
        return 0
    hosts = cluster.contract_groups["slurm_compute"]
    try:
        units = topology_units(cluster.plan, args.by, hosts)
        largest = max((len(n) for _, n in units), default=1)
        cap = parse_max_unavailable(args.max_unavailable, len(hosts), largest)
        if args.dry_run:
            waves = plan_waves(units, cap, by=args.by)
            if args.json:
                print_json({"cluster": cluster.name, "change": args.change, "by": args.by, "max_unavailable": cap,
                            "nodes": len(hosts), "waves": [w.as_json() for w in waves]})
                return 0
            print(f"{cluster.name}: {args.change} in {len(waves)} waves by {args.by}, at most {cap} of {len(hosts)} "
                  "nodes out at once (nodes drained by hand are left out when the rollout starts, and units running "
                  "jobs then go last)")
            for w in waves:
                print(f"  wave {w.index:>3}: {len(w.nodes):>4} nodes  {', '.join(w.units)}")
            return 0
    except WaveError as exc:
        raise UsageError(f"{args.target}: {exc}") from None
    try:
        if args.resume:  # read only: the folder is checked, not created (state.load)
            path = folder / state.NAME
            s = _load(path, cluster.name)
            slurm = live.slurm() if live else Slurm()
            if s.get("finished"):
                print(f"rollout {s['id']} already finished; nothing to resume", file=sys.stderr if args.json else None)
                if args.json:
                    _print_status(s, path, True)
                return 0
            s["halted"] = None
        else:
            path = state.state_path(folder)
            if os.path.lexists(path):  # a link, even a dangling one, is refused by load, never written through
                old = state.load(path)
                if not old["finished"]:
                    raise UsageError(f"{path}: rollout {old['id']} is not finished; continue it with --resume, see "
                                     "it with --status, or move the file aside to abandon it")
            slurm = live.slurm() if live else Slurm()
            now = slurm.nodes(hosts)
            skip = engine.out_for_others(now)
            try:
                waves = plan_waves(_busy_last(units, now), cap, by=args.by, skip=set(skip))
            except WaveError as exc:
                raise UsageError(f"{args.target}: {exc}") from None
            rid = f"{cluster.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
            s = engine.new_state(rid, cluster=cluster.name, source=str(cluster.source), change=args.change,
                                 by=args.by, max_unavailable=cap, waves=waves, skipped=skip,
                                 halt_share=args.halt_share / 100)
            state.save(path, s)
            say(f"rollout {rid}: {args.change} on {len(hosts) - len(skip)} nodes in {len(waves)} waves by {args.by}, "
                f"at most {cap} out at once; {len(skip)} out of service for other reasons left alone; state in "
                f"{path}")
    except SlurmError as exc:
        raise OperationError(str(exc)) from None
    apply = (hooks.command_hook(args.apply_command, "--apply-command") if args.apply_command
             else live.apply if live and s["change"] in ("drain", "reboot") else None)
    check = (hooks.command_hook(args.check_command, "--check-command") if args.check_command
             else live.check if live else None)
    run = engine.Rollout(slurm, path, s, apply=apply, check=check, controller=live.controller if live else None,
                         poll=args.poll, say=say)
    try:
        run.run()
    except engine.Halted as exc:
        print(f"halted: {exc}; fix the nodes, then --resume (state in {path})", file=sys.stderr)
        _print_status(run.state, path, args.json)
        return 1
    except SlurmError as exc:
        raise OperationError(f"{exc} (state kept in {path}: --resume continues)") from None
    _print_status(run.state, path, args.json)
    return 0


def _load(path: Path, cluster: str) -> dict:
    """The state file, checked (state.load), and of this cluster."""
    from gpucluster.rollout import state

    s = state.load(path)
    if s["cluster"] != cluster:
        raise UsageError(f"{path}: cluster: the rollout of '{s['cluster']}', not of '{cluster}'; give that "
                         "cluster's inventory or spec, or this cluster's --state-dir")
    return s


def _resize(cluster, args: argparse.Namespace, live, say) -> int:
    """--resize NEW_SPEC: grow or shrink (rollout/resize.py). With an inventory written from NEW_SPEC (the new hosts
    enrolled), the cluster is changed: the old node list is the one slurmctld has, the new one the spec's, and the
    steps run through the inventory (rollout/live.py). Otherwise, with --dry-run, the plan between two specs."""
    from gpucluster import slurmkeys
    from gpucluster.cluster import load_cluster
    from gpucluster.rollout import resize
    from gpucluster.rollout.engine import Halted
    from gpucluster.rollout.slurmclient import SlurmError

    if not Path(args.resize).is_file():
        raise UsageError(f"--resize {args.resize}: no such spec file; give the spec with the new node counts")
    new = load_cluster(args.resize)
    if new.name != cluster.name:
        raise UsageError(f"--resize {args.resize}: cluster '{new.name}', not '{cluster.name}'; give the same "
                         "cluster's spec with the node counts changed")
    enrolled = live is not None and Path(cluster.source).resolve() == Path(args.resize).resolve()
    if not enrolled and not args.dry_run:
        raise UsageError(f"--resize {args.resize}: the inventory must be written from this spec first, so the new "
                         "hosts are enrolled and the leaving ones are not: `gpucluster inventory NEW_SPEC -o "
                         "INVENTORY ...` (or `stage up NEW_SPEC`), then `gpucluster rollout INVENTORY --resize "
                         "NEW_SPEC`; with a SPEC, --dry-run prints the plan")
    try:
        slurm = live.slurm() if enrolled else None
        if enrolled:
            was = set(slurm.nodes())
            now = new.contract_groups["slurm_compute"]
            version = str(new.spec.slurm.version)
            how = "reconfigure" if slurmkeys.change_class("NodeName", version) == "reconfigure" else "restart"
            plan = resize.Resize(tuple(h for h in now if h not in was), tuple(sorted(was - set(now))),
                                 tuple(h for h in now if h in was), version, how)
        else:
            plan = resize.plan_resize(cluster, new)
        print(f"{cluster.name}: {len(plan.added)} nodes added, {len(plan.removed)} removed, {len(plan.kept)} kept; "
              f"Slurm {plan.version} learns a node list by {plan.how}")
        for i, step in enumerate(plan.steps(), 1):
            print(f"  {i}. {step}")
        if args.dry_run or not (plan.added or plan.removed):
            return 0
        from gpucluster.rollout.live import LiveController

        rid = f"{cluster.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        ctl = LiveController(live)
        resize.shrink(plan, ctl, slurm, rid, poll=args.poll, say=say)
        errors = resize.grow(plan, ctl, slurm, rid, check=live.check, say=say)
    except Halted as exc:
        print(f"halted: {exc}; run the same command again once their jobs have ended", file=sys.stderr)
        return 1
    except SlurmError as exc:
        raise OperationError(f"{exc}; the nodes keep their gpc: reasons: fix it, then run the same command again") \
            from None
    for n, why in sorted(errors.items()):
        print(f"  {n}: stays drained: {why}")
    return 1 if errors else 0


def _print_status(s: dict, path: Path, as_json: bool = False) -> None:
    from gpucluster.rollout.engine import summary

    if as_json:
        print_json({"state_file": str(path), **s})
        return
    done = sum(1 for w in s["waves"] if w["status"] == "done")
    where = "finished" if s.get("finished") else f"halted: {s['halted']}" if s.get("halted") else "under way"
    print(f"rollout {s['id']} ({s['change']} by {s['by']}, at most {s['max_unavailable']} out): {where}; "
          f"{done}/{len(s['waves'])} waves done; controller: "
          f"{', '.join(f'{k} {v}' for k, v in s['controller'].items())}  [{path}]")
    running = [w for w in s["waves"] if w["status"] == "running"]
    if running:
        print(f"  wave {running[0]['index']} in progress: {', '.join(running[0]['units'])}")
    for line in summary(s):
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
