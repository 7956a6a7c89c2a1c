"""One staged cluster of examples/staging.yaml for the whole test session, configured once.

Fixture API (session scope; other test files reuse it, so it stays small):

    def test_x(staged_cluster):                  # a StagedHandle
        c = staged_cluster
        c.spec, c.plan                           # the spec model and its plan (expected values come from here)
        c.spec_path                              # examples/staging.yaml (absolute)
        c.inventory                              # Path of the inventory's hosts.yml (its folder: c.inventory.parent)
        c.state_dir                              # the staged cluster's state folder (keys, secrets/, rendered/)
        c.staged                                 # gpucluster.stage.podman.StagedCluster (ports, ssh_config, containers)
        c.first_configure                        # ConfigureResult of the configure run made at setup
        c.hosts("slurm_compute")                 # inventory hosts of a contract group, sorted
        c.ssh("ctl01", "sinfo -N")               # CompletedProcess: a shell command over SSH as root
        c.exec("gpu01", "systemctl", "is-active", "slurmd")   # CompletedProcess: podman exec (no sshd needed)
        c.configure()                            # run `gpucluster configure` again; returns a ConfigureResult
        c.container("gpu01")                     # podman container name of a node
        c.wait_ssh("gpu04")                      # after `podman start`: sshd answers and systemd has booted
        c.logs                                   # folder with stage.log and configure-N.log

Setup stages the cluster with a state folder and inventory folder under pytest's tmp path (so CI
and a developer's own cluster never share names, networks or ports), runs configure once, and
yields even when that configure failed (test_cluster.py::test_first_configure_converged reports
it; check c.first_configure.ok before relying on services). Teardown removes the containers,
network and files, also after failures or Ctrl-C.

Needs root, podman and runc (scripts/stage-deps.sh). Without them the tests skip with the reason,
except in CI (env CI set), where they fail: CI runs everything it can.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "staging.yaml"


def pytest_collection_modifyitems(config, items):
    """Tests marked `disruptive` (they stop a node or a daemon) run after every other test of the
    session, so a node that comes back in a worse state cannot fail checks that have nothing to do
    with it. Among themselves they run by rank, `disruptive(2)` (a whole node stopped) after
    `disruptive` (rank 1: a daemon stopped or a key changed, then restored); ties keep their order."""
    last = [item for item in items if item.get_closest_marker("disruptive")]
    last.sort(key=lambda item: (item.get_closest_marker("disruptive").args or (1,))[0])
    if last:
        items[:] = [item for item in items if not item.get_closest_marker("disruptive")] + last


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


@pytest.fixture(scope="session")
def staged_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The configured staged cluster of examples/staging.yaml (StagedHandle); torn down at session end."""
    reason = _missing_tools()
    if reason:
        skip_or_fail(reason)
    from gpucluster.cluster import load_cluster
    from gpucluster.stage.lifecycle import stage_up
    from gpucluster.stage.podman import StageConfig, down

    cluster = load_cluster(SPEC)
    loaded, plan = cluster.loaded, cluster.plan
    base = tmp_path_factory.mktemp("staged")
    state, inv_dir, logs = base / "state", base / "inventory", base / "logs"
    logs.mkdir()
    stage_log = (logs / "stage.log").open("w")
    handle = None
    try:
        staged, inventory = stage_up(str(SPEC), state=str(state), inventory=str(inv_dir),
                                     log=lambda m: (stage_log.write(m + "\n"), stage_log.flush()))
        handle = StagedHandle(spec=loaded.spec, plan=plan, loaded=loaded, spec_path=SPEC, inventory=inventory,
                              state_dir=state, staged=staged, logs=logs)
        handle.first_configure = handle.configure()
        yield handle
    finally:
        stage_log.close()
        try:
            down(StageConfig(cluster=loaded.spec.name, state_dir=state), log=lambda _m: None)
        finally:
            shutil.rmtree(inv_dir, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)
