"""Values from outside gpucluster's own code, on their way into an inventory or an SSH command line.

Two rules, both applied (docs/security.md):

- Each value is checked against an allow-list of its syntax: host names and addresses, ports, login
  names, local paths, a ProxyJump host list. What passes cannot carry an option (`-o...`), a space, a
  quote, `%` (ssh's own tokens) or `{` (a Jinja template).
- Every string written into an inventory is written by `inventory_value` as Ansible's `!unsafe`, so even
  a value no rule here knows about is data to Ansible, never a template it evaluates on the operator's
  machine. The writer (gpucluster.inventory.writer) calls it on every string it writes but the two
  per-operator defaults it owns (DEFAULT_DIRS).

And SSH options are ours first: `ssh_common_args` puts `StrictHostKeyChecking=yes` and the known-hosts
file at the head of every command line, before anything a source gave; ssh keeps the first value of an
option, so nothing after them (a ProxyJump, the operator's ~/.ssh/config) turns host-key checking off.
"""

from __future__ import annotations

import ipaddress
import re

HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
SCOPE_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # an interface name (IFNAMSIZ - 1)
USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
# A local path: absolute, made of the characters file names on a cluster's controller use; no space, quote,
# '%' (ssh expands it), '{' (Jinja), '$' or '`' (a shell), and never a leading '-' (absolute, or ~/).
PATH_RE = re.compile(r"^~?/[A-Za-z0-9._+,=@~/-]{0,4095}$")  # '~/': ssh and Ansible expand it, per operator
JUMP_RE = re.compile(r"^(?:(?P<user>[^@]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+))(?::(?P<port>[0-9]+))?$")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"  # ssh expands '~' itself: each operator's own file, no one's home


class Data(str):
    """A string from outside, marked as data: the inventory writer emits it as `!unsafe`, the inventory
    reader gives it back as this type (so gpucluster never mistakes it for a Jinja default)."""

    __slots__ = ()


def inventory_value(value):
    """THE function that writes an outside value into an inventory: strings (in lists and mappings too)
    become `Data`, which the writer emits as Ansible's `!unsafe`; numbers, booleans and None stay as they are."""
    if isinstance(value, str):
        return value if isinstance(value, Data) else Data(value)
    if isinstance(value, dict):
        return {k: inventory_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [inventory_value(v) for v in value]
    return value


def valid_address(text: str) -> bool:
    """A DNS name, an IPv4 address, or an IPv6 address with, at most, a scope id that is an interface name."""
    addr, _, scope = text.partition("%")
    if scope or "%" in text:
        if not SCOPE_ID_RE.match(scope):
            return False
        try:
            return isinstance(ipaddress.ip_address(addr), ipaddress.IPv6Address)
        except ValueError:
            return False
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(HOSTNAME_RE.match(text)) and ".." not in text


def valid_port(text: str | int) -> bool:
    s = str(text)
    return s.isascii() and s.isdigit() and len(s) <= 5 and 1 <= int(s) <= 65535


def valid_user(text: str) -> bool:
    return bool(USER_RE.match(text))


def valid_path(text: str, *, spaces: bool = False) -> bool:
    """An absolute local path (or one under ~/) of plain characters. `spaces`: a path that never goes
    into a command line (the spec's, the state folder's) may hold spaces."""
    return bool(PATH_RE.match(text.replace(" ", "_") if spaces else text))


def proxy_jump_problem(text: str) -> str | None:
    """None when `text` is a ProxyJump host list (`[user@]host[:port]`, comma-separated), else why not.
    It is checked as one value: a list that holds a space or an option is refused, never split."""
    if not text or len(text) > 2048:
        return "an empty or over-long host list"
    for item in text.split(","):
        m = JUMP_RE.match(item)
        if not m:
            return f"'{item}' is not [user@]host[:port]"
        if m.group("user") is not None and not valid_user(m.group("user")):
            return f"'{m.group('user')}' in '{item}' is not a login name"
        host = m.group("v6") or m.group("host")
        if m.group("v6"):
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                return f"'{host}' in '{item}' is not an IPv6 address"
        elif not valid_address(host) or "%" in host:
            return f"'{host}' in '{item}' is not a host name or address"
        if m.group("port") is not None and not valid_port(m.group("port")):
            return f"'{m.group('port')}' in '{item}' is not a TCP port"
    return None


def ssh_common_args(known_hosts: str = DEFAULT_KNOWN_HOSTS, *, identities_only: bool = False,
                    proxy_jump: str | None = None) -> str:
    """ansible_ssh_common_args: gpucluster's own host-key options first, then what the source gave (each
    already checked: a path, a host list). Raises ValueError for a value that is not."""
    if known_hosts != DEFAULT_KNOWN_HOSTS and not valid_path(known_hosts):
        raise ValueError(f"known_hosts '{known_hosts}' is not an absolute path of plain characters")
    if proxy_jump is not None and proxy_jump_problem(proxy_jump):
        raise ValueError(f"ProxyJump '{proxy_jump}': {proxy_jump_problem(proxy_jump)}")
    args = ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"]
    if identities_only:
        args += ["-o", "IdentitiesOnly=yes"]
    if proxy_jump:
        args += ["-o", f"ProxyJump={proxy_jump}"]
    return " ".join(args)  # every piece is checked plain text: no quoting needed, none that could be undone
