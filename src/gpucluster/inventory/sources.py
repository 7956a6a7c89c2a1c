"""Where Ansible reaches each node: from an OpenSSH client config or from a hosts file.

Both give, per spec host, the Ansible connection variables (ansible_host, ansible_port, ansible_user,
the key, known_hosts, a jump host). Every host the spec names must be matched; a hosts file may name
no other host. A problem is a Finding located in the file given (line, column name), so
`gpucluster inventory` exits 2 naming file, line, field, rule and fix, and writes nothing.

ssh_config is read the way ssh(1) reads it for the options we carry: Host blocks in order, patterns
with * and ? and !negation, the first value obtained for an option wins, Include (globs, relative to
~/.ssh), %h/%%/%n/%r/%p tokens in HostName. A `Match` block cannot be evaluated without a connection
and is refused with a fix; options we do not carry are ignored (ssh reads them itself).
"""

from __future__ import annotations

import csv
import fnmatch
import glob
import io
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.errors import Finding, SpecError
from gpucluster.inventory.values import (
    DEFAULT_KNOWN_HOSTS,
    HOSTNAME_RE,
    proxy_jump_problem,
    ssh_common_args,
    valid_address,
    valid_path,
    valid_port,
    valid_user,
)
from gpucluster.paths import read_regular

# ssh_config keyword (lower case) -> what we call it
CARRIED = {"hostname": "HostName", "port": "Port", "user": "User", "identityfile": "IdentityFile",
           "userknownhostsfile": "UserKnownHostsFile", "proxyjump": "ProxyJump",
           "stricthostkeychecking": "StrictHostKeyChecking", "identitiesonly": "IdentitiesOnly"}
MAX_INCLUDE_DEPTH = 16
MAX_FILE_BYTES = 64 << 20  # an ssh_config (each Include) or a hosts file: 64 MiB covers 200k hosts' lines
MAX_FIELD = 1024  # a CSV field (hostname, address, port, user): far beyond any real one
__all__ = ["HOSTNAME_RE", "from_hosts_file", "from_ssh_config"]


@dataclass
class _Block:
    patterns: list[str]
    file: str
    line: int
    options: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # key -> (value, file, line)

    def matches(self, host: str) -> bool:
        hit = False
        for p in self.patterns:
            neg = p.startswith("!")
            if fnmatch.fnmatchcase(host, p[1:] if neg else p):
                if neg:
                    return False
                hit = True
        return hit

    @property
    def wildcard_only(self) -> bool:
        """`Host *` (defaults for every host): it does not count as naming a host."""
        return all(p == "*" for p in self.patterns)


def _tokens(line: str) -> list[str]:
    """ssh_config splits `Key value`, `Key=value` and quoted values."""
    line = line.strip()
    m = re.match(r"^(\S+?)\s*=\s*(.*)$", line) if "=" in line.split(None, 1)[0] else None
    if m:
        return [m.group(1), *shlex.split(m.group(2))]
    return shlex.split(line)


def _read_blocks(path: Path, findings: list[Finding], depth: int = 0,
                 blocks: list[_Block] | None = None, include_line: int | None = None) -> list[_Block]:
    """The Host blocks of `path` (and what it includes), in order. Every file is read bounded, a regular file
    only; one that is not is a finding at the Include line that named it."""
    blocks = [] if blocks is None else blocks
    name = str(path)
    try:
        text = read_regular(path, MAX_FILE_BYTES)[0].decode()
    except (OSError, UnicodeDecodeError) as exc:
        findings.append(Finding(("ssh_config",), f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                                "give the path of a readable OpenSSH client config (a regular file)",
                                "ssh-config", file=name, line=include_line))
        return blocks
    current = _Block(["*"], name, 0)  # options before any Host apply to every host
    blocks.append(current)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw.strip()  # ssh_config: only whole lines are comments
        if not line:
            continue
        try:
            words = _tokens(line)
        except ValueError as exc:
            findings.append(Finding(("ssh_config",), f"cannot split this line ({exc})", "fix the quoting",
                                    "ssh-config", file=name, line=lineno))
            continue
        key, args = words[0].lower(), words[1:]
        if key == "host":
            if not args:
                findings.append(Finding(("Host",), "Host without a pattern", "name the hosts, e.g. Host gpu*",
                                        "ssh-config", file=name, line=lineno))
                continue
            current = _Block(args, name, lineno)
            blocks.append(current)
        elif key == "match":
            findings.append(Finding(("Match",), "Match blocks depend on the connection and cannot be read ahead",
                                    "write the hosts as a Host block (Host gpu* ...) or use --hosts FILE",
                                    "ssh-config", file=name, line=lineno))
            current = _Block([], name, lineno)  # its options apply to no host
            blocks.append(current)
        elif key == "include":
            if depth >= MAX_INCLUDE_DEPTH:
                findings.append(Finding(("Include",), "Include nests too deeply", "flatten the includes",
                                        "ssh-config", file=name, line=lineno))
                continue
            for pattern in args:
                base = Path(os.path.expanduser(pattern))
                if not base.is_absolute():
                    base = Path.home() / ".ssh" / base
                for inc in sorted(glob.glob(str(base))):
                    # an Include inside a Host block applies to that block's hosts (ssh(1)); keep it simple:
                    # included blocks follow in order, their own Host lines decide
                    _read_included(Path(inc), findings, depth + 1, blocks, name, lineno)
                current = _Block(current.patterns, name, lineno)
                blocks.append(current)
        elif key in CARRIED:
            if not args:
                findings.append(Finding((CARRIED[key],), f"{CARRIED[key]} without a value", "give it a value",
                                        "ssh-config", file=name, line=lineno))
                continue
            current.options.setdefault(key, (" ".join(args), name, lineno))
    return blocks


def _read_included(path: Path, findings: list[Finding], depth: int, blocks: list[_Block], parent: str,
                   lineno: int) -> None:
    """An Include target: refused (located at the Include line) unless a regular file we can read."""
    try:
        read_regular(path, MAX_FILE_BYTES)
    except (OSError, UnicodeDecodeError) as exc:
        findings.append(Finding(("Include",), f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                                "include only regular files (an OpenSSH client config)", "ssh-config",
                                file=parent, line=lineno))
        return
    _read_blocks(path, findings, depth, blocks)


def _expand_hostname(value: str, host: str, port: str, user: str) -> str:
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch == "%" and i + 1 < len(value):
            tok = value[i + 1]
            out.append({"%": "%", "h": host, "n": host, "p": port, "r": user}.get(tok, "%" + tok))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _path(value: str) -> str:
    return os.path.expanduser(value)


def _carried_problems(opts: dict[str, tuple[str, str, int]], host: str, port: str, user: str) -> list[Finding]:
    """The carried options that are not what their syntax allows (User, IdentityFile, UserKnownHostsFile,
    ProxyJump): each a finding at its line. Nothing from ssh_config reaches an inventory unchecked."""
    out: list[Finding] = []

    def bad(key: str, message: str, fix: str) -> None:
        _value, file, line = opts[key]
        out.append(Finding((CARRIED[key],), message, fix, "ssh-config", file=file, line=line))

    if "user" in opts and not valid_user(user):
        bad("user", f"'{user}' is not a login name", "give a login name such as root or ops")
    for key in ("identityfile", "userknownhostsfile"):
        if key in opts:
            value = opts[key][0]
            if key == "userknownhostsfile":  # ssh takes several files; gpucluster carries the first
                value = value.split()[0]
            path = _path(_expand_hostname(value, host, port, user) if key == "identityfile" else value)
            if " " in value or not valid_path(path):
                bad(key, f"'{value}' is not one absolute path of plain characters (letters, digits, ._+,=@~/-)",
                    "give one path such as ~/.ssh/id_cluster; rename a file whose name needs more")
    if "proxyjump" in opts and opts["proxyjump"][0].lower() != "none":
        why = proxy_jump_problem(opts["proxyjump"][0])
        if why:
            bad("proxyjump", f"'{opts['proxyjump'][0]}' is not a jump host list: {why}",
                "give [user@]host[:port], comma-separated for several hops, and nothing else")
    return out


def from_ssh_config(path: str | os.PathLike, hosts: list[str], *, spec_file: str = "") -> dict[str, dict]:
    """Ansible connection variables per spec host from an OpenSSH client config. Raises SpecError."""
    path = Path(path)
    findings: list[Finding] = []
    if not path.is_file():
        raise SpecError([Finding(("--ssh-config",), f"{path} is not a file",
                                 "give the path of an OpenSSH client config, e.g. ~/.ssh/config", "ssh-config",
                                 file=str(path))])
    blocks = _read_blocks(path, findings)
    out: dict[str, dict] = {}
    missing: list[str] = []
    for host in hosts:
        opts: dict[str, tuple[str, str, int]] = {}
        named = False
        for b in blocks:
            if b.patterns and b.matches(host):
                named = named or not b.wildcard_only
                for k, v in b.options.items():
                    opts.setdefault(k, v)
        if not named:
            missing.append(host)
            continue
        user = opts.get("user", ("", "", 0))[0]
        port = opts.get("port", ("22", "", 0))[0]
        conn: dict = {}
        if "hostname" in opts:
            value, file, line = opts["hostname"]
            addr = _expand_hostname(value, host, port, user)
            if not valid_address(addr):
                findings.append(Finding(("HostName",), f"'{addr}' (for {host}) is not a host name or IP address",
                                        "give a DNS name or an IPv4/IPv6 address", "ssh-config", file=file,
                                        line=line))
                continue
            if addr != host:
                conn["ansible_host"] = addr
        if "port" in opts:
            value, file, line = opts["port"]
            if not valid_port(value):
                findings.append(Finding(("Port",), f"'{value}' is not a TCP port", "give a number from 1 to 65535",
                                        "ssh-config", file=file, line=line))
                continue
            conn["ansible_port"] = int(value)
        problems = _carried_problems(opts, host, port, user)
        if problems:
            findings.extend(problems)
            continue
        if user:
            conn["ansible_user"] = user
        if "identityfile" in opts:
            conn["ansible_ssh_private_key_file"] = _path(_expand_hostname(opts["identityfile"][0], host, port, user))
        known = _path(opts["userknownhostsfile"][0].split()[0]) if "userknownhostsfile" in opts else \
            DEFAULT_KNOWN_HOSTS
        jump = opts["proxyjump"][0] if "proxyjump" in opts and opts["proxyjump"][0].lower() != "none" else None
        # gpucluster's host-key options come first whatever the config says ("never turn this off to make it
        # work"); ssh keeps the first value it is given
        conn["ansible_ssh_common_args"] = ssh_common_args(
            known, identities_only=opts.get("identitiesonly", ("",))[0].lower() == "yes", proxy_jump=jump)
        out[host] = conn
    if missing:
        findings.append(Finding(("Host",), f"{len(missing)} host(s) of the spec{_in(spec_file)} match no Host block: "
                                f"{_some(missing)}", "add a Host block that names them (a pattern such as "
                                f"'Host {_pattern(missing)}' with HostName %h.<domain>), or use --hosts FILE",
                                "host-missing", file=str(path)))
    if findings:
        raise SpecError(findings)
    return out


def from_hosts_file(path: str | os.PathLike, hosts: list[str], *, spec_file: str = "",
                    require_all: bool = True, flag: str = "--hosts") -> dict[str, dict]:
    """Connection variables from a CSV file: header `hostname,address[,port][,user]`. Raises SpecError.
    require_all=False reads a partial file (fabric verify's --sites maps only the hosts the site renamed);
    `flag` is the option that named the file, blamed when it cannot be read."""
    path = Path(path)
    name = str(path)
    try:
        text = read_regular(path, MAX_FILE_BYTES)[0].decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Finding((flag,), f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                                 "give a CSV file (a regular file) with the header hostname,address[,port][,user]",
                                 "hosts-file", file=name)]) from None
    findings: list[Finding] = []
    rows = _csv_rows(text, name)
    header_at, columns = _hosts_file_header(rows, name)
    known = set(hosts)
    out: dict[str, dict] = {}
    first_line: dict[str, int] = {}
    for i, row in enumerate(rows[header_at + 1:], header_at + 2):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) != len(columns):
            findings.append(Finding(("line",), f"{len(row)} fields where the header has {len(columns)}",
                                    f"write {','.join(columns)} on each line", "hosts-file", file=name, line=i))
            continue
        rec = {c: v.strip() for c, v in zip(columns, row, strict=True)}
        long = next((c for c in columns if len(rec[c]) > MAX_FIELD), None)
        if long:
            findings.append(Finding((long,), f"the {long} is {len(rec[long])} characters long", "give a real "
                                    f"{long} (at most {MAX_FIELD} characters)", "hosts-file", file=name, line=i))
            continue
        host = rec["hostname"]
        if host not in known:
            findings.append(Finding(("hostname",), f"'{host}' is not a host of the spec{_in(spec_file)}",
                                    "remove the line, or fix the name (names come from node_groups[].hostname)",
                                    "host-unknown", file=name, line=i))
            continue
        if host in first_line:
            findings.append(Finding(("hostname",), f"'{host}' is listed again (first on line {first_line[host]})",
                                    "keep one line per host", "duplicate", file=name, line=i))
            continue
        first_line[host] = i
        conn, problem = _row_connection(rec, name, i)
        if problem:
            findings.append(problem)
            continue
        out[host] = conn
    missing = [h for h in hosts if h not in out and h not in first_line] if require_all else []
    if missing:
        findings.append(Finding(("hostname",), f"{len(missing)} host(s) of the spec{_in(spec_file)} are not in the "
                                f"file: {_some(missing)}", "add a line for each (hostname,address)",
                                "host-missing", file=name, line=len(rows) or 1))
    if findings:
        raise SpecError(findings)
    return out


def _hosts_file_header(rows: list[list[str]], name: str) -> tuple[int, list[str]]:
    """The first line that is not a comment, as lower-case column names; raises SpecError unless it is one of
    the four headers the format allows (nothing after it can be read without it)."""
    header_at = next((i for i, r in enumerate(rows) if r and not r[0].lstrip().startswith("#")), None)
    columns = [c.strip().lower() for c in rows[header_at]] if header_at is not None else []
    allowed = [["hostname", "address"], ["hostname", "address", "port"], ["hostname", "address", "port", "user"],
               ["hostname", "address", "user"]]
    if columns not in allowed:
        raise SpecError([Finding(("header",), f"the header is {','.join(columns) or 'missing'}",
                                 "start the file with the line: hostname,address[,port][,user]", "hosts-file",
                                 file=name, line=(header_at or 0) + 1)])
    return header_at, columns


def _row_connection(rec: dict[str, str], name: str, line: int) -> tuple[dict, Finding | None]:
    """One row's Ansible connection variables (only those that differ from the defaults: the hostname as the
    address, port 22, the configured user), or the first field that is not valid, located at `line`."""
    host = rec["hostname"]
    conn: dict = {}
    if not valid_address(rec["address"]):
        return conn, Finding(("address",), f"'{rec['address']}' is not a host name or IP address",
                             "give a DNS name or an IPv4/IPv6 address (an IPv6 scope id is an interface "
                             "name, e.g. fe80::1%eth0)", "hosts-file", file=name, line=line)
    if rec["address"] != host:
        conn["ansible_host"] = rec["address"]
    port = rec.get("port", "")
    if port:
        if not valid_port(port):
            return conn, Finding(("port",), f"'{port}' is not a TCP port", "give a number from 1 to 65535, "
                                 "or leave it empty for 22", "hosts-file", file=name, line=line)
        if int(port) != 22:
            conn["ansible_port"] = int(port)
    user = rec.get("user", "")
    if user:
        if not valid_user(user):
            return conn, Finding(("user",), f"'{user}' is not a user name", "give a login name such as root",
                                 "hosts-file", file=name, line=line)
        conn["ansible_user"] = user
    return conn, None


def _csv_rows(text: str, name: str) -> list[list[str]]:
    """The CSV rows; a row the csv module refuses (a field past its limit, a NUL) is a located finding."""
    reader = csv.reader(io.StringIO(text))
    rows: list[list[str]] = []
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as exc:
            raise SpecError([Finding(("line",), f"cannot read this line as CSV ({exc})", f"give fields of at most "
                                     f"{MAX_FIELD} characters, quoted where they hold a comma", "hosts-file",
                                     file=name, line=reader.line_num)]) from None
        rows.append(row)


def _in(spec_file: str) -> str:
    return f" ({spec_file})" if spec_file else ""


def _some(names: list[str]) -> str:
    import hostlist

    return hostlist.collect_hostlist(names[:10000]) + (" …" if len(names) > 10000 else "")


def _pattern(names: list[str]) -> str:
    """The longest prefix the names share, as a Host pattern (gpu001, gpu002 -> gpu00*)."""
    head = names[0]
    for n in names[1:]:
        while not n.startswith(head):
            head = head[:-1]
    return f"{head}*" if head else "*"
