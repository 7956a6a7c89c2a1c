#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""Kernel settings for large clusters: persisted in one sysctl.d file, applied where writable.

Why not ansible.posix.sysctl: in a container most of /proc/sys is read-only, and a node must still
converge (and say which settings it could not apply) instead of failing. One module call also
replaces a loop of one task per key.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_sysctl
short_description: Persist sysctls in one file and apply each one that the kernel lets us write
options:
  settings: {type: dict, required: true, description: "Key (dotted, e.g. net.core.somaxconn) to value."}
  path: {type: path, default: /etc/sysctl.d/90-gpucluster.conf, description: File that persists them.}
  header: {type: str, default: "", description: Comment placed at the top of the file.}
  proc_root: {type: path, default: /proc/sys, description: Where the live values are (tests use a folder).}
  minimum:
    type: bool
    default: true
    description:
      - Treat single integer values as minimums; a live value already above one is kept (not lowered, not
        persisted), e.g. fs.file-max, which the kernel sizes from the RAM.
"""

RETURN = r"""
applied: {type: dict, returned: always, description: Keys written to the running kernel now (key to value).}
readonly:
  type: dict
  returned: always
  description: Keys whose live value differs but cannot be written here (key to live value), e.g. in a container.
missing: {type: list, returned: always, description: Keys this kernel (or this network namespace) does not show.}
kept: {type: dict, returned: always, description: Keys whose live value is above the minimum already (key to it).}
"""

import errno
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpucluster_fileutil import write_if_changed


def normalise(value) -> str:
    """sysctl prints vectors tab-separated; compare them whitespace-insensitively."""
    return " ".join(str(value).split())


def render_file(settings: dict, header: str) -> str:
    lines = [f"# {line}".rstrip() for line in header.splitlines()] if header else []
    lines += [f"{key} = {normalise(value)}" for key, value in sorted(settings.items())]
    return "\n".join(lines) + "\n"


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def live_values(settings: dict, proc_root: str) -> dict:
    """Key to its live value (normalised); None where the kernel does not show the key."""
    out = {}
    for key in settings:
        try:
            with open(os.path.join(proc_root, *key.split("."))) as fh:
                out[key] = normalise(fh.read())
        except FileNotFoundError:
            out[key] = None
    return out


def above_minimum(settings: dict, live: dict) -> dict:
    """Keys whose live single-integer value already exceeds the wanted one (key to live value)."""
    kept = {}
    for key, value in settings.items():
        want, have = _int(normalise(value)), _int(live.get(key) or "")
        if want is not None and have is not None and have > want:
            kept[key] = live[key]
    return kept


def apply(settings: dict, proc_root: str, check_mode: bool) -> tuple[dict, dict, list]:
    applied, readonly, missing = {}, {}, []
    for key, value in sorted(settings.items()):
        node = os.path.join(proc_root, *key.split("."))
        try:
            with open(node) as fh:
                live = normalise(fh.read())
        except FileNotFoundError:
            missing.append(key)
            continue
        want = normalise(value)
        if live == want:
            continue
        if not os.access(node, os.W_OK):
            readonly[key] = live
            continue
        if check_mode:
            applied[key] = want
            continue
        try:
            with open(node, "w") as fh:
                fh.write(want)
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                readonly[key] = live
                continue
            raise
        applied[key] = want
    return applied, readonly, missing


def write_text(path: str, text: str, check_mode: bool) -> bool:
    """True when the file's text differs (it is then replaced whole, 0644, unless in check mode)."""
    return write_if_changed(path, text.encode(), 0o644, check_mode, make_dirs=True)[0]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "settings": {"type": "dict", "required": True},
            "path": {"type": "path", "default": "/etc/sysctl.d/90-gpucluster.conf"},
            "header": {"type": "str", "default": ""},
            "proc_root": {"type": "path", "default": "/proc/sys"},
            "minimum": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    settings = {str(k): v for k, v in p["settings"].items()}
    kept = above_minimum(settings, live_values(settings, p["proc_root"])) if p["minimum"] else {}
    wanted = {k: v for k, v in settings.items() if k not in kept}
    file_changed = write_text(p["path"], render_file(wanted, p["header"]), module.check_mode)
    applied, readonly, missing = apply(wanted, p["proc_root"], module.check_mode)
    module.exit_json(changed=file_changed or bool(applied), applied=applied, readonly=readonly, missing=missing,
                     kept=kept, path=p["path"])


if __name__ == "__main__":
    main()
