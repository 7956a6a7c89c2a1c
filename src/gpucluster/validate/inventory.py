"""Read an Ansible YAML inventory (the contract in docs/inventory.md) into hosts, groups and variables.

Parsed directly rather than through ansible's InventoryManager: that import alone takes about a
second, and the validator only needs the YAML shape the inventory writer produces (nested
`children`, `hosts`, `vars`). Host variables are merged the way Ansible does it for this shape:
all-vars, then group vars (parents before children), then host vars.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpucluster.errors import UsageError


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
        """How testinfra's ssh backend reaches the host: exactly what Ansible uses (strict host keys kept)."""
        extra = str(self.vars.get("ansible_ssh_common_args") or "")
        extra_extra = str(self.vars.get("ansible_ssh_extra_args") or "")
        return {
            "host": self.address,
            "port": self.port,
            "user": self.user,
            "identity": self.vars.get("ansible_ssh_private_key_file"),
            "extra_args": " ".join(a for a in (extra, extra_extra) if a),
        }


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
        for raw in re.split(r"[,:]", limit):
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


def inventory_file(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        for name in ("hosts.yml", "hosts.yaml", "inventory.yml", "inventory.yaml"):
            if (p / name).is_file():
                return p / name
        raise UsageError(f"{p}: no hosts.yml in this folder; pass the inventory folder that "
                         "`gpucluster stage up` or `gpucluster inventory` wrote")
    if not p.is_file():
        raise UsageError(f"{p}: no such inventory; pass the folder `gpucluster inventory SPEC -o DIR` wrote")
    return p


def load_inventory(path: str | Path) -> Inventory:
    p = inventory_file(path)
    try:
        data = yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{p}: cannot read the inventory ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("all"), dict):
        raise UsageError(f"{p}: not a YAML inventory with a top-level 'all:' (docs/inventory.md)")
    hosts: dict[str, Host] = {}
    groups: dict[str, list[str]] = {}

    def walk(name: str, node: dict | None, inherited: dict, parents: list[str]) -> None:
        node = node or {}
        gvars = {**inherited, **(node.get("vars") or {})}
        groups.setdefault(name, [])
        for hname, hvars in (node.get("hosts") or {}).items():
            hname = str(hname)
            h = hosts.get(hname)
            if h is None:
                h = hosts[hname] = Host(hname)
            # Later definitions add to earlier ones; the host's own vars win over group vars.
            h.vars = {**gvars, **h.vars, **(hvars or {})}
            for g in [*parents, name]:
                if g not in h.groups:
                    h.groups.append(g)
                if hname not in groups.setdefault(g, []):
                    groups[g].append(hname)
        for child, cnode in (node.get("children") or {}).items():
            walk(str(child), cnode, gvars, [*parents, name])

    all_vars = dict(data["all"].get("vars") or {})
    walk("all", data["all"], all_vars, [])
    for h in hosts.values():
        h.vars = {**all_vars, **h.vars}
        h.groups = [g for g in h.groups if g != "all"]
    groups.pop("all", None)
    return Inventory(path=p, hosts=hosts, groups=groups, vars=all_vars)


def ssh_args_list(extra: str) -> list[str]:
    return shlex.split(extra or "")
