"""Run the checks over SSH from this machine: pytest on checks/, hosts spread over pytest-xdist workers.

pytest runs as a subprocess of this interpreter (`python -m pytest`), so the checks see a clean
interpreter, xdist can start its workers, and a crash in a check never takes the CLI down with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHECKS_DIR = Path(__file__).resolve().parent / "checks"


@dataclass
class PytestRun:
    rc: int
    junit: Path
    log: Path


def default_workers(hosts: int) -> int:
    """I/O-bound (SSH round trips), so more workers than cores pays, up to one per host."""
    return max(1, min(hosts, 2 * (os.cpu_count() or 2), 32))


def pytest_command(expect: Path, hosts: list[str], workers: int, junit: Path, control_dir: str,
                   suite_name: str = "ssh", extra: list[str] | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", str(CHECKS_DIR), f"--rootdir={CHECKS_DIR}", "-c",
           str(CHECKS_DIR / "pytest.ini"), f"--gpc-expect={expect}", f"--gpc-hosts={','.join(hosts)}",
           f"--gpc-control-dir={control_dir}", f"--junitxml={junit}", "-o", f"junit_suite_name={suite_name}",
           "-q", "-rN", "--tb=short", "--no-header"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadscope"]  # scoped by host: checks/conftest.py
    else:
        cmd += ["-p", "no:xdist"]
    return cmd + list(extra or [])


def counts_of(progress_file: Path) -> dict[str, int]:
    """passed/failed/skipped so far, from the checks' progress file (checks/conftest.py)."""
    out = {"passed": 0, "failed": 0, "skipped": 0}
    try:
        for line in progress_file.read_text().splitlines():
            outcome = line.split(" ", 1)[0]
            out[outcome] = out.get(outcome, 0) + 1
    except OSError:
        pass
    return out


def run_pytest(expect: Path, hosts: list[str], workers: int, workdir: Path, *, stream: bool = False,
               extra: list[str] | None = None, suite_name: str = "ssh",
               on_progress: Callable[[dict[str, int]], None] | None = None) -> PytestRun:
    """pytest on the checks; `on_progress(counts)` is called about twice a second while it runs."""
    junit = workdir / f"junit-{suite_name}.xml"
    log = workdir / f"pytest-{suite_name}.log"
    progress_file = workdir / f"progress-{suite_name}"
    progress_file.write_text("")
    control_dir = tempfile.mkdtemp(prefix="gpcv-", dir="/tmp")  # short: unix socket paths max 108 bytes
    try:
        cmd = pytest_command(expect, hosts, workers, junit, control_dir, suite_name, extra)
        cmd.append(f"--gpc-progress={progress_file}")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        with log.open("w") as fh:
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            if stream:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        stdin=subprocess.DEVNULL, env=env, cwd=str(workdir))
                assert proc.stdout is not None
                for line in proc.stdout:
                    sys.stdout.write(line)
                    fh.write(line)
                rc = proc.wait()
            else:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=str(workdir))
                while True:
                    try:
                        rc = proc.wait(timeout=0.5)
                        break
                    except subprocess.TimeoutExpired:
                        if on_progress is not None:
                            on_progress(counts_of(progress_file))
                if on_progress is not None:
                    on_progress(counts_of(progress_file))
    finally:
        close_masters(control_dir)
    return PytestRun(rc=rc, junit=junit, log=log)


def close_masters(control_dir: str) -> None:
    """Stop the SSH master connections the workers shared (else they linger ControlPersist seconds)."""
    for sock in Path(control_dir).glob("*"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "gpucluster-validate"],
                           capture_output=True, timeout=10, check=False)
    shutil.rmtree(control_dir, ignore_errors=True)
