"""Real Slurm of each major line gpucluster claims, runnable on one Debian 12 machine.

22.05 is the host's own Debian 12 packages. Newer lines come from Debian roots built with
`debootstrap --variant=minbase --include=slurmctld,slurmd,slurm-client,munge SUITE` from the mirror the host's
apt sources name (trixie ships 24.11, sid 26.05), and run through `chroot` on loopback. slurmd is there for
the emulator's `slurmd -N NAME` nodes (Debian builds Slurm with --enable-multiple-slurmd on every line:
the host's 22.05 and both roots' slurmd take -N). A root is built
once and cached by the hash of its recipe, like the staged-node image (stage/image.py): an unchanged
recipe is never rebuilt. The cache lives in a per-user folder (0700, owner-checked), never in /tmp.

A root's daemons run in a private mount namespace (`unshare --mount`) where /proc is mounted and the
host's /etc/hosts is bound over the root's own, so nothing is mounted in the cached root for longer
than one process lives, and two runs never see each other's mounts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

from gpucluster.errors import OperationError
from gpucluster.paths import locked

Log = Callable[[str], None]

# The major lines gpucluster starts a real slurmctld of, and where each comes from. None: the host's
# own packages (Debian 12). The suite's Slurm was measured (trixie 24.11.5, sid 26.05.5); a root whose
# slurmctld reports another line is refused at build time, so a suite moving on is noticed, not hidden.
LINES: dict[str, str | None] = {"22.05": None, "24.11": "trixie", "26.05": "sid"}
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# Bump when the build procedure changes in a way the recipe text does not show.
RECIPE_VERSION = 3
CACHE_ENV = "GPUCLUSTER_CACHE_DIR"

# Run in a private mount namespace: mount /proc, bind the host's /etc/hosts (node and controller names
# resolve as on the host), then become the program inside the root. Same PID all the way (unshare and
# sh exec), so the caller's process tracking and signals reach the daemon itself.
_ENTER = ('r="$1"; shift; mount -t proc proc "$r/proc" && mount --bind /etc/hosts "$r/etc/hosts" '
          '&& exec chroot "$r" "$@"')


class RootError(OperationError):
    """A Slurm root could not be built, or does not hold the Slurm line it was built for."""


def verifier_line(version: tuple[int, int] | str) -> str:
    """The claimed line whose slurmctld checks a render for `version`: the oldest line not older
    than it (a slurmctld reads the configs of the releases before it; 25.05 and 25.11 renders run
    on 26.05)."""
    v = _tuple(version)
    for line in sorted(LINES, key=_tuple):
        if _tuple(line) >= v:
            return line
    raise ValueError(f"no claimed Slurm line reads {version}; newest is {max(LINES, key=_tuple)}")


def _tuple(version: tuple[int, int] | str) -> tuple[int, int]:
    if isinstance(version, tuple):
        return version
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@dataclass(frozen=True)
class Runtime:
    """Where one Slurm line's programs run: on the host (root None) or inside a cached Debian root.

    Paths the daemons see are inner paths; `host_path` maps them to where this process reads and
    writes them. line None: whatever Slurm the host has, unchecked (the harness's default)."""

    line: str | None = None
    root: Path | None = None

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` (a Slurm or munge program and its arguments) here."""
        if self.root is None:
            return [_find(Path("/"), argv[0]), *argv[1:]]
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _ENTER, "sh",
                str(self.root), _find(self.root, argv[0]), *argv[1:]]

    def tmp_base(self) -> Path:
        """Where private work folders go: /tmp as the daemons see it."""
        return self.root / "tmp" if self.root is not None else Path(tempfile.gettempdir())

    def inner_path(self, host: Path) -> PurePosixPath:
        if self.root is None:
            return PurePosixPath(host)
        return PurePosixPath("/") / Path(host).relative_to(self.root)

    def host_path(self, inner: PurePosixPath | str) -> Path:
        if self.root is None:
            return Path(inner)
        return self.root / str(inner).lstrip("/")

    @property
    def where(self) -> str:
        return "the host's packages" if self.root is None else f"the Debian root {self.root.name}"

    def version(self) -> str:
        """The full Slurm version slurmctld reports (e.g. 26.05.5)."""
        return _reported_version(self)

    def check(self) -> None:
        """The line this runtime was chosen for must be the one its slurmctld reports."""
        got = self.version()
        if self.line is not None and not got.startswith(self.line + "."):
            raise RootError(f"Slurm line {self.line} runs from {self.where}, whose slurmctld reports {got}; "
                            f"update gpucluster.emulate.roots.LINES to the suite that ships {self.line}")


@cache
def _reported_version(rt: Runtime) -> str:
    res = subprocess.run(rt.argv(["slurmctld", "-V"]), capture_output=True, text=True, timeout=60, check=False)
    m = re.search(r"(\d+\.\d+\.\d+)", res.stdout + res.stderr)
    if res.returncode != 0 or not m:
        raise RootError(f"slurmctld -V failed in {rt.where} (status {res.returncode}): "
                        f"{(res.stderr or res.stdout).strip()[-400:]}")
    return m.group(1)


def _find(root: Path, name: str) -> str:
    """A program's absolute path as seen inside `root` (daemons live in sbin, which a user's PATH may
    lack); the name itself when it is nowhere, so the error names it."""
    if name.startswith("/"):
        return name
    if root == Path("/") and shutil.which(name):
        return str(shutil.which(name))
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if (root / d.lstrip("/") / name).exists():
            return f"{d}/{name}"
    return name


def runtime(line: str, *, log: Log = print) -> Runtime:
    """The runtime of a claimed line, building (once) and caching its root when it needs one."""
    if line not in LINES:
        raise RootError(f"Slurm line {line} is not one gpucluster runs; choose one of {', '.join(LINES)}")
    suite = LINES[line]
    rt = Runtime(line) if suite is None else Runtime(line, ensure_root(suite, log=log))
    rt.check()
    return rt


# ---- the cache ------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """$GPUCLUSTER_CACHE_DIR/slurm-roots, else $XDG_CACHE_HOME/gpucluster/slurm-roots, else
    ~/.cache/gpucluster/slurm-roots; made 0700 and refused when another user owns it or others may
    write it (a root that others can change would run as root here)."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpucluster")
    folder = Path(base) / "slurm-roots"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise RootError(f"{folder}: cannot create the Slurm root cache ({exc.strerror or exc}); "
                        f"set {CACHE_ENV} to a writable folder") from None
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise RootError(f"{folder}: not a folder owned by this user; remove it or set {CACHE_ENV} elsewhere")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(folder, 0o700)
    return folder


def recipe(suite: str) -> str:
    """Everything a root is made from, as text; its sha256[:12] names the cached root. The mirror is part
    of it (a different mirror may serve other builds) but the text itself is never written anywhere."""
    from gpucluster.aptsources import debian_mirror

    return "\n".join([
        f"gpucluster slurm root recipe v{RECIPE_VERSION}",
        f"debootstrap --variant=minbase --include={','.join(PACKAGES)} {suite}",
        f"mirror {debian_mirror().uri}",
        "placeholder /etc/hosts (the host's is bound over it at run time)",
        "no apt sources, package lists or bootstrap log kept",
    ])


def root_name(suite: str, text: str | None = None) -> str:
    text = recipe(suite) if text is None else text
    return f"{suite}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def ensure_root(suite: str, *, log: Log = print) -> Path:
    """The cached root for `suite`, built first when the cache lacks it (about a minute, once)."""
    folder = cache_dir()
    name = root_name(suite)
    root = folder / name
    if (root / ".complete").is_file():
        return root
    with locked(folder / f".{suite}.lock"):
        if (root / ".complete").is_file():  # another process built it while we waited
            return root
        _build(suite, root, log)
    _prune(folder, suite, keep=name, log=log)
    return root


def _build(suite: str, root: Path, log: Log) -> None:
    for tool in ("debootstrap", "unshare", "chroot"):
        if shutil.which(tool) is None:
            raise RootError(f"building the Slurm {suite} root needs '{tool}': run scripts/setup.sh")
    if os.geteuid() != 0:
        raise RootError(f"building the Slurm {suite} root needs root (debootstrap, chroot)")
    from gpucluster.aptsources import debian_mirror

    work = root.with_name(f"{root.name}.build-{os.getpid()}")
    _remove(work)
    started = time.monotonic()
    log(f"slurm roots: building {root.name} (debootstrap {suite} minbase with {', '.join(PACKAGES)} from "
        "the host's apt mirror; about a minute, once, then cached by recipe hash)")
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "debootstrap", "--variant=minbase",
           f"--include={','.join(PACKAGES)}", suite, str(work), debian_mirror().uri]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        if res.returncode != 0:
            raise RootError(f"debootstrap {suite} failed with status {res.returncode}:\n"
                            + "\n".join((res.stdout + res.stderr).strip().splitlines()[-20:]))
        (work / "etc" / "hosts").touch()
        # The root never runs apt: drop the sources, package lists and log debootstrap left (they name
        # the mirror, which nothing here may keep).
        (work / "etc" / "apt" / "sources.list").unlink(missing_ok=True)
        (work / "var" / "log" / "bootstrap.log").unlink(missing_ok=True)
        for leftover in [*(work / "var/lib/apt/lists").glob("*"), *(work / "var/cache/apt").glob("*.bin")]:
            if leftover.is_file():
                leftover.unlink()
        # Debian starts daemons at install only under systemd/init; a chroot has none. Nothing to stop.
        rt = Runtime(None, work)
        version = _reported_version(rt)
        (work / ".complete").write_text(f"slurm {version}\nbuilt in {time.monotonic() - started:.0f} s\n")
        os.rename(work, root)
    except BaseException:
        _remove(work)
        raise
    log(f"slurm roots: {root.name} ready (Slurm {version}) after {time.monotonic() - started:.0f} s")


def _prune(folder: Path, suite: str, *, keep: str, log: Log) -> None:
    """Older roots of the same suite (a changed recipe) are removed: each is ~300 MB."""
    for old in folder.glob(f"{suite}-*"):
        if old.name != keep and old.is_dir() and ".build-" not in old.name:
            log(f"slurm roots: removing the outdated root {old.name}")
            _remove(old)


def _remove(path: Path) -> None:
    """Never rm -rf through a mount: refuse while anything below `path` is mounted."""
    if not path.exists():
        return
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    inside = [m for m in mounts if m == str(path) or m.startswith(str(path) + "/")]
    if inside:
        raise RootError(f"{path}: not removed, still mounted: {', '.join(inside)}")
    shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    """Build (once) and check every line's Slurm: what scripts/setup.sh runs so tests find them cached."""
    failed = 0
    for line, suite in LINES.items():
        try:
            rt = runtime(line, log=lambda m: print(m, flush=True))
        except (RootError, OSError) as exc:
            print(f"slurm roots: {line}: {exc}", flush=True)
            failed += 1
            continue
        where = "the host's packages" if suite is None else f"Debian {suite} root {rt.root}"
        print(f"slurm roots: {line}: slurmctld {rt.version()} from {where}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
