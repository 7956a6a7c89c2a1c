"""Topology-aware vs topology-blind rollouts on an emulated cluster (issue 18, "Emulated, at scale").

One emulated cluster (a real slurmctld and one `slurmd -N` per node) of a seed's topology (meta-24k-ib:
rail-optimised, scalable units of --unit nodes, one logical leaf each), a seeded job mix with a share of
large jobs (one whole leaf each) and small ones, and the same change rolled out to every node twice with the
same ceiling:

    aware  waves of whole leaves (gpucluster rollout --by leaf)
    blind  random batches of the same size (what the anchors do: Slinky's share of a node set, by name)

The change is a stand-in for a reboot: drain, wait for the jobs to end, hold the nodes out for --reboot-s
seconds, resume. That is what `scontrol reboot ASAP` does to availability; the reboot itself cannot be
emulated (an emulated slurmd cannot register a newer boot time). Measured per run: jobs killed (any job
that did not end COMPLETED), time to finish the rollout, mean wait of the large jobs submitted during it,
and the largest free leaf-aligned block (whole idle leaves, in nodes) sampled every second.

    .venv/bin/python bench/rollout_scale.py                        # 512 nodes (mind the machine's load)
    .venv/bin/python bench/rollout_scale.py --nodes 48 --unit 8    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpucluster.emulate.emulator import emulate
from gpucluster.emulate.specs import scaled_spec, write_and_render
from gpucluster.render.topology import logical_leaves
from gpucluster.rollout import state as st
from gpucluster.rollout.engine import Rollout, new_state
from gpucluster.rollout.slurmclient import Slurm
from gpucluster.rollout.waves import Wave, plan_waves, topology_units


def _jobs(seed: int, n: int, leaf: int, seconds: tuple[int, int]) -> list[tuple[int, int]]:
    """(nodes, seconds): a third large (one whole leaf), the rest 1-2 nodes."""
    rng = random.Random(seed)
    return [(leaf if rng.random() < 1 / 3 else rng.choice((1, 2)), rng.randint(*seconds)) for _ in range(n)]


def _field(text: str, key: str) -> str:
    return next((t.split("=", 1)[1] for t in text.split() if t.startswith(key + "=")), "")


def _ts(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) if text and text[0].isdigit() else float("nan")


def run_once(c, label: str, waves: list[Wave], leaves: list[list[str]], mix: list[tuple[int, int]], leaf: int,
             reboot_s: float, workdir: Path) -> dict:
    slurm = Slurm(lambda cmd: c.run(cmd))
    submitted: list[tuple[str, int]] = []
    for nodes, secs in mix:
        res = c.run(["sbatch", "--parsable", "-N", str(nodes), "--exclusive", "-o", "/dev/null", "--wrap",
                     f"sleep {secs}"])
        if res.returncode == 0:
            submitted.append((res.stdout.strip().split(";")[0], nodes))
    time.sleep(2)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            now = slurm.nodes()
            free = [all(n in now and "IDLE" in now[n].states and not now[n].out for n in lf) for lf in leaves]
            best = run = 0
            for f in free:
                run = run + 1 if f else 0
                best = max(best, run)
            samples.append(best * leaf)
            stop.wait(1.0)

    t = threading.Thread(target=sample, daemon=True)
    s = new_state(label, cluster="bench", source="", change="drain", by=label, max_unavailable=max(len(w.nodes)
                  for w in waves), waves=waves, skipped=[], halt_share=1.0)
    path = st.state_path(workdir / label)
    t0 = time.monotonic()
    t.start()
    Rollout(slurm, path, s, apply=lambda nodes: time.sleep(reboot_s) or {}, poll=1.0, say=lambda _: None,
            live=False).run()
    took = time.monotonic() - t0
    stop.set()
    t.join()
    deadline = time.monotonic() + 600
    while c.job_ids("PENDING,RUNNING,COMPLETING,CONFIGURING") and time.monotonic() < deadline:
        time.sleep(2)
    killed, waits = 0, []
    for jobid, nodes in submitted:
        out = c.run(["scontrol", "show", "job", "-o", jobid]).stdout
        if _field(out, "JobState") != "COMPLETED":
            killed += 1
        if nodes == leaf:
            waits.append(_ts(_field(out, "StartTime")) - _ts(_field(out, "SubmitTime")))
    return {"run": label, "waves": len(waves), "jobs": len(submitted), "killed": killed, "rollout_s": took,
            "large_wait_s": sum(waits) / max(1, len(waits)), "free_block_mean": sum(samples) / max(1, len(samples)),
            "free_block_min": min(samples, default=0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--unit", type=int, default=32, help="nodes per scalable unit (one logical leaf)")
    ap.add_argument("--max-unavailable", type=int, default=0, help="default: two leaves")
    ap.add_argument("--jobs", type=int, default=0, help="default: 3 per leaf")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--reboot-s", type=float, default=5.0)
    ap.add_argument("--max-load", type=float, default=4.0, help="refuse to start above this 1-minute load")
    args = ap.parse_args(argv)
    if os.getloadavg()[0] > args.max_load:
        print(f"load {os.getloadavg()[0]:.1f} > {args.max_load}: not starting {args.nodes} slurmd", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="gpc-rollout-bench-"))
    text = scaled_spec("meta-24k-ib", {"h100": args.nodes}, name="rollbench", fabric={"scalable_unit_nodes": args.unit})
    r = write_and_render(text, work, "rollbench")
    hosts = [h for g in r.spec.groups_with_role("compute") for h in g.hosts]
    units = topology_units(r.plan, "leaf", hosts)
    leaves = [list(n) for _, n in units]
    leaf = max(len(lf) for lf in leaves)
    cap = args.max_unavailable or 2 * leaf
    aware = plan_waves(units, cap, by="leaf")
    rng = random.Random(args.seed)
    shuffled = hosts[:]
    rng.shuffle(shuffled)
    blind = [Wave(i + 1, ("random",), tuple(shuffled[k:k + cap])) for i, k in enumerate(range(0, len(hosts), cap))]
    mix = _jobs(args.seed, args.jobs or 3 * len(leaves), leaf, (10, 40))
    assert len(logical_leaves(r.plan)) == len(leaves)
    rows = []
    with emulate(r.conf_dir, start_timeout=600) as c:
        for label, waves in (("aware", aware), ("blind", blind)):
            rows.append(run_once(c, label, waves, leaves, mix, leaf, args.reboot_s, work))
            c.cancel_all()
    print(f"\n{args.nodes} emulated nodes, {len(leaves)} leaves of {leaf}, --max-unavailable {cap}, "
          f"{len(mix)} jobs (large = {leaf} nodes), reboot stand-in {args.reboot_s:g} s, seed {args.seed}\n")
    print("| run | waves | jobs | killed | rollout s | mean wait, large jobs s | free leaf-aligned block, mean "
          "| min |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['run']} | {row['waves']} | {row['jobs']} | {row['killed']} | {row['rollout_s']:.0f} | "
              f"{row['large_wait_s']:.1f} | {row['free_block_mean']:.1f} | {row['free_block_min']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
