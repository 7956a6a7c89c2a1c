"""`gpucluster rollout` without a cluster: --dry-run prints the planner's waves, bad input exits 2 with a
located message and writes nothing, and the state file is all or nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucluster.cli import main
from gpucluster.cluster import load_cluster
from gpucluster.errors import UsageError
from gpucluster.paths import examples_dir
from gpucluster.rollout import state as st
from gpucluster.rollout.engine import new_state
from gpucluster.rollout.waves import parse_max_unavailable, plan_waves, topology_units

STAGING = examples_dir() / "staging.yaml"


def test_dry_run_prints_the_planners_waves(capsys) -> None:
    assert main(["rollout", str(STAGING), "--dry-run", "--max-unavailable", "2"]) == 0
    out = capsys.readouterr().out
    c = load_cluster(STAGING)
    units = topology_units(c.plan, "leaf", c.contract_groups["slurm_compute"])
    waves = plan_waves(units, parse_max_unavailable("2", len(c.contract_groups["slurm_compute"]), 2))
    assert f"in {len(waves)} waves" in out
    for w in waves:
        assert f"wave {w.index:>3}: {len(w.nodes):>4} nodes  {', '.join(w.units)}" in out


@pytest.mark.parametrize(("args", "words"), [
    (["--max-unavailable", "1"], "allow at least 2, or roll out --by node"),
    (["--max-unavailable", "lots"], "give a node count"),
])
def test_bad_input_exits_2_with_the_fix(args, words, capsys) -> None:
    assert main(["rollout", str(STAGING), "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert str(STAGING) in err and words in err and "Traceback" not in err


def test_missing_target_and_missing_state_exit_2(tmp_path, capsys) -> None:
    assert main(["rollout", str(tmp_path / "nope.yaml"), "--dry-run"]) == 2
    assert main(["rollout", str(STAGING), "--status", "--state-dir", str(tmp_path / "s")]) == 2
    assert "no rollout state here" in capsys.readouterr().err


def _state() -> dict:
    c = load_cluster(STAGING)
    waves = plan_waves(topology_units(c.plan, "leaf", c.contract_groups["slurm_compute"]), 2)
    return new_state("staging-1", cluster="staging", source=str(STAGING), change="drain", by="leaf",
                     max_unavailable=2, waves=waves, skipped=[], halt_share=0.1)


def test_state_file_is_atomic_and_checked(tmp_path) -> None:
    path = st.state_path(tmp_path / "s")
    s = _state()
    st.save(path, s)
    assert json.loads(path.read_text()) == s == st.load(path)
    with pytest.raises(TypeError):
        st.save(path, {**s, "source": object()})
    assert st.load(path) == s  # the failed write left the last state whole
    assert [p.name for p in Path(path.parent).iterdir()] == [st.NAME]
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not a rollout state file"):
        st.load(path)


@pytest.mark.parametrize(("version", "how"), [("22.05", "restart"), ("24.11", "reconfigure")])
def test_resize_dry_run_names_hosts_and_how_the_release_learns_them(version, how, tmp_path, capsys) -> None:
    from gpucluster.emulate.specs import scaled_spec

    for name, n in (("old", 12), ("new", 16)):
        (tmp_path / f"{name}.yaml").write_text(scaled_spec("meta-24k-ib", {"h100": n}, name="rs",
                                                           fabric={"scalable_unit_nodes": 4},
                                                           slurm={"version": version}))
    old, new = str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml")
    assert main(["rollout", old, "--resize", new, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"4 nodes added, 0 removed, 12 kept; Slurm {version} learns a node list by {how}" in out
    assert "enroll gti[0013-0016]" in out and "drain them at once (reason gpc:grow ID)" in out
    assert main(["rollout", new, "--resize", old, "--dry-run"]) == 0
    assert "drain gti[0013-0016] (reason gpc:shrink ID)" in capsys.readouterr().out
    assert main(["rollout", old, "--resize", new]) == 2  # a SPEC target: only the plan; changing needs an inventory
