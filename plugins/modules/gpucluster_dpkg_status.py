#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""Say, from dpkg's own database and without apt, whether packages are installed at the wanted versions.

The gpucluster_apt action asks this first and runs ansible.builtin.apt only when something is missing or at
another version. apt's module opens the whole package cache (every list the index holds) on each call, which
costs a node one to three CPU-seconds per task whether or not anything is installed; dpkg-query reads only
the packages named. Read-only: it never changes the node, so it runs the same in check mode.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_dpkg_status
short_description: Whether packages (NAME or NAME=VERSION, VERSION may end in *) are installed at that version
options:
  name: {type: list, elements: str, required: true, description: "Packages as apt's module takes them."}
"""

RETURN = r"""
satisfied: {type: bool, returned: always, description: Every package is installed at its wanted version.}
installed: {type: dict, returned: always, description: Package to the version dpkg has installed.}
unmet: {type: list, returned: always, description: "Each package that is not: its name and why."}
package_lists: {type: int, returned: always, description: "How many package lists apt's index holds (0: none)."}
"""

import fnmatch
import glob
import re

from ansible.module_utils.basic import AnsibleModule

# What this answers for: a package name (with an optional :arch) and an optional =VERSION pattern. Anything
# else apt's module takes (a .deb path, a relation like >=) is "unmet", so apt itself decides.
_WANT = re.compile(r"^(?P<name>[a-z0-9][a-z0-9.+-]*(?::[a-z0-9]+)?)(?:=(?P<version>[0-9A-Za-z.+~:*-]+))?$")


def wanted(specs: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """({name: version pattern or None}, unmet reasons for the specs this cannot judge)."""
    want: dict[str, str | None] = {}
    unmet = []
    for spec in specs:
        m = _WANT.match(spec.strip())
        if not m:
            unmet.append(f"{spec}: not NAME or NAME=VERSION; apt decides")
            continue
        want[m.group("name")] = m.group("version")
    return want, unmet


def judge(want: dict[str, str | None], rows: dict[str, tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
    """rows: name -> (dpkg Status, Version). ({name: installed version}, unmet reasons)."""
    installed, unmet = {}, []
    for name, pattern in sorted(want.items()):
        status, version = rows.get(name, ("", ""))
        if not status.endswith(" ok installed"):
            unmet.append(f"{name}: not installed ({status or 'unknown to dpkg'})")
            continue
        installed[name] = version
        if pattern is not None and not (fnmatch.fnmatchcase(version, pattern) if "*" in pattern
                                        else version == pattern):
            unmet.append(f"{name}: {version} installed, {pattern} wanted")
    return installed, unmet


def main() -> None:
    module = AnsibleModule(argument_spec={"name": {"type": "list", "elements": "str", "required": True}},
                           supports_check_mode=True)
    want, unmet = wanted(module.params["name"])
    rows: dict[str, tuple[str, str]] = {}
    if want:
        # One line per name dpkg knows; a name it does not know is an error line on stderr (rc 1), which
        # judge() reports as not installed.
        _rc, out, _err = module.run_command(["dpkg-query", "-W", "-f", "${binary:Package}\t${Status}\t${Version}\n",
                                            *want], environ_update={"LC_ALL": "C"})
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                pkg, status, version = parts
                rows[pkg] = (status, version)
                rows.setdefault(pkg.split(":", 1)[0], (status, version))
    installed, more = judge(want, rows)
    unmet += more
    lists = len(glob.glob("/var/lib/apt/lists/*_Packages*"))
    module.exit_json(changed=False, satisfied=not unmet, installed=installed, unmet=unmet, package_lists=lists)


if __name__ == "__main__":
    main()
