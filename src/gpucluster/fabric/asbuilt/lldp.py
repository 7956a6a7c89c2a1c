"""`lldpctl -f json` output (lldpd), one file per host and switch, into the neutral graph (RoCE fabrics).

The shape, from lldpd's JSON writer (src/client/json_writer.c) and display code (display.c): the
writer emits arrays of objects, then cleans them up: an array of one element becomes that element,
an object whose only key is "value" becomes that value, and an object with a "name" string is
re-keyed by it. So the same command prints

    {"lldp": {"interface": {"eth0": {...}}}}                      one interface with one neighbour
    {"lldp": {"interface": [{"eth0": {...}}, {"eth1": {...}}]}}     several (or several neighbours on
                                                                    one port: the same name twice)
    "chassis": {"leaf01": {"id": {"type": "mac", "value": ".."}, "descr": "..", "capability": [..]}}
    "chassis": {"id": {...}, ...}                                   a neighbour that sends no system name
    "port": {"id": {"type": "ifname", "value": "swp1"}, "descr": "..."}
    {"lldp": {}}                                                    no neighbour at all

and `-f json0` keeps every array and {"value": ...} object ("name" stays a key). Both are read.
lldpd on Linux sends the MAC as port ID and the interface name as port description, so a host's port
is its ifname (ID when it is an ifname, else the description); a switch's port number is the last
number in its port name (swp12, Ethernet1/12, etp12 -> 12).

Input: a folder of `<device>.json` files (the file name is the local device: lldpctl does not print
its own name), or one JSON object {device: lldpctl output, ...}.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from gpucluster.errors import UsageError
from gpucluster.fabric.asbuilt.findings import Finding
from gpucluster.fabric.asbuilt.graph import HCA, SWITCH, Fabric, rate_gbps
from gpucluster.fabric.asbuilt.names import DEFAULT_HOSTNAMES

_CHASSIS_FIELDS = {"id", "descr", "mgmt-ip", "mgmt-iface", "capability", "name"}
_LAST_NUMBER = re.compile(r"(\d+)\D*$")
_MAU_SPEED = re.compile(r"(\d+)G[Bb]ase", re.IGNORECASE)


def _value(x: object) -> object:
    """lldpd's leaf: "text", {"value": "text"}, or json0's [{"value": "text"}]."""
    while isinstance(x, list) and x:
        x = x[0]
    if isinstance(x, dict) and "value" in x:
        return _value(x["value"])
    return x


def _items(x: object) -> list:
    if x is None:
        return []
    return x if isinstance(x, list) else [x]


def interfaces(doc: object) -> Iterable[tuple[str, dict]]:
    """(local interface, neighbour entry) for every neighbour in one `lldpctl -f json|json0` output."""
    if not isinstance(doc, dict) or "lldp" not in doc:
        raise ValueError('no "lldp" object: not `lldpctl -f json` output')
    for lldp in _items(doc["lldp"]):
        if not isinstance(lldp, dict):
            continue
        for item in _items(lldp.get("interface")):
            if not isinstance(item, dict):
                continue
            if "name" in item and not isinstance(item.get("name"), dict):  # json0: the name is a field
                yield str(_value(item["name"])), item
            else:
                for name, entry in item.items():
                    for one in _items(entry):
                        if isinstance(one, dict):
                            yield str(name), one


def chassis_name(entry: dict) -> tuple[str, bool]:
    """(system name or chassis ID, whether it says it is a bridge/router)."""
    ch = entry.get("chassis")
    ch = ch[0] if isinstance(ch, list) and ch else ch
    if not isinstance(ch, dict):
        return "", False
    name = _value(ch.get("name")) if "name" in ch else None
    body = ch
    if name is None:
        keys = [k for k in ch if k not in _CHASSIS_FIELDS]
        if len(keys) == 1 and isinstance(ch[keys[0]], dict | list):  # re-keyed by its name
            name, body = keys[0], ch[keys[0]]
            body = body[0] if isinstance(body, list) and body else body
    if name is None:
        name = _value(body.get("id")) if isinstance(body, dict) else None
    forwards = False
    if isinstance(body, dict):
        for cap in _items(body.get("capability")):
            if isinstance(cap, dict) and str(_value(cap.get("type"))) in ("Bridge", "Router") \
                    and _value(cap.get("enabled")) in (True, "on", "yes"):
                forwards = True
    return str(name or ""), forwards


def port_name(entry: dict) -> str:
    port = entry.get("port")
    port = port[0] if isinstance(port, list) and port else port
    if not isinstance(port, dict):
        return ""
    pid = port.get("id")
    pid = pid[0] if isinstance(pid, list) and pid else pid
    kind = str(_value(pid.get("type"))) if isinstance(pid, dict) else ""
    value = str(_value(pid) or "")
    descr = _value(port.get("descr"))
    if kind in ("ifname", "local") and value:
        return value
    return str(descr) if descr else value


def port_rate(entry: dict) -> str:
    """The MAU type lldpd prints under auto-negotiation ('400GbaseCR8' -> '400G'); '' when absent."""
    port = entry.get("port")
    port = port[0] if isinstance(port, list) and port else port
    auto = port.get("auto-negotiation") if isinstance(port, dict) else None
    auto = auto[0] if isinstance(auto, list) and auto else auto
    current = str(_value(auto.get("current"))) if isinstance(auto, dict) else ""
    m = _MAU_SPEED.search(current)
    return f"{m.group(1)}G" if m else ""


def switch_port(name: str) -> int | None:
    m = _LAST_NUMBER.search(name)
    return int(m.group(1)) if m else None


class _Builder:
    def __init__(self, source: str, is_host: Callable[[str], bool]):
        self.fab = Fabric(source=source)
        self.is_host = is_host

    def end(self, device: str, port: str, host: bool, where: str) -> tuple[int, int] | None:
        fab = self.fab
        if host:
            return fab.node(("nic", device, port), HCA, f"{device} {port}", 1, 0), 1
        number = switch_port(port)
        if number is None or number <= 0:
            fab.findings.append(Finding("unparsed-line", f"{device}: port '{port}' has no port number",
                                        "name switch ports with their number (swp12, Ethernet1/12)", where=where))
            return None
        return fab.node(("sw", device), SWITCH, device, 0, 0), number

    def add(self, local: str, doc: object, where: str) -> None:
        try:
            entries = list(interfaces(doc))
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}; give the output of `lldpctl -f json` on {local}") from None
        local_host = self.is_host(local)
        for ifname, entry in entries:
            peer, forwards = chassis_name(entry)
            pport = port_name(entry)
            if not peer or not pport:
                self.fab.findings.append(Finding("unparsed-line", f"{local} {ifname}: a neighbour without "
                                                 "a system name or port", "check lldpd on the neighbour",
                                                 where=where))
                continue
            peer_host = self.is_host(peer) if not forwards else False
            a = self.end(local, ifname, local_host, where)
            b = self.end(peer, pport, peer_host, where)
            if a is None or b is None:
                continue
            rate = port_rate(entry)
            self.fab.connect(a[0], a[1], b[0], b[1], self.fab.rate_code(rate) if rate_gbps(rate) else 0)


def default_is_host(names: set[str]) -> Callable[[str], bool]:
    def is_host(name: str) -> bool:
        return name in names or name.split(".", 1)[0] in names or name.lower() in DEFAULT_HOSTNAMES
    return is_host


def read(path: str | Path, is_host: Callable[[str], bool], advance: Callable[[int], None] | None = None) -> Fabric:
    """A folder of per-device files, or one merged file. `is_host` tells hosts from switches (verify
    passes the plan's hosts and the --sites names); `advance(1)` is told each device read."""
    p = Path(path)
    b = _Builder(str(p), is_host)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".json" and f.is_file())
        if not files:
            raise UsageError(f"{p}: no <device>.json files; save `lldpctl -f json` of each host and switch "
                             "there as <its name>.json")
        for f in files:
            b.add(f.stem, _load(f), str(f))
            if advance is not None:
                advance(1)
    else:
        doc = _load(p)
        if isinstance(doc, dict) and "lldp" in doc:
            b.add(p.stem, doc, str(p))
        elif isinstance(doc, dict) and doc:
            for device, sub in doc.items():
                b.add(str(device), sub, f"{p} ({device})")
                if advance is not None:
                    advance(1)
        else:
            raise UsageError(f"{p}: expected `lldpctl -f json` output or {{device: that output, ...}}")
    return b.fab


def _load(p: Path) -> object:
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p}: cannot read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg}); give the output of "
                         "`lldpctl -f json` unchanged") from None
