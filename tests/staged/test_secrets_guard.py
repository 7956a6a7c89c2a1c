"""A converge from a state folder that lacks the cluster's secrets changes nothing on the staged cluster.

A second operator's machine, a lost laptop or an inventory written without --state-dir points gpucluster at a
state folder with no munge key, slurmdbd password or bundle-signing key. Without the guard (the first play of
playbooks/site.yml) such a run generated new ones and installed them: a new munge key on ctl01 took every slurmd
down and a running job ended NODE_FAIL. Here the run stops before anything changes, says why and how to pass the
secrets, and the job keeps running. Marked disruptive: should the guard fail, the cluster is re-keyed, and the
tests that need it whole have run by then.
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.staged, pytest.mark.disruptive]


def _job_state(c, job: str) -> str:
    return c.ssh("ctl01", f"squeue -h -j {job} -o %T").stdout.strip()


def test_a_converge_from_a_state_folder_without_the_secrets_changes_nothing(staged_cluster, tmp_path):
    c = staged_cluster
    if not c.first_configure.ok:
        pytest.skip("the first configure failed: test_first_configure_converged reports it")
    slurm_hosts = sorted({*c.hosts("slurm_controller"), *c.hosts("slurm_compute")})
    node = c.hosts("slurm_compute")[0]
    sub = c.ssh("ctl01", f"sbatch --parsable -N1 -w {node} -o /dev/null --wrap 'sleep 900'", check=True)
    job = sub.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 120
        while _job_state(c, job) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(2)
        assert _job_state(c, job) == "RUNNING", c.ssh("ctl01", f"scontrol show job {job}").stdout
        keys = {h: c.ssh(h, "sha256sum /etc/munge/munge.key", check=True).stdout.split()[0] for h in slurm_hosts}
        pids = {h: c.ssh(h, "systemctl show -p MainPID --value munge", check=True).stdout.strip() for h in slurm_hosts}

        fresh = tmp_path / "another-state-folder"
        result = c.configure(state_dir=fresh, secrets=None)

        text = result.log_path.read_text()
        assert not result.ok, "a run that would replace the cluster's secrets must fail"
        assert "holds the cluster's munge secret" in text and "--secrets FILE" in text, text[-4000:]
        assert "Nothing was changed" in text
        # The compile play writes the new state folder on this machine; no host of the cluster may change.
        changed = {h: tasks for h, tasks in result.changes.items() if h != "localhost"}
        assert not changed, f"nothing may change on the cluster, yet: {changed}"
        assert set(result.failed_hosts) >= set(slurm_hosts), result.failed_hosts
        assert not (fresh / "secrets" / "munge.key").exists(), "the refused run generated a key"
        for h in slurm_hosts:
            assert c.ssh(h, "sha256sum /etc/munge/munge.key", check=True).stdout.split()[0] == keys[h], h
            assert c.ssh(h, "systemctl show -p MainPID --value munge", check=True).stdout.strip() == pids[h], h
        assert _job_state(c, job) == "RUNNING"
        down = c.ssh("ctl01", "sinfo -h -N -t down,drain,fail -o '%N %T %E'").stdout.strip()
        assert not down, f"nodes went out of service: {down}"
    finally:
        c.ssh("ctl01", f"scancel {job}")
