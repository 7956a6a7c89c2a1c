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


_HOST_IN_ID = re.compile(r"\[[^:\]\[]+:([^:\]\[]+)")


def host_of_nodeid(nodeid: str) -> str | None:
    """'test_common.py::test_service_active[slurm_compute:gpu02:slurmd]' -> 'gpu02' (the scheduling scope)."""
    m = _HOST_IN_ID.search(nodeid)
    return m.group(1) if m else None


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


# Configless Slurm (docs/roles.md): the hosts that read the Slurm files themselves hold them in conf_dir; a
# compute node's slurmd fetches them from slurmctld into its cache (SlurmdSpoolDir/conf-cache, linked here).
SLURM_CONFIG_HOLDERS = ("slurm_controller", "slurm_login", "slurm_dbd")
SLURM_CONF_CACHE = "/run/slurm/conf"


def slurm_conf_dir(ctx, host: str) -> str:
    """Where host's Slurm files are: conf_dir on a host that holds them, slurmd's cache on a configless node."""
    holds = any(ctx.in_group(host, g) for g in SLURM_CONFIG_HOLDERS)
    return ctx.doc["slurm"]["conf_dir"] if holds else SLURM_CONF_CACHE


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


CONNECT_ATTEMPTS = 3
# validate's own folder on the flash tier: the storage probes' files and the container job's bundle
PROBE_DIR = ".gpucluster-validate"


def _is_host_key_problem(exc: Exception) -> bool:
    """A wrong or unknown host key is an answer, not a hiccup: never retried."""
    name = type(exc).__name__
    return name in ("BadHostKeyException",) or "not found in known_hosts" in str(exc) or "Host key" in str(exc)


class Unreachable(RuntimeError):
    """The host could not be reached (SSH connection, authentication or host key)."""


class Ctx:
    """Expectations plus connections. mode 'ssh': testinfra over SSH from this machine; mode 'local': this
    process runs on the node under test (inside a Slurm job) and talks to nothing else."""

    def __init__(self, doc: dict, mode: str = "ssh", hosts: list[str] | None = None, me: str | None = None,
                 peers: list[str] | None = None, control_dir: str | None = None, ssh_backend: str = "paramiko"):
        self.doc = doc
        self.mode = mode
        self.me = me
        self.run_hosts = list(hosts if hosts is not None else doc["selected"])
        self.peers = list(peers or ([] if mode == "local" else self.run_hosts))
        self.control_dir = control_dir or tempfile.gettempdir()
        self.ssh_backend = ssh_backend
        self._hosts: dict[str, Any] = {}
        self._unreachable: dict[str, str] = {}
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

        if name in self._hosts:
            return self._hosts[name]
        if name in self._unreachable:  # fail fast: one timeout per host and worker, not one per check
            raise Unreachable(self._unreachable[name])
        for attempt in range(CONNECT_ATTEMPTS):
            try:
                h = self._connect(name)
                break
            except Exception as exc:  # any connection problem (socket, auth, host key) makes it unreachable
                if _is_host_key_problem(exc) or attempt == CONNECT_ATTEMPTS - 1:
                    self._unreachable[name] = (f"{name}: unreachable after {attempt + 1} attempt(s) "
                                               f"({type(exc).__name__}: {exc})")
                    raise Unreachable(self._unreachable[name]) from None
                time.sleep(2 * (attempt + 1))  # a busy sshd (MaxStartups, a loaded node) gets another try
        self._hosts[name] = h
        return h

    def _connect(self, name: str):
        import testinfra

        if self.mode == "local":
            if name != self.me:
                raise RuntimeError(f"local mode on {self.me}: cannot reach {name} (runs over SSH instead)")
            h = testinfra.get_host("local://")
        elif self.ssh_backend == "paramiko" and _paramiko_ok(self.hostinfo(name)["ssh"]):
            h = paramiko_host(self.hostinfo(name)["ssh"])
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
            h.run("true")  # connect now, so an unreachable host is known before its first check
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


# ------------------------------------------------------------------ SSH without a process per command

_UNSUPPORTED = ("proxyjump", "proxycommand", "-j ", "-o proxy", "certificatefile", "gssapi")


def _ssh_options(extra: str) -> dict[str, str]:
    """-o Key=Value pairs of an ssh command line, keys lower-cased; the first value of a key wins, as in ssh
    (gpucluster's StrictHostKeyChecking=yes comes first: a later `=no` must not relax paramiko either)."""
    words = shlex.split(extra or "")
    out: dict[str, str] = {}
    for i, w in enumerate(words):
        opt = words[i + 1] if w == "-o" and i + 1 < len(words) else (w[2:] if w.startswith("-o") and len(w) > 2
                                                                      else None)
        if opt and "=" in opt:
            k, v = opt.split("=", 1)
            out.setdefault(k.strip().lower(), v.strip())
    return out


def _paramiko_ok(ssh: dict) -> bool:
    """Paramiko takes the inventory's key, port and known_hosts; anything fancier goes to OpenSSH."""
    extra = (ssh.get("extra_args") or "").lower()
    if any(u in extra for u in _UNSUPPORTED):
        return False
    try:
        import paramiko  # noqa: F401
    except ImportError:
        return False
    return True


def paramiko_host(ssh: dict):
    """A testinfra Host over one paramiko connection: no ssh process per command, which is what makes a
    few hundred checks per host cheap. Host keys are checked as strictly as the inventory says: the
    known_hosts file it names (else ~/.ssh/known_hosts) and an unknown key refused."""
    import paramiko
    import testinfra.host
    from testinfra.backend.paramiko import ParamikoBackend

    opts = _ssh_options(ssh.get("extra_args") or "")
    port = int(ssh.get("port") or 22)
    backend = ParamikoBackend(f"paramiko://{ssh['user']}@{ssh['host']}:{port}",
                              ssh_identity_file=ssh.get("identity"), timeout=20)
    client = paramiko.SSHClient()
    known = opts.get("userknownhostsfile")
    if known and known.lower() != "/dev/null":
        for path in known.split():
            if Path(os.path.expanduser(path)).exists():
                client.load_host_keys(os.path.expanduser(path))
    else:
        client.load_system_host_keys()
    strict = opts.get("stricthostkeychecking", "yes").lower()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if strict in ("no", "off", "accept-new")
                                       else paramiko.RejectPolicy())
    client.connect(ssh["host"], port=port, username=ssh["user"], key_filename=ssh.get("identity"),
                   timeout=20, banner_timeout=30, auth_timeout=30, allow_agent=not ssh.get("identity"),
                   look_for_keys=not ssh.get("identity"))
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(15)
    backend.__dict__["client"] = client  # ParamikoBackend.client is a cached_property: hand it ours
    return testinfra.host.Host(backend)


def run(host, command: str, timeout: int | None = None, retries: int = 2):
    """host.run with a retry when SSH itself (not the command) failed, e.g. a busy multiplexed master."""
    if timeout:
        command = f"timeout {int(timeout)} sh -c {shlex.quote(command)}"
    for attempt in range(retries + 1):
        try:
            return host.run(command)
        except (RuntimeError, OSError, EOFError):
            if attempt == retries:
                raise
            time.sleep(1 + attempt)
    raise AssertionError("unreachable")


def unit_state(host, unit: str) -> dict[str, str]:
    """ActiveState, SubState, UnitFileState, LoadState of a unit in one round trip."""
    out = run(host, f"systemctl show -p ActiveState,SubState,UnitFileState,LoadState {shlex.quote(unit)}")
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def stat(host, path: str) -> tuple[int, str, str] | None:
    """(mode, owner, group) in one round trip; None when the path does not exist."""
    out = run(host, f"stat -L -c '%a %U %G' {shlex.quote(path)}")
    if out.rc != 0:
        return None
    mode, user, group = out.stdout.split()
    return int(mode, 8), user, group


def host_facts(ctx, name: str) -> dict:
    """Unit states, package versions, live sysctls (and whether they are writable), the persisted
    sysctl file and the container type of a host, gathered in ONE command the first time a check asks,
    the way Ansible gathers facts. Each check still asserts its own item; a failed service check reads
    the journal live."""
    def gather():
        node = ctx.host(name)
        groups = ["all", *ctx.groups_of(name)]

        def wanted(section: str) -> set[str]:  # what the expectations name for this host's groups
            return {k for g in groups for k in (ctx.doc.get(section, {}).get(g) or ())}

        units = sorted(wanted("services"))
        pkgs = sorted(wanted("packages") | {"slurm-client"})
        keys = sorted(wanted("sysctls"))
        q = shlex.quote
        script = ["echo '@@units'"]
        if units:
            script.append("systemctl show -p Id,ActiveState,SubState,UnitFileState,LoadState "
                          + " ".join(q(u if "." in u else u + ".service") for u in units))
        script.append("echo '@@packages'")
        if pkgs:
            script.append("dpkg-query -W -f '${Package} ${db:Status-Abbrev} ${Version}\\n' "
                          + " ".join(q(p) for p in pkgs) + " 2>/dev/null")
        script.append("echo '@@sysctls'")
        for k in keys:
            path = "/proc/sys/" + k.replace(".", "/")
            script.append(f"if [ -e {q(path)} ]; then printf '%s\\t%s\\t' {q(k)} "
                          f"\"$(test -w {q(path)} && echo rw || echo ro)\"; tr '\\t\\n' '  ' < {q(path)}; echo; "
                          f"else printf '%s\\tmissing\\t\\n' {q(k)}; fi")
        script.append("echo '@@sysctl_file'")
        script.append(f"cat {q(ctx.doc.get('sysctl_file', '/dev/null'))} 2>/dev/null")
        script.append("echo '@@container'")
        script.append("systemd-detect-virt --container 2>/dev/null || true")
        script.append("echo '@@release'")  # the Debian major a per-release pin is chosen by
        script.append("(. /etc/os-release 2>/dev/null; echo \"${VERSION_ID:-}\")")
        out = run(node, "; ".join(script), timeout=120)
        return parse_facts(out.stdout)
    return ctx.cached(("facts", name), gather)


def parse_facts(text: str) -> dict:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = line[2:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    units: dict[str, dict[str, str]] = {}
    block: dict[str, str] = {}
    for line in [*sections.get("units", []), ""]:
        if not line.strip():
            if block.get("Id"):
                units[block["Id"].removesuffix(".service")] = block
            block = {}
        elif "=" in line:
            k, v = line.split("=", 1)
            block[k] = v
    packages = {}
    for line in sections.get("packages", []):
        parts = line.split()
        if len(parts) == 3 and parts[1].startswith("ii"):
            packages[parts[0]] = parts[2]
    sysctls = {}
    for line in sections.get("sysctls", []):
        parts = line.split("\t", 2)
        if len(parts) >= 2:
            sysctls[parts[0]] = {"access": parts[1], "value": " ".join(parts[2].split()) if len(parts) > 2 else ""}
    persisted = {}
    for line in sections.get("sysctl_file", []):
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            k, v = line.split("=", 1)
            persisted[k.strip()] = " ".join(v.split())
    virt = " ".join(sections.get("container", [])).strip()
    return {"units": units, "packages": packages, "sysctls": sysctls, "sysctl_file": persisted,
            "container": virt if virt and virt != "none" else None,
            "release": " ".join(sections.get("release", [])).strip().split(".")[0]}


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


# Staged nodes whose Slurm constrains devices get one number per GPU: major 120 (hex 78), reserved for local
# use, which no driver claims (gpucluster.stage.podman.STAND_IN_MAJOR).
STAND_IN_MAJOR = 120


def is_stand_in_device(host, path: str) -> bool:
    """Staged nodes map /dev/null (char 1:3) to /dev/nvidiaN, or a char device of major 120: a stand-in,
    not a GPU. stat prints the numbers in hex."""
    out = run(host, f"stat -L -c '%t:%T' {shlex.quote(path)} 2>/dev/null")
    numbers = out.stdout.strip()
    return out.rc == 0 and (numbers == "1:3" or numbers.split(":")[0] == f"{STAND_IN_MAJOR:x}")


def env_true(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
