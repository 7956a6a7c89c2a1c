"""Every class `gpucluster diff` names, applied to real daemons on each Slurm line
gpucluster runs (22.05 from the host, 24.11 and 26.05 from their Debian roots): the emulator's real slurmctld
and one real `slurmd -N` per node of examples/staging.yaml (4 GPU nodes), one cluster per line for the whole
module.

For each class, one example change: two specs differ by it, `diff_specs` names the class (on the NEW spec's
release, as `gpucluster diff` does), the test applies exactly that disruption and checks
- enough: the new value is live (`scontrol show config`, the node table, the address a daemon listens on);
- not more: the next-smaller disruption does not make it live (the old value is still in effect, or slurmctld
  refuses it);
- a job running across the change is not lost: it ends COMPLETED and was never requeued.
"drain" and "reboot" run the rollout's path for them (drain, apply, resume; `scontrol reboot ASAP
nextstate=RESUME`, the emulator's RebootProgram restarts the node's slurmd as a new boot); "none" restarts
nothing (every daemon's process is the one from before). What the emulator stands in for: the machine's
reboot (harness.REBOOT_SCRIPT), and the package or mount a drain-class change installs (nothing here).

The results, per class and release, are the table in docs/operations.md ("Verified on real daemons")."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import example_path, need_slurm_line

from gpucluster import slurmkeys, slurmtext
from gpucluster.cluster import load_cluster
from gpucluster.diff import diff_specs
from gpucluster.render import render_all, write_outputs

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]
LINES = ("22.05", "24.11", "26.05")
STAGING = example_path("staging").read_text()
JOB_S = 6  # the job each change runs under


# ---- specs --------------------------------------------------------------------------------------------------

def _spec(tmp: Path, name: str, text: str, line: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(text.replace('version: "22.05"', f'version: "{line}"', 1))
    return path


def _with_parameters(text: str, **params) -> str:
    lines = "".join(f"    {k}: {v}\n" for k, v in params.items())
    return text.replace("  partitions:\n", f"  parameters:\n{lines}  partitions:\n", 1)


def _diff(tmp: Path, line: str, new_text: str):
    """diff's answer for staging -> new_text on `line`: (the whole change set's class, its changes)."""
    result = diff_specs(_spec(tmp, "old", STAGING, line), _spec(tmp, "new", new_text, line))
    return result.cls, result.changes


# ---- the cluster ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=LINES)
def emulated(request, tmp_path_factory) -> Iterator:
    from gpucluster.emulate import SlurmCluster

    line = request.param
    need_slurm_line(line)
    tmp = tmp_path_factory.mktemp(f"classes-{line}")
    conf = tmp / "conf"
    cluster = load_cluster(_spec(tmp, "old", STAGING, line))
    write_outputs(render_all(cluster, cabling=False), conf)
    nodes = list(cluster.spec.group("gpu").hosts)
    t0 = time.monotonic()
    with SlurmCluster(conf, line=line, slurmd_nodes=nodes, start_timeout=120, reboot_delay=0.5) as sc:
        yield line, sc, tmp
    print(f"\nSlurm {line}: the classes took {time.monotonic() - t0:.0f} s on one cluster")


def _config(sc, key: str) -> str | None:
    m = re.search(rf"^{key}\s*=\s*(\S+)", sc.scontrol("show", "config"), flags=re.M | re.I)
    return m.group(1) if m else None


def _write_key(sc, key: str, value: str) -> None:
    """Write the new slurm.conf: the one key changed in the running cluster's file (the copy step)."""
    text = sc.conf_path.read_text()
    new, n = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M | re.I)
    sc.conf_path.write_text(new if n else text + f"{key}={value}\n")


def _pids(sc) -> dict[str, int]:
    out = {"slurmctld": sc.ctld.popen.pid}
    out.update({n: t.popen.pid for n, t in sc.slurmd.items()})
    return out


def _alive(sc) -> dict[str, bool]:
    out = {"slurmctld": sc.ctld.popen.poll() is None}
    out.update({n: t.popen.poll() is None for n, t in sc.slurmd.items()})
    return out


def _reconfigure(sc, wait_key: str | None = None, old: str | None = None) -> None:
    sc.run(["scontrol", "reconfigure"], timeout=60)
    deadline = time.monotonic() + 20
    while wait_key and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if _config(sc, wait_key) != old:
                return
        time.sleep(0.3)
    time.sleep(1.0)


# ---- the job across the change ------------------------------------------------------------------------------------

def _sbatch(sc, nodes: int = 2) -> str:
    res = sc.run(["sbatch", "--parsable", "-N", str(nodes), "-o", "/dev/null", "--wrap", f"sleep {JOB_S}"])
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _job(sc, job).get("JobState") == "RUNNING":
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job} never ran: {_job(sc, job)}")


def _job(sc, job: str) -> dict[str, str]:
    return slurmtext.record(sc.run(["scontrol", "show", "job", "-o", job]).stdout.strip())


def _survived(sc, job: str, timeout: float = 60) -> None:
    """The job ends COMPLETED, never requeued (Restarts=0), on the nodes it started on."""
    deadline = time.monotonic() + timeout
    rec = _job(sc, job)
    while rec.get("JobState") in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING") and time.monotonic() < deadline:
        time.sleep(0.5)
        rec = _job(sc, job)
    assert rec.get("JobState") == "COMPLETED" and rec.get("Restarts") == "0", rec


def _idle(sc, nodes, timeout: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        states = {n: sc.nodes()[n].get("State", "") for n in nodes}
        if all(s == "IDLE" for s in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.3)


# ---- the classes ------------------------------------------------------------------------------------------------

def test_none_restarts_no_daemon(emulated) -> None:
    """A health-check threshold only changes the checks' own file: class none, and nothing restarts."""
    line, sc, tmp = emulated
    cls, changes = _diff(tmp, line, STAGING.replace("health:\n", "health:\n  ecc_uncorrected_max: 5\n", 1))
    assert cls == "none", [(c.what, c.cls) for c in changes]
    job, pids = _sbatch(sc), _pids(sc)
    for c in changes:  # the copy is all the class does: the changed files beside Slurm's, which none reads
        text = render_all(load_cluster(tmp / "new.yaml"), cabling=False)[c.target]
        (sc.etc / c.target).write_text(text if isinstance(text, str) else "".join(text()))
    time.sleep(2)
    assert _pids(sc) == pids and all(_alive(sc).values())
    _survived(sc, job)


def test_reconfigure_is_enough_and_a_copy_alone_is_not(emulated) -> None:
    line, sc, tmp = emulated
    cls, changes = _diff(tmp, line, _with_parameters(STAGING, SlurmctldTimeout=333))
    assert cls == "reconfigure", [(c.what, c.cls) for c in changes]
    old = _config(sc, "SlurmctldTimeout")
    job = _sbatch(sc)
    _write_key(sc, "SlurmctldTimeout", "333")
    time.sleep(1)
    assert _config(sc, "SlurmctldTimeout") == old  # not more than needed: a copy (none) does not do it
    _reconfigure(sc, "SlurmctldTimeout", old)
    assert _config(sc, "SlurmctldTimeout") == "333"  # enough
    _survived(sc, job)


def _restart_slurmctld_keys(line: str) -> list[str]:
    return [k.name for k in slurmkeys.KEYS if slurmkeys.change_class(k.name, line) == slurmkeys.RESTART_SLURMCTLD]


def test_restart_slurmctld_is_enough_and_a_reconfigure_is_not(emulated) -> None:
    """22.05: SchedulerType needs a slurmctld restart (slurm.conf(5) 22.05.8; slurmctld logs "SchedulerType
    change requires restart of the slurmctld daemon" on a reconfigure). From 23.11 no slurm.conf key of the
    table is in this class (every one reconfigures, scontrol(1) 24.11.5): there, diff must say reconfigure. (A flag
    is: NoCtldInAddrAny, the listening test below.)"""
    line, sc, tmp = emulated
    cls, _ = _diff(tmp, line, _with_parameters(STAGING, SchedulerType="sched/builtin"))
    old = _config(sc, "SchedulerType")
    job = _sbatch(sc)
    pids = _pids(sc)
    _write_key(sc, "SchedulerType", "sched/builtin")
    _reconfigure(sc, "SchedulerType", old)
    after_reconfigure = _config(sc, "SchedulerType")
    if line == "22.05":
        assert cls == "restart-slurmctld" and "SchedulerType" in _restart_slurmctld_keys(line)
        assert after_reconfigure == old == "sched/backfill"  # not more: a reconfigure leaves the old scheduler
        sc.restart_slurmctld()
        assert _config(sc, "SchedulerType") == "sched/builtin"  # enough
        assert {n: p for n, p in _pids(sc).items() if n != "slurmctld"} == {
            n: p for n, p in pids.items() if n != "slurmctld"}  # no slurmd was restarted
    else:
        assert cls == "reconfigure" and _restart_slurmctld_keys(line) == []
        assert after_reconfigure == "sched/builtin"
    _survived(sc, job)


# ---- listening settings: what only a restart of the daemon that listens changes ------------------------------------

ANY = {"0.0.0.0", "::"}


def _listening(port: int) -> set[str]:
    """The addresses a socket listens on at `port` on this machine (/proc/net/tcp and tcp6: the daemons share
    this network namespace; a Debian root is only a chroot)."""
    import socket
    import struct

    out = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError), open(table) as fh:
            for row in fh.read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                addr, hexport = local.split(":")
                if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                    words = struct.unpack(f"<{len(addr) // 8}I", bytes.fromhex(addr))  # each word host-order
                    out.add(socket.inet_ntop(family, struct.pack(f">{len(words)}I", *words)))
    return out


def _resolved(name: str) -> set[str]:
    import socket

    return {a[4][0] for a in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}


def _communication_parameters(tmp: Path, line: str, flags: str):
    cls, changes = _diff(tmp, line, _with_parameters(STAGING, CommunicationParameters=flags))
    (change,) = [c for c in changes if c.what == "slurm.conf CommunicationParameters"]
    return cls, change


STEPS = ("reconfigure", "restart-slurmctld", "restart-slurmd")  # the daemon classes, least disruptive first


def _step(sc, step: str, old: str | None) -> None:
    """Do what class `step` says for a slurm.conf key already copied in (diff's action for it)."""
    if step == "reconfigure":
        _reconfigure(sc, "CommunicationParameters", old)
    elif step == "restart-slurmctld":
        sc.restart_slurmctld()
    else:
        assert step == "restart-slurmd", step  # slurmctld, then every slurmd
        sc.restart_slurmctld()
        sc.restart_slurmd(sorted(sc.slurmd))


def _listening_change(sc, change, bound, wanted) -> None:
    """Every step smaller than the class diff named leaves the old socket (every address): not more; the class's
    own step binds it to the daemon's address: enough."""
    old = _config(sc, "CommunicationParameters")
    assert all(a & ANY for a in bound().values()), bound()  # the old value: every address
    _write_key(sc, "CommunicationParameters", change.new)
    assert change.cls in STEPS, change
    for step in STEPS[:STEPS.index(change.cls)]:
        _step(sc, step, old)
        assert all(a & ANY for a in bound().values()), (step, bound())  # not more
    _step(sc, change.cls, old)
    assert all(a and a <= wanted[n] for n, a in bound().items()), (change.cls, bound(), wanted)  # enough
    assert _config(sc, "CommunicationParameters") == change.new


def test_a_listening_setting_of_slurmctld_needs_its_restart_and_no_slurmd_restart(emulated) -> None:
    """CommunicationParameters=NoCtldInAddrAny binds slurmctld's port to slurmctld's own address instead of every
    address (slurm.conf(5), all three lines). A listening socket is made at start, and from 23.11 the reconfigure's
    new slurmctld takes over the old one (24.11.5: "Changes to TCP listening settings will require a daemon
    restart"). So restart-slurmctld on every line: a reconfigure reads the flag (show config lists it) yet leaves
    the socket on every address; a slurmctld restart binds it; no slurmd reads the flag, none restarts."""
    line, sc, tmp = emulated
    cls, change = _communication_parameters(tmp, line, "NoCtldInAddrAny")
    port = int(_config(sc, "SlurmctldPort"))
    host = re.search(r"\((\S+)\)", _config(sc, r"SlurmctldHost\[0\]")).group(1)  # ctl(ADDR): its address
    job, pids = _sbatch(sc), _pids(sc)
    _listening_change(sc, change, lambda: {"slurmctld": _listening(port)}, {"slurmctld": _resolved(host)})
    if change.cls == "restart-slurmctld":
        assert {n: p for n, p in _pids(sc).items() if n != "slurmctld"} == {
            n: p for n, p in pids.items() if n != "slurmctld"}  # no slurmd was restarted
    _survived(sc, job)
    assert cls == change.cls == "restart-slurmctld", change


def test_a_listening_setting_of_slurmd_needs_every_slurmd_restarted(emulated) -> None:
    """CommunicationParameters=NoInAddrAny binds each slurmd's port to its node's address ("for all daemons/clients
    except for the slurmctld", slurm.conf(5)): diff says restart-slurmd (slurmctld, then every slurmd) on every
    line. Neither a reconfigure (from 23.11 it starts new slurmd processes, which take the old socket) nor a
    slurmctld restart moves a slurmd's socket; restarting each slurmd does."""
    line, sc, tmp = emulated
    cls, change = _communication_parameters(tmp, line, "NoInAddrAny")
    nodes = sorted(sc.slurmd)
    wanted = {n: _resolved(sc.nodes()[n]["NodeAddr"]) for n in nodes}
    job = _sbatch(sc)
    _listening_change(sc, change, lambda: {n: _listening(sc.node_ports[n]) for n in nodes}, wanted)
    _survived(sc, job)
    assert cls == change.cls == "restart-slurmd", change


def _job_nodes(sc, job: str) -> list[str]:
    import hostlist

    return hostlist.expand_hostlist(_job(sc, job)["NodeList"])


def test_drain_then_apply_keeps_the_job_and_brings_the_node_back(emulated) -> None:
    """A flash mount point is a drain-class change: the rollout drains the node, waits for its job, applies
    (stand-in: the remount itself, which the emulator has no flash tier for), and resumes it."""
    line, sc, tmp = emulated
    cls, changes = _diff(tmp, line, STAGING.replace("mount: /mnt/flash", "mount: /mnt/flash2", 1))
    assert cls == "drain", [(c.what, c.cls) for c in changes]
    job = _sbatch(sc)
    node = _job_nodes(sc, job)[0]
    sc.scontrol("update", f"nodename={node}", "state=DRAIN", "reason=gpc:rollout classes")
    assert _job(sc, job)["JobState"] == "RUNNING"  # a drain lets the job run on
    _survived(sc, job)
    deadline = time.monotonic() + 20
    while "DRAIN" not in sc.nodes()[node].get("State", "") and time.monotonic() < deadline:
        time.sleep(0.3)
    assert sc.nodes()[node]["State"] in ("IDLE+DRAIN", "DRAINED", "IDLE+DRAINED"), sc.nodes()[node]
    sc.scontrol("update", f"nodename={node}", "state=RESUME")  # the apply happened here; then resume
    assert _idle(sc, [node]) == {node: "IDLE"}


def test_reboot_asap_keeps_the_job_and_the_node_comes_back(emulated) -> None:
    """A driver branch is a reboot-class change: `scontrol reboot ASAP nextstate=RESUME` waits for the job,
    then the node reboots (the emulator's RebootProgram: its slurmd comes back with a new boot time) and
    returns to service by itself."""
    line, sc, tmp = emulated
    cls, changes = _diff(tmp, line, STAGING.replace("fabric:\n", 'drivers:\n  branch: "580"\nfabric:\n', 1))
    assert cls == "reboot", [(c.what, c.cls) for c in changes]
    job = _sbatch(sc)
    node = _job_nodes(sc, job)[0]
    before = len(sc.reboots)
    sc.scontrol("reboot", "ASAP", "nextstate=RESUME", "reason=gpc:rollout classes", node)
    assert _job(sc, job)["JobState"] == "RUNNING"
    _survived(sc, job)
    assert _idle(sc, [node], timeout=40) == {node: "IDLE"}
    assert [n for n, *_ in sc.reboots[before:]] == [node]  # it did reboot, once, after the job


def test_adding_a_node_takes_the_class_diff_names_on_each_release(emulated) -> None:
    """22.05: a node added needs slurmctld and every slurmd restarted (diff: restart-slurmd). A slurmctld
    restart alone is not enough: the old slurmds still run the old slurm.conf, and slurmctld says so.
    24.11 and 26.05: `scontrol reconfigure` takes the node (diff: reconfigure); the copy alone does not."""
    line, sc, tmp = emulated
    new_text = STAGING.replace("    count: 4\n", "    count: 5\n", 1)
    cls, changes = _diff(tmp, line, new_text)
    new = load_cluster(tmp / "new.yaml")
    conf = tmp / "conf-5"
    write_outputs(render_all(new, cabling=False), conf)
    old_nodes = sorted(sc.nodes())
    hosts = list(new.spec.group("gpu").hosts)
    added = [h for h in hosts if h not in old_nodes]
    assert len(added) == 1
    job = _sbatch(sc)
    sc.load_config(conf, hosts)  # the copy: the new slurm.conf on every host
    time.sleep(1)
    assert sorted(sc.nodes()) == old_nodes  # not more: the copy alone adds nothing
    if cls == "restart-slurmd":  # what diff named decides what is done; the release's answer is checked last
        mark = sc.ctld_log.stat().st_size
        sc.restart_slurmctld()
        sc.start_slurmd(added)
        deadline = time.monotonic() + 20
        stale: list[str] = []
        while not stale and time.monotonic() < deadline:
            stale = [ln for ln in sc.ctld_log.read_text(errors="replace")[mark:].splitlines()
                     if "different slurm.conf" in ln]
            time.sleep(0.5)
        assert stale, "a slurmctld restart alone: slurmctld should name the slurmds on the old slurm.conf"
        sc.restart_slurmd(old_nodes)  # enough: every slurmd on the new slurm.conf
    else:
        assert cls == "reconfigure", [(c.what, c.cls) for c in changes]
        _reconfigure(sc)
        assert sc.ctld.popen.poll() is None, "slurmctld stopped on the reconfigure:\n" + sc.log_tail(10)
        sc.start_slurmd(added)
    assert sorted(sc.nodes()) == hosts  # enough
    assert _idle(sc, [h for h in hosts if h not in _job_nodes(sc, job)]) == {
        h: "IDLE" for h in hosts if h not in _job_nodes(sc, job)}
    _survived(sc, job)
    assert cls == ("restart-slurmd" if line == "22.05" else "reconfigure"), (line, cls)
