"""Names on the wire versus names in the plan: node descriptions, defaults, and the site's own names.

An HCA's node description is what rdma-ndd writes ("<hostname> <device>", e.g. "gti0001 mlx5_3"),
older stacks write "<hostname> HCA-1"; before either runs it is the adapter's model string
("MT4129 ConnectX7   Mellanox Technologies"). A host that never got its name says "localhost".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.errors import UsageError

DEFAULT_HOSTNAMES = frozenset({"localhost", "localhost.localdomain", "ubuntu", "debian", "(none)", "none",
                               "linux"})
_MODEL = re.compile(r"^(MT\d{4,5}\b|Mellanox\b|NVIDIA\b|ConnectX|BlueField)|ConnectX|Mellanox Technologies",
                    re.IGNORECASE)
_AGGREGATION = re.compile(r"aggregation node", re.IGNORECASE)


def is_aggregation(desc: str | None) -> bool:
    """A SHARP aggregation node: a Ca inside the switch, never a host."""
    return bool(desc) and bool(_AGGREGATION.search(desc))


def host_and_device(desc: str | None) -> tuple[str, str] | None:
    """('gti0001', 'mlx5_3') from an HCA's description; None when it names no usable host."""
    if not desc:
        return None
    text = desc.strip()
    if not text or _MODEL.search(text):
        return None
    parts = text.split()
    host = parts[0]
    if host.lower() in DEFAULT_HOSTNAMES:
        return None
    return host, parts[1] if len(parts) > 1 else ""


def why_unidentified(desc: str | None) -> str:
    if not desc or not desc.strip():
        return "no node description"
    if _MODEL.search(desc):
        return f"the adapter's model string '{desc.strip()}' as its description"
    return f"the default name '{desc.split()[0]}'"


# ---- the site's names ---------------------------------------------------------------------------

@dataclass
class SiteNames:
    """Site name -> plan name, for hosts (a --sites file) and switches (a --switch-pattern)."""

    hosts: dict[str, str] = field(default_factory=dict)
    switch_pattern: re.Pattern | None = None

    def host(self, site: str) -> str:
        """The plan's name for a host the wire calls `site` (itself when unmapped; the domain is
        dropped when only the short name is mapped)."""
        if site in self.hosts:
            return self.hosts[site]
        short = site.split(".", 1)[0]
        return self.hosts.get(short, short)

    def switch(self, desc: str) -> str | None:
        """The plan's name for a switch described as `desc`, by the pattern; None when it does not match."""
        if self.switch_pattern is None:
            return None
        m = self.switch_pattern.fullmatch(desc.strip())
        if not m:
            return None
        if "name" in m.groupdict():
            return m.group("name")
        return m.group(1) if m.groups() else m.group(0)


def load_hosts(path: str | Path, plan_hosts: list[str], spec_file: str = "") -> dict[str, str]:
    """A --sites file, read by the inventory's own reader (the CSV form `gpucluster inventory --hosts`
    takes: header `hostname,address[,port][,user]`); for verify the address is the site's name for the
    plan's host, and hosts the file leaves out keep their plan names. Returns {site name: plan name}.
    Raises SpecError (file, line, field, rule, fix) for a malformed file or a host the spec lacks."""
    from gpucluster.inventory.sources import from_hosts_file

    conns = from_hosts_file(path, plan_hosts, spec_file=spec_file, require_all=False, flag="--sites")
    out: dict[str, str] = {}
    for plan, conn in conns.items():
        site = str(conn.get("ansible_host", plan))
        if site in out:
            raise UsageError(f"{path}: the site name '{site}' is given to {out[site]} and to {plan}; each site "
                             "name maps to one plan host")
        out[site] = plan
    return out


def switch_pattern(text: str) -> re.Pattern:
    """--switch-pattern: a format with {name} ('MF0;{name}:MQM9700/U1') or a regex whose group
    'name' (or first group) is the plan's name ('ib-(?P<name>.+)')."""
    if "{name}" in text:
        head, _, tail = text.partition("{name}")
        if "{name}" in tail:
            raise UsageError(f"--switch-pattern {text!r}: {{name}} may appear once")
        return re.compile(re.escape(head) + r"(?P<name>.+?)" + re.escape(tail))
    try:
        rx = re.compile(text)
    except re.error as exc:
        raise UsageError(f"--switch-pattern {text!r}: not a regular expression ({exc}); use a format such as "
                         "'MF0;{name}:MQM9700/U1' or a regex with (?P<name>...)") from None
    if not rx.groups:
        raise UsageError(f"--switch-pattern {text!r}: the regex captures nothing; mark the plan name with "
                         "(?P<name>...) or write a format with {name}")
    return rx
