#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""Render gpucluster's files on the Ansible controller, writing only what changed.

Why a module and not `ansible.builtin.template`: the Slurm and NCCL files must come from the one
renderer the CLI uses (`gpucluster.render`, templates/ only, its own Jinja environment), so the
files on the nodes are byte-identical to `gpucluster render`. Roles copy from the output folder.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_render
short_description: Render a cluster spec's configs (or one template) with gpucluster's renderer
description:
  - Spec mode (I(spec) given) loads the spec, plans the cluster and writes every file of
    C(gpucluster render --no-cabling) into the folder I(dest).
  - Template mode (I(template) given) renders one file of templates/ with I(context) plus the
    contents of I(secret_files) into the file I(dest) (for slurmdbd.conf, which holds a password).
  - A file is rewritten only when its content differs, so C(changed) is honest.
  - Runs on the Ansible controller (C(localhost)); needs the gpucluster package importable.
options:
  spec: {type: path, description: Cluster spec (spec mode).}
  template: {type: str, description: "Template name under templates/, e.g. slurm/slurmdbd.conf.j2."}
  dest: {type: path, required: true, description: Output folder (spec mode) or file (template mode).}
  context: {type: dict, default: {}, description: Template variables (template mode).}
  secret_files:
    type: dict
    default: {}
    description: Variable name to file path; each file's text (trailing newline removed) is added to the context.
  mode: {type: str, default: "0644", description: Mode of written files (template mode defaults callers to 0600).}
  import_path:
    type: path
    description: Folder added to sys.path when gpucluster is not importable (the checkout's src/).
"""

RETURN = r"""
changed_files: {type: list, returned: always, description: Names of files that were (or would be) written.}
files: {type: dict, returned: always, description: File name to sha256 of its content (spec mode only).}
slurm_switches:
  type: list
  returned: spec mode
  description: The plan's topology.conf switches (name, level, nodes, switches), for checks.
"""

import hashlib
import os
import sys
import tempfile
import traceback

from ansible.module_utils.basic import AnsibleModule


def _import_gpucluster(import_path):
    try:
        import gpucluster
    except ImportError:
        if import_path and os.path.isdir(os.path.join(import_path, "gpucluster")):
            sys.path.insert(0, import_path)
        else:
            raise
    import gpucluster.render

    return gpucluster


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_if_changed(path: str, text: str, mode: int, check_mode: bool) -> bool:
    """Atomically replace path with text when its bytes differ; fix the mode either way."""
    data = text.encode("utf-8")
    try:
        with open(path, "rb") as fh:
            same = fh.read() == data
    except FileNotFoundError:
        same = False
    if same:
        if not check_mode and (os.stat(path).st_mode & 0o7777) != mode:
            os.chmod(path, mode)
            return True
        return False
    if check_mode:
        return True
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".gpucluster-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def render_spec(spec_path: str, cabling: bool = False) -> tuple[dict, list]:
    """{name: text} exactly as `gpucluster render --no-cabling` writes them, and the plan's switches."""
    from gpucluster.cluster import load_cluster
    from gpucluster.render import render_all
    from gpucluster.render.topology import slurm_switches

    cluster = load_cluster(spec_path)
    files = {}
    for name, value in render_all(cluster, cabling=cabling).items():
        files[name] = value if isinstance(value, str) else "".join(value())
    switches = [{"name": s.name, "level": s.level, "nodes": list(s.nodes), "switches": list(s.switches)}
                for s in slurm_switches(cluster.plan)]
    return files, switches


def render_template(name: str, context: dict, secret_files: dict) -> str:
    from gpucluster.render import environment

    ctx = dict(context)
    for key, path in secret_files.items():
        with open(path, encoding="utf-8") as fh:
            ctx[key] = fh.read().rstrip("\n")
    return environment().get_template(name).render(ctx)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "spec": {"type": "path"},
            "template": {"type": "str"},
            "dest": {"type": "path", "required": True},
            "context": {"type": "dict", "default": {}},
            "secret_files": {"type": "dict", "default": {}, "no_log": False},
            "mode": {"type": "str", "default": "0644"},
            "import_path": {"type": "path"},
        },
        mutually_exclusive=[("spec", "template")],
        required_one_of=[("spec", "template")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        _import_gpucluster(p["import_path"])
    except ImportError as exc:
        module.fail_json(msg=f"gpucluster is not importable by {sys.executable} ({exc}); run Ansible from the "
                             "virtualenv where gpucluster is installed (.venv/bin/ansible-playbook), or pass "
                             "import_path pointing at the checkout's src/")
    mode = int(p["mode"], 8)
    try:
        if p["spec"]:
            texts, switches = render_spec(p["spec"])
            if not module.check_mode:
                os.makedirs(p["dest"], exist_ok=True)
            changed_files = [name for name, text in texts.items()
                             if write_if_changed(os.path.join(p["dest"], name), text, mode, module.check_mode)]
            module.exit_json(changed=bool(changed_files), changed_files=changed_files, dest=p["dest"],
                             files={n: sha256(t) for n, t in texts.items()}, slurm_switches=switches)
        text = render_template(p["template"], p["context"], p["secret_files"])
        changed = write_if_changed(p["dest"], text, mode, module.check_mode)
        # No checksum of a file that may hold a password.
        name = os.path.basename(p["dest"])
        module.exit_json(changed=changed, changed_files=[name] if changed else [], dest=p["dest"], files={})
    except Exception as exc:  # a spec error carries located findings: show them, not a traceback
        findings = getattr(exc, "findings", None)
        if findings:
            module.fail_json(msg="the cluster spec has problems:\n" + "\n".join(f.render() for f in findings))
        module.fail_json(msg=f"rendering failed: {exc}", exception=traceback.format_exc())


if __name__ == "__main__":
    main()
