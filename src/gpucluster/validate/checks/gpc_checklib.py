"""Helpers the checks share. Standard library + testinfra only: this file also runs on the nodes.

The expectations document (built by gpucluster.validate.expect on the validating machine) is the only
source of expected values; nothing here knows a cluster.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------ hostlists


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist ("gpu[01-03,07],ctl01", "r[1-2]n[1-2]") without python-hostlist."""
    out: list[str] = []
    for part in _split_top(expr):
        out += _expand_one(part)
    return out


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            if cur:
                parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def _expand_one(part: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", part)
    if not m:
        return [part]
    head, tail = part[: m.start()], part[m.end():]
    out = []
    for rng in m.group(1).split(","):
        if "-" in rng:
            lo, hi = rng.split("-", 1)
            width = len(lo) if lo.startswith("0") else 0
            for i in range(int(lo), int(hi) + 1):
                for rest in _expand_one(tail):
                    out.append(f"{head}{i:0{width}d}{rest}")
        else:
            for rest in _expand_one(tail):
                out.append(f"{head}{rng}{rest}")
    return out


# ------------------------------------------------------------------ Slurm output parsing


def parse_scontrol_records(text: str) -> list[dict[str, str]]:
    """`scontrol show ... -o` or the multi-line form: one dict per record (Key=Value words).

    Values may contain spaces only in fields Slurm prints last on a line (Reason=...); those are kept whole."""
    records: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                records.append(current)
                current = {}
            continue
        starts_record = not line.startswith((" ", "\t"))
        if starts_record and current:
            records.append(current)
            current = {}
        for key, value in _pairs(line.strip()):
            current[key] = value
    if current:
        records.append(current)
    return records


def _pairs(line: str) -> list[tuple[str, str]]:
    out = []
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=(\S*(?:\s+(?![A-Za-z][A-Za-z0-9_:/.]*=)\S+)*)", line):
        out.append((m.group(1), m.group(2)))
    return out


def parse_show_config(text: str) -> dict[str, str]:
    """`scontrol show config` ('Key   = Value' lines); '(null)' and empty values are left out."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z][A-Za-z0-9_]*)\s+=\s?(.*)$", line)
        if m and m.group(2).strip() not in ("", "(null)"):
            out[m.group(1)] = m.group(2).strip()
    return out


def node_state_ok(state: str) -> tuple[bool, str]:
    """A Slurm node state is good when its base state is IDLE, ALLOCATED or MIXED with no DOWN/DRAIN/FAIL
    flag and no '*' (not responding)."""
    s = state.upper()
    flags = s.split("+")
    base = flags[0].rstrip("*~#!%$@^-")
    bad = [f for f in flags if f.rstrip("*") in ("DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING",
                                                  "NOT_RESPONDING", "INVALID_REG", "INVAL", "MAINTENANCE")]
    if "*" in flags[0] or s.endswith("*"):
        return False, f"{state}: not responding to slurmctld"
    if base not in ("IDLE", "ALLOCATED", "MIXED", "COMPLETING") or bad:
        return False, f"{state}: expected IDLE, ALLOCATED or MIXED"
    return True, state


def parse_gres(value: str) -> list[str]:
    """'gpu:h100:4(S:0),gpu:h100:4' -> ['gpu:h100:4', ...], socket annotations removed."""
    if not value or value in ("(null)", "none"):
        return []
    return [re.sub(r"\(.*?\)", "", g) for g in _split_top(value)]


def parse_busbw(text: str) -> float | None:
    """nccl-tests' '# Avg bus bandwidth    : 123.4' line, in GB/s."""
    m = re.search(r"Avg bus bandwidth\s*:\s*([0-9.]+)", text)
    return float(m.group(1)) if m else None


def max_busbw(text: str) -> float | None:
    """The largest out-of-place busbw in an nccl-tests table (column 8 of the data rows)."""
    best = None
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[0].isdigit():
            try:
                v = float(cols[7])
            except ValueError:
                continue
            best = v if best is None else max(best, v)
    return best


# ------------------------------------------------------------------ expectations and hosts


@dataclass(frozen=True)
class Target:
    """One test instance: the inventory group it is reported under, the host it is about, an item."""

    group: str
    host: str
    item_id: str | None = None
    item: Any = None

    @property
    def id(self) -> str:
        return f"{self.group}:{self.host}" + (f":{self.item_id}" if self.item_id is not None else "")


class Ctx:
    """Expectations plus connections. mode 'ssh': testinfra over SSH from this machine; mode 'local': this
    process runs on the node under test (inside a Slurm job) and talks to nothing else."""

    def __init__(self, doc: dict, mode: str = "ssh", hosts: list[str] | None = None, me: str | None = None,
                 peers: list[str] | None = None, control_dir: str | None = None):
        self.doc = doc
        self.mode = mode
        self.me = me
        self.run_hosts = list(hosts if hosts is not None else doc["selected"])
        self.peers = list(peers or ([] if mode == "local" else self.run_hosts))
        self.control_dir = control_dir or tempfile.gettempdir()
        self._hosts: dict[str, Any] = {}
        self._cache: dict[Any, Any] = {}

    # -- structure
    def groups_of(self, host: str) -> list[str]:
        return self.doc["hosts"][host]["groups"]

    def in_group(self, host: str, group: str) -> bool:
        return group == "all" or group in self.groups_of(host)

    def group(self, name: str) -> list[str]:
        return list(self.doc["groups"].get(name, []))

    def hostinfo(self, host: str) -> dict:
        return self.doc["hosts"][host]

    @property
    def controller(self) -> str | None:
        ctl = self.group("slurm_controller")
        return ctl[0] if ctl else None

    # -- connections
    def host(self, name: str):
        """A testinfra Host for `name`. In local mode only the node itself is reachable."""
        import testinfra

        if name in self._hosts:
            return self._hosts[name]
        if self.mode == "local":
            if name != self.me:
                raise RuntimeError(f"local mode on {self.me}: cannot reach {name} (runs over SSH instead)")
            h = testinfra.get_host("local://")
        else:
            ssh = self.hostinfo(name)["ssh"]
            spec = f"ssh://{ssh['user']}@{ssh['host']}" + (f":{ssh['port']}" if ssh.get("port") else "")
            extra = ssh.get("extra_args") or ""
            if "controlmaster" in extra.lower() and "controlpath" not in extra.lower():
                # One master connection per host, shared by every pytest-xdist worker.
                extra += f" -o ControlPath={self.control_dir}/%C"
            extra += " -o BatchMode=yes -o ServerAliveInterval=15"
            kwargs = {"ssh_extra_args": extra.strip(), "timeout": 20}
            if ssh.get("identity"):
                kwargs["ssh_identity_file"] = ssh["identity"]
            h = testinfra.get_host(spec, **kwargs)
        self._hosts[name] = h
        return h

    def slurm_host(self):
        """Where Slurm client commands run: the controller over SSH, or the node itself in local mode."""
        if self.mode == "local":
            return self.host(self.me)
        if not self.controller:
            raise RuntimeError("the inventory has no slurm_controller host")
        return self.host(self.controller)

    def cached(self, key: Any, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def run(host, command: str, timeout: int | None = None, retries: int = 2):
    """host.run with a retry when SSH itself (not the command) failed, e.g. a busy multiplexed master."""
    if timeout:
        command = f"timeout {int(timeout)} sh -c {shlex.quote(command)}"
    for attempt in range(retries + 1):
        try:
            return host.run(command)
        except RuntimeError:
            if attempt == retries:
                raise
            time.sleep(1 + attempt)
    raise AssertionError("unreachable")


def journal(host, unit: str, lines: int = 25) -> str:
    """The last journal lines of a unit, to print beside a failed service check."""
    try:
        out = run(host, f"journalctl -u {shlex.quote(unit)} -n {lines} --no-pager -o short-iso 2>&1")
        text = out.stdout.strip()
    except RuntimeError as exc:
        text = f"(journal not readable: {exc})"
    return f"last {lines} journal lines of {unit}:\n{text or '(empty)'}"


def load_doc(path: str) -> dict:
    return json.loads(Path(path).read_text())


def is_stand_in_device(host, path: str) -> bool:
    """Staged nodes map /dev/null (char 1:3) to /dev/nvidiaN: a stand-in, not a GPU."""
    out = run(host, f"stat -L -c '%t:%T' {shlex.quote(path)} 2>/dev/null")
    return out.rc == 0 and out.stdout.strip() == "1:3"


def env_true(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
