"""gpucluster_manifest: an Ansible callback that lists what a node's pull run manages (docs/roles.md,
"Converging a fleet"): every path a file task reported (dest or path) and every service a task keeps running.

gpucluster-pull enables it for its local run and, after a successful full run, hashes those paths into the
node's manifest; the next no-op pull of the same bundle verifies the manifest instead of running the roles.
Why from the run itself: the list is what the roles did on this node this time (their `when:`, loops and
templated paths resolved), never a second list kept by hand that drifts from the roles.

Writes JSON {"files": {path: task}, "services": {name: task}} to $GPUCLUSTER_MANIFEST_OUT at the end of the run.
"""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

# Modules whose result names a file, folder or link they manage (their `dest` or `path`).
FILE_MODULES = frozenset({"copy", "template", "file", "lineinfile", "blockinfile", "replace", "ini_file",
                          "assemble", "get_url", "gpucluster_sysctl"})
# The project's modules that manage several files: module_args `files` (dest: text), `limits_file`, and the
# `changed_files` they report (gpucluster_limits' drop-ins are seen only in a run that changes them).
MULTI_FILE_MODULES = frozenset({"gpucluster_files", "gpucluster_limits"})
# Modules that keep a service in a state; those asked for started/restarted/reloaded must stay active.
SERVICE_MODULES = frozenset({"service", "systemd", "systemd_service"})
RUNNING = frozenset({"started", "restarted", "reloaded"})


def _items(result: dict) -> list[dict]:
    """A loop's per-item results, or the one result."""
    items = result.get("results")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else [result]


def _arg(item: dict, task_args: dict, *names: str):
    """The first of `names` in the module's result, its invocation's module_args, or the task's own args."""
    module_args = (item.get("invocation") or {}).get("module_args") or {}
    for source in (item, module_args, task_args):
        for name in names:
            value = source.get(name)
            if isinstance(value, str) and value and "{{" not in value:
                return value
    return None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpucluster_manifest"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.files: dict[str, str] = {}
        self.services: dict[str, str] = {}

    def _record(self, result) -> None:
        task = result._task
        action = str(task.action).rsplit(".", 1)[-1]
        if action not in FILE_MODULES | MULTI_FILE_MODULES | SERVICE_MODULES:
            return
        label = task.get_name()
        for item in _items(result._result):
            if item.get("skipped") or item.get("failed"):
                continue
            if action in FILE_MODULES:
                self._file(_arg(item, task.args, "dest", "path", "name"), label)
            elif action in MULTI_FILE_MODULES:
                module_args = (item.get("invocation") or {}).get("module_args") or {}
                files = module_args.get("files")
                for path in [*(files if isinstance(files, dict) else ()), module_args.get("limits_file"),
                             *(item.get("changed_files") or ())]:
                    self._file(path, label)
            else:
                name, state = _arg(item, task.args, "name", "unit"), _arg(item, task.args, "state")
                if name and state in RUNNING:
                    self.services[name] = label

    def _file(self, path, label: str) -> None:
        if isinstance(path, str) and os.path.isabs(path):
            self.files[os.path.normpath(path)] = label

    def v2_runner_on_ok(self, result) -> None:
        self._record(result)

    def v2_playbook_on_stats(self, stats) -> None:
        out = os.environ.get("GPUCLUSTER_MANIFEST_OUT")
        if not out:
            return
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"files": self.files, "services": self.services}, fh, sort_keys=True)
