"""One staged cluster of examples/staging.yaml for the whole test session, configured once.

Fixture API (session scope; other test files reuse it, so it stays small):

    def test_x(staged_cluster):                  # a StagedHandle
        c = staged_cluster
        c.spec, c.plan                           # the spec model and its plan (expected values come from here)
        c.spec_path                              # examples/staging.yaml (absolute)
        c.inventory                              # hosts.yml of `gpucluster inventory --ssh-config` (folder: .parent)
        c.state_dir                              # the cluster's private state folder (secrets/, compiled/, runner/)
        c.secrets_file                           # the operator's secrets file (gpucluster secrets --generate)
        c.apt_before                             # host -> apt index of the fresh image before the first configure
        c.staged                                 # gpucluster.stage.podman.StagedCluster (ports, ssh_config, containers)
        c.first_configure                        # ConfigureResult of the configure run made at setup
        c.hosts("slurm_compute")                 # inventory hosts of a contract group, sorted
        c.ssh("ctl01", "sinfo -N")               # CompletedProcess: a shell command over SSH as root
        c.exec("gpu01", "systemctl", "is-active", "slurmd")   # CompletedProcess: podman exec (no sshd needed)
        c.configure()                            # run `gpucluster configure` again; returns a ConfigureResult
        c.container("gpu01")                     # podman container name of a node
        c.wait_ssh("gpu04")                      # after `podman start`: sshd answers and systemd has booted
        c.logs                                   # folder with stage.log and configure-N.log

Setup stages the cluster with its folders under pytest's tmp path (so CI and a developer's own cluster
never share names, networks or ports), then treats the containers as a fleet gpucluster did not stage:
`gpucluster inventory --ssh-config` on the stage's ssh_config, `gpucluster secrets --generate`, and
configure with --secrets. In CI the node image is built in the same run. It runs configure once, and
yields even when that configure failed (test_cluster.py::test_first_configure_converged reports
it; check c.first_configure.ok before relying on services). Teardown removes the containers,
network and files, also after failures or Ctrl-C.

Needs root, podman and runc (scripts/stage-deps.sh). Without them the tests skip with the reason,
except in CI (env CI set), where they fail: CI runs everything it can.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "staging.yaml"
TRIXIE_SPEC = ROOT / "examples" / "staging-trixie.yaml"  # the same cluster on Slurm 24.11, Debian 13 nodes


# The staged phase runs under pytest-xdist with `--dist loadgroup` (scripts/test.sh): one worker per group, so
# the two clusters come up, configure and are tested side by side, each by exactly one worker. A test's group
# is the cluster its fixtures name; a staged test that names neither stages its own nodes from the default
# (bookworm) image and joins the 22.05 group, because in CI the 22.05 fixture removes that image before it
# builds a fresh one (`podman rmi --force` also removes every container made from it).
GROUP_22_05 = "staged-22.05"  # examples/staging.yaml: bookworm nodes
GROUP_24_11 = "staged-24.11"  # examples/staging-trixie.yaml: trixie nodes
CLUSTER_GROUPS = {"staged_cluster": GROUP_22_05, "staged_trixie": GROUP_24_11}


def staged_group(item: pytest.Item) -> str:
    """The xdist group of a staged test: the group of the cluster fixture it uses (directly or through another
    fixture), else GROUP_22_05 (see above). A test using both cluster fixtures would need one worker for both,
    which the grouping cannot give: it is refused at collection."""
    groups = {CLUSTER_GROUPS[f] for f in getattr(item, "fixturenames", ()) if f in CLUSTER_GROUPS}
    if len(groups) > 1:
        both = ", ".join(sorted(CLUSTER_GROUPS))
        raise pytest.UsageError(f"{item.nodeid}: uses both staged cluster fixtures ({both}); each cluster is "
                                "brought up by one xdist worker: split the test in two")
    return groups.pop() if groups else GROUP_22_05


def pytest_collection_modifyitems(config, items):
    """Every staged test gets the xdist group of its cluster (staged_group). Tests marked `disruptive` (they
    stop a node or a daemon) run after every other test of the session, so a node that comes back in a worse
    state cannot fail checks that have nothing to do with it. Among themselves they run by rank,
    `disruptive(2)` (a whole node stopped) after `disruptive` (rank 1: a daemon stopped or a key changed,
    then restored); ties keep their order. One order for all items keeps that order inside each group too:
    xdist's loadgroup sends a group's tests to its worker in collection order."""
    for item in items:
        if item.get_closest_marker("staged") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(staged_group(item)))
    last = [item for item in items if item.get_closest_marker("disruptive")]
    last.sort(key=lambda item: (item.get_closest_marker("disruptive").args or (1,))[0])
    if last:
        items[:] = [item for item in items if not item.get_closest_marker("disruptive")] + last


@pytest.fixture(autouse=True)
def _record_group(request, record_property):
    """The test's xdist group in the JUnit report, so scripts/test.sh can sum each cluster's worker."""
    marker = request.node.get_closest_marker("xdist_group")
    if marker is not None:
        record_property("xdist_group", marker.kwargs.get("name") or (marker.args[0] if marker.args else ""))


def _missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "staged nodes need root (rootful podman)"
    for tool in ("podman", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/stage-deps.sh installs it)"
    if not Path("/usr/sbin/runc").exists():
        return "/usr/sbin/runc is not installed (scripts/stage-deps.sh installs it)"
    return None


def skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is not skipped)")
    pytest.skip(reason)


@dataclass
class StagedHandle:
    """A staged, configured cluster; see the module docstring for the API."""

    spec: object
    plan: object
    loaded: object
    spec_path: Path
    inventory: Path
    state_dir: Path
    staged: object
    first_configure: object = None
    logs: Path = field(default_factory=Path)
    secrets_file: Path | None = None  # `gpucluster secrets --generate`'s file: configure runs with --secrets
    apt_before: dict = field(default_factory=dict)  # host -> apt index before the first configure
    _runs: int = 0

    def hosts(self, group: str) -> list[str]:
        from gpucluster.cluster import cluster_of

        return sorted(cluster_of(self.loaded).contract_groups.get(group, []))

    def container(self, host: str) -> str:
        return self.staged.containers[host]

    def ssh(self, host: str, command: str, *, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
        res = subprocess.run(["ssh", "-F", str(self.staged.ssh_config), "-o", "BatchMode=yes",
                              "-o", "ConnectTimeout=10", host, command],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise AssertionError(f"{host}: `{command}` exited {res.returncode}: {(res.stderr or res.stdout)[-800:]}")
        return res

    def exec(self, host: str, *argv: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        res = subprocess.run(["podman", "exec", self.container(host), *argv], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=timeout, check=False)
        if check and res.returncode != 0:
            out = (res.stderr or res.stdout)[-800:]
            raise AssertionError(f"{host}: {' '.join(argv)} exited {res.returncode}: {out}")
        return res

    def configure(self, **kwargs):
        """`gpucluster configure` on this cluster; its progress goes to logs/configure-N.log."""
        from gpucluster.configure import configure, summary

        self._runs += 1
        log_path = self.logs / f"configure-{self._runs}.log"
        with log_path.open("w") as fh:
            def log(line: str) -> None:
                fh.write(line + "\n")
                fh.flush()

            kwargs.setdefault("secrets", self.secrets_file)
            result = configure(self.inventory, log=log, **kwargs)
            fh.write(summary(result) + "\n")
        result.log_path = log_path
        return result

    def wait_ssh(self, host: str, timeout: float = 180) -> None:
        """Until sshd answers on the node's published port, a command runs over SSH and systemd has booted."""
        _addr, port = self.staged.nodes[host]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                    s.settimeout(3)
                    if s.recv(8).startswith(b"SSH-") and self.ssh(host, "true", timeout=30).returncode == 0:
                        # and until systemd has finished booting (units it starts itself are not racing us)
                        self.ssh(host, "systemctl is-system-running --wait", timeout=max(30.0, timeout))
                        return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError(f"{host}: sshd did not answer on 127.0.0.1:{port} within {timeout:.0f}s")


def cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`gpucluster ARGS` as a user types it (a fresh process), output captured."""
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, env=env, check=False)


def _fresh_image_in_ci(log, suite: str | None = None) -> None:
    """CI builds the staged-node image in the same run that configures it: a cached image older than an hour
    once hid a demo that failed on every new machine (apt's cache_valid_time trusted the empty index of a
    fresh image). Outside CI the recipe-hash cache is kept (a developer's second run takes seconds)."""
    if not os.environ.get("CI"):
        return
    from gpucluster.stage.image import IMAGE_REPO, SUITE, image_ref

    ref = image_ref(suite=suite or SUITE)
    if subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0:
        log(f"CI: removing the cached image {ref} so this run builds and configures a fresh one")
        subprocess.run(["podman", "rmi", "--force", ref], check=True, capture_output=True)
    log(f"CI: {IMAGE_REPO} will be built from its recipe")


def _apt_index(handle: StagedHandle, host: str) -> dict:
    """What apt's package index looks like on a node: package lists present, and the age of the folder's
    date (the trap: an emptied index whose folder is newer than an hour looks fresh to cache_valid_time)."""
    res = handle.exec(host, "sh", "-c", "ls /var/lib/apt/lists | grep -c _Packages; "
                      "echo $(( $(date +%s) - $(stat -c %Y /var/lib/apt/lists) ))", check=True)
    lists, age = res.stdout.split()
    return {"package_lists": int(lists), "folder_age_s": int(age)}


KEEP_ENV = "GPUCLUSTER_STAGED_KEEP"


def kept_folder(folder: str) -> Path | None:
    """GPUCLUSTER_STAGED_KEEP=DIR (a developer's machine, never CI): the cluster lives under DIR/folder and stays up
    after the session; the next session reuses it without a first configure (its result is kept beside it), so
    one staged test runs in seconds. Remove it with `gpucluster stage down SPEC --state-dir DIR/folder/stage`.
    Tests that change the cluster leave their changes: run those against a fresh cluster before a push."""
    where = os.environ.get(KEEP_ENV, "").strip()
    if not where or os.environ.get("CI"):
        return None
    from gpucluster.paths import private_dir

    return private_dir(Path(where).resolve() / folder)


def _staged(tmp_path_factory: pytest.TempPathFactory, spec_path: Path, folder: str, *, apt_index: bool = False):
    """Bring up and configure the staged cluster of spec_path the way an operator sets up a fleet gpucluster
    did not stage: the containers come up, the inventory comes from `gpucluster inventory --ssh-config <the
    stage's ssh_config>`, the secrets from `gpucluster secrets --generate`, and configure runs with
    --secrets. Yields its StagedHandle; tears it down after."""
    reason = _missing_tools()
    if reason:
        skip_or_fail(reason)
    from gpucluster.cluster import load_cluster
    from gpucluster.stage.lifecycle import node_suite, stage_up

    cluster = load_cluster(spec_path)
    loaded, plan = cluster.loaded, cluster.plan
    keep = kept_folder(folder)
    base = keep or tmp_path_factory.mktemp(folder)
    state, inv_dir, logs = base / "stage", base / "inventory", base / "logs"
    cluster_state, secrets = base / "cluster-state", base / "operator" / "secrets.json"
    logs.mkdir(exist_ok=keep is not None)
    stage_log = (logs / "stage.log").open("a" if keep else "w")

    def log(m: str) -> None:
        stage_log.write(m + "\n")
        stage_log.flush()

    try:
        # kept mode reuses the first configure only while every container of that configure still exists (stopped
        # ones stage up restarts); containers stage up would create anew are unconfigured nodes
        first = base / "first-configure.pickle"  # kept mode: the first configure's result, for the tests that read it
        reused = keep is not None and first.is_file() and _containers_exist(loaded.spec.name, state, cluster)
        _fresh_image_in_ci(log, node_suite(cluster, str(spec_path)))
        staged, _stage_inventory = stage_up(str(spec_path), state=str(state), inventory=str(base / "stage-inventory"),
                                            log=log, cluster=cluster)
        if not reused:
            res = cli("inventory", str(spec_path), "-o", str(inv_dir), "--ssh-config", str(staged.ssh_config),
                      "--state-dir", str(cluster_state))
            assert res.returncode == 0, f"gpucluster inventory --ssh-config failed: {res.stderr}"
            res = cli("secrets", "--generate", "-o", str(secrets))
            assert res.returncode == 0, f"gpucluster secrets --generate failed: {res.stderr}"
        handle = StagedHandle(spec=loaded.spec, plan=plan, loaded=loaded, spec_path=spec_path,
                              inventory=inv_dir / "hosts.yml", state_dir=cluster_state, staged=staged, logs=logs,
                              secrets_file=secrets)
        if reused:
            handle.apt_before, handle.first_configure, handle._runs = pickle.loads(first.read_bytes())
            log(f"kept cluster reused from {base}: no first configure")
        else:
            if apt_index:  # what the fresh image brought, before configure fetches the package index
                handle.apt_before = {h: _apt_index(handle, h) for h in ("ctl01", "gpu01")}
            handle.first_configure = handle.configure()
            if keep and handle.first_configure.ok:
                first.write_bytes(pickle.dumps((handle.apt_before, handle.first_configure, handle._runs)))
        yield handle
    finally:
        stage_log.close()
        if not keep:  # a kept cluster stays up for the next session (kept_folder)
            _down(loaded.spec.name, state, (inv_dir, state, cluster_state, base / "stage-inventory", secrets.parent))


def _containers_exist(name: str, state: Path, cluster) -> bool:
    from gpucluster.stage.lifecycle import stage_nodes
    from gpucluster.stage.podman import StageConfig, container_name

    cfg = StageConfig(cluster=name, state_dir=state)
    return all(subprocess.run(["podman", "container", "exists", container_name(cfg, node.name)],
                              capture_output=True, check=False).returncode == 0 for node in stage_nodes(cluster))


def _down(name: str, state: Path, folders: tuple[Path, ...]) -> None:
    from gpucluster.stage.podman import StageConfig, down

    try:
        down(StageConfig(cluster=name, state_dir=state), log=lambda _m: None)
    finally:
        for d in folders:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def staged_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The configured staged cluster of examples/staging.yaml (StagedHandle, set up by _staged); torn down at
    session end."""
    yield from _staged(tmp_path_factory, SPEC, "staged", apt_index=True)


@pytest.fixture(scope="session")
def staged_trixie(tmp_path_factory: pytest.TempPathFactory):
    """The configured staged cluster of examples/staging-trixie.yaml (StagedHandle, set up by _staged): Slurm
    24.11 on Debian 13 nodes, on the production cgroup profile, with its own tmp folders, names, network and
    ports; session scope: every module of its xdist group (test_trixie.py, test_rollout_staged.py) shares it,
    brought up once by the one worker that runs that group."""
    yield from _staged(tmp_path_factory, TRIXIE_SPEC, "staged-trixie", apt_index=True)

