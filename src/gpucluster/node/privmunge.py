"""A private munged for one health run's scontrol calls, when the node's own munged does not answer.

Why: a node whose munged died is exactly a node that must be drained, but scontrol on it cannot get a
credential, and slurmd never gets slurmctld's health-check RPC either (it cannot verify it). Restarting
the node's munged would hide the fault; asking another host needs credentials this node must not hold.
So the runner starts a munged of its own with the node's own key (the key slurmctld already trusts), on
a socket nobody else uses, points scontrol at it for this run's calls, and stops it before the run ends.

Where: a fresh folder under /run/gpucluster/health (root's, never a shared /tmp path), made by mkdtemp,
given to the key's owner (munged refuses a key owned by anyone but the user it runs as, and runs as
the owner here as the munge unit does) with mode 0711: munged refuses a socket folder that is not
searchable by all ("Socket is inaccessible: execute permissions for all required"), so 0700 cannot
work; 0711 lets no one list or add files, and the socket itself is 0777 by munged's design, as the
node's own one is (a credential always carries the connecting user's uid, so it grants nothing the
system munged does not). scontrol finds the socket through a private slurm.conf that includes the
node's own and sets AuthInfo=socket= (a later AuthInfo wins; its other options are kept).

Standard library only: this file runs on nodes that have python3, not gpucluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket as _socket
import stat
import subprocess
import tempfile
import time

BASE = "/run/gpucluster/health"
KEY = "/etc/munge/munge.key"
SLURM_CONFS = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")  # Debian's path; configless cache
PREFIX = "munge-"
STALE_S = 120  # a folder older than this is a killed run's (a run lasts at most Slurm's 60 s)
# What scontrol prints when it cannot get a credential from munged (Slurm's auth/munge plugin), e.g.
# "error: Munge encode failed: Failed to access "/run/munge/munge.socket.2": No such file or directory".
_NO_CREDENTIAL = re.compile(r"munge encode failed|if munged is up", re.IGNORECASE)


class PrivateMungeError(Exception):
    """The private munged could not be started; the message says why, for the state file."""


def munge_failure(scontrol_text: str) -> bool:
    """Whether scontrol failed because it could not get a credential here (not because slurmctld said no)."""
    return bool(_NO_CREDENTIAL.search(scontrol_text or ""))


def node_slurm_conf(env: dict) -> str | None:
    """The slurm.conf scontrol reads on this node: $SLURM_CONF, else Debian's path, else configless' cache."""
    for path in (env.get("SLURM_CONF"), *SLURM_CONFS):
        if path and os.path.isfile(path):
            return path
    return None


def auth_info(conf_text: str, socket: str) -> str:
    """The AuthInfo value for the private slurm.conf: the node's own options with socket= replaced."""
    options: list[str] = []
    for line in conf_text.splitlines():
        m = re.match(r"\s*AuthInfo\s*=\s*(\S+)", line, re.IGNORECASE)
        if m:
            options = [o for o in m.group(1).split(",") if o and not o.lower().startswith("socket=")]
    return ",".join([f"socket={socket}", *options])


def private_base(base: str) -> str:
    """The folder the private munged folders go in: made if missing; refused unless it is a real folder of
    this user that no one else may write (every folder above a munged socket must be searchable by all)."""
    if not os.path.isdir(base):
        os.makedirs(base, mode=0o755, exist_ok=True)
        os.chmod(base, 0o755)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PrivateMungeError(f"{base} is not a private folder (owner uid {st.st_uid}, mode "
                                f"{stat.S_IMODE(st.st_mode):04o}): it must be a folder of uid {os.geteuid()} "
                                "that others cannot write")
    return base


def _munged_pid(folder: str) -> int | None:
    """The pid of the munged serving `folder`, from its pid file, if that process still is that munged."""
    try:
        with open(os.path.join(folder, "munged.pid")) as fh:
            pid = int(fh.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if "munged" in cmdline and folder in cmdline else None


def remove_leftovers(base: str, now: float | None = None) -> list[str]:
    """Folders (and their munged) left by runs that were killed before they could stop them."""
    now = time.time() if now is None else now
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(base, name)
        try:
            st = os.lstat(folder)
        except OSError:
            continue
        if not name.startswith(PREFIX) or not stat.S_ISDIR(st.st_mode) or now - st.st_mtime < STALE_S:
            continue
        pid = _munged_pid(folder)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _answers(path: str) -> bool:
    """Whether something listens on the Unix socket (munged binds before it listens)."""
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
        s.settimeout(1)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def _tail(path: str, limit: int = 200) -> str:
    try:
        with open(path, errors="replace") as fh:
            lines = [line.strip() for line in fh if line.strip()]
    except OSError:
        return ""
    return " ".join(lines[-1:])[-limit:]


class PrivateMunged:
    """`with PrivateMunged(key, slurm_conf) as env:` runs scontrol with `env` (SLURM_CONF) through a munged of
    its own; the munged is stopped and its folder removed on leaving, whatever happened."""

    def __init__(self, key: str = KEY, slurm_conf: str | None = None, base: str = BASE, timeout: float = 3.0,
                 munged: str | None = None) -> None:
        self.key, self.slurm_conf, self.base, self.timeout = key, slurm_conf, base, timeout
        self.munged = munged or shutil.which("munged") or "/usr/sbin/munged"
        self.folder: str | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def socket(self) -> str:
        assert self.folder is not None
        return os.path.join(self.folder, "munge.socket")

    def start(self) -> dict[str, str]:
        if not self.slurm_conf:
            raise PrivateMungeError("no slurm.conf found for scontrol ($SLURM_CONF, " + ", ".join(SLURM_CONFS) + ")")
        try:
            key = os.stat(self.key)
        except OSError as exc:
            raise PrivateMungeError(f"{self.key}: {exc.strerror}") from None
        if not os.access(self.munged, os.X_OK):
            raise PrivateMungeError(f"{self.munged} not found (package munge)")
        base = private_base(self.base)
        remove_leftovers(base)
        self.folder = tempfile.mkdtemp(prefix=PREFIX, dir=base)
        euid = os.geteuid()
        as_owner: dict = {}
        if key.st_uid != euid:
            if euid != 0:
                raise PrivateMungeError(f"{self.key} belongs to uid {key.st_uid}; munged must run as that user, "
                                        f"and uid {euid} cannot start it so")
            as_owner = {"user": key.st_uid, "group": key.st_gid, "extra_groups": []}
            os.chown(self.folder, key.st_uid, key.st_gid)
        os.chmod(self.folder, 0o711)
        log = os.path.join(self.folder, "munged.log")
        argv = [self.munged, "--foreground", f"--socket={self.socket}", f"--key-file={self.key}",
                f"--pid-file={self.folder}/munged.pid", f"--log-file={log}", f"--seed-file={self.folder}/munged.seed"]
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, cwd="/", start_new_session=True,
                                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, **as_owner)
        except OSError as exc:
            self.stop()
            raise PrivateMungeError(f"cannot start munged: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.timeout
        while not _answers(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = _tail(log) or (self.proc.stderr.read() if self.proc.poll() is not None else "")
                self.stop()
                raise PrivateMungeError(f"munged did not start within {self.timeout:g}s: "
                                        f"{' '.join(str(why).split())[:200] or 'no message'}")
            time.sleep(0.02)
        with open(self.slurm_conf, errors="replace") as fh:
            node_conf = fh.read()
        conf = os.path.join(self.folder, "slurm.conf")
        with open(conf, "w") as fh:
            fh.write("# gpucluster-health: this node's munged did not answer, so this run's scontrol calls go through\n"
                     "# a private munged with the node's own key (docs/health.md). Removed when the run ends.\n"
                     f"Include {self.slurm_conf}\nAuthInfo={auth_info(node_conf, self.socket)}\n")
        os.chmod(conf, 0o644)
        return {"SLURM_CONF": conf}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:  # munged exits at once on SIGTERM; the run's last second is kept for this (runner.STOP_RESERVE_S)
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=1)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> dict[str, str]:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()
