#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""A rendered config file with its secret filled in, written 0600 on the Ansible controller.

Why a module: the renderer never sees a secret (`gpucluster render` writes slurmdbd.conf with an empty
StoragePass=), and a secret must never pass through Ansible variables, task results or logs. This module
reads the rendered file and the secret file itself, and returns only whether the result changed.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_secret_conf
short_description: Fill KEY= lines of a rendered config from secret files, into a 0600 file
options:
  src: {type: path, required: true, description: "The rendered file (e.g. compiled/rendered/slurmdbd.conf)."}
  dest: {type: path, required: true, description: The filled file (0600), in the cluster's secrets folder.}
  fill:
    type: dict
    required: true
    description: KEY to secret file; the file's text (trailing newline removed) becomes the value of the KEY= line.
"""

RETURN = r"""
changed_files: {type: list, returned: always, description: The filled file when it was (or would be) written.}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpucluster_fileutil import write_if_changed


def fill(text: str, secrets: dict[str, str]) -> str:
    """The text with each `KEY=` line's value set; every key must have exactly one such line."""
    lines = text.splitlines(keepends=True)
    for key, value in secrets.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"the secret for {key} spans lines; it must be one line")
        hits = [i for i, line in enumerate(lines) if line.split("=", 1)[0] == key and "=" in line]
        if len(hits) != 1:
            raise ValueError(f"the rendered file has {len(hits)} {key}= lines, not one; render it again")
        lines[hits[0]] = f"{key}={value}\n"
    return "".join(lines)


def main() -> None:
    module = AnsibleModule(argument_spec={"src": {"type": "path", "required": True},
                                          "dest": {"type": "path", "required": True},
                                          "fill": {"type": "dict", "required": True, "no_log": False}},
                           supports_check_mode=True)
    p = module.params
    try:
        with open(p["src"], encoding="utf-8") as fh:
            text = fh.read()
        secrets = {}
        for key, path in p["fill"].items():
            with open(path, encoding="utf-8") as fh:
                secrets[key] = fh.read().rstrip("\n")
        changed, _before = write_if_changed(p["dest"], fill(text, secrets).encode("utf-8"), 0o600, module.check_mode,
                                            prefix=".secret-")
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"{p['dest']}: {exc}")  # names files and keys, never a value
    module.exit_json(changed=changed, changed_files=[p["dest"]] if changed else [])


if __name__ == "__main__":
    main()
