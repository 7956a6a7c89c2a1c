#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""Process limits for logins (limits.d) and daemons (systemd drop-ins), lowered to what the node grants.

Why a module: the limits a node can grant depend on the node (a container's init has hard limits
it cannot raise, and a limits.conf entry above them makes pam_limits refuse logins, locking out
SSH), so they are read, compared and written in one call: one round trip per node instead of five.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_limits
short_description: Write limits.d and systemd drop-ins (TasksMax, LimitNOFILE, LimitMEMLOCK) the node can honour
options:
  limits:
    type: dict
    required: true
    description: limits.conf items (nofile, memlock in KiB, nproc, stack) to a number or C(unlimited).
  limits_file: {type: path, default: /etc/security/limits.d/90-gpucluster.conf, description: The limits.d file.}
  units: {type: list, elements: str, default: [], description: systemd services that get a drop-in.}
  tasks_max: {type: str, default: infinity, description: TasksMax in those drop-ins.}
  dropin_name: {type: str, default: 90-gpucluster-limits.conf, description: File name of the drop-ins.}
  header: {type: str, default: "Managed by Ansible", description: First comment line of each file.}
  proc_root: {type: path, default: /proc, description: Where /proc/1/limits and /proc/1/status are (tests).}
  systemd_dir: {type: path, default: /etc/systemd/system, description: Where drop-in folders go (tests).}
"""

RETURN = r"""
effective: {type: dict, returned: always, description: "Item to {limits: limits.conf value, systemd: unit value}."}
capped: {type: dict, returned: always, description: "Items lowered to the node's hard limit: {wanted, allowed}."}
can_raise: {type: bool, returned: always, description: Whether init holds CAP_SYS_RESOURCE (may raise hard limits).}
changed_files: {type: list, returned: always, description: Files written.}
"""

import os
from collections.abc import Mapping

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpucluster_fileutil import write_if_changed

UNLIMITED = "unlimited"
CAP_SYS_RESOURCE = 24
# /proc/<pid>/limits rows -> limits.conf items; memlock and stack are KiB in limits.conf, bytes in /proc.
PROC_NAMES = {"Max open files": "nofile", "Max locked memory": "memlock", "Max processes": "nproc",
              "Max stack size": "stack"}
KIB = {"memlock", "stack"}
SYSTEMD_NAMES = {"nofile": "LimitNOFILE", "memlock": "LimitMEMLOCK", "nproc": "LimitNPROC", "stack": "LimitSTACK"}


def as_limit(value) -> int | str:
    text = str(value).strip().lower()
    if text in ("unlimited", "infinity", "-1"):
        return UNLIMITED
    return int(text)


def proc_limits(text: str) -> dict:
    """/proc/<pid>/limits -> {item: {soft, hard}} in limits.conf units."""
    out = {}
    for line in text.splitlines():
        for label, item in PROC_NAMES.items():
            if line.startswith(label):
                fields = line[len(label):].split()
                values = {}
                for key, raw in (("soft", fields[0]), ("hard", fields[1])):
                    v = as_limit(raw)
                    values[key] = v // 1024 if (item in KIB and v != UNLIMITED) else v
                out[item] = values
    return out


def can_raise_limits(status_text: str) -> bool:
    """Whether init's capability bounding set holds CAP_SYS_RESOURCE."""
    for line in status_text.splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return True


def _le(a, b) -> bool:
    if b == UNLIMITED:
        return True
    return a != UNLIMITED and int(a) <= int(b)


def systemd_value(item: str, value) -> str:
    if value == UNLIMITED:
        return "infinity"
    return f"{value}K" if item in KIB else str(value)


def cap_limits(wanted: Mapping, node: Mapping, can_raise: bool) -> tuple[dict, dict]:
    """(effective, capped): wanted limits, lowered to the node's hard limits when it cannot raise them."""
    effective, capped = {}, {}
    for item, raw in wanted.items():
        want = as_limit(raw)
        hard = UNLIMITED if can_raise else as_limit((node.get(item) or {}).get("hard", UNLIMITED))
        value = want if _le(want, hard) else hard
        if value != want:
            capped[item] = {"wanted": str(want), "allowed": str(hard)}
        effective[item] = {"limits": str(value), "systemd": systemd_value(item, value)}
    return effective, capped


def limits_text(effective: Mapping, header: str) -> str:
    lines = [f"# {header}"]
    for item, v in effective.items():
        for who in ("*", "root"):
            for kind in ("soft", "hard"):
                lines.append(f"{who:<5} {kind:<4}  {item:<8} {v['limits']}")
    return "\n".join(lines) + "\n"


def dropin_text(effective: Mapping, tasks_max: str, header: str) -> str:
    lines = [f"# {header}", "[Service]", f"TasksMax={tasks_max}"]
    lines += [f"{SYSTEMD_NAMES[item]}={v['systemd']}" for item, v in effective.items() if item in SYSTEMD_NAMES]
    return "\n".join(lines) + "\n"


def write_text(path: str, text: str, check_mode: bool) -> bool:
    """True when the file's text differs (it is then replaced whole, 0644, unless in check mode)."""
    return write_if_changed(path, text.encode(), 0o644, check_mode, make_dirs=True)[0]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "limits": {"type": "dict", "required": True},
            "limits_file": {"type": "path", "default": "/etc/security/limits.d/90-gpucluster.conf"},
            "units": {"type": "list", "elements": "str", "default": []},
            "tasks_max": {"type": "str", "default": "infinity"},
            "dropin_name": {"type": "str", "default": "90-gpucluster-limits.conf"},
            "header": {"type": "str", "default": "Managed by Ansible"},
            "proc_root": {"type": "path", "default": "/proc"},
            "systemd_dir": {"type": "path", "default": "/etc/systemd/system"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(os.path.join(p["proc_root"], "1", "limits")) as fh:
            node = proc_limits(fh.read())
        with open(os.path.join(p["proc_root"], "1", "status")) as fh:
            can_raise = can_raise_limits(fh.read())
        effective, capped = cap_limits(p["limits"], node, can_raise)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot work out the node's limits: {exc}; limits must be numbers or 'unlimited'")
    files = {p["limits_file"]: limits_text(effective, p["header"])}
    dropin = dropin_text(effective, p["tasks_max"], p["header"])
    for unit in p["units"]:
        name = unit if "." in unit else f"{unit}.service"
        files[os.path.join(p["systemd_dir"], f"{name}.d", p["dropin_name"])] = dropin
    changed_files = [path for path, text in files.items() if write_text(path, text, module.check_mode)]
    module.exit_json(changed=bool(changed_files), changed_files=changed_files, effective=effective, capped=capped,
                     can_raise=can_raise, units_changed=any(f.startswith(p["systemd_dir"]) for f in changed_files))


if __name__ == "__main__":
    main()
