"""gpucluster_apt (plugins/action/gpucluster_apt.py) and its probe, gpucluster_dpkg_status: apt runs only where dpkg
does not already have every package at its wanted version.

The pure parts (which specs the probe judges, how a version pattern matches) are tested as functions; the whole
action runs through the real `ansible` against this machine's real dpkg and apt, in check mode (nothing is
installed or removed): a package this machine has is ok without apt, a version it cannot have goes to apt, which
refuses it as apt does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_file

ROOT = Path(__file__).resolve().parents[1]
ANSIBLE = ROOT / ".venv" / "bin" / "ansible"
_util = ROOT / "plugins" / "module_utils" / "gpucluster_fileutil.py"
sys.modules.setdefault(f"ansible.module_utils.{_util.stem}", load_file(_util, f"ansible.module_utils.{_util.stem}"))
probe = load_file(ROOT / "plugins" / "modules" / "gpucluster_dpkg_status.py", "gpucluster_dpkg_status")
action = load_file(ROOT / "plugins" / "action" / "gpucluster_apt.py", "gpucluster_apt_action")


def test_specs_the_probe_judges_and_those_it_leaves_to_apt():
    want, unmet = probe.wanted(["munge", "slurmd=22.05.8-4+deb12u3", "moosefs-master=3.0.117*", "libc6:amd64",
                                "./local.deb", "python3>=3.11"])
    assert want == {"munge": None, "slurmd": "22.05.8-4+deb12u3", "moosefs-master": "3.0.117*", "libc6:amd64": None}
    assert [u.split(":")[0] for u in unmet] == ["./local.deb", "python3>=3.11"]


@pytest.mark.parametrize(("row", "pattern", "met"), [
    (("install ok installed", "22.05.8-4"), None, True),
    (("hold ok installed", "22.05.8-4"), "22.05.8-4", True),
    (("install ok installed", "22.05.8-4"), "22.05.8-5", False),
    (("install ok installed", "3.0.117-1"), "3.0.117*", True),
    (("install ok installed", "3.0.118-1"), "3.0.117*", False),
    (("install ok installed", "22.05.8-4"), "22.05.8", False),  # no implicit prefix: apt's exact match
    (("deinstall ok config-files", "22.05.8-4"), None, False),
    (("install ok half-configured", "22.05.8-4"), None, False),
    (None, None, False),
])
def test_installed_means_dpkg_says_installed_at_the_pattern(row, pattern, met):
    installed, unmet = probe.judge({"pkg": pattern}, {"pkg": row} if row else {})
    assert (not unmet) is met, unmet
    assert ("pkg" in installed) is bool(row and row[0].endswith(" ok installed"))


@pytest.mark.parametrize(("args", "names"), [
    ({"name": ["a", "b=1"]}, ["a", "b=1"]),
    ({"name": "a, b", "state": "present", "update_cache": True, "cache_valid_time": 3600}, ["a", "b"]),
    ({"pkg": ["a"], "install_recommends": False, "allow_downgrade": True}, ["a"]),
    ({"name": ["a"], "state": "latest"}, None),
    ({"name": ["a"], "state": "absent"}, None),
    ({"name": ["a"], "purge": True}, None),
    ({"deb": "/tmp/x.deb"}, None),
    ({"update_cache": True}, None),
    ({"name": []}, None),
])
def test_only_a_present_only_task_is_probed(args, names):
    assert action.probe_names(args) == names


def _adhoc(module_args: dict, tmp_path: Path, module: str = "gpucluster_apt") -> dict:
    """One task of the real `ansible` on this machine (local connection, the system Python that has apt's bindings),
    in check mode; its result as the json callback gives it."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_HOME": str(tmp_path)}
    res = subprocess.run([str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local", "--check",
                          "-e", "ansible_python_interpreter=/usr/bin/python3", "-m", module,
                          "-a", json.dumps(module_args)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    # the json callback's document, after any line another enabled callback printed first
    out, _end = json.JSONDecoder().raw_decode(res.stdout[res.stdout.find("{"):])
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


needs = pytest.mark.skipif(not ANSIBLE.exists() or not Path("/usr/bin/dpkg-query").exists()
                           or subprocess.run(["/usr/bin/python3", "-c", "import apt"], capture_output=True,
                                             check=False).returncode != 0,
                           reason="needs .venv's ansible (scripts/setup.sh), dpkg and the system python3-apt")


@needs
def test_packages_already_installed_are_ok_without_apt(tmp_path):
    have = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "dpkg"], capture_output=True, text=True,
                          check=True).stdout
    r = _adhoc({"name": ["dpkg", "coreutils", f"dpkg={have}"], "state": "present", "update_cache": True}, tmp_path)
    assert not r.get("failed") and r.get("changed") is False, r
    assert "apt not run" in r["msg"] and r["installed"]["dpkg"] == have, r


@needs
def test_a_version_dpkg_does_not_have_goes_to_apt(tmp_path):
    r = _adhoc({"name": ["dpkg", "dpkg=0.0.0-gpucluster-test"], "state": "present"}, tmp_path)
    # apt's own answer: it looked for that version and has none (the probe alone would say "unmet", not this)
    assert r.get("failed") is True, r
    assert "apt not run" not in r.get("msg", "") and "0.0.0-gpucluster-test" in r.get("msg", ""), r


@pytest.mark.parametrize(("probe_result", "forced"), [
    ({"satisfied": False, "package_lists": 0}, True),   # an emptied index: its date would look fresh to apt
    ({"satisfied": False, "package_lists": 12}, False),
    ({"failed": True, "package_lists": 0}, False),      # a failed probe changes nothing of the task's arguments
    ({"satisfied": False}, False),
])
def test_an_empty_index_is_refreshed_before_apt_installs(probe_result, forced):
    args = {"name": ["python3-pymysql"], "update_cache": True, "cache_valid_time": 3600}
    got = action.with_index(args, probe_result)
    assert (got == {**args, "cache_valid_time": 0}) is forced, got
    assert args["cache_valid_time"] == 3600  # the task's own arguments are not changed in place


@needs
def test_the_probe_counts_the_package_lists(tmp_path):
    """This machine's apt index has lists (setup installed packages from it); the probe reports them."""
    import glob

    r = _adhoc({"name": ["dpkg", "no-such-package-gpucluster-test"]}, tmp_path, module="gpucluster_dpkg_status")
    assert r["package_lists"] == len(glob.glob("/var/lib/apt/lists/*_Packages*")) > 0, r
    assert r["satisfied"] is False and "dpkg" in r["installed"], r
    assert [u.split(":")[0] for u in r["unmet"]] == ["no-such-package-gpucluster-test"], r
