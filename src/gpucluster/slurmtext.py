"""Reading Slurm's text, in one place.

Two kinds of text, read two ways:

- Configuration records gpucluster writes or its emulator prints (slurm.conf lines, topology.conf records,
  `scontrol show ... -o` of the emulator's own clusters): `settings`, `all_settings`, `record`, `records`.
  Their values are gpucluster's own, so a field starts wherever ` Key=` does.
- What a running cluster's Slurm commands say, where free text (a node's reason, a job's name or comment)
  may hold anything sbatch and scontrol accept: newlines, ` State=IDLE`, `|`, escapes. That is read as data:
  `--json` where every supported line offers it (the node table, the job queue), and delimited fields only
  where no field is free text (`sinfo -N -o '%N %t'`). A value that does not fit is a `SlurmOutputError`
  naming the command and what was wrong, never a guess.

Which command each Slurm line offers (measured on Debian's 22.05.8, trixie's 24.11 and sid's 26.05):

- the node table: 22.05 `sinfo --json` (its scontrol has no --json); 24.11 and 26.05 `scontrol --json show
  node` (their `sinfo --json` groups nodes by state and keeps one reason per group);
- the job queue: `squeue --json` on every line (22.05's ignores -t and -w: the answer is filtered here).

The Ansible filters import this module on the controller, where gpucluster is installed."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import hostlist

from gpucluster.errors import OperationError

# Lines of slurm.conf that are records (several Key=Value on one line), not settings.
RECORD_KEYS = frozenset(("nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname",
                         "blockname"))
_FIELD = re.compile(r"\s+(?=[A-Za-z][\w/:.]*=)")


def settings(text: str, *, lower: bool = False) -> dict[str, str]:
    """The single Key=Value settings of a slurm.conf text (comments, records and Include lines left out);
    with `lower`, keys as Slurm compares them (case-insensitively)."""
    out: dict[str, str] = {}
    for raw in str(text).splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        if key.lower() in RECORD_KEYS or key.lower() in ("include", "slurmctldhost") or " " in key:
            continue
        out[key.lower() if lower else key] = value.strip()
    return out


def all_settings(text: str) -> dict[str, tuple[str, ...]]:
    """Every Key=Value setting of a slurm.conf text by lower-case key, each value a key took in file order
    (SlurmctldHost is given once per controller); records and Include lines left out. What a comparison of
    two files needs, where `settings` gives the one value a reader wants."""
    out: dict[str, tuple[str, ...]] = {}
    for raw in str(text).splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip().lower()
        if key in RECORD_KEYS or key == "include" or " " in key:
            continue
        out[key] = (*out.get(key, ()), value.strip())
    return out


def record(line: str) -> dict[str, str]:
    """One record line (NodeName=..., SwitchName=..., or an `scontrol show ... -o` line) as a dict. Values
    may hold spaces where scontrol writes them (OS=Linux 6.1 #1 SMP ...): a field starts at `Key=`."""
    out: dict[str, str] = {}
    for tok in _FIELD.split(line.strip()):
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = v.strip()
    return out


def records(text: str, kind: str) -> list[dict[str, str]]:
    """Every record of a file or of scontrol's output whose first key is `kind` (NodeName, SwitchName...)."""
    prefix = f"{kind.lower()}="
    return [record(line) for line in str(text).splitlines() if line.strip().lower().startswith(prefix)]


# ---- a running cluster's command output ---------------------------------------------------------------

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
NODES_JSON = ("scontrol", "--json", "show", "node")  # 23.02 and later
NODES_JSON_2205 = ("sinfo", "--json")  # 22.05: one record per node, the same fields
# The node table from a shell (one SSH command): scontrol's JSON, else (22.05) sinfo's.
NODES_SH = "out=$(scontrol --json show node 2>/dev/null) && printf '%s\\n' \"$out\" || exec sinfo --json"
NODES_LABEL = "scontrol --json show node (22.05: sinfo --json)"  # NODES_SH, as an error names it
JOBS_JSON = ("squeue", "--json")
NODE_STATES = ("sinfo", "-h", "-N", "-o", "%N %t")  # no free text: a name and sinfo's compact state
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a node name as slurm.conf takes it (no space, no '=')
_TOKEN = re.compile(r"[A-Z][A-Z_]*")  # a state word (IDLE, DRAIN, REBOOT_ISSUED)
_COMPACT = re.compile(r"[a-z]+[*~#!%$@^+-]?")  # sinfo %t: idle, drain*, mix-, down~


class SlurmOutputError(OperationError):
    """A Slurm command failed, or its output could not be read as that command's output: which command, what
    was wrong (the CLI prints it and exits 1, as for any outside tool)."""

    def __init__(self, command: str | Sequence[str], what: str) -> None:
        self.command = command if isinstance(command, str) else " ".join(command)
        self.what = what
        super().__init__(f"{self.command}: {what}")


@dataclass(frozen=True)
class SlurmNode:
    """One node as slurmctld has it. `state` is written as scontrol writes it (IDLE+DRAIN: the base state,
    then its flags); `reason` is the reason exactly as set, without scontrol's [user@time] stamp."""

    name: str
    states: frozenset[str]
    state: str
    reason: str = ""
    reason_user: str = ""
    reason_time: str = ""  # local time, as scontrol prints it (2026-11-23T01:23:51); "" when unknown


@dataclass(frozen=True)
class SlurmJob:
    """One job of the queue. `id` is written as squeue's %i writes it (123, 123_4 for an array task,
    123+1 for a heterogeneous component); `nodelist` is Slurm's hostlist, `nodes` its names."""

    id: str
    user: str
    name: str
    states: frozenset[str]
    nodelist: str
    nodes: frozenset[str]


def _document(text: str, command: str | Sequence[str], key: str) -> list:
    """The `key` list of a Slurm --json document; the document's own errors are the error."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmOutputError(command, f"not JSON ({exc}); is this Slurm's --json output?") from None
    if not isinstance(doc, dict):
        raise SlurmOutputError(command, f"a JSON {type(doc).__name__}, not an object")
    errors = doc.get("errors") or []
    if errors:
        first = errors[0] if isinstance(errors, list) else errors
        what = first.get("description") or first.get("error") if isinstance(first, dict) else first
        raise SlurmOutputError(command, f"Slurm reported an error: {what!s:.300}")
    items = doc.get(key)
    if not isinstance(items, list):
        raise SlurmOutputError(command, f"no '{key}' list (keys: {', '.join(sorted(map(str, doc))[:12])})")
    return items


def _field(command, where: str, obj: dict, key: str, kind: type, default):
    """obj[key] of type `kind`; absent or null: `default`."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise SlurmOutputError(command, f"{where}: '{key}' is {type(value).__name__} {str(value)[:40]!r}, not "
                                        f"{kind.__name__}")
    return value


def _number(command, where: str, obj: dict, key: str) -> int | None:
    """A number in either shape Slurm writes it: a plain int (22.05), or {set, infinite, number} (23.02 on);
    None when unset, infinite or absent."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlurmOutputError(command, f"{where}: '{key}' is {str(value)[:40]!r}, not a number")
    return value


def _words(command, where: str, value, flags) -> tuple[str, ...]:
    """A state: a list of words (23.02 on: base first, then flags), or a base word and a flags list (22.05)."""
    if isinstance(value, str):
        value = [value, *(flags or [])]
    if not isinstance(value, list) or not value:
        raise SlurmOutputError(command, f"{where}: state {str(value)[:60]!r} is not a list of state words")
    out = []
    for w in value:
        if not isinstance(w, str) or not _TOKEN.fullmatch(w.upper()):
            raise SlurmOutputError(command, f"{where}: {str(w)[:40]!r} is not a Slurm state word")
        out.append(w.upper())
    return tuple(out)


def _name(command, where: str, value) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise SlurmOutputError(command, f"{where}: {str(value)[:60]!r} is not a node name")
    return value


def parse_nodes_json(text: str, command: str | Sequence[str] = NODES_JSON) -> dict[str, SlurmNode]:
    """`scontrol --json show node` (23.02 on) or `sinfo --json` (22.05) -> name -> SlurmNode."""
    out: dict[str, SlurmNode] = {}
    for i, raw in enumerate(_document(text, command, "nodes")):
        if not isinstance(raw, dict):
            raise SlurmOutputError(command, f"node {i}: not an object")
        name = _name(command, f"node {i}", raw.get("name"))
        where = f"node {name}"
        if name in out:
            raise SlurmOutputError(command, f"{where} is listed twice")
        states = _words(command, where, raw.get("state"), _field(command, where, raw, "state_flags", list, []))
        reason = _field(command, where, raw, "reason", str, "")
        user = _field(command, where, raw, "reason_set_by_user", str, "")
        when = _number(command, where, raw, "reason_changed_at")
        out[name] = SlurmNode(name, frozenset(states), "+".join(states), reason, user if reason else "",
                              time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when)) if reason and when else "")
    return out


def parse_jobs_json(text: str, command: str | Sequence[str] = JOBS_JSON) -> list[SlurmJob]:
    """`squeue --json` -> its jobs, in its order."""
    out = []
    for i, raw in enumerate(_document(text, command, "jobs")):
        if not isinstance(raw, dict):
            raise SlurmOutputError(command, f"job {i}: not an object")
        jid = _number(command, f"job {i}", raw, "job_id")
        if jid is None or jid <= 0:
            raise SlurmOutputError(command, f"job {i}: no job_id")
        where = f"job {jid}"
        array, task = _number(command, where, raw, "array_job_id"), _number(command, where, raw, "array_task_id")
        het, offset = _number(command, where, raw, "het_job_id"), _number(command, where, raw, "het_job_offset")
        shown = (f"{array}_{task}" if array and task is not None else
                 f"{het}+{offset}" if het and offset is not None else str(jid))
        nodelist = _field(command, where, raw, "nodes", str, "")
        try:
            nodes = frozenset(hostlist.expand_hostlist(nodelist)) if nodelist and nodelist != "(null)" else frozenset()
        except hostlist.BadHostlist as exc:
            raise SlurmOutputError(command, f"{where}: nodes {nodelist[:80]!r} is not a hostlist ({exc})") from None
        for n in nodes:
            _name(command, where, n)
        states = _words(command, where, raw.get("job_state"), [])
        out.append(SlurmJob(shown, _field(command, where, raw, "user_name", str, ""),
                            _field(command, where, raw, "name", str, ""), frozenset(states), nodelist, nodes))
    return out


def parse_node_states(text: str, command: str | Sequence[str] = NODE_STATES) -> dict[str, str]:
    """`sinfo -h -N -o '%N %t'` -> node -> compact state (idle, drain, down*...); the first line of a node
    listed in several partitions. Neither field can hold a space, so any other line is an error."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not _NAME.fullmatch(parts[0]) or not _COMPACT.fullmatch(parts[1]):
            raise SlurmOutputError(command, f"line {n}: {line[:80]!r} is not 'NODE STATE'")
        out.setdefault(parts[0], parts[1])
    return out


def printable(text: str) -> str:
    """Free text for a terminal: control characters (newlines, escape sequences) written as escapes, so a
    reason or a job name can neither move the cursor nor fake a line of the report."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _failed(command: Sequence[str], res: subprocess.CompletedProcess) -> SlurmOutputError:
    tail = " ".join(((res.stderr or "") + " " + (res.stdout or "")).split())[-300:]
    return SlurmOutputError(command, f"exited {res.returncode}: {tail or 'no output'}")


def lacks_json(res: subprocess.CompletedProcess) -> bool:
    """True when a client refused --json as an option it does not have (22.05's scontrol)."""
    return res.returncode != 0 and "unrecognized option" in (res.stderr or "") and "--json" in (res.stderr or "")


class NodeTable:
    """The node table through `run`, with the command this cluster's Slurm line offers (scontrol's --json,
    else sinfo's), remembered after the first read so a poll costs one call."""

    def __init__(self, run: Runner) -> None:
        self.run = run
        self.command: tuple[str, ...] = NODES_JSON

    def read(self) -> dict[str, SlurmNode]:
        """Safe from several threads at once (a rollout and its sampler): each call keeps its own command."""
        command = self.command
        res = self.run(list(command))
        if command == NODES_JSON and lacks_json(res):
            command = self.command = NODES_JSON_2205
            res = self.run(list(command))
        if res.returncode != 0:
            raise _failed(command, res)
        return parse_nodes_json(res.stdout or "", command)


def read_jobs(run: Runner, states: Iterable[str], nodes: Iterable[str] | None = None) -> list[SlurmJob]:
    """The queue's jobs in any of `states` (and on any of `nodes`), through `run`. squeue is asked to filter
    (24.11 does) and the answer is filtered again here (22.05's --json ignores -t and -w)."""
    wanted = frozenset(s.upper() for s in states)
    on = frozenset(nodes) if nodes is not None else None
    command = [*JOBS_JSON, "-t", ",".join(sorted(wanted))]
    if on is not None:
        if not on:
            return []
        command += ["-w", hostlist.collect_hostlist(sorted(on))]
    res = run(command)
    if res.returncode != 0:
        raise _failed(command, res)
    return [j for j in parse_jobs_json(res.stdout or "", command)
            if j.states & wanted and (on is None or j.nodes & on)]
