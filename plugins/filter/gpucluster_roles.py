"""Filters for the common, munge and slurm_* roles: computed values in Python, not Jinja branches.

Each filter takes plain data and returns plain data; tests/test_roles_static.py covers them.

  gpucluster_etc_hosts(hosts, hv, if, prev)  /etc/hosts lines for inventory hosts: {lines, missing, kept}
  gpucluster_is_container(facts)             True when Ansible's facts say the node is a container
  gpucluster_slurm_restart_reasons(results[, version])  why a config change needs a daemon restart ([] = reconfigure)
  gpucluster_sysctl_report(result, container) one sentence on settings persisted but not live
  gpucluster_limits_report(result, container) one sentence on limits lowered to what the node grants
  gpucluster_failed_checks(checks)           messages of failed preflight checks [{ok, msg}, ...]
  gpucluster_slurm_node_state(sinfo_line)    {state, reason, responding, usable, mismatch} of one node
  gpucluster_slurm_nodes_state(sinfo, hosts) {nodes: {host: that}, usable, waiting} of many nodes, one sinfo
  gpucluster_pin(packages, version)          ["pkg=version", ...] (or the bare names when version is '')
  gpucluster_file_map(names, src, dest)      {dest/name: text of src/name} read on the controller, bytes kept
  gpucluster_apt_pin(version, pkgs, path)    {path: apt preferences pin text} ({} when version is '')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CONTAINER_TYPES = {"podman", "docker", "container", "containerd", "lxc", "openvz", "systemd-nspawn", "wsl"}


def etc_hosts(hosts: Iterable[str], hostvars: Mapping[str, Any], interface: str = "", previous: str = "") -> dict:
    """`ADDRESS NAME` for every inventory host: its `gpucluster_address` host var when set, else the IPv4
    address its facts give on `interface` (default route when empty), else the address the managed
    block of `previous` (the node's current /etc/hosts) last gave it. A host that is down for one run
    keeps its entry everywhere, so daemons can still resolve it when it comes back. Returns
    {lines, missing (no address at all), kept (names whose last known address was kept)}."""
    known = _managed_block_addresses(previous)
    lines, missing, kept = [], [], []
    for host in sorted(set(hosts)):
        hv = hostvars.get(host) or {}
        facts = hv.get("ansible_facts") or {}
        addr = hv.get("gpucluster_address")
        if not addr and interface:
            addr = ((facts.get(interface.replace("-", "_")) or {}).get("ipv4") or {}).get("address")
        elif not addr:
            addr = (facts.get("default_ipv4") or {}).get("address")
        if not addr and host in known:
            addr = known[host]
            kept.append(host)
        if addr:
            lines.append(f"{addr} {host}")
        else:
            missing.append(host)
    return {"lines": lines, "missing": missing, "kept": kept}


def _managed_block_addresses(text: str) -> dict[str, str]:
    """{name: address} inside the `# BEGIN gpucluster ... # END gpucluster` block of an /etc/hosts text."""
    out: dict[str, str] = {}
    inside = False
    for line in (text or "").splitlines():
        if line.startswith("# BEGIN gpucluster "):
            inside = True
        elif line.startswith("# END gpucluster "):
            inside = False
        elif inside:
            fields = line.split("#", 1)[0].split()
            for name in fields[1:]:
                out[name] = fields[0]
    return out


def is_container(facts: Mapping[str, Any]) -> bool:
    return (facts.get("virtualization_role") == "guest"
            and str(facts.get("virtualization_type", "")).lower() in CONTAINER_TYPES)


_RESTART_FILES = {"cgroup.conf"}  # read by slurmd at start


def slurm_conf_restart_reasons(before: str, after: str, version: str | None = None) -> list[str]:
    """Why a slurm.conf change needs a daemon restart on Slurm `version` (None: on any release gpucluster
    supports, the conservative answer). Which keys need one is gpucluster.slurmkeys' table, read from
    Slurm's man pages; the file is read by gpucluster.slurmtext, the one slurm.conf parser."""
    from gpucluster import slurmkeys, slurmtext

    old, new = slurmtext.all_settings(before), slurmtext.all_settings(after)
    reasons = [f"{key} changed" for key in sorted(slurmkeys.restart_keys(version)) if old.get(key) != new.get(key)]
    nodes = "NodeName"
    if slurmkeys.change_class(nodes, version or slurmkeys.RELEASES[0]) != slurmkeys.RECONFIGURE and \
            _records(before, nodes) != _records(after, nodes):
        reasons.append("node definitions (NodeName lines) changed")
    return reasons


def _records(text: str, kind: str) -> list[tuple]:
    from gpucluster import slurmtext

    return sorted(tuple(sorted(r.items())) for r in slurmtext.records(text, kind))


def slurm_restart_reasons(result: Mapping[str, Any], version: str | None = None) -> list[str]:
    """Why the Slurm files a gpucluster_files task just installed need a daemon restart ([] = reconfigure).

    Reads the task's standard diffs (before/after per file). A file that did not exist before is a
    first install: the role starts the daemon afterwards, so that alone needs no restart.
    """
    if not isinstance(result, Mapping) or not result.get("changed"):
        return []
    diffs = result.get("diff") or []
    if isinstance(diffs, Mapping):
        diffs = [diffs]
    by_name = {str(d.get("after_header") or d.get("before_header") or "").rsplit("/", 1)[-1]: d for d in diffs}
    reasons: list[str] = []
    for path in result.get("changed_files") or []:
        name = str(path).rsplit("/", 1)[-1]
        if name not in ("slurm.conf", *_RESTART_FILES):
            continue
        d = by_name.get(name)
        if d is None or "before" not in d or "after" not in d:
            reasons.append(f"{name} changed and its previous content is unknown")
            continue
        before, after = str(d["before"]), str(d["after"])
        if not before.strip():
            continue
        if name == "slurm.conf":
            reasons += slurm_conf_restart_reasons(before, after, version)
        else:
            reasons.append(f"{name} changed (read at daemon start)")
    return reasons


def apt_pin(version: str, packages: str, path: str, enabled: bool = True) -> dict[str, str]:
    """{path: apt preferences text} holding `packages` (apt glob patterns) at `version`; {} when no pin."""
    version = str(version or "").strip()
    if not (enabled and version):
        return {}
    pin([], version)  # validates the version string
    return {str(path): ("# Managed by Ansible (role slurm_common): these packages stay at the tested version;\n"
                        "# change slurm_common_version to upgrade.\n"
                        f"Package: {packages}\nPin: version {version}\nPin-Priority: 1001\n")}


def file_map(names: Iterable[str], src_dir: str, dest_dir: str) -> dict[str, str]:
    """{dest_dir/name: text of src_dir/name} for the names present in src_dir, read on the controller
    byte for byte (no newline stripping, unlike the file lookup's default)."""
    out: dict[str, str] = {}
    for name in names:
        src = Path(str(src_dir)) / str(name)
        if src.is_file():
            out[f"{str(dest_dir).rstrip('/')}/{name}"] = src.read_bytes().decode("utf-8")
    return out


# sinfo %t states of a node that cannot run jobs until something changes (a '*' suffix: not responding).
BAD_NODE_STATES = frozenset({"unk", "down", "inval", "fail", "failg", "futr", "boot"})
_MISMATCH = re.compile(r"(?i)differ|lower than|invalid|gres|low socket|low realmemory")


def slurm_node_state(line: str) -> dict[str, Any]:
    """Parse `sinfo --noheader --node N --format '%t|%E'`: {state, reason, responding, usable, mismatch}."""
    first = str(line).strip().splitlines()[0] if str(line).strip() else ""
    state, _, reason = first.partition("|")
    base = re.sub(r"[^a-z]", "", state.lower())
    responding = bool(state) and not state.endswith("*")
    usable = responding and base not in BAD_NODE_STATES
    mismatch = base.startswith("drain") or base.startswith("drng")
    return {"state": state, "reason": reason.strip(), "responding": responding, "usable": usable,
            "mismatch": bool(mismatch and _MISMATCH.search(reason or ""))}


def slurm_nodes_state(text: str, hosts: Iterable[str]) -> dict[str, Any]:
    """Parse one `sinfo --noheader --Node --nodes H1,H2,... --format '%N|%t|%E'` for many nodes:
    {nodes: {host: slurm_node_state of its line}, usable: every host usable, waiting: hosts not yet usable}.
    A host sinfo does not list is not usable (slurmctld does not know it); a node in two partitions is listed
    twice with one state."""
    lines: dict[str, str] = {}
    for line in str(text).splitlines():
        name, sep, rest = line.strip().partition("|")
        if sep and name not in lines:
            lines[name] = rest
    nodes = {h: slurm_node_state(lines.get(h, "")) for h in hosts}
    waiting = [h for h, st in nodes.items() if not st["usable"]]
    return {"nodes": nodes, "usable": not waiting, "waiting": waiting}


def sysctl_report(result: Mapping[str, Any], container: bool = False) -> str:
    """The gpucluster_sysctl result as one sentence: what is persisted but not live, and why."""
    parts = []
    readonly = result.get("readonly") or {}
    if readonly:
        keys = ", ".join(f"{k} (is {v})" for k, v in sorted(readonly.items()))
        parts.append(f"persisted in {result.get('path', 'the sysctl.d file')} but read-only here, so not live: {keys}")
    missing = result.get("missing") or []
    if missing:
        parts.append(f"not visible here (other network namespace or kernel): {', '.join(sorted(missing))}")
    text = "; ".join(parts)
    if container and text:
        text += ". A container cannot change these for itself: set them on the host (podman run --sysctl for net.*)"
    return text + "." if text else ""


def limits_report(result: Mapping[str, Any], container: bool = False) -> str:
    capped = result.get("capped") or {}
    if not capped:
        return ""
    items = ", ".join(f"{k} {v['wanted']} lowered to {v['allowed']}" for k, v in sorted(capped.items()))
    who = "this container" if container else "this node"
    return (f"{items}: {who} cannot raise hard limits (no CAP_SYS_RESOURCE), and a limits.conf entry above them "
            "would make pam_limits refuse logins.")


def failed_checks(checks: Iterable[Mapping[str, Any]]) -> list[str]:
    """Messages of the preflight checks that failed: [{ok: bool, msg: "what to change"}, ...].

    One assert per role reports every problem at once instead of stopping at the first."""
    failed = []
    for check in checks:
        ok = check.get("ok")
        if isinstance(ok, str):
            ok = ok.strip().lower() in ("true", "yes", "1")
        if not ok:
            failed.append(" ".join(str(check.get("msg", "a preflight check failed")).split()))
    return failed


def pin(packages: Iterable[str], version: str) -> list[str]:
    version = str(version or "").strip()
    if version and not re.match(r"^[0-9A-Za-z.+~:-]+$", version):
        raise ValueError(f"package version {version!r} is not a Debian version string")
    return [f"{p}={version}" if version else str(p) for p in packages]


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpucluster_etc_hosts": etc_hosts,
            "gpucluster_is_container": is_container,
            "gpucluster_slurm_restart_reasons": slurm_restart_reasons,
            "gpucluster_pin": pin,
            "gpucluster_failed_checks": failed_checks,
            "gpucluster_sysctl_report": sysctl_report,
            "gpucluster_limits_report": limits_report,
            "gpucluster_slurm_node_state": slurm_node_state,
            "gpucluster_slurm_nodes_state": slurm_nodes_state,
            "gpucluster_file_map": file_map,
            "gpucluster_apt_pin": apt_pin,
        }
