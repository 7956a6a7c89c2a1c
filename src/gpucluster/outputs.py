"""Write a whole set of generated files into a folder at once: a reader sees the old set or the new one.

Used by `gpucluster render` (`render.fileset.write_outputs`), and meant for every folder of generated
state: the inventory (`hosts.yml` + `group_vars/*.yml`), secrets files, the compiled state folder.

API
    write_set(folder, files, *, folder_mode=None, file_mode=None) -> Written
        files: {name: content}. A name is a relative path (`group_vars/all.yml` makes the folder);
        content is str (written as UTF-8), bytes, a callable returning an iterable of str/bytes chunks
        (streamed: a 26 MB cabling map is never held whole), or OutputFile(content, mode) for a mode
        of its own. Modes: `file_mode` for every file (secrets: 0o600), default 0o666 & ~umask;
        `folder_mode` for the folder (secrets: 0o700), default the old folder's (a new one: 0o777 & ~umask).
        Returns Written(folder, sizes, removed, kept). Raises UsageError (nothing changed) when the
        folder cannot take the set, and ValueError for a bad name (a caller's bug).
    write_file(path, content, *, mode=None) -> int
        One file replaced atomically among files that are not gpucluster's (a sibling temporary folder,
        fsync, one rename), with the same signal handling: for a single output that lives in a folder of
        the user's (an as-built topology file in the current folder), where write_set's whole-folder
        semantics would be wrong. Returns its size.
    read_manifest(folder) -> {name: sha256} of the set gpucluster last wrote there ({} if none).
    MANIFEST: the manifest's file name, `.gpucluster-manifest.json`, inside the folder.

How
    1. Survey, before anything is written: the folder must be a folder (or absent), not '/', not a system
       directory, not a mount point, with no mount point inside and at most MAX_CARRIED entries.
       Every entry is sorted: a name of the new set (replaced), a file of the previous set per the
       manifest whose content is unchanged (stale: removed), or anything else (the user's: kept).
       A folder where the new set puts a file, or the other way round, is refused.
    2. The new set is written into a private (0700) sibling folder `.<name>.gpucluster-XXXXXX`, each
       file fsync'ed; the user's files are hard-linked in (copied where links fail), their folders
       recreated with their modes; the manifest is written last.
    3. One `renameat2(RENAME_EXCHANGE)` swaps the two folders (a plain rename when the folder is new).
       Filesystems without it (NFS) get two renames with signals blocked between them.
    4. The old set, now at the sibling's name, is removed; a file a user added during the write is
       moved across first.
    SIGINT, SIGTERM and SIGHUP during 2-4 are recorded, and stop the write at its next checkpoint (between
    chunks, files and links; none between creating the sibling and remembering it, nor around the swap).
    Before the swap the old set stays, after it the new one; the sibling is removed either way, and the
    signal is then delivered as it would have been (KeyboardInterrupt, or death by the signal).

The manifest is what "files gpucluster wrote" means: a file it lists is removed when a new set no
longer has it, unless its content changed since (then it is the user's, and kept). A folder without
a manifest (an older render) loses nothing but the names the new set replaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.errors import OperationError, UsageError

MANIFEST = ".gpucluster-manifest.json"
MAX_CARRIED = 10_000  # entries of the user's in the folder; past that, -o points somewhere it should not
# Never swapped out from under the system, even when asked: '/' and the top-level system directories.
PROTECTED = frozenset({"/", "/etc", "/usr", "/var", "/boot", "/proc", "/sys", "/dev", "/run", "/tmp", "/bin",
                       "/sbin", "/lib", "/lib64", "/root", "/home", "/srv", "/opt", "/mnt", "/media"})
_VIRTUAL = ("/proc/", "/sys/", "/dev/")  # kernel file systems: nothing to render into
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_CHUNK = 1 << 20

Content = str | bytes | Callable[[], Iterable[str | bytes]]


@dataclass(frozen=True)
class OutputFile:
    """A file of the set with a mode of its own (e.g. 0o600 for a key beside public files)."""

    content: Content
    mode: int | None = None


@dataclass(frozen=True)
class Written:
    folder: Path
    sizes: dict[str, int]  # name -> bytes, in the order given
    removed: tuple[str, ...] = ()  # files of the previous set that this one no longer has
    kept: tuple[str, ...] = ()  # files that are not gpucluster's (or were edited since), carried over


def write_set(folder: str | Path, files: Mapping[str, Content | OutputFile], *, folder_mode: int | None = None,
              file_mode: int | None = None) -> Written:
    """Replace the set of files in `folder` by `files`, as one step (module docstring: how)."""
    names = _check_names(files)
    target = _target(Path(folder))
    survey = _survey(target, names)
    with _Signals() as signals, _Writer(target, _umask(), signals.check) as writer:
        sizes, _digests = writer.build(files, survey, file_mode)
        writer.swap(survey, folder_mode)
    return Written(target, sizes, tuple(sorted(survey.stale)), tuple(survey.kept))


def write_file(path: str | Path, content: Content, *, mode: int | None = None) -> int:
    """Replace one file atomically, leaving its folder's other files alone (module docstring: API)."""
    path = Path(os.path.abspath(path))
    if str(path).startswith(_VIRTUAL) or path.parent == path:
        raise UsageError(f"{path}: not a place to write a file; choose a path of your own")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a folder; give the path of a file")
    umask = _umask()
    with _Signals() as signals, _Writer(path, umask, signals.check) as writer:
        size, _digest = _write(writer.staging / path.name, content, 0o666 & ~umask if mode is None else mode,
                               signals.check)
        signals.check()  # the last point where a signal leaves the old file in place
        os.replace(writer.staging / path.name, path)
        _fsync_dir(path.parent)
    return size


def read_manifest(folder: str | Path) -> dict[str, str]:
    """{name: sha256} of the set gpucluster last wrote into `folder`; {} when there is none (or it is not ours)."""
    try:
        with open(Path(folder) / MANIFEST, "rb") as fh:
            data = json.loads(fh.read(8 << 20))
        files = data["files"]
        return {str(k): str(v["sha256"]) for k, v in files.items()} if data.get("written_by") == "gpucluster" else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


# ---- 1. survey ----------------------------------------------------------------------------------

def _check_names(files: Mapping[str, object]) -> set[str]:
    names = set()
    for name in files:
        parts = name.split("/")
        if (not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name
                or name == MANIFEST or any(len(p.encode()) > 255 for p in parts)):
            raise ValueError(f"{name!r} is not a relative file name for an output set")
        names.add(name)
    for name in names:
        for parent in _parents(name):
            if parent in names:
                raise ValueError(f"{parent!r} is both a file and the folder of {name!r}")
    return names


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _target(folder: Path) -> Path:
    target = Path(os.path.realpath(os.path.abspath(folder)))  # a symlinked folder: its target is replaced
    if str(target) in PROTECTED or target.parent == target or str(target).startswith(_VIRTUAL):
        raise UsageError(f"{folder}: gpucluster replaces its output folder as a whole; give it a folder of "
                         "its own, not a system directory")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise UsageError(f"{folder}: cannot create the output folder ({exc.strerror or exc}); "
                         "choose a writable path") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{folder}: exists and is not a folder; choose a folder path")
    if os.path.ismount(target):
        raise UsageError(f"{folder}: is a mount point, and gpucluster swaps its output folder as a whole; "
                         "write into a folder below it")
    return target


@dataclass
class _Survey:
    exists: bool = False
    st: os.stat_result | None = None
    dirs: list[tuple[str, os.stat_result]] = field(default_factory=list)  # the user's folders to recreate
    carry: list[str] = field(default_factory=list)  # the user's non-folders to link across
    kept: list[str] = field(default_factory=list)
    stale: set[str] = field(default_factory=set)
    known: set[str] = field(default_factory=set)  # every entry the survey saw (late arrivals are the rest)


def _survey(target: Path, names: set[str]) -> _Survey:
    out = _Survey()
    try:
        out.st = os.stat(target)
    except FileNotFoundError:
        return out
    out.exists = True
    ours = read_manifest(target)
    new_dirs = {p for n in names for p in _parents(n)}
    pending = [""]
    seen = 0
    nonempty: set[str] = set()
    while pending:
        rel = pending.pop()
        try:
            entries = sorted(os.scandir(target / rel if rel else target), key=lambda e: e.name)
        except OSError as exc:
            raise UsageError(f"{target / rel}: cannot read it ({exc.strerror or exc}); nothing was changed") from None
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if name == MANIFEST:
                continue
            seen += 1
            if seen > MAX_CARRIED:
                raise UsageError(f"{target}: holds more than {MAX_CARRIED:,} entries gpucluster did not write; "
                                 "give it an output folder of its own")
            st = entry.stat(follow_symlinks=False)
            if st.st_dev != out.st.st_dev:
                raise UsageError(f"{target / name}: is a mount point inside the output folder, which gpucluster "
                                 "replaces as a whole; move it, or write elsewhere")
            out.known.add(name)
            if stat.S_ISDIR(st.st_mode):
                if name in names:
                    raise UsageError(f"{target / name}: is a folder where gpucluster writes the file {name}; "
                                     "move it away (nothing was changed)")
                out.dirs.append((name, st))
                pending.append(name)
                continue
            if name in names:
                continue  # replaced by the new set
            if name in new_dirs and name not in ours:
                raise UsageError(f"{target / name}: is a file where gpucluster makes the folder {name}; "
                                 "move it away (nothing was changed)")
            if name in ours and stat.S_ISREG(st.st_mode) and _sha256(target / name) == ours[name]:
                out.stale.add(name)  # gpucluster wrote it, nobody changed it, the new set has it no more
                continue
            out.carry.append(name)
            out.kept.append(name)
            nonempty.update(_parents(name))
    # folders: recreate those that keep something of the user's, or were empty (the user made them)
    had_children = {p for name in out.known for p in _parents(name)}
    out.dirs = [(d, st) for d, st in out.dirs if d in nonempty or d not in had_children]
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---- 2-4. write, swap, clean ---------------------------------------------------------------------

class _Signalled(BaseException):
    """A deferred signal, raised at the next checkpoint: a BaseException, so no `except Exception` on the
    way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Signals:
    """While a set is written, SIGINT/SIGTERM/SIGHUP are only recorded: the writer stops at its next
    checkpoint (between chunks, files, links), so no signal can land between creating the sibling and
    remembering it, or between the swap and knowing it happened. On exit, after the cleanup, the signal
    is delivered as it would have been (SIGTERM or SIGHUP before a SIGINT that came first)."""

    def __init__(self) -> None:
        self.previous: dict[int, object] = {}
        self.fired: list[int] = []

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():  # Python runs handlers there only
            for sig in _SIGNALS:
                prev = signal.getsignal(sig)
                if prev in (signal.SIG_IGN, None):  # ignored (nohup), or set outside Python: leave it
                    continue
                self.previous[sig] = prev
                signal.signal(sig, self._record)
        return self

    def _record(self, signum: int, _frame: object) -> None:
        self.fired.append(signum)

    def check(self) -> None:
        if self.fired:
            raise _Signalled(self.fired[0])

    def __exit__(self, kind, exc, tb) -> bool:
        # Restore the handlers with the signals blocked: one that arrives meanwhile stays pending in the
        # kernel and reaches the restored handler; without the block, CPython drops a signal that trips
        # our handler but is dispatched after the default is back (a SIGTERM lost in 1 of ~1,000 kills).
        previous = self.previous
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            _dispatch()  # a signal that tripped before the block is recorded now, by our handler
            for sig, prev in previous.items():
                signal.signal(sig, prev)
            fired = list(self.fired)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if not fired:
            return False
        # a SIGTERM or SIGHUP after a SIGINT still ends the process: it goes first
        signum = next((s for s in fired if s != signal.SIGINT), fired[0])
        _deliver(signum, previous.get(signum, signal.SIG_DFL))
        raise OperationError(f"interrupted by {signal.Signals(signum).name}; "
                             + ("the new set is in place" if exc is None else "nothing was changed"))


class _Writer:
    """One write: the sibling folder and its cleanup whatever happens."""

    def __init__(self, target: Path, umask: int, check: Callable[[], None]):
        self.target = target
        self.umask = umask
        self.check = check
        self.staging: Path | None = None  # the new set before the swap, the old one after
        self.aside: Path | None = None  # the old set during a two-rename swap

    def __enter__(self) -> _Writer:
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.staging = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.gpucluster-",
                                                 dir=self.target.parent))
        except OSError as exc:
            raise UsageError(f"{self.target}: cannot create the output folder or a sibling of it "
                             f"({exc.strerror or exc}); choose a writable path") from None
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        for path in (self.staging, self.aside):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
        self.staging = self.aside = None
        if isinstance(exc, OSError):
            raise UsageError(f"{self.target}: writing failed ({exc.strerror or exc}); nothing was changed") from None
        return False

    # -- 2. write the new set beside the folder
    def build(self, files: Mapping[str, Content | OutputFile], survey: _Survey,
              file_mode: int | None) -> tuple[dict[str, int], dict[str, str]]:
        staging = self.staging
        for rel, _st in survey.dirs:  # parents first: the survey walked top-down
            (staging / rel).mkdir(parents=True, exist_ok=True)
        sizes: dict[str, int] = {}
        digests: dict[str, str] = {}
        default = 0o666 & ~self.umask
        for name, value in files.items():
            mode = file_mode if file_mode is not None else default
            if isinstance(value, OutputFile):
                value, mode = value.content, value.mode if value.mode is not None else mode
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o777 & ~self.umask)
            sizes[name], digests[name] = _write(path, value, mode, self.check)
        for rel in survey.carry:
            self.check()
            _carry(self.target / rel, staging / rel)
        manifest = {"written_by": "gpucluster", "format": 1,
                    "files": {n: {"sha256": digests[n], "size": sizes[n]} for n in files}}
        _write(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n", 0o644 & ~self.umask,
               self.check)
        for rel, st in reversed(survey.dirs):  # their modes last: a read-only folder of yours still took the files
            _own(staging / rel, st)
        for rel in sorted({p for n in files for p in _parents(n)} | {d for d, _ in survey.dirs} | {""},
                          key=len, reverse=True):
            _fsync_dir(staging / rel)
        return sizes, digests

    # -- 3. swap, 4. clean up
    def swap(self, survey: _Survey, folder_mode: int | None) -> None:
        staging, target = self.staging, self.target
        if folder_mode is not None:
            os.chmod(staging, folder_mode)
        elif survey.st is not None:
            _own(staging, survey.st)
        else:
            os.chmod(staging, 0o777 & ~self.umask)
        self.check()  # the last point where a signal leaves the old set in place
        if not survey.exists:
            try:
                os.rename(staging, target)
                self.staging = None
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        if not _exchange(staging, target):
            # no RENAME_EXCHANGE here (NFS, old kernels): two renames, with no checkpoint between them
            self.aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.gpucluster-old-", dir=target.parent))
            os.rename(target, self.aside)
            try:
                os.rename(staging, target)
            except OSError:
                os.rename(self.aside, target)
                self.aside = None
                raise
        # the old set is now at the staging (or aside) name; __exit__ removes it
        _fsync_dir(target.parent)
        self._late_arrivals(survey)

    def _late_arrivals(self, survey: _Survey) -> None:
        """Files a user put into the folder while the new set was written went into the old folder: move
        them across rather than remove them with it."""
        old = self.aside or self.staging
        for root, _dirs, names in os.walk(old):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), old)
                if rel == MANIFEST or rel in survey.known:
                    continue
                dest = self.target / rel
                with contextlib.suppress(OSError):
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if not os.path.lexists(dest):
                        os.rename(os.path.join(root, name), dest)


def _dispatch() -> None:
    """A Python-level call: the interpreter runs the handlers of signals already received on entering it."""


def _deliver(signum: int, previous: object) -> None:
    """Deliver a signal the write deferred, as the process would have received it."""
    if callable(previous):
        previous(signum, None)  # Python's SIGINT handler raises KeyboardInterrupt
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _write(path: Path, value: Content, mode: int, check: Callable[[], None]) -> tuple[int, str]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    h = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "wb") as fh:
        chunks: Iterable[str | bytes] = [value] if isinstance(value, (str, bytes)) else value()
        for chunk in chunks:
            check()
            data = chunk.encode("utf-8") if isinstance(chunk, str) else chunk
            fh.write(data)
            h.update(data)
            size += len(data)
        fh.flush()
        os.fchmod(fh.fileno(), mode)
        os.fsync(fh.fileno())
    return size, h.hexdigest()


def _carry(src: Path, dst: Path) -> None:
    """The user's file into the new folder: the same inode where a hard link works (nothing copied, nothing
    lost), else a copy with its metadata; a symbolic link stays a link."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except OSError:
        pass
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode):
        shutil.copy2(src, dst, follow_symlinks=False)
    else:
        raise UsageError(f"{src}: cannot carry it into the new output folder (not a regular file, and hard "
                         "links fail here); move it away (nothing was changed)")


def _own(path: Path, st: os.stat_result) -> None:
    os.chmod(path, stat.S_IMODE(st.st_mode))
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
        os.chown(path, st.st_uid, st.st_gid)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    _renameat2.restype = ctypes.c_int


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE). False where the system lacks it."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


__all__ = ["MANIFEST", "MAX_CARRIED", "OutputFile", "Written", "read_manifest", "write_file", "write_set"]
