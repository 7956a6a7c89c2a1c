"""The Slurm roles on staged nodes: converge, configs from the renderer, GRES, topology, a topology-
placed job in accounting, secrets handling, idempotence, and a node that is down during configure.

Expected values come from the spec, the plan and the inventory writer, never from copies. The
tests run in file order: the stopped-node test is last because it restarts a node.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import hostlist
import pytest

from gpucluster.cluster import load_cluster
from gpucluster.render.topology import slurm_switches

SPEC = Path(__file__).resolve().parents[2] / "examples" / "staging.yaml"

pytestmark = pytest.mark.staged

_CLUSTER = load_cluster(SPEC)
_LOADED, PLAN = _CLUSTER.loaded, _CLUSTER.plan
STAGED_SPEC = _LOADED.spec


def _group(name: str) -> list[str]:
    return sorted(_CLUSTER.contract_groups.get(name, []))


CONTROLLER = _group("slurm_controller")[0]
COMPUTE = _group("slurm_compute")
SLURM_HOSTS = sorted(set(_group("slurm_controller") + COMPUTE + _group("slurm_login") + _group("slurm_dbd")))
CONFIG_FILES = ("slurm.conf", "topology.conf", "gres.conf", "cgroup.conf")
PLAN_GROUP = {h: g.name for g in STAGED_SPEC.node_groups for h in g.hosts}


def _journal(cluster, host: str, unit: str) -> str:
    return cluster.exec(host, "journalctl", "-u", unit, "-n", "40", "--no-pager").stdout


def _need_converged(cluster) -> None:
    """The Slurm hosts converged in the first configure (a failure elsewhere, e.g. a storage node, is
    test_first_configure_converged's to report, not every Slurm test's)."""
    bad = sorted(set(cluster.first_configure.failed_hosts) & set(SLURM_HOSTS))
    if bad:
        pytest.fail(f"the first configure failed on Slurm hosts {bad} (see test_first_configure_converged; "
                    f"log {cluster.first_configure.log_path})", pytrace=False)


def _failed_before(cluster) -> set[str]:
    return set(cluster.first_configure.failed_hosts)


def test_first_configure_converged(staged_cluster):
    from gpucluster.configure import summary

    result = staged_cluster.first_configure
    assert result.ok, f"configure failed; log {result.log_path}\n{summary(result)}"


# ---------------------------------------------------------------- configs from the one renderer


@pytest.fixture(scope="module")
def cli_rendered(tmp_path_factory) -> dict[str, str]:
    """sha256 of each file `gpucluster render SPEC -o DIR --no-cabling` writes (the CLI itself)."""
    out = tmp_path_factory.mktemp("cli-render")
    subprocess.run([sys.executable, "-m", "gpucluster.cli", "render", str(SPEC), "-o", str(out), "--no-cabling"],
                   check=True, capture_output=True, text=True)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.is_file()}


# Configless (docs/roles.md): the hosts that read the files themselves hold /etc/slurm; a compute node's slurmd
# fetches them from slurmctld into its cache (SlurmdSpoolDir/conf-cache, linked from /run/slurm/conf).
CONFIG_HOLDERS = sorted(set(SLURM_HOSTS) - (set(COMPUTE) - set(_group("slurm_controller") + _group("slurm_login")
                                                                  + _group("slurm_dbd"))))
CONF_CACHE = "/run/slurm/conf"


def _config_path(host: str, name: str) -> str:
    return f"/etc/slurm/{name}" if host in CONFIG_HOLDERS else f"{CONF_CACHE}/{name}"


@pytest.fixture(scope="module")
def node_hashes(staged_cluster):
    """host -> {path: sha256} of /etc/slurm/<file> and the conf cache's <file> on that node (one SSH call)."""
    seen: dict[str, dict[str, str]] = {}

    def get(host: str) -> dict[str, str]:
        if host not in seen:
            paths = " ".join(f"{d}/{f}" for d in ("/etc/slurm", CONF_CACHE) for f in CONFIG_FILES)
            res = staged_cluster.ssh(host, f"sha256sum {paths} 2>/dev/null; true", check=True)
            seen[host] = {line.split()[1]: line.split()[0] for line in res.stdout.splitlines() if line.strip()}
        return seen[host]

    return get


@pytest.mark.parametrize("host", SLURM_HOSTS)
@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_on_node_is_byte_identical_to_cli_render(staged_cluster, cli_rendered, node_hashes, host, name):
    """Controllers hold the rendered file; a compute node's slurmd has it from slurmctld, byte for byte."""
    _need_converged(staged_cluster)
    if name not in cli_rendered:
        pytest.skip(f"`gpucluster render` writes no {name} for this spec")
    path = _config_path(host, name)
    got = node_hashes(host).get(path)
    assert got is not None, f"{host}: {path} is missing"
    assert got == cli_rendered[name], f"{host}: {path} differs from `gpucluster render` output"


# ---------------------------------------------------------------- Slurm sees the cluster as planned


@pytest.mark.parametrize("host", COMPUTE)
def test_compute_node_idle_with_its_gpus(staged_cluster, host):
    _need_converged(staged_cluster)
    group = STAGED_SPEC.group(PLAN_GROUP[host])
    want_gres = f"gpu:{STAGED_SPEC.parts.gpus[group.gpu].slurm_type}:{group.gpus_per_node}"
    res = staged_cluster.ssh(CONTROLLER, f"sinfo --noheader --Node --node {host} --format '%N|%t|%G'", check=True)
    fields = res.stdout.strip().split("|")
    state, gres = (fields[1], fields[2]) if len(fields) == 3 else ("?", "?")
    if state != "idle":
        journal = _journal(staged_cluster, host, "slurmd")
        pytest.fail(f"{host} is {state!r} in sinfo, not idle; slurmd journal:\n{journal}", pytrace=False)
    assert gres.split("(")[0] == want_gres, f"{host}: sinfo GRES {gres!r}, the spec gives {want_gres!r}"


def _parse_topology(text: str) -> dict[str, dict]:
    out = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "SwitchName" in fields:
            out[fields["SwitchName"]] = {
                "level": int(fields.get("Level", -1)),
                "nodes": set(hostlist.expand_hostlist(fields["Nodes"])) if fields.get("Nodes") else set(),
                "switches": set(hostlist.expand_hostlist(fields["Switches"])) if fields.get("Switches") else set(),
            }
    return out


def _planned_topology() -> dict[str, dict]:
    switches = {s.name: s for s in slurm_switches(PLAN)}

    def nodes_under(name: str) -> set[str]:
        s = switches[name]
        own = {h for expr in s.nodes for h in hostlist.expand_hostlist(expr)}
        return own.union(*(nodes_under(c) for c in s.switches)) if s.switches else own

    return {s.name: {"level": s.level, "nodes": nodes_under(s.name), "switches": set(s.switches)}
            for s in slurm_switches(PLAN)}


def test_scontrol_topology_equals_the_plan(staged_cluster):
    _need_converged(staged_cluster)
    res = staged_cluster.ssh(CONTROLLER, "scontrol show topology", check=True)
    assert _parse_topology(res.stdout) == _planned_topology(), f"scontrol show topology:\n{res.stdout}"


@pytest.fixture(scope="module")
def switches_job(staged_cluster):
    """A 2-node job that asks for one leaf switch: (job id, its nodes)."""
    _need_converged(staged_cluster)
    cmd = ("sbatch --parsable --wait -N2 --switches=1 -o /tmp/switches-%j.out "
           "--wrap 'srun hostname; echo SLURM_TOPOLOGY_ADDR=$SLURM_TOPOLOGY_ADDR'")
    res = staged_cluster.ssh(CONTROLLER, cmd, timeout=300)
    assert res.returncode == 0, f"sbatch failed: {(res.stderr or res.stdout)[-800:]}"
    job = res.stdout.strip().splitlines()[-1].split(";")[0]
    # slurmdbd records the job asynchronously: right after it ends sacct was seen to list one node of
    # the two (the demo hit it). Read the allocation until it names two nodes, for up to a minute.
    deadline = time.monotonic() + 60
    while True:
        nodes = staged_cluster.ssh(CONTROLLER, f"sacct -j {job} -X -n -P -o NodeList", check=True).stdout.strip()
        expanded = hostlist.expand_hostlist(nodes) if nodes else []
        if len(expanded) >= 2 or time.monotonic() > deadline:
            return job, expanded
        time.sleep(2)


def test_two_node_job_with_switches_1_lands_under_one_leaf(switches_job):
    job, nodes = switches_job
    assert len(nodes) == 2, f"job {job} ran on {nodes}, asked for 2 nodes"
    leaves = {PLAN.unit_of_host[h].name for h in nodes}
    assert len(leaves) == 1, f"job {job} spans leaves {sorted(leaves)} (nodes {nodes}) despite --switches=1"


def test_sacct_lists_the_job(staged_cluster, switches_job):
    job, nodes = switches_job
    deadline = time.monotonic() + 60
    while True:
        res = staged_cluster.ssh(CONTROLLER, f"sacct -j {job} -X -n -P -o JobID,State,NodeList,ExitCode")
        fields = res.stdout.strip().split("|")
        if (len(fields) >= 4 and fields[1] == "COMPLETED") or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert fields[0] == job and fields[1] == "COMPLETED", (
        f"sacct for job {job}: {res.stdout.strip() or res.stderr.strip()!r}; slurmdbd journal:\n"
        f"{_journal(staged_cluster, _group('slurm_dbd')[0], 'slurmdbd')}")
    assert set(hostlist.expand_hostlist(fields[2])) == set(nodes)


def test_cluster_registered_in_accounting(staged_cluster):
    _need_converged(staged_cluster)
    res = staged_cluster.ssh(CONTROLLER, "sacctmgr --noheader --parsable2 list cluster format=cluster", check=True)
    assert STAGED_SPEC.name in res.stdout.split(), f"sacctmgr lists {res.stdout.split()}"


# ---------------------------------------------------------------- secrets


def _secret_files(cluster) -> dict[str, bytes]:
    secrets = cluster.state_dir / "secrets"
    return {p.name: p.read_bytes() for p in secrets.iterdir() if p.is_file()}


def test_secrets_are_private_files_outside_git(staged_cluster):
    _need_converged(staged_cluster)
    secrets = staged_cluster.state_dir / "secrets"
    names = set(_secret_files(staged_cluster))
    assert {"munge.key", "slurmdbd.password", "slurmdbd.conf", "bundle-signing.key"} <= names, \
        f"secrets folder holds {sorted(names)}"
    for p in secrets.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, f"{p} has mode {oct(p.stat().st_mode & 0o777)}, not 0600"
    assert secrets.stat().st_mode & 0o777 == 0o700
    assert not str(secrets.resolve()).startswith(str(SPEC.parents[1])), "secrets must live outside the checkout"


@pytest.mark.parametrize("host", SLURM_HOSTS)
def test_munge_key_on_node_is_the_cluster_key(staged_cluster, host):
    _need_converged(staged_cluster)
    want = hashlib.sha256(_secret_files(staged_cluster)["munge.key"]).hexdigest()
    res = staged_cluster.ssh(host, "stat -c '%a %U %G' /etc/munge/munge.key && sha256sum /etc/munge/munge.key",
                             check=True)
    mode_line, sum_line = res.stdout.strip().splitlines()
    assert mode_line == "400 munge munge", f"{host}: /etc/munge/munge.key is {mode_line}"
    assert sum_line.split()[0] == want, f"{host}: /etc/munge/munge.key is not the cluster's key"  # no hash printed


def test_slurmdbd_conf_is_private(staged_cluster):
    _need_converged(staged_cluster)
    dbd = _group("slurm_dbd")[0]
    res = staged_cluster.ssh(dbd, "stat -c '%a %U %G' /etc/slurm/slurmdbd.conf", check=True)
    assert res.stdout.strip() == "600 slurm slurm"


def test_secrets_never_reach_logs_or_artifacts(staged_cluster):
    """Neither the DB password, the munge key (raw or base64) nor the bundle-signing key (a line of its private
    part, or the file as base64) appears in any configure log or event."""
    _need_converged(staged_cluster)
    files = _secret_files(staged_cluster)
    key, signing = files["munge.key"], files["bundle-signing.key"]
    needles = [files["slurmdbd.password"].strip(), key, base64.b64encode(key), base64.b64encode(key[:48]),
               signing.splitlines()[3], base64.b64encode(signing)[:64]]
    haystacks = list(staged_cluster.logs.glob("*.log")) + [
        p for p in (staged_cluster.state_dir / "runner").rglob("*") if p.is_file()]
    assert haystacks
    leaks = [str(p) for p in haystacks for n in needles if n and n in p.read_bytes()]
    assert not leaks, f"a secret appears in {sorted(set(leaks))}"


# ---------------------------------------------------------------- idempotence and a node that is down


def test_second_configure_changes_nothing(staged_cluster):
    _need_converged(staged_cluster)
    result = staged_cluster.configure()
    new = set(result.failed_hosts) - _failed_before(staged_cluster)
    assert not new, f"second configure failed on {sorted(new)}: {result.failures} (log {result.log_path})"
    changed = {h: tasks for h, tasks in result.changes.items() if tasks}
    assert result.changed == 0, f"second configure changed {result.changed} things: {changed} (log {result.log_path})"


@pytest.mark.disruptive(2)
def test_node_down_during_configure_fails_alone_and_rerun_converges(staged_cluster):
    _need_converged(staged_cluster)
    victim = COMPUTE[-1]
    subprocess.run(["podman", "stop", "-t", "5", staged_cluster.container(victim)], check=True, capture_output=True)
    try:
        result = staged_cluster.configure()
    finally:
        subprocess.run(["podman", "start", staged_cluster.container(victim)], check=True, capture_output=True)
        staged_cluster.wait_ssh(victim)
    assert not result.ok, "configure reported success with a compute node stopped"
    message = " ".join(result.failures.get(victim, []))
    assert "unreachable" in message and ("ssh" in message.lower() or "connect" in message.lower()), message
    # Every other host converges (hosts that already failed in the first configure are that test's to report).
    others = set(result.failed_hosts) - {victim} - _failed_before(staged_cluster)
    assert not others, f"{sorted(others)} failed too while only {victim} was down: {result.failures}"
    assert all(result.hosts[h].ok > 0 for h in SLURM_HOSTS if h != victim), "Slurm hosts were not configured"

    # The rerun an operator makes: the host that failed (its tasks delegated to the controller still run there);
    # the others converged in the run above (test_second_configure_changes_nothing runs them all).
    rerun = staged_cluster.configure(limit=victim)
    assert set(rerun.hosts) - {"localhost"} == {victim}, rerun.hosts
    still = set(rerun.failed_hosts) - _failed_before(staged_cluster)
    assert not still, (f"rerun after {victim} came back failed on {sorted(still)}: {rerun.failures} "
                       f"(log {rerun.log_path})")
    res = staged_cluster.ssh(CONTROLLER, f"sinfo --noheader --Node --node {victim} --format '%t'", check=True)
    assert res.stdout.strip() == "idle", f"{victim} is {res.stdout.strip()!r} after the rerun"
