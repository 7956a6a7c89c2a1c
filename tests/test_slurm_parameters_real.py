"""slurm.parameters values against the real slurmctld of every line gpucluster runs (22.05 host, 24.11
trixie root, 26.05 sid root): whatever `check` accepts, each line's slurmctld loads.

Every case goes through the spec check first. The cases it accepts are merged into one spec per line (their
keys are distinct), rendered, and that line's slurmctld must start on the files with no config error (the
strict harness of tests/test_slurm_versions_real.py): one start per line. The cases `check` refuses are
listed with the rule that refuses them, so a check that stopped refusing shows here too.
"""

from __future__ import annotations

import pytest
from conftest import compiled, spec_from_data
from test_slurm_versions_real import base_data, need, start

from gpucluster.cluster import check_meaning
from gpucluster.emulate.roots import LINES
from gpucluster.render import render_all, write_outputs
from gpucluster.spec.model import LoadedSpec

# (key, value): good ones first; each key once, so the accepted cases merge into one file.
GOOD = [
    ("SlurmctldDebug", "debug"), ("SlurmdDebug", "verbose"), ("TreeWidth", 32), ("MaxJobCount", 20000),
    ("MinJobAge", 600), ("KillWait", 60), ("SlurmctldTimeout", 300), ("SlurmdTimeout", 600),
    ("MessageTimeout", 20), ("TCPTimeout", 4), ("InactiveLimit", 0), ("Waittime", 0), ("ReturnToService", "1"),
    ("SchedulerParameters", "bf_continue,bf_interval=60,default_queue_depth=200"),
    ("PropagateResourceLimitsExcept", "MEMLOCK,STACK"),
    ("SelectTypeParameters", "CR_Core_Memory,CR_ONE_TASK_PER_CORE"), ("SelectType", "select/cons_tres"),
    ("SchedulerType", "sched/backfill"), ("PriorityType", "priority/basic"), ("JobCompType", "jobcomp/filetxt"),
    ("MpiDefault", "pmi2"), ("Licenses", "fluent:4,matlab:2"), ("FirstJobId", 1000), ("JobRequeue", 0),
    ("MaxArraySize", 2001), ("schedulertimeslice", 60),  # keys the table does not hold: one token each
]
BAD = [
    ("SlurmctldDebug", "info HealthCheckInterval=7", "slurm-value"),
    ("SlurmctldDebug", "loud", "slurm-value"),
    ("ControlAddr", "10.0.0.1", "owned-key"), ("BackupController", "ctl02", "owned-key"),
    ("BackupAddr", "10.0.0.2", "owned-key"), ("SlurmctldAddr", "10.0.0.3", "owned-key"),
    ("ControlMachine", "ctl01", "owned-key"), ("HealthCheckInterval", 7, "owned-key"),
    ("SchedulerParameters", "bf_continue bf_interval=60", "slurm-value"),
    ("SchedulerParameters", "bf_continue,,bf_interval=60", "slurm-value"),
    ("SchedulerParameters", "bf_interval=", "slurm-value"),
    ("PropagateResourceLimitsExcept", "MEMLOCK,", "slurm-value"),
    ("TreeWidth", 70000, "slurm-value"), ("TreeWidth", "ten", "slurm-value"),
    ("SlurmctldTimeout", 70000, "slurm-value"), ("ReturnToService", 3, "slurm-value"),
    ("SelectType", "select/bogus", "slurm-value"), ("MpiDefault", "pmix", "slurm-value"),
    ("FirstJobId", '"1000"', "slurm-value"), ("JobRequeue", "0 Prolog=/tmp/x", "slurm-value"),
    ("SchedulerParamters", "bf_continue", "unknown-key"), ("NotAKey", 1, "unknown-key"),
    ("HealthCheckTimeout", 60, "unknown-key"),  # 26.05.5's page documents it, 22.05.8's does not
]


def findings(line: str, params: dict) -> list:
    loaded = LoadedSpec(spec=spec_from_data(base_data(line, params)), source="spec.yaml", lines={})
    return [f for f in check_meaning(loaded) if f.level == "error"]


@pytest.mark.parametrize(("key", "value", "rule"), BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_check_refuses(key, value, rule):
    found = findings("22.05", {key: value})
    assert [f.rule for f in found if f.path == ("slurm", "parameters", key)] == [rule], found


@pytest.mark.slurm
@pytest.mark.parametrize("line", LINES)
def test_every_value_check_accepts_the_lines_slurmctld_loads(line, tmp_path):
    need(line)
    accepted = {k: v for k, v in GOOD if not findings(line, {k: v})}
    assert len(accepted) == len(GOOD), f"check refused good cases: {set(dict(GOOD)) - set(accepted)}"
    loaded = LoadedSpec(spec=spec_from_data(base_data(line, accepted)), source="spec.yaml", lines={})
    assert not [f for f in check_meaning(loaded) if f.level == "error"]
    write_outputs(render_all(compiled(loaded.spec), cabling=False), tmp_path)
    text = (tmp_path / "slurm.conf").read_text()
    assert all(f"{k}=" in text for k in accepted)
    result = start(tmp_path, line)
    assert result.ok, f"slurmctld {line} refused values check accepted:\n{result.message}"


CONTROLS = [("SelectType=select/cons_tres", "SelectType=select/bogus"),
            ("SelectType=select/cons_tres", "SelectType=select/cons_tres\nSchedulerParamters=bf_continue")]


@pytest.mark.slurm
@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("edit", CONTROLS, ids=["unknown-plugin", "unknown-key"])
def test_the_harness_sees_what_check_refuses(line, edit, tmp_path):
    """The controls: what check refuses (an unknown plugin, a misspelt key), written behind check's back,
    stops the line's slurmctld; so the test above can fail, and the rules are not stricter than needed there."""
    need(line)
    write_outputs(render_all(compiled(spec_from_data(base_data(line))), cabling=False), tmp_path)
    conf = tmp_path / "slurm.conf"
    conf.write_text(conf.read_text().replace(*edit))
    assert edit[1] in conf.read_text()
    assert not start(tmp_path, line).ok
