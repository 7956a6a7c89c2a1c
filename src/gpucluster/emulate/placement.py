"""Where does Slurm put jobs, with and without the rendered topology?

A seeded workload of sleep jobs (1 to 64 nodes, whole nodes) is submitted to an emulated cluster;
each job's node list is read back from ``squeue`` and scored against the leaf membership of the
rendered topology.conf (the physical fabric, which is the same whether or not slurmctld was told
about it).

Definitions (per run; "usable" nodes exclude drained nodes and nodes held by fragmentation jobs):
- min leaves: the fewest leaves whose usable nodes add up to the job's size (largest first).
- on min leaves: the job spans exactly its min leaves.
- needless spine crossing: the job spans more than one leaf although its size fits in one leaf's
  usable nodes. Weighted: the same, counted in nodes instead of jobs.
- above lowest switch: the lowest switch above all of the job's nodes is higher than the lowest
  switch that has enough usable nodes (covers pods/cores on 3-tier trees).
- time to place: from releasing the (held) workload to the start of its last job.
All of these are static bounds (an empty cluster minus the fragmentation); whether a leaf had room
*at the moment* a job was placed is measured by :func:`run_sequential`, which submits one job at a
time and knows the occupancy.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import hostlist

from gpucluster.emulate.harness import SlurmCluster, SlurmCommandError
from gpucluster.emulate.switchtree import Fabric


@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: int
    seconds: int


def make_workload(
    n_jobs: int,
    *,
    seed: int,
    max_nodes: int = 64,
    min_seconds: int = 5,
    max_seconds: int = 30,
) -> list[JobSpec]:
    """Sizes log-uniform in [1, max_nodes] (as many 1-2 node jobs as 32-64 node ones), durations uniform."""
    rng = random.Random(seed)
    top = math.log2(max_nodes)
    return [
        JobSpec(
            f"w{i:04d}",
            max(1, min(max_nodes, round(2 ** rng.uniform(0, top)))),
            rng.randint(min_seconds, max_seconds),
        )
        for i in range(n_jobs)
    ]


@dataclass
class Placed:
    job: JobSpec
    jobid: str
    nodes: list[str] = field(default_factory=list)
    submitted: float = 0.0  # seconds since the workload was released
    started: float | None = None
    fit_one_leaf_now: bool | None = None  # run_sequential only: a leaf had room when it was submitted


@dataclass
class RunResult:
    label: str
    placed: list[Placed]
    place_s: float
    usable: set[str]
    sdiag: dict[str, float]
    ctld_peak_kib: int | None
    switches: bool
    skipped: list[JobSpec] = field(default_factory=list)  # larger than the usable nodes


@dataclass(frozen=True)
class Scores:
    jobs: int
    on_min_leaves: float
    mean_leaves: float
    mean_min_leaves: float
    needless_spine: float
    needless_spine_weighted: float
    above_lowest_switch: float
    place_s: float
    mean_wait_s: float
    sched_mean_cycle_us: float
    bf_mean_cycle_us: float
    ctld_peak_mib: float
    one_leaf_violations: int  # run_sequential: fit under one leaf at submission but spread

    ROWS = (
        ("jobs", "jobs placed", "{:.0f}"),
        ("on_min_leaves", "share on the minimum number of leaves", "{:.1%}"),
        ("mean_leaves", "mean leaves per job", "{:.2f}"),
        ("mean_min_leaves", "  (minimum possible, mean)", "{:.2f}"),
        ("needless_spine", "share crossing a spine needlessly", "{:.1%}"),
        ("needless_spine_weighted", "  same, weighted by job size", "{:.1%}"),
        ("above_lowest_switch", "share above the lowest possible switch", "{:.1%}"),
        ("place_s", "time to place the workload (s)", "{:.1f}"),
        ("mean_wait_s", "mean wait (s)", "{:.1f}"),
        ("sched_mean_cycle_us", "main scheduler mean cycle (us)", "{:.0f}"),
        ("bf_mean_cycle_us", "backfill mean cycle (us)", "{:.0f}"),
        ("ctld_peak_mib", "slurmctld peak RSS (MiB)", "{:.1f}"),
    )


def score(run: RunResult, fabric: Fabric) -> Scores:
    placed = [p for p in run.placed if p.nodes]
    caps = fabric.capacity(run.usable)
    biggest_leaf = max(caps.values()) if caps else 0
    on_min = leaves_sum = min_sum = needless = needless_nodes = above = 0
    total_nodes = 0
    violations = 0
    for p in placed:
        k = len(p.nodes)
        n_leaves = len(fabric.leaves(p.nodes))
        least = fabric.min_leaves(k, run.usable)
        leaves_sum += n_leaves
        min_sum += least
        on_min += n_leaves == least
        total_nodes += k
        if n_leaves > 1 and k <= biggest_leaf:
            needless += 1
            needless_nodes += k
        if fabric.lca_level(p.nodes) > fabric.min_lca_level(k, run.usable):
            above += 1
        if p.fit_one_leaf_now and n_leaves > 1:
            violations += 1
    n = len(placed) or 1
    waits = [p.started - p.submitted for p in placed if p.started is not None]
    return Scores(
        jobs=len(placed),
        on_min_leaves=on_min / n,
        mean_leaves=leaves_sum / n,
        mean_min_leaves=min_sum / n,
        needless_spine=needless / n,
        needless_spine_weighted=needless_nodes / (total_nodes or 1),
        above_lowest_switch=above / n,
        place_s=run.place_s,
        mean_wait_s=sum(waits) / len(waits) if waits else 0.0,
        sched_mean_cycle_us=run.sdiag.get("main_mean_cycle", 0.0),
        bf_mean_cycle_us=run.sdiag.get("bf_mean_cycle", 0.0),
        ctld_peak_mib=(run.ctld_peak_kib or 0) / 1024,
        one_leaf_violations=violations,
    )


# ---------------------------------------------------------------------------------------- running
def sbatch_args(job: JobSpec, *, switches: int | None, switch_wait: str, hold: bool) -> list[str]:
    limit = max(1, math.ceil((job.seconds + 60) / 60))  # minutes; a limit lets backfill plan
    args = [
        "sbatch",
        "--parsable",
        "-J",
        job.name,
        "-N",
        str(job.nodes),
        "--exclusive",
        "-t",
        str(limit),
        "-o",
        "/dev/null",
        "-e",
        "/dev/null",
    ]
    if hold:
        args.append("-H")
    if switches:
        args.append(f"--switches={switches}@{switch_wait}")
    return [*args, "--wrap", f"sleep {job.seconds}"]


def submit(cluster: SlurmCluster, args: list[str]) -> str:
    res = cluster.run(args, check=True)
    return res.stdout.strip().split(";")[0]


def job_states(cluster: SlurmCluster) -> dict[str, tuple[str, str]]:
    """jobid -> (state, nodelist) for every job slurmctld still remembers."""
    out = cluster.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%N"], check=True).stdout
    states: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        jid, state, nodes = (line.split("|") + ["", ""])[:3]
        states[jid] = (state, nodes)
    return states


def sdiag(cluster: SlurmCluster) -> dict[str, float]:
    """Mean/max cycle of the main and backfill schedulers (microseconds) from ``sdiag``."""
    text = cluster.run(["sdiag"]).stdout
    out: dict[str, float] = {}
    section = "main"
    for line in text.splitlines():
        if line.startswith("Main schedule statistics"):
            section = "main"
        elif line.startswith("Backfilling stats"):
            section = "bf"
        elif line.startswith(("Latency", "Remote Procedure", "Pending RPC")):
            section = "other"
        m = re.match(r"\s*(Mean cycle|Max cycle|Total cycles):\s*([\d.]+)", line)
        if m and section in ("main", "bf"):
            out[f"{section}_{m.group(1).lower().replace(' ', '_')}"] = float(m.group(2))
    return out


def _busy_nodes(cluster: SlurmCluster) -> set[str]:
    busy: set[str] = set()
    for state, nodes in job_states(cluster).values():
        if state in ("RUNNING", "COMPLETING", "CONFIGURING") and nodes:
            busy.update(hostlist.expand_hostlist(nodes))
    return busy


def usable_nodes(cluster: SlurmCluster) -> set[str]:
    """Nodes that can take work: not drained/down, not held by a job that outlives the workload."""
    out = set()
    for name, rec in cluster.nodes().items():
        bad = rec["states"] & {"DRAIN", "DOWN", "FUTURE", "NOT_RESPONDING", "FAIL", "MAINTENANCE"}
        if not bad:
            out.add(name)
    return out


def run_batch(
    cluster: SlurmCluster,
    jobs: Sequence[JobSpec],
    fabric: Fabric,
    *,
    label: str,
    switches: bool = False,
    switch_wait: str = "1:00",
    blocked: Iterable[str] = (),
    poll_s: float = 0.5,
    timeout_s: float = 1800,
) -> RunResult:
    """Submit the whole workload held, release it at once, record where and when each job starts."""
    usable = usable_nodes(cluster) - set(blocked)
    skipped = [j for j in jobs if j.nodes > len(usable)]
    jobs = [j for j in jobs if j.nodes <= len(usable)]  # could never start (fragmentation)
    ids: list[str] = []
    for job in jobs:
        want = fabric.min_leaves(job.nodes, usable) if switches else None
        ids.append(submit(cluster, sbatch_args(job, switches=want, switch_wait=switch_wait, hold=True)))
    placed = {jid: Placed(job, jid) for jid, job in zip(ids, jobs, strict=True)}
    cluster.run(["sdiag", "-r"])
    cluster.reset_ctld_peak()
    t0 = time.monotonic()
    cluster.run(["scontrol", "release", ",".join(ids)], check=True)
    last = 0.0
    deadline = t0 + timeout_s
    while True:
        now = time.monotonic() - t0
        for jid, (state, nodes) in job_states(cluster).items():
            p = placed.get(jid)
            if p is None or p.started is not None or state in ("PENDING", ""):
                continue
            if not nodes:
                continue  # cancelled before it started
            p.nodes = hostlist.expand_hostlist(nodes)
            p.started = now
            last = now
        if all(p.started is not None for p in placed.values()):
            break
        if time.monotonic() > deadline:
            raise SlurmCommandError(
                f"{label}: {sum(p.started is None for p in placed.values())} jobs still pending after "
                f"{timeout_s:.0f}s\n{cluster.log_tail(20)}"
            )
        time.sleep(poll_s)
    stats = sdiag(cluster)
    peak = cluster.ctld_peak_rss_kib()
    wait_idle(cluster, ids, timeout_s=timeout_s)
    return RunResult(label, list(placed.values()), last, usable, stats, peak, switches, skipped)


def run_sequential(
    cluster: SlurmCluster,
    jobs: Sequence[JobSpec],
    fabric: Fabric,
    *,
    label: str,
    timeout_s: float = 600,
    wait_done: bool = True,
) -> RunResult:
    """Submit one job at a time and wait for it to start, knowing the occupancy when it was submitted.

    Only our job is pending, so between the snapshot and its start nodes can only become free: if
    the snapshot shows a leaf with room, one truly had room when Slurm placed the job.
    ``wait_done=False`` returns once the last job has started (the placements are all known then), leaving the
    jobs running: for a caller that cancels them rather than wait out their sleeps.
    """
    usable = usable_nodes(cluster)
    placed: list[Placed] = []
    t0 = time.monotonic()
    cluster.reset_ctld_peak()
    for job in jobs:
        busy = _busy_nodes(cluster)
        free = usable - busy
        fits = max(fabric.capacity(free).values(), default=0) >= job.nodes
        jid = submit(cluster, sbatch_args(job, switches=None, switch_wait="0", hold=False))
        p = Placed(job, jid, submitted=time.monotonic() - t0, fit_one_leaf_now=fits)
        deadline = time.monotonic() + timeout_s
        while True:
            state, nodes = job_states(cluster).get(jid, ("", ""))
            if state not in ("PENDING", "") and nodes:
                p.nodes = hostlist.expand_hostlist(nodes)
                p.started = time.monotonic() - t0
                break
            if time.monotonic() > deadline:
                raise SlurmCommandError(f"{label}: job {jid} ({job}) did not start\n{cluster.log_tail(20)}")
            time.sleep(0.2)
        placed.append(p)
    last = max((p.started or 0.0) for p in placed) if placed else 0.0
    stats = sdiag(cluster)
    peak = cluster.ctld_peak_rss_kib()
    if wait_done:
        wait_idle(cluster, [p.jobid for p in placed], timeout_s=timeout_s)
    return RunResult(label, placed, last, usable, stats, peak, False)


def wait_idle(cluster: SlurmCluster, ids: Sequence[str], *, timeout_s: float) -> None:
    """Wait until these jobs are gone from the queue's active states."""
    active = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}
    deadline = time.monotonic() + timeout_s
    want = set(ids)
    while time.monotonic() < deadline:
        states = job_states(cluster)
        if not [j for j in want if states.get(j, ("",))[0] in active]:
            return
        time.sleep(1.0)
    raise SlurmCommandError(f"jobs still active after {timeout_s:.0f}s")


# ---------------------------------------------------------------------------------- fragmentation
@dataclass
class Fragmentation:
    drained: list[str]
    busy: list[str]
    busy_jobs: list[str]


def fragment(
    cluster: SlurmCluster,
    *,
    seed: int,
    drain_share: float = 0.08,
    busy_share: float = 0.17,
    hold_seconds: int = 86400,
) -> Fragmentation:
    """Drain some nodes and occupy others with long single-node jobs, scattered over all leaves."""
    rng = random.Random(seed)
    nodes = sorted(usable_nodes(cluster))
    rng.shuffle(nodes)
    n_drain = round(len(nodes) * drain_share)
    n_busy = round(len(nodes) * busy_share)
    drained = sorted(nodes[:n_drain])
    busy = sorted(nodes[n_drain : n_drain + n_busy])
    if drained:
        cluster.scontrol(
            "update", f"NodeName={hostlist.collect_hostlist(drained)}", "State=DRAIN", "Reason=bench-fragmentation"
        )
    jobs = []
    for node in busy:
        jobs.append(
            submit(
                cluster,
                [
                    "sbatch",
                    "--parsable",
                    "-J",
                    "frag",
                    "-N",
                    "1",
                    "-w",
                    node,
                    "--exclusive",
                    "-o",
                    "/dev/null",
                    "--wrap",
                    f"sleep {hold_seconds}",
                ],
            )
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = job_states(cluster)
        if all(states.get(j, ("",))[0] == "RUNNING" for j in jobs):
            break
        time.sleep(0.5)
    else:
        raise SlurmCommandError("fragmentation jobs did not all start")
    return Fragmentation(drained, busy, jobs)


def unfragment(cluster: SlurmCluster, frag: Fragmentation) -> None:
    if frag.busy_jobs:
        cluster.run(["scancel", *frag.busy_jobs])
        wait_idle(cluster, frag.busy_jobs, timeout_s=120)
    if frag.drained:
        cluster.scontrol("update", f"NodeName={hostlist.collect_hostlist(frag.drained)}", "State=RESUME")


# ------------------------------------------------------------------------------------------ report
def table(columns: Sequence[tuple[str, Scores]], *, ratio: tuple[int, int] | None = (0, 1)) -> str:
    """Rows = metrics, one column per run, plus a ratio column (first / second)."""
    heads = [name for name, _ in columns] + (["ratio"] if ratio and len(columns) > 1 else [])
    rows = []
    for attr, label, fmt in Scores.ROWS:
        vals = [getattr(s, attr) for _, s in columns]
        cells = [fmt.format(v) for v in vals]
        if ratio and len(columns) > 1:
            a, b = vals[ratio[0]], vals[ratio[1]]
            cells.append(f"{a / b:.2f}x" if b else ("=" if a == b else "-"))
        rows.append([label, *cells])
    width0 = max(len(r[0]) for r in rows)
    widths = [max(len(h), *(len(r[i + 1]) for r in rows)) for i, h in enumerate(heads)]
    lines = [" " * width0 + "  " + "  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    for r in rows:
        lines.append(r[0].ljust(width0) + "  " + "  ".join(c.rjust(w) for c, w in zip(r[1:], widths, strict=True)))
    return "\n".join(lines)
