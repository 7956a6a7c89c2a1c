"""Read an Ansible YAML inventory (the contract in docs/inventory.md) into hosts, groups and variables.

Parsed directly rather than through ansible's InventoryManager: that import alone takes about a
second, and gpucluster only needs the shape its writer produces (nested `children`, `hosts` with
Ansible's ranges such as gpu[0001:0032], inline `vars`, and group_vars/ beside the file). Host
variables are merged the way Ansible does it for this shape: all, then groups by depth (parents
before children) and name, then the host's own.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpucluster.errors import UsageError
from gpucluster.inventory.values import Data, inventory_value

OURS_FIRST = "-o StrictHostKeyChecking=yes"


@dataclass
class Host:
    name: str
    groups: list[str] = field(default_factory=list)  # every group the host is in, in inventory order
    vars: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host") or self.name)

    @property
    def port(self) -> int | None:
        port = self.vars.get("ansible_port")
        return int(port) if port else None

    @property
    def user(self) -> str:
        return str(self.vars.get("ansible_user") or "root")

    def ssh(self) -> dict:
        """How testinfra's ssh backend reaches the host: what Ansible uses, with gpucluster's host-key option
        first whatever the inventory says (ssh keeps the first value of an option)."""
        extra = str(self.vars.get("ansible_ssh_common_args") or "")
        extra_extra = str(self.vars.get("ansible_ssh_extra_args") or "")
        if not extra.startswith(OURS_FIRST):
            extra = f"{OURS_FIRST} {extra}".strip()
        return {
            "host": self.address,
            "port": self.port,
            "user": self.user,
            "identity": self.vars.get("ansible_ssh_private_key_file"),
            "extra_args": " ".join(a for a in (extra, extra_extra) if a),
        }

    def ssh_argv(self, command: str, *options: str) -> list[str]:
        """ssh as Ansible reaches the host (its address, port, user, key and common args; host keys checked
        first), never prompting; `options` are more -o settings (e.g. "ServerAliveInterval=15"). The
        destination follows `--`, so an address can never be read as an option."""
        c = self.ssh()
        argv = ["ssh", *shlex.split(c["extra_args"]), "-o", "BatchMode=yes"]
        for option in options:
            argv += ["-o", option]
        if c["identity"]:
            argv += ["-i", str(c["identity"])]
        if c["port"]:
            argv += ["-p", str(c["port"])]
        return [*argv, "-l", c["user"], "--", c["host"], command]


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, list[str]]  # group -> hosts, in inventory order
    vars: dict  # all-vars

    def group(self, name: str) -> list[str]:
        return list(self.groups.get(name, []))

    def select(self, limit: str | None) -> list[str]:
        """Hosts matching an Ansible-style limit: names or globs of hosts or groups, separated by ',' or
        ':'; '!x' removes, '&x' intersects. None selects every host."""
        every = list(self.hosts)
        if not limit:
            return every
        chosen: list[str] = []
        removes: set[str] = set()
        intersect: list[set[str]] = []
        for raw in limit_terms(limit):
            term = raw.strip()
            if not term:
                continue
            op = term[0] if term[0] in "!&" else ""
            pattern = term[1:] if op else term
            matched = self._match(pattern)
            if not matched:
                raise UsageError(f"--limit: '{pattern}' matches no host or group in {self.path}; "
                                 f"groups: {', '.join(sorted(g for g in self.groups if self.groups[g]))}")
            if op == "!":
                removes |= set(matched)
            elif op == "&":
                intersect.append(set(matched))
            else:
                chosen += [h for h in matched if h not in chosen]
        if not chosen and (removes or intersect):
            chosen = every
        out = [h for h in chosen if h not in removes]
        for keep in intersect:
            out = [h for h in out if h in keep]
        return out

    def _match(self, pattern: str) -> list[str]:
        if pattern in ("all", "*"):
            return list(self.hosts)
        if pattern in self.groups:
            return self.group(pattern)
        if pattern in self.hosts:
            return [pattern]
        hits: list[str] = []
        for g in fnmatch.filter(self.groups, pattern):
            hits += [h for h in self.groups[g] if h not in hits]
        hits += [h for h in fnmatch.filter(self.hosts, pattern) if h not in hits]
        return hits


INVENTORY_NAMES = ("hosts.yml", "hosts.yaml", "inventory.yml", "inventory.yaml")
_SLURM_RANGE = re.compile(r"^[\w.-]*\[[0-9,-]+\][\w.-]*$")


def limit_terms(limit: str) -> list[str]:
    """An Ansible --limit split into its terms (',' or ':' outside brackets), with Slurm hostlists such as
    gpu[001-064] or gpu[01-02,07] expanded to host names, as operators write them from sinfo; Ansible's own
    group slices (webservers[0:2]) and globs pass through. '!' and '&' prefixes are kept on every host."""
    import hostlist

    terms, depth, cur = [], 0, ""
    for ch in limit:
        depth += (ch == "[") - (ch == "]")
        if ch in ",:" and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    out = []
    for term in (t.strip() for t in terms):
        if not term:
            continue
        op = term[0] if term[0] in "!&" else ""
        body = term[len(op):]
        if _SLURM_RANGE.match(body):
            out += [op + h for h in hostlist.expand_hostlist(body)]
        else:
            out.append(term)
    return out
_RANGE = re.compile(r"^(?P<head>[^\[]*)\[(?P<lo>[0-9]+|[a-z]):(?P<hi>[0-9]+|[a-z])(?::(?P<step>[0-9]+))?\]"
                    r"(?P<tail>.*)$")


def inventory_file(path: str | Path) -> Path:
    """The inventory's YAML file: the folder's hosts.yml (other files there, e.g. reports, are not
    inventory), or the file given. configure and validate both take an inventory this way."""
    p = Path(path)
    if p.is_dir():
        for name in INVENTORY_NAMES:
            if (p / name).is_file():
                return p / name
        raise UsageError(f"{p}: no hosts.yml in this inventory folder; write one with `gpucluster inventory SPEC "
                         "-o DIR` (or `gpucluster stage up`)")
    if not p.is_file():
        raise UsageError(f"{p}: no such inventory; pass the folder `gpucluster inventory SPEC -o DIR` wrote")
    return p


def expand_hosts(pattern: str) -> list[str]:
    """Ansible's host ranges: gpu[0001:0004] -> gpu0001..gpu0004 (width of the first bound kept),
    [a:c] letters, an optional :step; several ranges in one pattern expand left to right."""
    m = _RANGE.match(pattern)
    if not m:
        return [pattern]
    lo, hi, step = m.group("lo"), m.group("hi"), int(m.group("step") or 1)
    if lo.isdigit() != hi.isdigit():
        raise UsageError(f"host pattern {pattern!r}: the range mixes letters and numbers")
    if lo.isdigit():
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        middles = [f"{i:0{width}d}" for i in range(int(lo), int(hi) + 1, step)]
    else:
        middles = [chr(c) for c in range(ord(lo), ord(hi) + 1, step)]
    return [h for mid in middles for h in expand_hosts(f"{m.group('head')}{mid}{m.group('tail')}")]


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    pass


# Ansible's !unsafe: a value written as data (gpucluster.inventory.values.inventory_value) is read as data.
def _unsafe(loader, node):
    if isinstance(node, yaml.ScalarNode):
        return Data(loader.construct_scalar(node))
    if isinstance(node, yaml.SequenceNode):
        return inventory_value(loader.construct_sequence(node, deep=True))
    return inventory_value(loader.construct_mapping(node, deep=True))


_Loader.add_constructor("!unsafe", _unsafe)


def _yaml(path: Path):
    try:
        return yaml.load(path.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read the inventory ({exc})") from None


def _group_vars(folder: Path) -> dict[str, dict]:
    """group_vars/<group>.yml (or .yaml, or a folder of them) beside the inventory file."""
    out: dict[str, dict] = {}
    gv = folder / "group_vars"
    if not gv.is_dir():
        return out
    for entry in sorted(gv.iterdir()):
        files = sorted(entry.glob("*.y*ml")) if entry.is_dir() else [entry]
        group = entry.name if entry.is_dir() else entry.stem
        for f in files:
            if f.suffix in (".yml", ".yaml") and f.is_file():
                data = _yaml(f) or {}
                if not isinstance(data, dict):
                    raise UsageError(f"{f}: group vars must be a mapping")
                out.setdefault(group, {}).update(data)
    return out


def load_inventory(path: str | Path) -> Inventory:
    p = inventory_file(path)
    data = _yaml(p)
    if not isinstance(data, dict) or not isinstance(data.get("all"), dict):
        raise UsageError(f"{p}: not a YAML inventory with a top-level 'all:' (docs/inventory.md)")
    file_vars = _group_vars(p.parent)
    hosts: dict[str, Host] = {}
    own: dict[str, dict] = {}  # host -> its own vars
    groups: dict[str, dict[str, None]] = {}  # group -> its own hosts, in order (a dict: an ordered set)
    depth: dict[str, int] = {}
    group_vars: dict[str, dict] = {}
    kids: dict[str, list[str]] = {}

    def walk(name: str, node: dict | None, level: int) -> None:
        node = node or {}
        depth[name] = max(depth.get(name, 0), level)
        groups.setdefault(name, {})
        if node.get("vars"):
            group_vars.setdefault(name, {}).update(node["vars"])
        for pattern, hvars in (node.get("hosts") or {}).items():
            for hname in expand_hosts(str(pattern)):
                hosts.setdefault(hname, Host(hname))
                own.setdefault(hname, {}).update(hvars or {})
                groups[name][hname] = None
        for child, cnode in (node.get("children") or {}).items():
            if str(child) not in kids.setdefault(name, []):
                kids[name].append(str(child))
            walk(str(child), cnode, level + 1)

    walk("all", data["all"], 0)
    for g, v in file_vars.items():
        group_vars[g] = {**v, **group_vars.get(g, {})}

    # A group holds its children's hosts (Ansible); members are listed in inventory order.
    order = {h: i for i, h in enumerate(hosts)}

    memo: dict[str, set[str]] = {}

    def members(g: str, seen: frozenset = frozenset()) -> set[str]:
        if g not in memo:
            out = set(groups.get(g, []))
            for child in kids.get(g, []):
                if child not in seen:
                    out |= members(child, seen | {g})
            memo[g] = out
        return memo[g]

    full = {g: sorted(members(g), key=order.__getitem__) for g in groups if g != "all"}
    host_groups: dict[str, list[str]] = {h: [] for h in hosts}
    for g in full:  # inventory order of groups
        for h in full[g]:
            host_groups[h].append(g)
    all_vars = dict(group_vars.get("all", {}))
    # Ansible's precedence: all, then groups by depth (parents first), then by name; the host's own last.
    rank = {g: (depth.get(g, 1), g) for g in group_vars if g != "all"}
    for h, host in hosts.items():
        merged = dict(all_vars)
        for g in sorted((g for g in host_groups[h] if g in rank), key=rank.__getitem__):
            merged.update(group_vars[g])
        merged.update(own.get(h, {}))
        host.vars = merged
        host.groups = host_groups[h]
    return Inventory(path=p, hosts=hosts, groups=full, vars=all_vars)


def ssh_args_list(extra: str) -> list[str]:
    return shlex.split(extra or "")
