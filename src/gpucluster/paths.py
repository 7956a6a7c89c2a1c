"""Where gpucluster finds what it does not ship inside the package: the Ansible project (ansible.cfg,
playbooks/, roles/, plugins/), the example specs and the Pulumi project.

One documented setting, GPUCLUSTER_HOME: a gpucluster checkout (or an unpacked release of one).
Without it, the checkout this package runs from, when it runs from one, else the current folder.
Templates are package data (gpucluster/templates): `check`, `plan` and `render` need nothing here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from gpucluster.errors import UsageError

SETTING = "GPUCLUSTER_HOME"
_CHECKOUT = Path(__file__).resolve().parents[2]  # src/gpucluster/paths.py -> the checkout's root


def _is_home(path: Path) -> bool:
    return (path / "ansible.cfg").is_file() and (path / "playbooks" / "site.yml").is_file()


def home(given: str | os.PathLike | None = None) -> Path | None:
    """The gpucluster project folder: `given`, $GPUCLUSTER_HOME, this checkout, or the current folder."""
    for candidate in (given, os.environ.get(SETTING), _CHECKOUT, Path.cwd()):
        if candidate and _is_home(Path(candidate)):
            return Path(candidate).resolve()
    return None


def ansible_dir(given: str | os.PathLike | None = None) -> Path:
    """The folder holding ansible.cfg, playbooks/ and roles/; a UsageError says how to point at one."""
    found = home(given)
    if found is None:
        raise UsageError(f"cannot find playbooks/site.yml and ansible.cfg: set {SETTING} to a gpucluster checkout "
                         "(or pass --project-dir), or run from one")
    return found


def roles_dir() -> Path | None:
    found = home()
    return found / "roles" if found else None


def examples_dir() -> Path:
    found = home()
    return (found or _CHECKOUT) / "examples"


def pulumi_project() -> Path | None:
    """The folder holding Pulumi.yaml: this checkout, or $GPUCLUSTER_HOME."""
    for candidate in (os.environ.get(SETTING), _CHECKOUT):
        if candidate and (Path(candidate) / "Pulumi.yaml").is_file():
            return Path(candidate).resolve()
    return None


def state_home() -> Path:
    """Where per-cluster state lives by default: $XDG_STATE_HOME/gpucluster, else ~/.local/state/gpucluster.
    Never inside a checkout, never a shared /tmp path."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpucluster"


def state_dir(cluster: str, given: str | os.PathLike | None = None) -> Path:
    """A cluster's state folder (compiled files, Ansible runs, secrets): `given`, else state_home()/<cluster>."""
    return Path(given).expanduser().absolute() if given else state_home() / cluster


def unsafe_ancestor(path: str | os.PathLike) -> str | None:
    """None when no one but this user and root can replace `path` by renaming a folder above it; else why
    not, naming the folder. Each ancestor (of the absolute path, not resolved) must be a plain folder, not a
    link, owned by root or this user, and not writable by others unless sticky (/tmp: others cannot rename
    what is ours there). A link is refused: give the real path."""
    p = Path(os.path.abspath(path))
    me = os.geteuid()
    for folder in reversed(p.parents):
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            return None  # it is created below a folder that passed
        except OSError as exc:
            return f"{folder}: cannot check it ({exc.strerror or exc})"
        if stat.S_ISLNK(st.st_mode):
            return (f"{folder} is a link (to {os.path.realpath(folder)}): whoever can change it decides where "
                    "the folder is; give the real path")
        if not stat.S_ISDIR(st.st_mode):
            return f"{folder} is not a folder"
        if st.st_uid not in (0, me):
            return f"{folder} belongs to uid {st.st_uid}, who can replace what is in it"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (f"{folder} can be written by other users (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit): "
                    "they can swap what lies under it")
    return None


# Folders of the operating system: never a private folder of gpucluster's, whoever runs it (as root, closing /etc
# to 0700 would lock every other user and service out of it). The first set with everything under it.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr")
SYSTEM_DIRS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv", "/tmp", "/var", "/var/lib",
               "/var/tmp", "/var/log", "/run/user")


def system_folder(path: str | os.PathLike) -> str | None:
    """The system folder `path` is, or lies under (SYSTEM_TREES), or None."""
    text = os.path.normpath(os.path.abspath(path))
    if text in SYSTEM_DIRS or text in SYSTEM_TREES:
        return text
    return next((d for d in SYSTEM_TREES if text.startswith(d + "/")), None)


def private_dir(path: str | os.PathLike, *, what: str = "state folder") -> Path:
    """Create `path` (0700) or check the one there: a real folder (not a link), owned by this user, that no
    one else can write. Anything else is refused, since whoever controls such a folder can feed Ansible
    variables or swap the cluster's files. Every folder above it is checked too (unsafe_ancestor). A folder
    of ours that others can only read (0755, as an older gpucluster made its cache) is closed to 0700 on
    the way."""
    p = Path(path)
    system = system_folder(p)
    if system:
        raise UsageError(f"{p}: the {what} would be the system folder {system} or lie inside it; choose a folder of "
                         "its own, e.g. under your home or /var/lib/gpucluster")
    why = unsafe_ancestor(p)
    if why:
        raise UsageError(f"{p}: the {what} is not private: {why}; choose a path under your home, or fix the "
                         "folder's owner and mode")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=0o700)
        st = os.lstat(p)
    except OSError as exc:
        raise UsageError(f"{p}: cannot create the {what} ({exc.strerror or exc}); choose a writable path") from None
    check_private_dir(p, st, what)
    if st.st_mode & 0o077:
        os.chmod(p, 0o700)
    return p


def check_private_dir(p: Path, st: os.stat_result, what: str, *,
                      plain_fix: str = "; remove it or choose another path",
                      owner_fix: str = "; another user could change what runs: remove it, or choose another path",
                      ) -> None:
    """The rule of a private folder, on the lstat `st` of the folder `p` (the `what`): a plain folder, not a
    link, this user's, that no one else can write. Anything else is a UsageError; `plain_fix` and `owner_fix`
    end the message for a link or file and for another owner (each with its leading separator)."""
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{p}: the {what} is not a plain folder (a link or a file){plain_fix}")
    if st.st_uid != os.geteuid():
        raise UsageError(f"{p}: the {what} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}){owner_fix}")
    if st.st_mode & 0o022:
        raise UsageError(f"{p}: the {what} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                         f"check what is in it, then run chmod 700 {p}")


def read_regular(path: str | os.PathLike, limit: int, *, follow_links: bool = True) -> tuple[bytes, os.stat_result]:
    """(the bytes, the stat of the file they came from) of a regular file of at most `limit` bytes. A FIFO,
    a device (/dev/zero), a socket or a folder is refused without blocking (opened O_NONBLOCK, checked by
    fstat on the open file, so what is checked is what is read); without `follow_links` a link is refused too
    (ELOOP). Raises OSError whose errno and strerror say why (EINVAL: not a regular file; EFBIG: too large)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags if follow_links else flags | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device, socket or folder)")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        return b"".join(chunks), st
    finally:
        os.close(fd)


def cache_dir(*parts: str) -> Path:
    """A private folder under $GPUCLUSTER_CACHE_DIR, else $XDG_CACHE_HOME/gpucluster, else
    ~/.cache/gpucluster, made 0700 and checked (private_dir)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(os.environ.get("GPUCLUSTER_CACHE_DIR") or Path(base) / "gpucluster")
    private_dir(folder, what="cache folder")
    for part in parts:
        folder = private_dir(folder / part, what="cache folder")
    return folder


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive flock on PATH (created if missing) for the block: one builder of a shared cache
    entry at a time. PATH belongs in a private folder (cache_dir), never in the shared /tmp."""
    with Path(path).open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
