"""Shared helpers for the spec, plan, render, CLI and fuzz tests.

Expected values in these tests come from the spec and the plan (or from arithmetic written out in
the test), never from copying a rendered file; the golden files are the one deliberate exception,
and they are regenerated with GPUCLUSTER_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest
import yaml

from gpucluster.cluster import Cluster, cluster_of, load_cluster
from gpucluster.errors import Finding, SpecError
from gpucluster.fabric import Plan
from gpucluster.spec.loader import parse_yaml, validate_data
from gpucluster.spec.model import ClusterSpec, LoadedSpec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = ROOT / "examples"
EXAMPLES = sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml"))
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
BROKEN_DIR = Path(__file__).resolve().parent / "broken"


def load_file(path: Path, name: str):
    """A Python file that is not a package module (an Ansible plugin, a node-side check) imported under `name`
    (registered in sys.modules, so dataclasses and pickling inside it work)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def example_path(name: str) -> Path:
    return EXAMPLES_DIR / f"{name}.yaml"


def example_text(name: str) -> str:
    return example_path(name).read_text()


@cache
def cluster_example(name: str) -> Cluster:
    """The compiled cluster of an example (gpucluster.cluster), cached for the session."""
    return load_cluster(example_path(name))


def loaded_example(name: str) -> tuple[LoadedSpec, Plan]:
    """(loaded spec, plan) of an example, cached for the session: the big ones take a while."""
    cluster = cluster_example(name)
    return cluster.loaded, cluster.plan


def compiled(spec: ClusterSpec, source: str = "<generated>") -> Cluster:
    """The compiled cluster of an in-memory spec (meaning checks and plan, as load_cluster runs them)."""
    return cluster_of(LoadedSpec(spec=spec, source=Path(source), lines={}))


@cache
def _example_data(name: str) -> dict:
    data, _lines, findings = parse_yaml(example_text(name), name)
    assert not findings, findings
    return data


def example_data(name: str) -> dict:
    """The example as plain data (a fresh deep copy: tests mutate it)."""
    return copy.deepcopy(_example_data(name))


def dump_spec(data: dict) -> str:
    """YAML text of spec data. PyYAML quotes '1:1' (it would otherwise read as base 60)."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


def spec_from_data(data: dict, name: str = "<generated>") -> ClusterSpec:
    """Syntax layer only, no YAML round trip: for generated specs in property tests."""
    return validate_data(data, {}, Path(name)).spec


def generic_spec(nodes: int | list[int], *, radix=64, rails=1, design="fat-tree", tiers="auto", leaf_ratio="1:1",
                 spine_ratio=None, unit=None, rail_groups=1, pod=None, speed=400, radices=None) -> dict:
    """Spec data for one or more compute groups on switches of a given radix (a user catalog entry)."""
    counts = nodes if isinstance(nodes, list) else [nodes]
    k1, k2, k3 = radices or (radix, radix, radix)
    groups = [{"name": "ctl", "role": "controller", "count": 1, "hostname": "ctl#",
               "cpu": {"sockets": 1, "cores_per_socket": 8}, "memory_gb": 16}]
    for i, n in enumerate(counts):
        groups.append({"name": f"g{i}", "role": "compute", "count": n, "hostname": f"g{i}n#####",
                       "cpu": {"sockets": 2, "cores_per_socket": 48}, "memory_gb": 1024,
                       "gpu": "h100-sxm5-80g", "gpus_per_node": 8, "nic": "gen-nic", "nics_per_node": rails})
    fabric: dict = {"type": "infiniband", "design": design, "tiers": tiers,
                    "switches": {"leaf": "gen-leaf", "spine": "gen-spine", "core": "gen-core"},
                    "oversubscription": {"leaf": leaf_ratio}}
    if spine_ratio:
        fabric["oversubscription"]["spine"] = spine_ratio
    if design == "rail-optimized":
        fabric["scalable_unit_nodes"] = unit or k1 // 2
        fabric["rail_groups"] = rail_groups
    elif unit:
        fabric["nodes_per_leaf"] = unit
    if pod:
        fabric["nodes_per_pod"] = pod
    sw = {"fabrics": ["infiniband", "roce"]}
    return {
        "name": "gen",
        "slurm": {"partitions": [{"name": "all", "groups": [f"g{i}" for i in range(len(counts))]}]},
        "node_groups": groups,
        "fabric": fabric,
        "catalog": {
            "nics": {"gen-nic": {"name": "generic", "speed_gbps": speed, "fabrics": ["infiniband", "roce"]}},
            "switches": {"gen-leaf": {"name": "leaf", "ports": {speed: k1}, **sw},
                         "gen-spine": {"name": "spine", "ports": {speed: k2}, **sw},
                         "gen-core": {"name": "core", "ports": {speed: k3}, **sw}},
        },
    }


def findings_of(path: Path) -> list[Finding]:
    """Every finding load_cluster raises for a file; [] when it loads."""
    try:
        load_cluster(path)
    except SpecError as exc:
        return exc.findings
    return []


def mutate(text: str, old: str, new: str) -> tuple[str, int]:
    """Replace the one occurrence of `old` in text; returns the text and the 1-based line `new`
    starts on, i.e. where a finding about it must point."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    at = text.index(old)
    return text.replace(old, new), text.count("\n", 0, at) + 1


def line_of(text: str, needle: str) -> int:
    """1-based line of the only line that starts with needle."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if line.startswith(needle)]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


@pytest.fixture
def write_spec(tmp_path):
    """write_spec(text, name='spec.yaml') -> Path of a spec file in the test's tmp dir."""

    def write(text: str | bytes, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        return p

    return write


def health_slurm_conf(name: str, nodes: str, *extra: str) -> str:
    """slurm.conf of a small emulated cluster for the health tests: `nodes` (a hostlist) of 2 CPUs and 500 MB in
    one partition, with `extra` lines (Licenses=, PrivateData=) before the nodes."""
    head = [f"ClusterName={name}", "SlurmctldHost=ctl01", "AuthType=auth/munge", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]
    return "\n".join([*head, *extra, f"NodeName={nodes} CPUs=2 RealMemory=500 State=UNKNOWN",
                      f"PartitionName=batch Nodes={nodes} Default=YES MaxTime=INFINITE State=UP"]) + "\n"


def root_scontrol_env(cluster, folder: Path) -> dict[str, str]:
    """The emulated cluster's environment with a plain `scontrol` first on PATH, as the health runner calls it: a
    wrapper in `folder` that runs the line's own (inside its Debian root for 24.11 and 26.05)."""
    folder.mkdir()
    wrapper = folder / "scontrol"
    argv = " ".join(f"'{a}'" for a in cluster.runtime.argv(["scontrol"]))
    wrapper.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
    wrapper.chmod(0o755)
    return {**cluster.env, "PATH": f"{folder}:{cluster.env.get('PATH', '/usr/bin:/bin')}"}


def wait_for(what: str, probe, timeout: float = 30.0, every: float = 0.5):
    """`probe()` until it returns something true (returned), polled every `every` s; an AssertionError naming
    `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def slurmctld_available() -> bool:
    return all(shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("slurmctld", "munged", "scontrol"))


def skip_or_fail(reason: str) -> None:
    """A test that needs a tool: skip with the reason outside CI, fail inside it (CI runs everything)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is not skipped)")
    pytest.skip(reason)


def validate_checks(file: str, name: str):
    """A module of validate's checks (src/gpucluster/validate/checks/FILE), loaded once as `name` with the
    gpc_checklib it imports, as the suite's own pytest run imports them (no package)."""
    import importlib.util
    import warnings

    from gpucluster.validate.suite import CHECKS_DIR

    for mod_name, mod_file in (("gpc_checklib", "gpc_checklib.py"), (name, file)):
        if mod_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(mod_name, CHECKS_DIR / mod_file)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = mod
            with warnings.catch_warnings():  # the checks' own `per` mark is registered by their conftest
                warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
                spec.loader.exec_module(mod)
    return sys.modules[name]


def ansible_lint(targets: list[str], *, offline: bool = False) -> subprocess.CompletedProcess | None:
    """ansible-lint's production profile on `targets` (paths under the project root), or None where the test
    command's ansible-lint phase already linted the whole of roles/ and playbooks/ and passed (scripts/test.sh sets
    GPUCLUSTER_ANSIBLE_LINT_PASSED then): the caller skips, saying so. A missing ansible-lint is skip_or_fail."""
    if os.environ.get("GPUCLUSTER_ANSIBLE_LINT_PASSED") == "roles/ playbooks/" and all(
            t.startswith(("roles/", "playbooks/")) for t in targets):
        return None
    exe = Path(sys.executable).parent / "ansible-lint"
    if not exe.exists():
        skip_or_fail("not run: ansible-lint is not installed (pip install -e '.[dev]')")
    return subprocess.run([str(exe), "--profile", "production", *(["--offline"] if offline else []), "--nocolor",
                           *targets], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=1800, check=False)


LINTED_BY_THE_PHASE = ("ran in the test command's ansible-lint phase: the production profile over the whole of roles/ "
                       "and playbooks/, which passed")


def need_slurm_line(line: str) -> None:
    """A real slurmctld of `line` can run here, or skip_or_fail says why: 22.05 from the host's packages, the
    other lines from their Debian roots (gpucluster.emulate.roots), which chroot needs root for."""
    from gpucluster.emulate.roots import RootError, runtime

    if line == "22.05":
        if not slurmctld_available():
            skip_or_fail("not run: slurmctld/slurmd/munged not installed (apt-get install slurmctld slurmd munge)")
        return
    if os.geteuid() != 0:
        skip_or_fail(f"not run: Slurm {line} runs from a Debian root through chroot, which needs root")
    try:
        runtime(line)
    except RootError as exc:
        skip_or_fail(f"not run: Slurm {line}: {exc}")


# ---- `from conftest import ...` ----------------------------------------------------------------
# Test modules in tests/ import these helpers as `conftest`. Without packages, pytest imports every
# conftest.py as the module `conftest`, so tests/staged/conftest.py (collected before test_*.py, as
# 'staged' sorts first) would replace this one in sys.modules and break those imports in a full run.
# Before each module directly in tests/ is imported, this module is put back.
_HELPERS = sys.modules[__name__]
_HERE = Path(__file__).resolve().parent


def pytest_collectstart(collector):
    path = getattr(collector, "path", None)
    if isinstance(collector, pytest.Module) and path is not None and Path(path).resolve().parent == _HERE:
        sys.modules["conftest"] = _HELPERS


# ---- slow tests --------------------------------------------------------------------------------
SLOW_ENV = "GPUCLUSTER_SLOW"


def _register_slow(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"slow: over ~60 s on 2 cores; runs in CI, with {SLOW_ENV}=1 or -m slow")


def daemon_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that starts real Slurm daemons (marked `slurm` or `emulate`): its module plus
    the values of its module-scoped parameters, i.e. one group per cluster a module-scoped fixture starts.
    Under `--dist loadgroup` (scripts/test.sh) each such cluster starts on one worker only, while the
    clusters of one module (e.g. one per Slurm release) still run on different workers side by side; plain
    `--dist load` would start a module's cluster again on every worker that got one of its tests. Staged
    tests are grouped by tests/staged/conftest.py; every other test is its own group (spread freely)."""
    starts_daemons = item.get_closest_marker("slurm") or item.get_closest_marker("emulate")
    if item.get_closest_marker("staged") or not starts_daemons:
        return None
    module = item.nodeid.split("::", 1)[0]
    callspec = getattr(item, "callspec", None)
    scopes = getattr(callspec, "_arg2scope", {})  # pytest's own record of each parameter's fixture scope
    shared = [f"{name}{callspec.indices[name]}" for name in sorted(getattr(callspec, "params", {}))
              if getattr(scopes.get(name), "value", "function") in ("module", "package", "session")]
    return module + (f"[{','.join(shared)}]" if shared else "")


def pytest_collection_modifyitems(config, items):
    """Tests that start Slurm daemons get their cluster's xdist group (daemon_group). Slow tests stay out of
    a developer's default run (a time budget, not a missing tool): they run with GPUCLUSTER_SLOW=1, when -m
    names them, and always in CI (CI runs everything it can)."""
    for item in items:
        group = daemon_group(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("CI") or os.environ.get(SLOW_ENV) == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason=f"slow (over ~60 s on 2 cores): run with {SLOW_ENV}=1 or -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# ---- xdist groups (scripts/test.sh runs both pytest phases with `--dist loadgroup`) ---------------------
# Tests carry the standard `xdist_group` mark (daemon_group above, tests/staged/conftest.py). xdist's own
# loadgroup tells the controller a test's group by appending "@group" to its node id, which pytest 9.2's
# structured node ids ignore (pytest-xdist#1386): the groups would be silently spread over every worker
# (src/gpucluster/validate/checks/conftest.py met the same). So each worker writes the groups it collected
# to a file in a folder the controller made, and the controller's scheduler reads them back.
_GROUPS_KEY = "gpucluster_xdist_groups"
_groups_dir = pytest.StashKey[Path]()  # the controller's folder of the workers' group files


def _loadgroup(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("xdist") and config.getvalue("dist") == "loadgroup"


def pytest_configure(config):
    _register_slow(config)
    if _loadgroup(config) and not hasattr(config, "workerinput"):  # the controller
        import tempfile

        config.stash[_groups_dir] = Path(tempfile.mkdtemp(prefix="pytest-xdist-groups-"))


def pytest_unconfigure(config):
    folder = config.stash.get(_groups_dir, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Controller: tell each worker where to write the groups it collected."""
    folder = node.config.stash.get(_groups_dir, None)
    if folder is not None:
        node.workerinput[_GROUPS_KEY] = str(folder)


def _group_of(item: pytest.Item) -> str | None:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """Worker: write {node id: group} before xdist reports the collection (its hook runs after this one)."""
    import json

    folder = getattr(session.config, "workerinput", {}).get(_GROUPS_KEY)
    if folder is None:
        return
    groups = {item.nodeid: g for item in session.items if (g := _group_of(item))}
    target = Path(folder) / f"{session.config.workerinput['workerid']}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(target)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Controller: loadgroup scheduling by the groups the workers wrote; a test without a group is its own
    unit (spread freely), as in xdist's loadgroup. Groups are handed out largest first."""
    folder = config.stash.get(_groups_dir, None)
    if folder is None:
        return None
    import json

    from xdist.scheduler import LoadGroupScheduling

    class FileGroups(LoadGroupScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first called in schedule(), after every worker's collection came in
                self._groups = {}
                for f in sorted(folder.glob("*.json")):
                    self._groups.update(json.loads(f.read_text()))
            return self._groups.get(nodeid) or super()._split_scope(nodeid)

    return FileGroups(config, log)
