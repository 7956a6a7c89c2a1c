"""ansible.builtin.apt that asks dpkg first: `gpucluster_apt:` takes apt's arguments, and where they only ask for
packages to be present (state present, the default) it runs gpucluster_dpkg_status on the node; when every package
is installed at its wanted version the task is ok without apt. Otherwise, or when the probe itself fails, apt runs
with exactly the arguments the task gave, so installs, pins, downgrades, check mode and diffs are apt's own.

A node whose index holds no package list at all (an image or a cloud node shipped with /var/lib/apt/lists
emptied) gets it refreshed before apt installs, whatever the task's cache_valid_time: that folder's date is the
image's build date, which cache_valid_time would trust, and every package outside the image would be "not
available". A node that has every package never fetches an index it does not need.

Why: apt's module loads the node's whole package cache on every call, one to three CPU-seconds a task whether or
not anything is installed (eight such tasks on a GPU node were half a no-op converge's node CPU). Skipping apt when
nothing is to be installed also skips its update_cache/cache_valid_time refresh, which only serves an install.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

APT = "ansible.builtin.apt"
PROBE = "gpucluster_dpkg_status"
# apt arguments under which "every package installed at its version" means apt would change nothing. Any other
# (state latest/absent, upgrade, autoremove, a deb file, purge ...) goes straight to apt.
PRESENT_ONLY = frozenset({"name", "pkg", "package", "state", "update_cache", "cache_valid_time", "install_recommends",
                          "allow_downgrade", "allow_change_held_packages", "default_release", "dpkg_options",
                          "lock_timeout", "policy_rc_d", "force_apt_get"})


def probe_names(args: dict) -> list[str] | None:
    """The package list the probe can judge, or None when apt must decide (other state or arguments, no names)."""
    if set(args) - PRESENT_ONLY or args.get("state", "present") != "present":
        return None
    names = args.get("name", args.get("pkg", args.get("package")))
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        return None
    return names


def with_index(args: dict, probe: dict) -> dict:
    """apt's arguments, with a refresh of the index forced where the probe found no package list at all."""
    if probe.get("failed") or probe.get("package_lists") != 0:
        return args
    return {**args, "update_cache": True, "cache_valid_time": 0}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        names = probe_names(args)
        if names is not None:
            probe = self._execute_module(module_name=PROBE, module_args={"name": names}, task_vars=task_vars)
            if not probe.get("failed") and probe.get("satisfied") is True:
                result.update(changed=False, installed=probe.get("installed", {}),
                              msg=f"{len(names)} package(s) installed at the wanted versions (dpkg); apt not run")
                return result
            args = with_index(args, probe)
        result.update(self._execute_module(module_name=APT, module_args=args, task_vars=task_vars))
        return result
