"""Process bookkeeping for the daemons the emulator starts.

Every process is started by us, remembered by PID, and stopped by PID: never by name, because other
engineers run their own slurmctld/slurmd/munged on the same machine. Daemons that Slurm itself forks
(slurmstepd, the job's own processes) are not our children once they double-fork, so each tracker
stamps a unique marker into the environment of what it starts; slurmd hands that environment down
to slurmstepd, and sbatch (run with the same environment) exports it to the job. On stop the
tracker finds those descendants by the marker in /proc/<pid>/environ and stops them by PID too.

Three layers make sure nothing survives: the context managers call :meth:`ProcessTracker.stop`,
an atexit hook stops every tracker still alive, and each direct child gets PR_SET_PDEATHSIG so the
kernel sends it SIGTERM if the Python process dies without running either.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MARKER_VAR = "GPUCLUSTER_EMULATE_ID"
ORDER_SLURMCTLD = 10
ORDER_SLURMD = 20
ORDER_MUNGED = 90
_PR_SET_PDEATHSIG = 1

_live: weakref.WeakSet[ProcessTracker] = weakref.WeakSet()
_live_lock = threading.Lock()


def _child_setup() -> None:  # pragma: no cover - runs in the forked child
    """New session (a terminal's Ctrl-C reaches only us, so we stop daemons in order) + PDEATHSIG."""
    os.setsid()
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class Tracked:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path | None
    order: int  # lower stops first

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class ProcessTracker:
    """Starts processes, remembers them by PID and stops all of them (and their marked descendants)."""

    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    procs: list[Tracked] = field(default_factory=list)
    stopped: bool = False

    def __post_init__(self) -> None:
        with _live_lock:
            _live.add(self)

    def __hash__(self) -> int:  # WeakSet needs hashable; identity is what we mean
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env[MARKER_VAR] = self.marker
        return env

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        log: Path | None = None,
        order: int = 50,
        cwd: Path | None = None,
    ) -> Tracked:
        if self.stopped:
            raise RuntimeError("tracker already stopped")
        env = dict(env)
        env[MARKER_VAR] = self.marker
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
        try:
            popen = subprocess.Popen(
                list(argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                preexec_fn=_child_setup,
                close_fds=True,
            )
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        t = Tracked(name=name, popen=popen, log=log, order=order)
        self.procs.append(t)
        return t

    def alive(self) -> list[Tracked]:
        return [t for t in self.procs if t.popen.poll() is None]

    def marked_pids(self) -> list[int]:
        """PIDs (other than ours) whose environment carries this tracker's marker."""
        needle = f"{MARKER_VAR}={self.marker}".encode()
        me = os.getpid()
        found: list[int] = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid == me:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            if needle in data.split(b"\0"):
                found.append(pid)
        return found

    def stop(self, grace: float = 10.0, marked_grace: float = 2.0) -> list[str]:
        """Stop everything; returns a note per process that needed SIGKILL. Safe to call twice."""
        notes: list[str] = []
        if self.stopped:
            return notes
        own = {t.pid for t in self.procs}
        # direct children in order (slurmctld, then slurmd, then munged last: they need it to talk)
        groups: dict[int, list[Tracked]] = {}
        for t in self.procs:
            groups.setdefault(t.order, []).append(t)
        for order in sorted(groups):
            batch = [t for t in groups[order] if t.popen.poll() is None]
            if order >= ORDER_SLURMD:
                # job steps and jobs that slurmd forked (marked, not ours), while slurmd still runs
                notes += _terminate_pids([p for p in self.marked_pids() if p not in own], marked_grace)
            for t in batch:
                with contextlib.suppress(ProcessLookupError):
                    t.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for t in batch:
                try:
                    t.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    notes.append(f"{t.name} (pid {t.pid}) ignored SIGTERM; killed")
                    with contextlib.suppress(ProcessLookupError):
                        t.popen.kill()
                    t.popen.wait()
        # whatever is still marked (a slurmstepd that outlived its slurmd, a job's sleep)
        notes += _terminate_pids([p for p in self.marked_pids() if p not in own], marked_grace)
        for t in self.procs:  # reap
            with contextlib.suppress(Exception):
                t.popen.wait(timeout=1)
        self.stopped = True
        return notes


def _terminate_pids(pids: Iterable[int], grace: float) -> list[str]:
    pids = list(pids)
    notes: list[str] = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    remaining = set(pids)
    while remaining and time.monotonic() < deadline:
        remaining = {p for p in remaining if _exists(p)}
        if remaining:
            time.sleep(0.05)
    for pid in remaining:
        notes.append(f"pid {pid} ignored SIGTERM; killed")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return notes


def _exists(pid: int) -> bool:
    """True while pid is a live (non-zombie) process; a zombie that is not ours cannot be reaped here."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    state = stat.rsplit(b")", 1)[1].split()[0]
    return state not in (b"Z", b"X")


def proc_status_kib(pid: int, field_name: str) -> int | None:
    """A kB field (VmHWM, VmRSS, ...) from /proc/<pid>/status."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pss_kib(pid: int) -> int | None:
    """Proportional set size (kB) from /proc/<pid>/smaps_rollup: shared pages split among sharers."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (write 5 to clear_refs, Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


@atexit.register
def _stop_all_live() -> None:
    with _live_lock:
        trackers = list(_live)
    for tracker in trackers:
        with contextlib.suppress(Exception):
            tracker.stop(grace=5.0, marked_grace=1.0)
