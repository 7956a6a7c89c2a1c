#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""Compile the cluster once on the Ansible controller: every rendered file and the facts the roles read.

Why a module: the roles must install exactly what `gpucluster render` writes and read facts from the
one compiled load (gpucluster.compiled), never parse the spec again themselves. The compiled state is
kept in the cluster's private state folder and reused while the spec, the templates and the code are
unchanged, so a configure after a demo or an inventory run parses nothing.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_compile
short_description: Compile a gpucluster spec into the cluster's state folder (rendered files + facts)
description:
  - Runs gpucluster.compiled.ensure_compiled on the controller (C(localhost)); needs the gpucluster
    package importable (the project's venv).
  - Recompiles only when the spec, the templates or gpucluster changed; C(changed) says whether it did.
  - The compiled folder is the controller's cache of the spec, not a change to any node, so the task runs
    in check mode too (C(check_mode: false) in the play).
options:
  spec: {type: path, required: true, description: The cluster spec.}
  state_dir: {type: path, required: true, description: "The cluster's private state folder (0700, owned by the user)."}
"""

RETURN = r"""
compiled: {type: str, returned: always, description: The compiled folder (state_dir/compiled).}
rendered: {type: str, returned: always, description: Its rendered/ folder (what `gpucluster render` writes).}
files: {type: dict, returned: always, description: Rendered file name to sha256.}
"""

import json
import os
import traceback

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(argument_spec={"spec": {"type": "path", "required": True},
                                          "state_dir": {"type": "path", "required": True}},
                           supports_check_mode=True)
    try:
        from gpucluster.compiled import ensure_compiled
        from gpucluster.errors import SpecError, UsageError
    except ImportError as exc:
        module.fail_json(msg=f"gpucluster is not importable by this Python ({exc}): run Ansible from the virtualenv "
                             "where gpucluster is installed (gpucluster configure does; or .venv/bin/ansible-playbook)")
    try:
        compiled, changed = ensure_compiled(module.params["spec"], module.params["state_dir"])
        with open(os.path.join(compiled, "facts.json")) as fh:
            files = json.load(fh)["rendered"]
    except SpecError as exc:
        module.fail_json(msg="the cluster spec has problems:\n" + "\n".join(f.render() for f in exc.findings))
    except UsageError as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:  # a bug, not the user's input: keep the traceback for the report
        module.fail_json(msg=f"compiling failed: {exc}", exception=traceback.format_exc())
    module.exit_json(changed=changed, compiled=str(compiled), rendered=os.path.join(compiled, "rendered"),
                     files=files)


if __name__ == "__main__":
    main()
