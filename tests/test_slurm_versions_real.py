"""The version table against the real slurmctld of every line gpucluster claims (22.05 host, 24.11
trixie root, 26.05 sid root).

For each line, every slurm.parameters entry the table says that release supports is rendered through
gpucluster into one config (flags of one key joined), and that line's slurmctld must load it with no
config error in its log (strict harness: unknown keys are fatal to slurmctld; "is defunct", "Invalid
DebugFlag", "Invalid ReconfigFlag" and the like are config errors). For each entry the table says a line
does NOT support, the key is appended to that line's rendered slurm.conf behind gpucluster's back (the
spec would refuse it) and slurmctld must refuse it, unless the table marks the entry `silent` (Slurm
ignores unknown flags of some lists, e.g. SchedulerParameters, without a word).

So a table entry that names the wrong release for any of the three lines fails here.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import compiled, example_data, skip_or_fail, slurmctld_available, spec_from_data

from gpucluster.cluster import check_meaning
from gpucluster.emulate.roots import LINES, RootError, runtime
from gpucluster.render import render_all, write_outputs
from gpucluster.spec.model import LoadedSpec
from gpucluster.spec.slurm_versions import FEATURES, PARAMETERS, Change

pytestmark = pytest.mark.slurm


def need(line: str) -> None:
    if line == "22.05":
        if not slurmctld_available():
            skip_or_fail("slurmctld/munged/scontrol not installed (apt-get install slurmctld slurm-client munge)")
    elif os.geteuid() != 0:
        skip_or_fail(f"Slurm {line} runs from a Debian root through chroot, which needs root")
    try:
        runtime(line)  # builds the line's Debian root once (cached), or says why it cannot
    except RootError as exc:
        skip_or_fail(f"Slurm {line}: {exc}")


def is_flag(c: Change) -> bool:
    return c.value is not None and "/" not in c.value


def merged(changes: list[Change]) -> dict[str, str]:
    """slurm.parameters holding every entry: the flags of one key joined with commas."""
    out: dict[str, list[str]] = {}
    for c in changes:
        out.setdefault(c.key, [])
        if c.test_value not in out[c.key]:
            out[c.key].append(c.test_value)
    return {k: ",".join(v) for k, v in out.items()}


def base_data(line: str, parameters: dict[str, str] | None = None) -> dict:
    """Staging's cluster in the production profile (task/cgroup, PrologFlags=Contain: some keys need them)."""
    data = example_data("staging")
    data["slurm"].update(version=line, profile="production", parameters=parameters or {})
    return data


@dataclass
class Loaded:
    ok: bool
    message: str


def start(conf_dir: Path, line: str) -> Loaded:
    from gpucluster.emulate import SlurmCluster, SlurmStartError

    try:
        with SlurmCluster(conf_dir, line=line, start_timeout=120):
            return Loaded(True, "")
    except SlurmStartError as exc:
        return Loaded(False, str(exc))


_ACCEPTED: dict[str, Loaded] = {}


def accepted_run(line: str, tmp_path_factory) -> Loaded:
    """One slurmctld per line with every entry the table says that line supports."""
    if line not in _ACCEPTED:
        need(line)
        params = merged([c for c in PARAMETERS if c.supported(line)])
        loaded = LoadedSpec(spec=spec_from_data(base_data(line, params)), source="spec.yaml", lines={})
        errors = [f.render() for f in check_meaning(loaded) if f.level == "error"]
        assert not errors, errors
        out = tmp_path_factory.mktemp(f"accepted-{line}")
        write_outputs(render_all(compiled(loaded.spec), cabling=False), out)
        _ACCEPTED[line] = start(out, line)
    return _ACCEPTED[line]


SUPPORTED = [(c, line) for line in LINES for c in PARAMETERS if c.supported(line)]
REFUSED = [(c, line) for line in LINES for c in PARAMETERS if not c.supported(line) and not c.silent]


@pytest.mark.parametrize(("change", "line"), SUPPORTED, ids=[f"{c.setting}@{line}" for c, line in SUPPORTED])
def test_the_line_loads_what_the_table_says_it_supports(change, line, tmp_path_factory):
    result = accepted_run(line, tmp_path_factory)
    assert result.ok, f"slurmctld {line} refused the keys the table says it takes:\n{result.message}"


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """Each line's render of the base spec, without parameters."""
    dirs = {}
    for line in LINES:
        out = tmp_path_factory.mktemp(f"bare-{line}")
        write_outputs(render_all(compiled(spec_from_data(base_data(line))), cabling=False), out)
        dirs[line] = out
    return dirs


@pytest.mark.parametrize(("change", "line"), REFUSED, ids=[f"{c.setting}@{line}" for c, line in REFUSED])
def test_the_line_refuses_what_the_table_says_it_lacks(change, line, bare, tmp_path):
    need(line)
    conf = tmp_path / "conf"
    shutil.copytree(bare[line], conf)
    with (conf / "slurm.conf").open("a") as fh:
        fh.write(f"{change.key}={change.test_value}\n")
    result = start(conf, line)
    early = change.added and line < change.added
    assert not result.ok, (f"slurmctld {line} took {change.key}={change.test_value}, which the table says "
                           f"{'arrives in ' + change.added if early else 'is gone by ' + str(change.removed)}")


# ---- features chosen by spec fields, checked the same way -----------------------------------------

HC = [c for c in FEATURES if c.key == "HealthCheckNodeState"]
HC_CASES = [(c, line) for line in LINES for c in HC]


@pytest.mark.parametrize(("change", "line"), HC_CASES, ids=[f"{c.setting}@{line}" for c, line in HC_CASES])
def test_health_check_states_per_line(change, line, tmp_path):
    """A state the line lacks is logged ('Invalid HealthCheckNodeState value X ignored'), which the strict
    harness treats as a config error; rendered around the spec check for the lines that lack it."""
    need(line)
    data = base_data(line)
    data["health"] = {"node_state": change.value}
    if change.supported(line):
        write_outputs(render_all(compiled(spec_from_data(data)), cabling=False), tmp_path)
    else:
        plain = base_data(line)
        plain["health"] = {"enabled": False}  # render without the checks, then add them as this line lacks them
        write_outputs(render_all(compiled(spec_from_data(plain)), cabling=False), tmp_path)
        with (tmp_path / "slurm.conf").open("a") as fh:
            fh.write("HealthCheckProgram=/usr/local/sbin/gpucluster-health\nHealthCheckInterval=300\n"
                     f"HealthCheckNodeState={change.value}\n")
    assert start(tmp_path, line).ok == change.supported(line)
