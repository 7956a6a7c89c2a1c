"""Read rendered Slurm configs and adapt them to run on one machine.

The adaptation is the whole point of the emulator's honesty: everything the scheduler decides with
(nodes, CPUs, memory, GRES counts, partitions, topology, scheduler parameters, timeouts) is passed
through untouched; only what cannot work on one host as root is changed, and every change is
recorded as an :class:`Adaptation` with its reason so the harness can print and the docs can list
them. Pure functions, no I/O: the harness writes the results.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import hostlist

from gpucluster.words import plural

# Line kinds whose lines carry several Key=Value pairs and a record name.
RECORD_KEYS = ("nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname")

_TOKEN = re.compile(r'(?:[^\s"]+|"[^"]*")+')


class ConfError(ValueError):
    """A config the emulator cannot adapt (e.g. an Include it cannot follow)."""


@dataclass(frozen=True)
class Adaptation:
    """One change made to a rendered file so it runs on one machine."""

    file: str
    key: str
    old: str | None
    new: str | None
    why: str

    def __str__(self) -> str:
        old = "(unset)" if self.old is None else self.old
        new = "(removed)" if self.new is None else self.new
        return f"{self.file}: {self.key}: {old} -> {new}  # {self.why}"


@dataclass
class Line:
    """One line of a slurm.conf-like file: comment/blank, a global Key=Value, or a record."""

    raw: str
    pairs: list[tuple[str, str]] = field(default_factory=list)  # empty for comment/blank

    @property
    def kind(self) -> str:
        """'' for comment/blank, the lowercase record key (nodename, ...) or 'param'."""
        if not self.pairs:
            return ""
        first = self.pairs[0][0].lower()
        return first if first in RECORD_KEYS else "param"

    def get(self, key: str) -> str | None:
        for k, v in self.pairs:
            if k.lower() == key.lower():
                return v
        return None

    def set(self, key: str, value: str | None) -> None:
        """Set (or with None remove) key, keeping its position."""
        out: list[tuple[str, str]] = []
        done = False
        for k, v in self.pairs:
            if k.lower() == key.lower():
                if value is not None and not done:
                    out.append((k, value))
                    done = True
                continue
            out.append((k, v))
        if value is not None and not done:
            out.append((key, value))
        self.pairs = out

    def render(self) -> str:
        if not self.pairs:
            return self.raw
        return " ".join(f"{k}={v}" for k, v in self.pairs)


def parse_lines(text: str) -> list[Line]:
    lines: list[Line] = []
    for raw in text.splitlines():
        body = raw.split("#", 1)[0].strip()
        if not body:
            lines.append(Line(raw))
            continue
        if body.lower().startswith("include"):
            raise ConfError(f"'{body}': Include is not supported by the emulator; render a single file")
        pairs: list[tuple[str, str]] = []
        for tok in _TOKEN.findall(body):
            if "=" not in tok:
                raise ConfError(f"'{body}': token '{tok}' is not Key=Value")
            k, v = tok.split("=", 1)
            pairs.append((k, v))
        lines.append(Line(raw, pairs))
    return lines


def render_lines(lines: Iterable[Line]) -> str:
    return "\n".join(line.render() for line in lines) + "\n"


def unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


@dataclass
class SlurmConf:
    """A parsed slurm.conf: global parameters plus node/partition records, order kept."""

    lines: list[Line]

    @classmethod
    def parse(cls, text: str) -> SlurmConf:
        return cls(parse_lines(text))

    def render(self) -> str:
        return render_lines(self.lines)

    def param(self, key: str) -> str | None:
        for line in self.lines:
            if line.kind == "param" and line.pairs[0][0].lower() == key.lower():
                return line.pairs[0][1]
        return None

    def set_param(self, key: str, value: str | None) -> str | None:
        """Replace every line of key with one (or none); returns the old value."""
        old = self.param(key)
        kept: list[Line] = []
        placed = False
        for line in self.lines:
            if line.kind == "param" and line.pairs[0][0].lower() == key.lower():
                if value is not None and not placed:
                    kept.append(Line("", [(key, value)]))
                    placed = True
                continue
            kept.append(line)
        if value is not None and not placed:
            # globals go before the first record: some readers want NodeName lines last
            idx = next((i for i, ln in enumerate(kept) if ln.kind in RECORD_KEYS), len(kept))
            kept.insert(idx, Line("", [(key, value)]))
        self.lines = kept
        return old

    def records(self, kind: str) -> list[Line]:
        return [ln for ln in self.lines if ln.kind == kind]

    def node_names(self) -> list[str]:
        """Every node named by a NodeName line (DEFAULT excluded), in file order."""
        names: list[str] = []
        for line in self.records("nodename"):
            spec = line.pairs[0][1]
            if spec.lower() == "default":
                continue
            names.extend(hostlist.expand_hostlist(spec))
        return names


@dataclass(frozen=True)
class Layout:
    """Where this machine's copy lives and how its daemons reach each other."""

    workdir: PurePosixPath
    hostname: str
    ctld_port: int
    slurmd_port: int
    munge_socket: PurePosixPath
    emulated: tuple[str, ...] = ()  # nodes that get a slurmd -N here
    node_port_base: int = 0  # first Port of the emulated nodes' contiguous block
    node_ports: Mapping[str, int] = field(default_factory=dict)  # ports kept from before (a grown cluster)
    absent_state: str | None = None  # State= for nodes without a slurmd (FUTURE, CLOUD) or keep
    reboot_program: str | None = None  # the emulated reboot's command line, quoted (harness.REBOOT_SCRIPT)


# Parameters that name files/dirs on the production hosts.
_PATHS = {
    "StateSaveLocation": "state",
    "SlurmdSpoolDir": "spool/%n",
    "SlurmctldPidFile": "run/slurmctld.pid",
    "SlurmdPidFile": "run/slurmd-%n.pid",
    "SlurmctldLogFile": "log/slurmctld.log",
    "SlurmdLogFile": "log/slurmd-%n.log",
}
_ONLY_IF_SET_PATHS = {"SlurmSchedLogFile": "log/slurmsched.log"}
_CONTROLLER_KEYS = ("SlurmctldHost", "ControlMachine", "ControlAddr", "BackupController", "BackupAddr")
_DBD_KEYS = (
    "AccountingStorageHost",
    "AccountingStorageBackupHost",
    "AccountingStoragePort",
    "AccountingStorageUser",
    "AccountingStoragePass",
    "AccountingStorageEnforce",
    "AccountingStorageExternalHost",
    "AccountingStorageTRES",  # gres TRES: slurmctld refuses them without slurmdbd
)
# Scripts the production hosts carry; on an emulated host they do not exist (and would run once per
# emulated node on one machine).
_SCRIPTS = (
    "Prolog",
    "Epilog",
    "PrologSlurmctld",
    "EpilogSlurmctld",
    "TaskProlog",
    "TaskEpilog",
    "HealthCheckProgram",
    "HealthCheckInterval",
    "HealthCheckNodeState",
    "UnkillableStepProgram",
)
# Node-side plugins that read hardware the emulated nodes lack.
_HW_PLUGINS = {
    "AcctGatherEnergyType": "acct_gather_energy/none",
    "AcctGatherInterconnectType": "acct_gather_interconnect/none",
    "AcctGatherFilesystemType": "acct_gather_filesystem/none",
    "AcctGatherProfileType": "acct_gather_profile/none",
}


def adapt_slurm_conf(
    text: str,
    layout: Layout,
    *,
    overrides: Mapping[str, str | None] | None = None,
) -> tuple[str, list[Adaptation], dict[str, int]]:
    """Adapt a rendered slurm.conf to ``layout``.

    Returns the new text, the adaptations made, and the Port given to each emulated node.
    ``overrides`` are deliberate experiment settings (e.g. ``TopologyPlugin=topology/none`` for the
    flat baseline), applied last and recorded with why='override'.
    """
    conf = SlurmConf.parse(text)
    notes: list[Adaptation] = []
    _controller(conf, layout, notes)
    _private_paths_and_auth(conf, layout, notes)
    _absent_services(conf, layout.workdir, notes)
    if layout.emulated:
        _emulated_slurmd(conf, layout, notes)
    ports = _adapt_nodes(conf, layout, notes)

    for key, value in (overrides or {}).items():
        old = conf.set_param(key, value)
        notes.append(Adaptation("slurm.conf", key, old, value, "override"))
    return conf.render(), notes, ports


def _set(conf: SlurmConf, notes: list[Adaptation], key: str, value: str | None, why: str) -> None:
    """Set ``key`` to ``value`` (None removes it), noting why when that changes it."""
    old = conf.set_param(key, value)
    if old != value:
        notes.append(Adaptation("slurm.conf", key, old, value, why))


def _controller(conf: SlurmConf, layout: Layout, notes: list[Adaptation]) -> None:
    """The controller is this machine, on loopback, on free ports."""
    old_ctl = [conf.param(k) for k in _CONTROLLER_KEYS]
    for key in _CONTROLLER_KEYS:
        conf.set_param(key, None)
    new_ctl = f"{layout.hostname}(127.0.0.1)"
    conf.set_param("SlurmctldHost", new_ctl)
    notes.append(
        Adaptation(
            "slurm.conf",
            "SlurmctldHost",
            ",".join(v for v in old_ctl if v) or None,
            new_ctl,
            "the controller is this machine (slurmctld accepts only its own hostname), loopback only",
        )
    )
    _set(conf, notes, "SlurmctldPort", str(layout.ctld_port), "a free loopback port (other clusters may run here)")
    _set(conf, notes, "SlurmdPort", str(layout.slurmd_port), "a free loopback port")


def _private_paths_and_auth(conf: SlurmConf, layout: Layout, notes: list[Adaptation]) -> None:
    """Files in this run's private directory, the daemons as root, and the run's private munged: the
    production hosts' paths, users and keys do not exist here. Raises ConfError for an AuthType other than
    auth/munge."""
    w = layout.workdir
    for key, rel in _PATHS.items():
        _set(conf, notes, key, str(w / rel), "private directory of this run")
    for key, rel in _ONLY_IF_SET_PATHS.items():
        if conf.param(key) is not None:
            _set(conf, notes, key, str(w / rel), "private directory of this run")
    _set(conf, notes, "SlurmUser", "root", "runs as root on this machine; the slurm user may not exist")
    _set(conf, notes, "SlurmdUser", "root", "runs as root on this machine")
    auth = conf.param("AuthType") or "auth/munge"
    if auth != "auth/munge":
        raise ConfError(f"AuthType={auth}: the emulator only runs auth/munge")
    opts = [o for o in (conf.param("AuthInfo") or "").split(",") if o and not o.startswith("socket=")]
    _set(conf, notes, "AuthInfo", ",".join([f"socket={layout.munge_socket}", *opts]), "private munged (fresh key)")
    for key in ("AuthAltTypes", "AuthAltParameters"):
        if conf.param(key) is not None:
            _set(conf, notes, key, None, "alternative auth (jwt) needs a key file from the production hosts")


def _absent_services(conf: SlurmConf, w: PurePosixPath, notes: list[Adaptation]) -> None:
    """Services this machine does not run: slurmdbd accounting is off, and so is a job completion store
    other than a text file, which moves to this run's private directory."""
    if (conf.param("AccountingStorageType") or "").endswith("/slurmdbd"):
        _set(conf, notes, "AccountingStorageType", "accounting_storage/none", "no slurmdbd here")
        for key in _DBD_KEYS:
            if conf.param(key) is not None:
                _set(conf, notes, key, None, "belongs to slurmdbd accounting")
    jobcomp = conf.param("JobCompType") or "jobcomp/none"
    if jobcomp == "jobcomp/filetxt":
        _set(conf, notes, "JobCompLoc", str(w / "log/jobcomp.txt"), "private directory of this run")
    elif jobcomp != "jobcomp/none":
        _set(conf, notes, "JobCompType", "jobcomp/none", "job completion store is not available here")
        _set(conf, notes, "JobCompLoc", None, "job completion store is not available here")


def _emulated_slurmd(conf: SlurmConf, layout: Layout, notes: list[Adaptation]) -> None:
    """One host plays many nodes: no process tracking, binding, hardware plugins or production scripts that
    need a node of their own, the emulated reboot, and the nodes' configured CPUs and memory."""
    proctrack = conf.param("ProctrackType")
    if proctrack not in (None, "proctrack/linuxproc", "proctrack/pgid"):
        _set(conf, notes, "ProctrackType", "proctrack/linuxproc", "many slurmd share one cgroup tree here")
    task = conf.param("TaskPlugin")
    if task not in (None, "task/none"):
        _set(conf, notes, "TaskPlugin", "task/none", "binding to cores/cgroups the emulated nodes do not have")
    if (conf.param("JobAcctGatherType") or "") == "jobacct_gather/cgroup":
        _set(conf, notes, "JobAcctGatherType", "jobacct_gather/linux", "cgroup gathering needs proctrack/cgroup")
    for key, none in _HW_PLUGINS.items():
        value = conf.param(key)
        if value is not None and value != none:
            _set(conf, notes, key, none, "reads hardware the emulated nodes lack")
    for key in _SCRIPTS:
        if conf.param(key) is not None:
            _set(conf, notes, key, None, "script from the production hosts; would run once per emulated node here")
    if layout.reboot_program is not None:
        _set(conf, notes, "RebootProgram", layout.reboot_program,
             "the emulated reboot: this node's slurmd is stopped and started again with -b (a new boot time)")
    sdp = [p for p in (conf.param("SlurmdParameters") or "").split(",") if p]
    if "config_overrides" not in sdp:
        _set(
            conf,
            notes,
            "SlurmdParameters",
            ",".join([*sdp, "config_overrides"]),
            "emulated nodes report this machine's CPUs/memory; use the configured ones instead",
        )


def _adapt_nodes(conf: SlurmConf, layout: Layout, notes: list[Adaptation]) -> dict[str, int]:
    emulated = set(layout.emulated)
    unknown = emulated - set(conf.node_names())
    if unknown:
        raise ConfError(
            f"nodes {hostlist.collect_hostlist(sorted(unknown))} are not in slurm.conf; "
            "the emulator never invents nodes: choose a spec with the node count you want"
        )
    ports: dict[str, int] = {}
    next_port = layout.node_port_base
    out: list[Line] = []
    n_absent = 0
    n_local = 0
    for line in conf.lines:
        if line.kind != "nodename" or line.pairs[0][1].lower() == "default":
            out.append(line)
            continue
        names = hostlist.expand_hostlist(line.pairs[0][1])
        here = [n for n in names if n in emulated]
        away = [n for n in names if n not in emulated]
        if here:
            order = hostlist.expand_hostlist(hostlist.collect_hostlist(here))
            runs: list[tuple[list[str], int]] = []  # nodes whose ports follow each other: one line each
            for n in order:
                if n in layout.node_ports:
                    ports[n] = layout.node_ports[n]
                else:
                    ports[n] = next_port
                    next_port += 1
                if runs and ports[n] == runs[-1][1] + len(runs[-1][0]):
                    runs[-1][0].append(n)
                else:
                    runs.append(([n], ports[n]))
            for names, first in runs:
                new = Line("", list(line.pairs))
                new.pairs[0] = (line.pairs[0][0], hostlist.collect_hostlist(names))
                new.set("NodeAddr", None)
                new.set("BcastAddr", None)
                new.set("NodeHostname", "localhost")
                new.set("Port", str(first) if len(names) == 1 else f"[{first}-{first + len(names) - 1}]")
                out.append(new)
        if away:
            new = Line("", list(line.pairs))
            new.pairs[0] = (line.pairs[0][0], hostlist.collect_hostlist(away))
            # a numeric address: nothing to resolve, and NodeHostname stays unique (slurmctld checks
            # every node against all others sharing its NodeHostname: quadratic at fleet scale)
            new.set("NodeAddr", "127.0.0.1")
            new.set("BcastAddr", None)
            new.set("Port", None)
            if layout.absent_state:
                new.set("State", layout.absent_state)
                n_absent += len(away)
            out.append(new)
            n_local += len(away)
    conf.lines = out
    notes.extend(_node_notes(ports, n_local, n_absent, layout.absent_state))
    return ports


def _node_notes(ports: dict[str, int], n_local: int, n_absent: int, absent_state: str | None) -> list[Adaptation]:
    """What _adapt_nodes changed on the NodeName lines, one note per kind: emulated nodes on local ports,
    nodes without a slurmd at a numeric address, and those nodes' state."""
    notes: list[Adaptation] = []
    if ports:
        notes.append(
            Adaptation(
                "slurm.conf",
                "NodeName: NodeHostname/Port",
                None,
                f"NodeHostname=localhost Port=[{min(ports.values())}-{max(ports.values())}] "
                f"for {plural(len(ports), 'node')}",
                "every emulated slurmd runs here (slurmd -N NAME), each on its own port",
            )
        )
    if n_local:
        notes.append(
            Adaptation(
                "slurm.conf",
                "NodeName: NodeAddr",
                None,
                f"NodeAddr=127.0.0.1 for {n_local} nodes without a slurmd",
                "slurmctld resolves every node address at start (10 s per unknown name)",
            )
        )
    if n_absent:
        notes.append(
            Adaptation(
                "slurm.conf",
                "NodeName: State",
                None,
                f"State={absent_state} for {n_absent} nodes without a slurmd",
                "nodes not emulated here are kept (never dropped) in a state that needs no slurmd",
            )
        )
    return notes


def adapt_gres_conf(text: str, device_root: PurePosixPath) -> tuple[str, list[Adaptation], list[str]]:
    """Point gres.conf File= at stand-in files under ``device_root``; drop AutoDetect.

    Returns the new text, the adaptations, and the stand-in paths the caller must create. Counts,
    types, Cores= and Links= are kept, so slurmd reports exactly the GRES the rendered file declares.
    """
    notes: list[Adaptation] = []
    stand_ins: list[str] = []
    lines = parse_lines(text)
    out: list[Line] = []
    for line in lines:
        if not line.pairs:
            out.append(line)
            continue
        auto = line.get("AutoDetect")
        if auto is not None and auto.lower() != "off":
            line.set("AutoDetect", None)
            notes.append(Adaptation("gres.conf", "AutoDetect", auto, None, "no GPUs to detect on an emulated node"))
            if not line.pairs:
                continue
        file_spec = line.get("File")
        if file_spec is not None:
            paths = hostlist.expand_hostlist(file_spec)
            moved = [str(device_root / PurePosixPath(p).relative_to("/")) for p in paths]
            stand_ins.extend(moved)
            new_spec = str(device_root / PurePosixPath(file_spec.lstrip("/")))
            line.set("File", new_spec)
            notes.append(
                Adaptation(
                    "gres.conf",
                    "File",
                    file_spec,
                    new_spec,
                    "device files do not exist here; stand-ins (symlinks to /dev/null) keep the count and names",
                )
            )
        out.append(line)
    # a line that was only AutoDetect=... disappears; nothing else is dropped
    return render_lines(out), _dedupe(notes), sorted(set(stand_ins))


def _dedupe(notes: list[Adaptation]) -> list[Adaptation]:
    seen: set[Adaptation] = set()
    out = []
    for n in notes:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out
