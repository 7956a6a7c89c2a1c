"""One reboot-class change rolled out twice on one running cluster, under the same job arrivals and the same
ceiling: topology-aware (waves of whole leaves) and topology-blind (random batches of the same size, what the
anchors do: Slinky's share of a node set, a list of hosts cut in batches).
bench/rollout_compare.py runs it at 512 emulated nodes, tests/test_rollout_compare.py at 32.

It drives a real cluster through its Slurm clients only (a `run` function, as rollout.slurmops): jobs go in
with sbatch, the rollout is the engine's own (`scontrol reboot ASAP nextstate=RESUME`), and every figure is
read back from slurmctld:

    killed          jobs that did not end COMPLETED, or that Slurm restarted (requeued): must be 0
    rollout_s       from the first wave to the last node back in service
    large_wait_s    mean of StartTime - SubmitTime over the large jobs (one whole leaf, --switches=1)
                    submitted while the rollout ran
    block samples   every `every` seconds, the largest leaf-aligned block (consecutive whole leaves, in
                    nodes) that is (a) in service: no node drained, rebooting or down, and (b) free: also idle
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster import slurmtext
from gpucluster.rollout import state as st
from gpucluster.rollout.engine import Rollout, new_state
from gpucluster.rollout.slurmops import NodeState, Slurm
from gpucluster.rollout.waves import Wave
from gpucluster.slurmtext import Runner

ACTIVE = "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING,REQUEUED,RESIZING"


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds after the run starts
    nodes: int
    seconds: int
    large: bool


def job_mix(seed: int, *, total: int, leaf: int, length: float, seconds: tuple[int, int],
            load: float = 0.8, large_share: float = 0.25) -> list[Arrival]:
    """Poisson arrivals for `length` seconds that ask for about `load` of the nodes: a `large_share` of the
    jobs take one whole leaf, the rest 1 to 4 nodes. Seeded: both runs see the same jobs at the same times."""
    rng = random.Random(seed)
    mean_nodes = large_share * leaf + (1 - large_share) * 2.5
    rate = load * total / (mean_nodes * sum(seconds) / 2)  # jobs per second
    out, t = [], 0.0
    while t < length:
        large = rng.random() < large_share
        out.append(Arrival(round(t, 3), leaf if large else rng.randint(1, 4), rng.randint(*seconds), large))
        t += rng.expovariate(rate)
    return out


def blind_waves(hosts: Sequence[str], size: int, seed: int) -> list[Wave]:
    """Random batches of `size` nodes: a rollout that knows no topology."""
    shuffled = list(hosts)
    random.Random(seed).shuffle(shuffled)
    return [Wave(i + 1, (f"random{i + 1}",), tuple(shuffled[k:k + size]))
            for i, k in enumerate(range(0, len(shuffled), size))]


def leaf_blocks(nodes: dict[str, NodeState], leaves: Sequence[Sequence[str]]) -> tuple[int, int]:
    """(largest in-service block, largest free block), each in nodes, of consecutive whole leaves."""
    def in_service(n: str) -> bool:
        s = nodes.get(n)
        return s is not None and not s.out and not s.rebooting and "NOT_RESPONDING" not in s.states

    def free(n: str) -> bool:
        return in_service(n) and "IDLE" in nodes[n].states and "COMPLETING" not in nodes[n].states

    def best(ok: Callable[[str], bool]) -> int:
        top = run = 0
        for lf in leaves:
            run = run + len(lf) if all(ok(n) for n in lf) else 0
            top = max(top, run)
        return top

    return best(in_service), best(free)


@dataclass
class Result:
    run: str
    waves: int
    wave_nodes: int
    jobs: int = 0
    killed: int = 0
    killed_jobs: list[str] = field(default_factory=list)
    rollout_s: float = 0.0
    large_jobs: int = 0
    large_wait_s: float = 0.0
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t from rollout start, in service, free)

    def mean(self, col: int) -> float:
        return sum(s[col] for s in self.samples) / max(1, len(self.samples))

    def as_json(self) -> dict:
        return {"run": self.run, "waves": self.waves, "wave_nodes": self.wave_nodes, "jobs": self.jobs,
                "killed": self.killed, "killed_jobs": self.killed_jobs, "rollout_s": round(self.rollout_s, 1),
                "large_jobs": self.large_jobs, "large_wait_s": round(self.large_wait_s, 1),
                "in_service_block_mean": round(self.mean(1), 1), "free_block_mean": round(self.mean(2), 1),
                "samples": self.samples}


def _jobs(run: Runner) -> dict[str, dict[str, str]]:
    res = run(["scontrol", "show", "job", "-o"])
    out = {}
    for line in (res.stdout or "").splitlines():
        if line.startswith("JobId="):
            raw = slurmtext.record(line)
            out[raw["JobId"]] = raw
    return out


def _epoch(text: str) -> float | None:
    if not text or not text[0].isdigit():
        return None
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def run_once(run: Runner, label: str, waves: list[Wave], leaves: Sequence[Sequence[str]], mix: list[Arrival],
             state_dir: Path, *, warmup: float, every: float = 1.0, poll: float = 0.5,
             drain_timeout: float = 900.0) -> Result:
    """Submit `mix` from t=0, start the rollout at t=warmup, stop submitting when it ends, wait for every job,
    then read the outcome of each from slurmctld (MinJobAge must keep finished jobs that long)."""
    slurm = Slurm(run)
    result = Result(label, len(waves), max(len(w.nodes) for w in waves))
    submitted: dict[str, Arrival] = {}
    stop_submit, stop_sample = threading.Event(), threading.Event()
    start = time.monotonic()
    rollout_t0 = start + warmup

    def submit() -> None:
        for a in mix:
            if stop_submit.wait(max(0.0, start + a.at - time.monotonic())):
                return
            argv = ["sbatch", "--parsable", "-N", str(a.nodes), "--exclusive", "-o", "/dev/null", "-J",
                    f"{label}-{'large' if a.large else 'small'}"]
            res = run([*argv, *(["--switches=1"] if a.large else []), "--wrap", f"sleep {a.seconds}"])
            if res.returncode == 0:
                submitted[res.stdout.strip().split(";")[0]] = a

    def sample() -> None:
        while not stop_sample.wait(every):
            t = time.monotonic()
            if t >= rollout_t0:
                result.samples.append((round(t - rollout_t0, 1), *leaf_blocks(slurm.nodes(), leaves)))

    threads = [threading.Thread(target=submit, daemon=True), threading.Thread(target=sample, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, rollout_t0 - time.monotonic()))
    wall0 = time.time()
    s = new_state(f"compare-{label}", cluster="compare", source="", change="reboot", by=label,
                  max_unavailable=result.wave_nodes, waves=waves, skipped=[], halt_share=1.0)
    Rollout(slurm, st.state_path(state_dir / label), s, poll=poll, say=lambda _: None, live=False).run()
    result.rollout_s = time.monotonic() - rollout_t0
    wall1 = time.time()
    stop_submit.set()
    stop_sample.set()
    for t in threads:
        t.join()
    deadline = time.monotonic() + drain_timeout
    while time.monotonic() < deadline:
        res = run(["squeue", "-h", "-t", ACTIVE, "-o", "%i"])
        if res.returncode == 0 and not res.stdout.split():
            break
        time.sleep(1.0)
    jobs = _jobs(run)
    waits = []
    for jobid, a in submitted.items():
        raw = jobs.get(jobid, {})
        if raw.get("JobState") != "COMPLETED" or raw.get("Restarts", "0") != "0":
            result.killed_jobs.append(f"{jobid}:{raw.get('JobState', 'gone')}:restarts={raw.get('Restarts', '?')}")
        sub, begin = _epoch(raw.get("SubmitTime", "")), _epoch(raw.get("StartTime", ""))
        if a.large and sub is not None and begin is not None and wall0 - 1 <= sub <= wall1:
            waits.append(begin - sub)
    result.jobs, result.killed = len(submitted), len(result.killed_jobs)
    result.large_jobs, result.large_wait_s = len(waits), sum(waits) / max(1, len(waits))
    return result


def wait_quiet(run: Runner, hosts: Sequence[str], timeout: float = 600.0) -> None:
    """Until no job is left and every node is idle and in service: the second run starts as the first did."""
    slurm = Slurm(run)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = slurm.nodes(hosts)
        if len(now) == len(hosts) and all("IDLE" in s.states and not s.out and not s.rebooting
                                          and not s.states & {"COMPLETING", "NOT_RESPONDING"}
                                          for s in now.values()):
            return
        time.sleep(1.0)
    raise TimeoutError(f"nodes not all idle and in service after {timeout:.0f} s")
