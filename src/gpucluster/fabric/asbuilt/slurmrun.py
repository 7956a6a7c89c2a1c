"""`fabric test`'s engine: the cluster's own scheduler runs every case as a Slurm job.

From this machine it is one SSH session per round to the inventory's login host (else the controller),
the connection Ansible uses, through gpucluster.slurmclient: the session runs a round's `srun --nodelist=...`
lines at once and sends back their labelled output. Slurm does the fan-out, the node pinning and the clean-up;
a node that is down, drained or busy costs its cases, not the run.

Before the first round one probe job asks every tested node what it has (GPUs on the PCI bus, HCAs,
the tools), and the transport follows from the hosts: all_reduce_perf where every node has GPUs and
nccl-tests, ib_write_bw where every node has an HCA and perftest, and iperf3 over the container network
where no node has either: staged nodes, where iperf3 is the staging stand-in for the transport.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import yaml

from gpucluster import slurmtext
from gpucluster.errors import OperationError, UsageError
from gpucluster.fabric.asbuilt import jobs
from gpucluster.fabric.asbuilt.fabrictest import Case, Outcome, Verdict, cases, run_test, unit_hosts
from gpucluster.fabric.asbuilt.measure import measure
from gpucluster.fabric.asbuilt.tooloutput import ToolError, demux
from gpucluster.fabric.plan import Plan
from gpucluster.inventory.reader import Inventory
from gpucluster.inventory.values import valid_path
from gpucluster.paths import roles_dir
from gpucluster.slurmclient import Client, SlurmError, failed, slurm_host, tail

USABLE = ("idle", "alloc", "mix", "allocated", "mixed", "comp", "completing")


# ---- where the tests' programs are ---------------------------------------------------------------

def nccl_paths(inv: Inventory) -> tuple[str, str]:
    """(all_reduce_perf, the NCCL env script): where the nccl role puts them, the inventory's override first."""
    defaults: dict = {}
    roles = roles_dir()
    if roles is not None:
        try:
            defaults = yaml.safe_load((roles / "nccl" / "defaults" / "main.yml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            defaults = {}

    def value(var: str, fallback: str) -> str:
        v = inv.vars.get(var, defaults.get(var))
        if not isinstance(v, str) or not v or "{{" in v:
            return fallback
        if not (v.startswith("/") and valid_path(v)):  # it becomes srun's program: never an option
            raise UsageError(f"{inv.path}: {var}: {v!r} is not an absolute path of plain characters; give the "
                             "node's path, e.g. /opt/nccl-tests")
        return v

    return (f"{value('nccl_tests_dir', '/opt/nccl-tests')}/build/all_reduce_perf",
            value("nccl_env_script", "/etc/profile.d/gpucluster-nccl.sh"))


# ---- what the nodes have ------------------------------------------------------------------------

@dataclass
class NodeProbe:
    node: str
    gpus: int = 0
    hcas: tuple[str, ...] = ()
    tools: dict[str, str] = field(default_factory=dict)


def parse_probe(text: str) -> dict[str, NodeProbe]:
    out: dict[str, NodeProbe] = {}
    for task, t in demux(text).items():
        if task < 0 or not t.node:
            continue
        p = out[t.node] = NodeProbe(t.node)
        for line in t.lines:
            key, sep, value = line.partition("=")
            if not sep:
                continue
            if key == "gpus" and value.strip().isdigit():
                p.gpus = int(value)
            elif key == "hcas":
                p.hcas = tuple(value.split())
            elif key.startswith("tool."):
                p.tools[key[5:]] = value.strip()
    return out


def choose_transport(probes: dict[str, NodeProbe], wanted: str = "auto") -> tuple[str, str]:
    """(transport, why) from what every node has. Raises UsageError when the wanted one cannot run and
    OperationError when the nodes disagree (some with GPUs or HCAs, some without)."""
    nodes = sorted(probes)
    with_gpu = [n for n in nodes if probes[n].gpus]
    with_hca = [n for n in nodes if probes[n].hcas]
    need = {"nccl": "all_reduce_perf", "perftest": "ib_write_bw", "iperf3": "iperf3"}

    def lacking(transport: str) -> list[str]:
        return [n for n in nodes if need[transport] not in probes[n].tools]

    if wanted != "auto":
        missing = lacking(wanted)
        if wanted == "nccl":
            missing += [n for n in nodes if not probes[n].gpus and n not in missing]
        if wanted == "perftest":
            missing += [n for n in nodes if not probes[n].hcas and n not in missing]
        if missing:
            raise UsageError(f"--transport {wanted}: {_some(missing)} lack {need[wanted]}"
                             + (" or a GPU" if wanted == "nccl" else " or an HCA" if wanted == "perftest" else "")
                             + "; run without --transport to choose from what the nodes have")
        return wanted, f"--transport {wanted}"
    if len(with_gpu) == len(nodes) and not lacking("nccl"):
        return "nccl", f"every node has GPUs and {need['nccl']}"
    if len(with_hca) == len(nodes) and not lacking("perftest"):
        return "perftest", "every node has an HCA and ib_write_bw" + (
            f" ({_some(lacking('nccl'))} lack all_reduce_perf)" if with_gpu else "")
    if not with_gpu and not with_hca:
        missing = lacking("iperf3")
        if missing:
            raise OperationError(f"no node has a GPU or an HCA, so the test runs iperf3 (the staging stand-in for the "
                                 f"transport), but {_some(missing)} lack it: run `gpucluster configure INVENTORY "
                                 "--tags fabric-test` (the rdma role installs it)")
        return "iperf3", ("no GPU and no HCA on any node (staged nodes): iperf3 is the staging stand-in for the "
                          "transport")
    if with_gpu and lacking("nccl"):
        raise OperationError(f"{_some(lacking('nccl'))} lack all_reduce_perf (nccl-tests / rccl-tests) and not every "
                             "node has an HCA with ib_write_bw: build the tests with the nccl role "
                             "(nccl_tests_source), or give --transport")
    raise OperationError(f"the nodes differ: GPUs on {len(with_gpu)} of {len(nodes)}, HCAs on {len(with_hca)}: test "
                         "like with like (--tier, or fix the nodes that lack them)")


def _some(names: list[str], n: int = 8) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


# ---- the runner -----------------------------------------------------------------------------------

@dataclass
class Failure:
    case: Case
    why: str
    job: str = ""


class SlurmRunner:
    """fabrictest.Runner: each case as one Slurm job, a round at a time, submitted from `submit`."""

    def __init__(self, plan: Plan, inv: Inventory, settings: jobs.Settings, *, log: Callable[[str], None] = print):
        self.plan, self.inv, self.settings, self.log = plan, inv, settings, log
        self.submit = slurm_host(inv, "to submit the test jobs from")
        self.client = Client(self.submit)
        self.transport = "iperf3"
        self.failures: list[Failure] = []
        self.jobs: list[str] = []
        self.states: dict[str, str] = {}
        self.usable: set[str] = set()
        self.probes: dict[str, NodeProbe] = {}
        self.rounds = 0

    # -- before the first round
    def nodes(self) -> list[str]:
        return [h for u in self.plan.units for h in unit_hosts(self.plan, u)]

    def check_nodes(self) -> list[str]:
        """The tested nodes Slurm can use now (sinfo); the others are said, and their cases fail."""
        nodes = self.nodes()
        compute = set(self.inv.group("slurm_compute"))
        argv = [*slurmtext.NODE_STATES, "-n", ",".join(nodes)]
        res = self.client(argv)
        if res.returncode != 0:
            raise failed(argv, res, self.submit.name,
                         hint="is slurmctld up and the inventory's login/controller host reachable?")
        for node, state in slurmtext.parse_node_states(res.stdout or "", argv).items():
            self.states.setdefault(node, state)
        usable = []
        for n in nodes:
            state = self.states.get(n, "unknown to Slurm")
            if n not in compute:
                self.states[n] = "not in slurm_compute"
            elif not state.endswith(("*", "~", "#", "!", "%", "$", "@", "^", "-")) and state.rstrip("+") in USABLE:
                usable.append(n)
        self.usable = set(usable)
        return usable

    def probe(self, nodes: list[str], wanted: str = "auto") -> tuple[str, str]:
        argv = jobs.probe_argv(tuple(nodes), self.settings)
        res = self._round([argv])
        rc, text = res.get(0, (255, ""))
        probes = parse_probe(text)
        for job in {t.job for t in demux(text).values() if t.job}:
            self.jobs.append(job)
        silent = [n for n in nodes if n not in probes]
        if silent:
            raise OperationError(f"the probe job on {len(nodes)} node(s) did not hear from {_some(silent)} (srun exit "
                                 f"{rc}): {' '.join(text.split())[-400:] or 'no output'}")
        self.transport, why = choose_transport(probes, wanted)
        self.probes = probes
        return self.transport, why

    # -- the rounds
    def run(self, cases: list[Case]) -> list[Outcome]:
        runnable, argvs = [], []
        for c in cases:
            down = [n for n in c.nodes if n not in self.usable]
            if down:
                self.failures.append(Failure(c, "not run: " + ", ".join(f"{n} is {self.states.get(n, 'unknown')}"
                                                                        for n in down[:4])))
                continue
            runnable.append(c)
            argvs.append(jobs.case_argv(self.transport, c.nodes, c.rail, self._settings_for(c)))
        if not runnable:
            return []
        self.rounds += 1
        self.log(f"  round {self.rounds}: {len(runnable)} job(s), {runnable[0].tier}"
                 + (f" rail {runnable[0].rail}" if runnable[0].rail is not None else "")
                 + f", e.g. {runnable[0].label}")
        results = self._round(argvs)
        out: list[Outcome] = []
        for i, c in enumerate(runnable):
            rc, text = results.get(i, (255, ""))
            try:
                m = measure(self.transport, c.nodes, rc, text)
            except ToolError as exc:
                job = next((t.job for t in demux(text).values() if t.job), "")
                self.failures.append(Failure(c, str(exc), job))
                if job:
                    self.jobs.append(job)
                continue
            self.jobs.append(m.job)
            out.append(Outcome(c, round(m.value, 3), m.job, m.detail))
        return out

    def _settings_for(self, c: Case) -> jobs.Settings:
        if self.settings.partition:
            return self.settings
        part = partition_for(self.plan, c.nodes)
        return self.settings if not part else replace(self.settings, partition=part)

    def _round(self, argvs: list[list[str]]) -> dict[int, tuple[int, str]]:
        s = self.settings
        batches = -(-len(argvs) // max(1, s.parallel))
        timeout = batches * (s.time_limit_min * 60 + s.immediate_s + 60) + 60
        token = secrets.token_hex(8)  # no job can print a case line of this round
        try:
            res = self.client(["bash", "-s"], input=jobs.round_script(argvs, s.parallel, token), timeout=timeout)
        except SlurmError as exc:
            raise SlurmError(f"{exc} (a round of {len(argvs)} job(s), {s.parallel} at once, each up to "
                             f"{s.time_limit_min} min)") from None
        found = jobs.split_round(res.stdout or "", token)
        if not found:
            raise SlurmError(f"the jobs could not be started from {self.submit.name} (ssh exit {res.returncode}): "
                             f"{tail(res)}")
        return found


def partition_for(plan: Plan, nodes: tuple[str, ...]) -> str:
    """The partition whose groups hold every node of the case ('' when it is the default one, or none does)."""
    groups = {plan.unit_of_host[n].group for n in nodes if n in plan.unit_of_host}
    for p in plan.spec.slurm.partitions:
        if groups <= set(p.groups):
            return "" if p.default else p.name
    return ""


# ---- one whole run ----------------------------------------------------------------------------------

@dataclass
class TestRun:
    """What `fabric test` did: the transport and why, the verdict, and the cases that gave no figure."""

    cluster: str
    transport: str
    why: str
    verdict: Verdict
    failures: list[Failure]
    jobs: list[str]
    submit: str
    states: dict[str, str]

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.failures


def settings_for(plan: Plan, inv: Inventory, **given) -> jobs.Settings:
    """Job settings for this cluster: GPUs and HCAs per node from the spec, the tests' paths from the nccl
    role (or the inventory), the rest as given."""
    binary, env = nccl_paths(inv)
    gpus, hcas = {}, {}
    for g in plan.spec.fabric_groups:
        names = tuple(plan.hcas(g))
        for h in g.hosts:
            gpus[h] = g.gpus_per_node
            hcas[h] = names
    given.setdefault("nccl_binary", binary)
    return jobs.Settings(nccl_env=env, gpus_per_node=gpus, hcas=hcas, **given)


def run_fabric_test(plan: Plan, inv: Inventory, settings: jobs.Settings, *, tiers, wanted: str = "auto",
                    efficiency: float | None = None, log: Callable[[str], None] = print) -> TestRun:
    runner = SlurmRunner(plan, inv, settings, log=log)
    nodes = runner.nodes()
    if not nodes:
        raise UsageError(f"{plan.spec.name}: the plan has no fabric nodes to test (no node group with NICs)")
    if not cases(plan, tiers, "iperf3"):
        why = {"core": f"the fabric has {plan.tiers} tiers", "rail": f"the fabric is {plan.design}"}
        reasons = "; ".join(why.get(t, "no pairs") for t in tiers)
        raise UsageError(f"--tier {','.join(tiers)}: no case to run ({reasons}); `gpucluster fabric test-plan SPEC` "
                         "lists the cases per tier")
    usable = runner.check_nodes()
    if len(usable) < 2:
        states = ", ".join(f"{n} {runner.states.get(n, 'unknown')}" for n in nodes[:8])
        raise OperationError(f"Slurm can use {len(usable)} of the {len(nodes)} fabric nodes now ({states}): a "
                             "bandwidth test needs two; resume them (scontrol update nodename=... state=resume)")
    log(f"submitting from {runner.submit.name}: {len(usable)} of {len(nodes)} fabric nodes usable in Slurm")
    transport, why = runner.probe(usable, wanted)
    log(f"transport: {transport} ({why})")
    verdict = run_test(plan, runner, tiers, transport, efficiency)
    jobs_run = sorted({j for j in runner.jobs if j}, key=_job_key)
    return TestRun(plan.spec.name, transport, why, verdict, runner.failures, jobs_run, runner.submit.name,
                   runner.states)


def _job_key(job: str) -> tuple[int, str]:
    return (int(job), "") if job.isdigit() else (0, job)
