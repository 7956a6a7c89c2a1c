"""The staged containers treated as a fleet gpucluster did not stage: the production path.

On the Debian 13 cluster (staged_trixie): the two staged clusters' workers run side by side, and these tests
balance them (the Debian 12 cluster carries the health, storage and validate tests; this one also the pull
tests). The session fixture wrote the inventory
with `gpucluster inventory --ssh-config`, the secrets with `gpucluster secrets --generate`, and configured with
--secrets. Here: the fresh image's apt trap was met,
the supplied secrets are the ones on the nodes, a dry run (--check --diff) reports exactly what a spec
change would do and changes nothing, one concern can be pushed to some hosts in batches, and the steps
after the compile parse the spec no more.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.staged


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`gpucluster ARGS` in a fresh process, as an operator types it."""
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900, env=env, check=False)

SLURM_CONF_TASK = "slurm_common : Slurm config files from the renderer"
ARG_SPEC_TASK = "Validating arguments against arg spec"


GUARD_PLAY = "Secrets | nothing is replaced implicitly"  # site.yml's first play on the hosts, for every --tags


def _tasks_by_role(log: str, *, skip_play: str | None = None) -> dict[str, list[str]]:
    """The configure log's task lines under each `-- role NAME` header (a play header ends a role's run); with
    `skip_play`, leaving out the roles' tasks that play runs."""
    ran: dict[str, list[str]] = {}
    role = None
    skipping = False
    for line in log.splitlines():
        text = line.split("] ", 1)[-1] if line.startswith("[") else line
        if text.startswith("-- role "):
            role = None if skipping else text[len("-- role "):].strip()
            if role:
                ran.setdefault(role, [])
        elif text.startswith("== "):
            role = None
            skipping = skip_play is not None and text[3:].strip() == skip_play
        elif role and text.startswith("   ") and text.strip():
            ran[role].append(text.strip())
    return ran


def _need_converged(c) -> None:
    if not c.first_configure.ok:
        pytest.fail(f"the first configure did not converge ({c.first_configure.failures}); see "
                    f"{c.first_configure.log_path}")


def _secrets(c) -> dict:
    return json.loads(c.secrets_file.read_text())


def _slurm_hosts(c) -> list[str]:
    return sorted({h for g in ("slurm_dbd", "slurm_controller", "slurm_compute", "slurm_login") for h in c.hosts(g)})


def _config_holders(c) -> list[str]:
    """The hosts holding /etc/slurm/slurm.conf: configless, compute nodes get it from slurmctld (docs/roles.md)."""
    return sorted({h for g in ("slurm_dbd", "slurm_controller", "slurm_login") for h in c.hosts(g)})


def test_fresh_image_met_the_apt_trap_and_configure_got_past_it(staged_trixie):
    """The node image ships no package lists (it is built with /var/lib/apt/lists emptied). In CI the image
    was built in this run, so the folder's date is minutes old: apt's cache_valid_time alone would call that
    index fresh, and python3-pymysql (not in the image) would be 'not available'."""
    c = staged_trixie
    for host, before in c.apt_before.items():
        assert before["package_lists"] == 0, f"{host}: the image came with package lists: {before}"
        if os.environ.get("CI"):
            assert before["folder_age_s"] < 3600, f"{host}: CI did not configure a freshly built image: {before}"
    _need_converged(c)
    res = c.exec("ctl01", "dpkg-query", "-W", "-f", "${Status}", "python3-pymysql")
    assert res.stdout.strip() == "install ok installed", f"ctl01: python3-pymysql: {res.stdout} {res.stderr}"


@pytest.mark.parametrize("host", ["ctl01", "gpu01", "gpu04"])
def test_munge_key_on_the_node_is_the_one_supplied(staged_trixie, host):
    c = staged_trixie
    _need_converged(c)
    want = hashlib.sha256(base64.b64decode(_secrets(c)["munge_key_b64"])).hexdigest()
    res = c.exec(host, "sha256sum", "/etc/munge/munge.key", check=True)
    assert res.stdout.split()[0] == want, f"{host}: /etc/munge/munge.key is not the supplied key"  # no hash shown


def test_slurmdbd_uses_the_supplied_password(staged_trixie):
    c = staged_trixie
    _need_converged(c)
    dbd = c.hosts("slurm_dbd")[0]
    res = c.exec(dbd, "sh", "-c", "sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf | tr -d '\\n' | sha256sum",
                 check=True)
    want = hashlib.sha256(_secrets(c)["slurm_dbd_password"].encode()).hexdigest()
    assert res.stdout.split()[0] == want, f"{dbd}: slurmdbd.conf does not hold the supplied password"


def test_steps_after_the_compile_parse_nothing(staged_trixie, tmp_path):
    """One compiled load: validate reads the compiled state the configure left (no parse, no plan)."""
    c = staged_trixie
    _need_converged(c)
    trace = tmp_path / "trace"
    res = cli("validate", str(c.inventory.parent), "-n", "2", "-k", "munge",
              env={**os.environ, "GPUCLUSTER_TRACE": str(trace)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert not trace.exists() or trace.read_text() == "", f"validate parsed or planned: {trace.read_text()}"


def test_check_mode_shows_one_slurm_conf_change_where_it_lands_and_changes_nothing(staged_trixie, tmp_path):
    """The spec gains one slurm.conf parameter: --check --diff reports exactly that line, on the hosts holding
    slurm.conf only (configless: the controllers, never a compute node), and the nodes keep their files.
    Every other task of every host reports no change, so this is also the check run on a converged cluster
    (a separate no-op check run cost a whole push converge of CI time and showed nothing more)."""
    c = staged_trixie
    _need_converged(c)
    data = yaml.safe_load(Path(c.spec_path).read_text())
    data["slurm"].setdefault("parameters", {})["MaxArraySize"] = 4321
    spec = tmp_path / "staging-changed.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = tmp_path / "inventory"
    res = cli("inventory", str(spec), "-o", str(inv), "--ssh-config", str(c.staged.ssh_config),
              "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 0, res.stderr
    before = {h: c.exec(h, "sha256sum", "/etc/slurm/slurm.conf", check=True).stdout.split()[0]
              for h in _config_holders(c)}
    from gpucluster.configure import configure, summary

    lines: list[str] = []
    result = configure(inv, secrets=c.secrets_file, check=True, diff=True, log=lines.append)
    report = "\n".join(lines) + summary(result)
    (c.logs / "check-changed-spec.log").write_text(report)
    assert result.ok, f"check run failed: {result.failures}"
    changed = {h: t for h, t in result.changes.items() if t and h != "localhost"}  # localhost: its own compile
    assert set(changed) == set(_config_holders(c)), report
    assert all(tasks == [t for t in tasks if t.startswith(SLURM_CONF_TASK)] for tasks in changed.values()), changed
    for host in _config_holders(c):
        diffs = "\n".join(text for _task, text in result.diffs.get(host, []))
        added = [ln for ln in diffs.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        removed = [ln for ln in diffs.splitlines() if ln.startswith("-") and not ln.startswith("---")]
        assert "+MaxArraySize=4321" in added and not removed, f"{host}: {diffs}"
        assert all(ln in ("+MaxArraySize=4321", "+# Site parameters (slurm.parameters in the spec)", "+")
                   for ln in added), f"{host}: {diffs}"
    after = {h: c.exec(h, "sha256sum", "/etc/slurm/slurm.conf", check=True).stdout.split()[0]
             for h in _config_holders(c)}
    assert after == before, "a check run changed slurm.conf on a node"
    shutil.rmtree(tmp_path / "state", ignore_errors=True)


def test_one_concern_to_some_hosts_in_batches(staged_trixie):
    """--tags slurm --limit 'gpu[01-02]' (a Slurm hostlist, as sinfo prints it) --batch 1: only the Slurm
    play, only those hosts, one at a time, and on a converged cluster nothing to change."""
    c = staged_trixie
    _need_converged(c)
    result = c.configure(tags="slurm", limit="gpu[01-02]", batch=1)
    assert result.ok, f"{result.failures} (log {result.log_path})"
    assert set(result.hosts) - {"localhost"} == {"gpu01", "gpu02"}, result.hosts
    assert result.changed == 0, f"{result.changes} (log {result.log_path})"
    log = result.log_path.read_text()
    assert log.count("== Slurm | accounting, controller, compute and login nodes") == 2, "not one batch per host"
    # The secrets guard runs for every --tags (it reads each host's secrets and changes nothing: changed == 0 above);
    # it is site.yml's first play, so the roles' tasks it runs are left out here.
    assert GUARD_PLAY in log, "the secrets guard ran"
    ran = _tasks_by_role(log, skip_play=GUARD_PLAY)
    # Ansible validates every role's arguments whatever --tags says (that task is tagged always); nothing else
    # of another concern may run.
    other = {role: tasks for role, tasks in ran.items()
             if not role.startswith("slurm_") and any(not t.startswith(ARG_SPEC_TASK) for t in tasks)}
    assert not other, f"--tags slurm ran other concerns: {other}"
    assert {"slurm_common", "slurm_compute"} <= set(ran), ran
