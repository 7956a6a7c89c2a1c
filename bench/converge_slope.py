"""The controller's cost of a no-op converge at 4, 8 and 16 staged GPU nodes, by push and by pull, with the slope
fitted and projected to fleet sizes (docs/roles.md, "Controller cost at 4, 8 and 16 nodes").

    .venv/bin/python bench/converge_slope.py [--inventory inventories/staging16] [--sizes 4,8,16]
        [--modes push,pull,timer]
        [--repeat N] [--push-tags TAGS] [--pull-option NAME=VALUE ...] [--variant LABEL:ENV=VALUE,... ...] [--json FILE]

On one staged cluster that is already converged (bench/staging-16.yaml: `gpucluster stage up bench/staging-16.yaml`,
then `gpucluster configure inventories/staging16 --push` once), each size is a --limit to the first N GPU nodes of
the same containers. Push limited to GPU nodes runs every play on those nodes only (the compile play is the
controller's own, delegated tasks reach the Slurm controller whatever the limit); pull converges those nodes from
the bundle. The controller's CPU is this process and every process it starts (bench/converge_cost.py), apart from
the nodes' CPU (their containers' cgroups): on the staged cluster they share this machine's cores, on a real
cluster they do not. Mode `timer` is the pull with `trigger="timer"`: this machine signs and publishes a pointer,
the nodes' gpucluster-pull.timer converges them, and their results are read from the bundle server (one ssh per
poll, none per host).

--pull-option passes a keyword to gpucluster.configure.pull.pull() (whatever modes it offers: tags=nccl, or a
fast no-op path where one exists); --variant measures a push again with Ansible settings changed through the
environment (ANSIBLE_STRATEGY=free, ANSIBLE_FORKS=4, ...) or with another checkout's ansible.cfg, playbooks and
roles (PROJECT=DIR, e.g. `git archive` of the commit before a change), in the same run, for the "cheaper push"
figures.

Prints one row per run, then the least-squares fit of controller CPU-seconds against hosts for each mode (the
slope is the CPU-seconds each added host costs) and the projection to 3,072 and 25,000 nodes. Nothing is
asserted: CPU-seconds hold on a shared machine (they count only this process tree's work), wall time does not
(it waits on the cores the other work holds), so the load average is printed beside every row.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT_TO = (3072, 25000)


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares y = a + b*x over (x, y): (a, b, the standard error of b; 0 with fewer than 3 points)."""
    n = len(points)
    if n < 2 or len({x for x, _ in points}) < 2:
        return (points[0][1] if points else 0.0), 0.0, 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    if n < 3:
        return a, b, 0.0
    resid = sum((y - a - b * x) ** 2 for x, y in points)
    return a, b, (resid / (n - 2) / sxx) ** 0.5


def _staged_containers(inventory: Path, stage_state: Path | None = None) -> dict[str, str]:
    """node -> podman container of a staged inventory (named by its cluster and the stage's state folder: the
    inventory's own, unless `gpucluster inventory --ssh-config` wrote it with another, as the staged tests do)."""
    from gpucluster.inventory.reader import load_inventory
    from gpucluster.inventory.statedir import literal
    from gpucluster.stage.podman import StageConfig, container_name

    inv = load_inventory(inventory)
    cfg = StageConfig(cluster=str(literal(inv.vars["gpucluster_cluster"])),
                      state_dir=stage_state or Path(str(literal(inv.vars["gpucluster_state_dir"]))))
    return {h: container_name(cfg, h) for h in inv.hosts}


def _options(pairs: list[str], accepted: set[str]) -> dict[str, object]:
    """NAME=VALUE pairs for pull(), typed (ints, true/false) and checked against its signature."""
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in accepted:
            raise SystemExit(f"--pull-option {pair!r}: pull() takes {', '.join(sorted(accepted))} (NAME=VALUE)")
        value: object = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        elif raw.isdigit():
            value = int(raw)
        out[name] = value
    return out


def _variants(specs: list[str]) -> list[tuple[str, dict[str, str]]]:
    out = []
    for spec in specs:
        label, sep, rest = spec.partition(":")
        env = dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
        if not sep or not env:
            raise SystemExit(f"--variant {spec!r}: write LABEL:ENV=VALUE[,ENV=VALUE]")
        out.append((label, env))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inventory", default=str(ROOT / "inventories" / "staging16"))
    parser.add_argument("--group", default="slurm_compute",
                        help="the hosts each size takes the first N of (all: every host of the inventory)")
    parser.add_argument("--sizes", default="4,8,16")
    parser.add_argument("--skip", default="", help="hosts to leave out (a node that did not converge), comma separated")
    parser.add_argument("--modes", default="push,pull",
                        help="push, pull, timer (pull by the nodes' timers), comma separated")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--push-tags", help="push only these tags (configure --tags); default: every play")
    parser.add_argument("--pull-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:ENV=VALUE,...",
                        help="a push measured again with these Ansible environment settings")
    parser.add_argument("--variant-sizes", default="", help="sizes the variants run at (default: --sizes)")
    parser.add_argument("--push-sizes", default="", help="sizes the push runs at (default: --sizes; a 16-node push "
                        "takes about 20 minutes on the staged machine)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    # SIGTERM ends the whole plan, not only the run under way: the run's configure or pull unwinds (and stops its
    # ansible-playbook) on the SystemExit, and no later run starts. Before, one run failed and the next began.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    sys.path.insert(0, str(ROOT / "bench"))
    from converge_cost import become_subreaper, container_cgroups, measure

    from gpucluster.configure import configure
    from gpucluster.configure.pull import pull
    from gpucluster.inventory.reader import inventory_file, load_inventory

    subreaper = become_subreaper()
    inventory = inventory_file(args.inventory)
    inv = load_inventory(inventory)
    skip = {h.strip() for h in args.skip.split(",") if h.strip()}
    every = list(inv.hosts) if args.group == "all" else inv.group(args.group)  # all: the whole cluster's push
    nodes = [h for h in every if h not in skip]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not nodes or max(sizes) > len(nodes):
        raise SystemExit(f"{inventory}: {len(nodes)} hosts in {args.group}, fewer than the {max(sizes)} asked for")
    pull_kwargs = _options(args.pull_option, set(inspect.signature(pull).parameters) - {"inventory", "log"})
    cgroups = container_cgroups(_staged_containers(inventory))
    quiet = lambda _line: None  # noqa: E731
    numbers: dict = {"inventory": str(inventory), "cpus": os.cpu_count(), "load_before": _load(),
                     "subreaper": subreaper, "pull_options": {k: str(v) for k, v in pull_kwargs.items()}, "runs": []}

    def push_run(limit: str, project: str | None = None) -> Callable[[], tuple[int, bool]]:
        def run() -> tuple[int, bool]:
            r = configure(inventory, limit=limit, project=project, tags=args.push_tags, log=quiet)
            return r.changed, r.ok
        return run

    def pull_run(limit: str, **extra: object) -> Callable[[], tuple[int, bool]]:
        def run() -> tuple[int, bool]:
            r = pull(inventory, limit=limit, log=quiet, **{**pull_kwargs, **extra})
            return r.changed, r.ok
        return run

    plan: list[tuple[str, int, Callable, dict[str, str]]] = []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    variant_sizes = [int(s) for s in args.variant_sizes.split(",") if s.strip()] or sizes
    push_sizes = [int(s) for s in args.push_sizes.split(",") if s.strip()] or sizes
    for _ in range(max(1, args.repeat)):
        for n in sizes:
            limit = ",".join(nodes[:n])
            if "push" in modes and n in push_sizes:
                plan.append((f"push --tags {args.push_tags}" if args.push_tags else "push", n, push_run(limit), {}))
            for label, env in _variants(args.variant):
                if n in variant_sizes:  # PROJECT=DIR: another checkout's ansible.cfg, playbooks and roles
                    project = env.pop("PROJECT", None)
                    plan.append((f"push {label}", n, push_run(limit, project), env))
            if "pull" in modes:
                named = " ".join(f"{k}={v}" for k, v in pull_kwargs.items())
                plan.append((f"pull {named}".strip(), n, pull_run(limit), {}))
            if "timer" in modes:  # the same pull, the nodes' timers as the trigger (no ssh per host)
                plan.append(("pull trigger=timer", n, pull_run(limit, trigger="timer"), {}))

    print(f"{'mode':24s} {'hosts':>5s} {'wall s':>7s} {'ctl CPU s':>9s} {'ctl s/host':>10s} {'nodes CPU s':>11s} "
          f"{'changes':>7s}  load", flush=True)
    for label, n, run, env in plan:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            cost = measure(label, n, run, cgroups)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        load = _load()
        numbers["runs"].append({**cost.row(), "env": env, "load_after": load})
        print(f"{label:24s} {n:5d} {cost.wall_s:7.1f} {cost.controller_cpu_s:9.2f} {cost.controller_per_host:10.3f} "
              f"{cost.nodes_cpu_s:11.1f} {cost.changed:7d}  {load}{'' if cost.ok else '  FAILED'}", flush=True)
        if args.json:  # after every run: a long bench cut short keeps what it measured
            Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n")

    print(f"\n{'mode':24s} {'fixed s':>8s} {'s/host':>8s} {'+-':>6s} "
          + " ".join(f"{f'{n:,} nodes':>14s}" for n in PROJECT_TO))
    numbers["fits"] = {}
    for label in dict.fromkeys(r["label"] for r in numbers["runs"]):
        points = [(r["hosts"], r["controller_cpu_s"]) for r in numbers["runs"] if r["label"] == label and r["ok"]]
        if len({x for x, _ in points}) < 2:
            continue
        a, b, se = fit(points)
        proj = {n: a + b * n for n in PROJECT_TO}
        numbers["fits"][label] = {"fixed_s": round(a, 2), "per_host_s": round(b, 3), "per_host_se": round(se, 3),
                                  "projected_cpu_h": {str(n): round(v / 3600, 2) for n, v in proj.items()}}
        print(f"{label:24s} {a:8.2f} {b:8.3f} {se:6.3f} "
              + " ".join(f"{v / 3600:10.2f} CPU-h" for v in proj.values()))
    print(f"\nload average now {_load()} on {os.cpu_count()} CPUs (shared: CPU-seconds hold, wall time does not)")
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
