"""Filters for the nvidia_gpu role's IMEX steps (GB200/GB300 NVL72 compute trays).

  gpucluster_imex_domain(texts, host)                 {name, hosts} of the rendered domain file naming host
  gpucluster_imex_nodes_config(hosts, hostvars, if)   {text, missing}: nodes_config.cfg with one address a line
  gpucluster_imex_package(stack, names)               {package: version} of nvidia-imex at the locked driver

tests/test_imex.py covers them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

_DOMAIN_FILE = re.compile(r"(?:^|/)imex-domain\.(?P<name>[A-Za-z0-9_.-]+)\.hosts$")


def imex_domain(texts: Mapping[str, str], host: str) -> dict:
    """The NVLink domain whose rendered file (render/imex.py: imex-domain.<domain>.hosts, a host name a line)
    lists `host`: {name, hosts}; name '' where none does (a node outside every NVL72 rack). A host in two
    domain files is an error: the compiled state is not one plan's."""
    found = []
    for path, text in sorted((texts or {}).items()):
        m = _DOMAIN_FILE.search(str(path))
        if not m:
            continue
        hosts = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
        if host in hosts:
            found.append({"name": m.group("name"), "hosts": hosts})
    if len(found) > 1:
        raise ValueError(f"{host} is listed in the IMEX files of {len(found)} NVLink domains "
                         f"({', '.join(f['name'] for f in found)}); compile the spec again (gpucluster render)")
    return found[0] if found else {"name": "", "hosts": []}


def _address(hv: Mapping[str, Any], interface: str) -> str:
    """gpucluster_address where the inventory sets it, else the IPv4 address the facts give on `interface`
    (the default route's when empty): the same choice the common role makes for /etc/hosts."""
    addr = hv.get("gpucluster_address")
    facts = hv.get("ansible_facts") or {}
    if not addr and interface:
        addr = ((facts.get(interface.replace("-", "_")) or {}).get("ipv4") or {}).get("address")
    if not addr:
        addr = (facts.get("default_ipv4") or {}).get("address")
    if not addr:
        return ""
    try:
        return str(ipaddress.ip_address(str(addr)))
    except ValueError:
        return ""


def imex_nodes_config(hosts: Sequence[str], hostvars: Mapping[str, Any], interface: str = "") -> dict:
    """nodes_config.cfg for one NVLink domain: each tray's address, one a line, in the rendered order (every
    tray of the domain writes the same bytes; IMEX refuses maps that differ). {text, missing}: text is ''
    while any tray has no address (a partial list would make IMEX wait for a quorum that is not there)."""
    lines, missing = [], []
    for host in hosts:
        addr = _address((hostvars or {}).get(host) or {}, interface)
        if addr:
            lines.append(addr)
        else:
            missing.append(host)
    return {"text": "" if missing else "".join(f"{a}\n" for a in lines), "missing": missing}


def _release_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)) or (0,)


def imex_package(stack: Mapping[str, Any], names: Mapping[str, Any]) -> dict[str, str]:
    """{package: version}: nvidia-imex at the locked driver's version (NVIDIA builds it with the driver, one
    version for both), named nvidia-imex-<branch> before the branch where NVIDIA dropped the suffix (as Fabric
    Manager; names: the role's __nvidia_gpu_names). {} where the stack locks no NVIDIA driver."""
    stack = stack or {}
    pin = (stack.get("pins") or {}).get("driver")
    if stack.get("vendor") != "nvidia" or not pin:
        return {}
    branch = str(stack.get("branch") or "0")
    suffixed = _release_key(branch) < _release_key(str(names.get("unsuffixed_from", "0")))
    return {f"nvidia-imex-{branch}" if suffixed else "nvidia-imex": str(pin["version"])}


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpucluster_imex_domain": imex_domain,
            "gpucluster_imex_nodes_config": imex_nodes_config,
            "gpucluster_imex_package": imex_package,
        }
