"""Topology-aware against topology-blind, CI-sized (bench/rollout_compare.py is the 512-node run): 32 emulated
nodes of meta-24k-ib's shape in 4 leaves of 8, a seeded job mix with a quarter of the jobs one whole leaf, and
a reboot-class rollout to every node twice with --max-unavailable 8, the reboot real in the emulator
(`scontrol reboot ASAP nextstate=RESUME`, the emulated RebootProgram restarts the node's slurmd with -b).

What must hold: no job killed or requeued in either run, every node back in service after each, and whole
leaves keep a larger in-service leaf-aligned block than random batches of the same size. 91-97 s at load
average 10-30 on the shared 2-core machine, 167 s at load 60."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import load_file

from gpucluster.emulate.adapt import SlurmConf
from gpucluster.emulate.emulator import emulate
from gpucluster.emulate.specs import scaled_spec, write_and_render
from gpucluster.rollout.slurmops import Slurm
from gpucluster.rollout.waves import plan_waves, topology_units

compare = load_file(Path(__file__).resolve().parent.parent / "bench" / "rollout_compare_lib.py", "rollout_compare_lib")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HAVE_SLURM = all(shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("slurmctld", "slurmd", "munged"))
pytestmark = [pytest.mark.skipif(not IN_CI and not HAVE_SLURM, reason="slurmctld/slurmd/munged not installed"),
              pytest.mark.slurm, pytest.mark.emulate]
NODES, LEAF, SEED = 32, 8, 18


def test_whole_leaves_keep_a_larger_block_and_neither_kills_a_job(tmp_path: Path) -> None:
    text = scaled_spec("meta-24k-ib", {"h100": NODES}, name="cmp32", fabric={"scalable_unit_nodes": LEAF})
    r = write_and_render(text, tmp_path, "cmp32")
    hosts = [h for g in r.spec.groups_with_role("compute") for h in g.hosts]
    units = topology_units(r.plan, "leaf", hosts)
    leaves = [n for _, n in units]
    assert [len(lf) for lf in leaves] == [LEAF] * (NODES // LEAF)  # leaves of the plan's real size
    aware, blind = plan_waves(units, LEAF), compare.blind_waves(hosts, LEAF, SEED)
    assert [len(w.nodes) for w in aware] == [len(w.nodes) for w in blind]  # same ceiling, same batch size
    mix = compare.job_mix(SEED, total=NODES, leaf=LEAF, length=300, seconds=(1, 3))
    results = {}
    # the rendered scheduler, with its delays cut to what 32 nodes and 1-3 s jobs need: a submitted job is tried at
    # once (batch_sched_delay, 3 s by default) and the jobs queued behind a whole-leaf job every second
    # (bf_interval, 30 s by default), so the queue left when each rollout ends drains in seconds
    sched = SlurmConf.parse((r.conf_dir / "slurm.conf").read_text()).param("SchedulerParameters")
    overrides = {"MinJobAge": "3600", "SchedulerParameters": f"{sched},batch_sched_delay=0,bf_interval=1"}
    with emulate(r.conf_dir, overrides=overrides, reboot_delay=0.5) as c:
        for label, waves in (("aware", aware), ("blind", blind)):
            before = len(c.reboots)
            results[label] = compare.run_once(c.run, label, waves, leaves, mix, tmp_path, warmup=2)
            compare.wait_quiet(c.run, hosts, timeout=120)
            assert sorted(n for n, *_ in c.reboots[before:]) == sorted(hosts)  # every node really rebooted once
        now = Slurm(c.run).nodes(hosts)
        assert all(not s.out and not s.rebooting for s in now.values())
    aware_r, blind_r = results["aware"], results["blind"]
    for res in results.values():
        assert res.jobs > 10 and res.killed == 0, res.killed_jobs
        assert res.samples, "no sample of the blocks taken during the rollout"
    assert aware_r.large_jobs and blind_r.large_jobs
    assert min(s[1] for s in aware_r.samples) >= NODES - 2 * LEAF  # a wave is one leaf, never more out
    assert aware_r.mean(1) > blind_r.mean(1), (aware_r.as_json(), blind_r.as_json())
