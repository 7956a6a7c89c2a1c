#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""Install several small text files in one module call, with diffs of the ones that changed.

Why not a loop of ansible.builtin.copy: each item costs an SSH round trip and a Python start per
node (on the 2-core machines that stage clusters, about a second each), and Slurm needs four files
on every node. The content comes from the controller (the render step's output, read with the
gpucluster_file_map filter), so the bytes on the node are the renderer's bytes. Not for secrets:
contents travel in module arguments, which verbose output shows.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_files
short_description: Install small text files (dest to content) in one call; report and diff the changed ones
options:
  files: {type: dict, required: true, description: Absolute destination path to the file's full text.}
  owner: {type: str, default: root, description: Owner of every file.}
  group: {type: str, default: root, description: Group of every file.}
  mode: {type: str, default: "0644", description: Mode of every file.}
"""

RETURN = r"""
changed_files: {type: list, returned: always, description: Files written (content, owner or mode).}
diff: {type: list, returned: when content changed, description: "Standard diffs (before/after and headers)."}
"""

import grp
import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpucluster_fileutil import write_if_changed


def install(path: str, text: str, uid: int, gid: int, mode: int, check_mode: bool) -> tuple[bool, dict | None]:
    """(changed, diff or None). The file is replaced atomically; owner and mode are fixed in place."""
    changed, before = write_if_changed(path, text.encode("utf-8"), mode, check_mode, uid, gid)
    if changed and before != text.encode("utf-8"):
        return True, {"before_header": path, "after_header": path,
                      "before": (before or b"").decode("utf-8", "replace"), "after": text}
    return changed, None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "dict", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0644"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        uid, gid = pwd.getpwnam(p["owner"]).pw_uid, grp.getgrnam(p["group"]).gr_gid
    except KeyError as exc:
        module.fail_json(msg=f"unknown owner or group {exc}; install the package that creates it first")
    changed_files, diffs = [], []
    for path, text in sorted(p["files"].items()):
        if not os.path.isabs(path):
            module.fail_json(msg=f"{path}: destinations must be absolute paths")
        if not os.path.isdir(os.path.dirname(path)):
            module.fail_json(msg=f"{os.path.dirname(path)} does not exist on this node; install the package "
                                 "that owns it first")
        changed, diff = install(path, str(text), uid, gid, int(p["mode"], 8), module.check_mode)
        if changed:
            changed_files.append(path)
        if diff:
            diffs.append(diff)
    result = {"changed": bool(changed_files), "changed_files": changed_files}
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
