#!/usr/bin/python3
"""gpucluster-pull: a node converges itself from the cluster's compiled bundle (docs/roles.md, "Converging a fleet").

One file, gpucluster.node.pullrunner in the repository: the pull_runner role copies it as it is to
/usr/local/sbin/gpucluster-pull (by push once, then from each bundle a node converges to). Python's standard
library only: it runs before anything else the bundle brings. Its commands:

  gpucluster-pull store HASH < BUNDLE.tar.gz    on a bundle server (the Slurm controller): check the bundle
                                                against HASH and publish it where nodes fetch it
  gpucluster-pull run --hash HASH --url URL --host NAME [--tags T] [--skip-tags T] [--check] [--diff] [--full]
                                                on a node: fetch the bundle HASH from URL (unless it is cached),
                                                check it, run its playbook locally for NAME, print one JSON line
  gpucluster-pull store-pointer < SIGNED.json   on a bundle server: check the operator's signed pointer (which
                                                bundle the fleet converges to) and publish it
  gpucluster-pull timer --url URL --host NAME   on a node, from gpucluster-pull.timer: fetch the signed pointer;
                                                a new one, signed by the cluster's key, runs that bundle as `run`
                                                would, and the result goes back to the server (PUT /results/NAME)
  gpucluster-pull serve --port P                on a bundle server: serve the bundles and the pointer, and take
                                                each node's result (only from that node's own address)
  gpucluster-pull results [--serial N]          on a bundle server: the nodes' last results, one JSON line each

Why a signed pointer for the timer: the fan-out sends HASH over SSH, which authenticates the operator. A timer
has no operator on the line, and the bundle server is plain HTTP. So the operator signs {bundle, serial} with
the cluster's own key (ssh-keygen -Y sign, generated once in the operator's private folder); the node verifies
it against the public key push installed (/etc/gpucluster/allowed_signers) and refuses any serial older than
one it has seen (a replayed pointer cannot roll a node back). The bundle is then checked against the signed
hash, as in `run`.

The fast no-op (the way `ansible-pull --only-if-changed` and Chef-style agents skip a converge, but able to see
drift): after a successful full run of bundle H, the node keeps H and a manifest of what that run manages (every
path a file task reported, with its sha256, mode and owner, and the services the roles keep running; the list
comes from the run itself, the gpucluster_manifest callback the bundle carries). The next `run --hash H` verifies
the manifest instead of running Ansible, and reports "unchanged". Any mismatch, another hash, no manifest, or
--full runs the roles. What the manifest does not cover (packages, command tasks, files a task did not name)
is trusted: a periodic --full catches it (docs/roles.md, "Converging a fleet").

Why the hash is checked here, on the node: the operator sends HASH over SSH (authenticated), the bundle comes
over plain HTTP from the controller; a bundle whose MANIFEST does not hash to HASH, or whose files do not match
the MANIFEST, or that holds a file the MANIFEST does not list, is refused before anything of it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import http.server
import io
import json
import os
import re
import selectors
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor

WORK = "/var/lib/gpucluster/pull"          # this node's cache of checked bundles and its last result (0700)
PUBLISHED = "/srv/gpucluster-bundles"      # what a bundle server serves (no secrets: bundles carry none)
KEEP = 3                                   # bundles kept in the cache (the current one and the two before)
HASH_RE = re.compile(r"^[0-9a-f]{64}\Z")
RECAP_RE = re.compile(r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
                      r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)")
MAX_BYTES = 256 * 1024 * 1024             # a bundle as fetched (gzip); about 2 MiB in practice
MAX_MEMBER = 64 * 1024 * 1024              # one file of a bundle, uncompressed
MAX_TOTAL = 256 * 1024 * 1024              # all files of a bundle, uncompressed (about 15 MiB in practice)
MAX_MEMBERS = 20000                        # files and folders of a bundle (about 1,200 in practice)
MAX_HEADER = 64 * 1024                     # one extended (pax) or long-name tar header
FETCH_DEADLINE = 600.0                     # seconds for a whole bundle fetch, however the server dribbles
POINTER_DEADLINE = 60.0                    # seconds for the pointer fetch
APPLIED = "applied.json"                   # under WORK: the last full run's bundle and manifest (0600)
CALLBACK_DIR = "roles/pull_runner/files/callback_plugins"  # in the bundle: the manifest callback
PREFORK_DIR = "plugins/callback"           # in the bundle: gpucluster_prefork (Jinja plugins loaded before forks)
CALLBACKS = "gpucluster_manifest,gpucluster_prefork"
SYSTEMCTL = "systemctl"
MANIFEST_VERSION = 1
POINTER = "current.signed"                 # under PUBLISHED: the operator's signed pointer (JSON envelope)
POINTER_VERSION = 2                        # 2: names its cluster, expires, lists its hosts
MAX_POINTER = 4 * 1024 * 1024              # a pointer with a host list of 25,000 names is about 400 KiB
SIGNERS = "/etc/gpucluster/allowed_signers"  # the cluster's bundle-signing public key, installed by push
SIGN_NAMESPACE = "gpucluster-bundle"       # ssh-keygen -Y namespace and principal: a key signs only pointers
TIMER_STATE = "timer.json"                 # under WORK: the newest serial seen, the last one converged (0600)
RESULTS = "/var/lib/gpucluster-results"    # on a bundle server: one result per node, written by `serve`
MAX_RESULT = 64 * 1024
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")
CLUSTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key"  # signs this node's results: only root reads it
SERVER_WORKERS = 16                        # threads answering whole requests (serve --workers)
SERVER_MAX_CONNECTIONS = 1024              # connections waiting for their request at once (serve --max-connections)
SERVER_TIMEOUT = 10.0                      # seconds for a request to arrive whole, and for each send (serve --timeout)
MAX_HEAD = 16 * 1024                       # a request's line and headers
SEND_RATE = 64 * 1024                      # bytes a second a client must at least read a bundle at
SSH_KEYGEN = "ssh-keygen"
RETRY_AFTER = 600                          # seconds before a timer tries a pointer again after a failed run


class Refused(Exception):
    """The bundle is not the one asked for, or not well-formed: nothing of it runs."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _private(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class _Capped:
    """A reader that refuses to give more than `limit` bytes in all: the uncompressed side of a bundle, so a gzip
    bomb (or a stream of headers) costs at most `limit` bytes of reading, never memory beyond one chunk."""

    def __init__(self, inner, limit: int, what: str) -> None:
        self.inner, self.limit, self.what, self.count = inner, limit, what, 0

    def read(self, size: int = -1) -> bytes:
        allowance = self.limit - self.count + 1
        if size is None or size < 0 or size > allowance:
            size = allowance
        data = self.inner.read(size)
        self.count += len(data)
        if self.count > self.limit:
            raise Refused(f"{self.what}: more than {self.limit} bytes")
        return data


class _Header(tarfile.TarInfo):
    """A tar header whose extended (pax) or long-name data is read into memory only when it is small."""

    def _proc_member(self, tar):  # tarfile's own hook: runs before that data is read
        if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                         tarfile.GNUTYPE_LONGLINK) and self.size > MAX_HEADER:
            raise Refused(f"an extended tar header of {self.size} bytes (at most {MAX_HEADER})")
        return super()._proc_member(tar)


def _member_path(member: tarfile.TarInfo) -> str:
    """The member's name when it is a plain relative file or folder; Refused otherwise."""
    name = member.name
    parts = name.rstrip("/").split("/") if member.isdir() else name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name or any(p in ("", ".", "..") for p in parts)
            or member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)):
        raise Refused(f"member {name[:200]!r} is not a plain relative file or folder")
    return name


def _unpack_stream(raw, want: str, dest: str) -> None:
    manifest = None
    digests: dict[str, str] = {}
    count = total = 0
    os.makedirs(dest, mode=0o700)
    plain = _Capped(gzip.GzipFile(fileobj=raw, mode="rb"), MAX_TOTAL + MAX_MEMBERS * 1024 + 65536,
                    "the bundle once uncompressed")
    with tarfile.open(fileobj=plain, mode="r|", tarinfo=_Header) as tar:
        for member in tar:
            count += 1
            if count > MAX_MEMBERS:
                raise Refused(f"more than {MAX_MEMBERS} members")
            name = _member_path(member)
            if member.isdir():
                continue  # the node makes its own folders, 0700
            if name in digests:
                raise Refused(f"member {name[:200]!r} appears twice")
            if member.size > MAX_MEMBER:
                raise Refused(f"member {name[:200]!r} is {member.size} bytes (at most {MAX_MEMBER})")
            total += member.size
            if total > MAX_TOTAL:
                raise Refused(f"members larger than {MAX_TOTAL} bytes in all")
            path = os.path.join(dest, name)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            digest = hashlib.sha256()
            source = tar.extractfile(member)
            kept = []
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                while source is not None:
                    block = source.read(1 << 20)
                    if not block:
                        break
                    digest.update(block)
                    fh.write(block)
                    if name == "MANIFEST":
                        kept.append(block)
            digests[name] = digest.hexdigest()
            if name == "MANIFEST":
                manifest = b"".join(kept)
    if manifest is None:
        raise Refused("no MANIFEST")
    got = digests.pop("MANIFEST")
    if got != want:
        raise Refused(f"MANIFEST hashes to {got}, not {want}")
    listed: dict[str, str] = {}
    for line in manifest.decode().splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or not HASH_RE.match(digest) or name in listed:
            raise Refused(f"MANIFEST line {line[:120]!r} is not 'SHA256  PATH'")
        listed[name] = digest
    if set(listed) != set(digests):
        extra, missing = sorted(set(digests) - set(listed)), sorted(set(listed) - set(digests))
        raise Refused(f"files not in MANIFEST {extra[:5]}, missing {missing[:5]}")
    for name, digest in digests.items():
        if digest != listed[name]:
            raise Refused(f"{name}: sha256 differs from MANIFEST")


def unpack_checked(data, want: str, dest: str) -> None:
    """Unpack the tar.gz `data` (bytes, or a path to it) into the new folder `dest` when it is exactly the bundle
    `want`: regular files and folders only, relative paths without '..', every file listed in MANIFEST with its
    sha256, nothing more, and sha256(MANIFEST) == want. Read as a stream with its limits checked while reading
    (MAX_MEMBER per file, MAX_TOTAL in all, MAX_MEMBERS, MAX_HEADER), so a bomb costs bounded memory and disk;
    nothing is left in `dest` unless every check passed."""
    try:
        raw = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else open(data, "rb")  # noqa: SIM115
        with raw:
            _unpack_stream(raw, want, dest)
    except BaseException as exc:
        if os.path.isdir(dest):
            shutil.rmtree(dest, ignore_errors=True)
        if isinstance(exc, (tarfile.TarError, EOFError, zlib.error, UnicodeError, ValueError)) or (
                isinstance(exc, OSError) and not isinstance(exc, Refused)):
            raise Refused(f"not a well-formed bundle ({type(exc).__name__}: {str(exc)[:200]})") from None
        raise


def _download(url: str, out, limit: int, seconds: float) -> int:
    """Copy `url` into the file `out` as it arrives: Refused past `limit` bytes or `seconds` in all (a server
    that sends one byte a minute cannot hold a tick); each read waits at most 30 s. The bytes copied."""
    deadline = time.monotonic() + seconds
    size = 0
    with urllib.request.urlopen(url, timeout=min(30.0, seconds)) as resp:
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > limit:
            raise Refused(f"{url}: {length} bytes, more than {limit}")
        while True:
            if time.monotonic() > deadline:
                raise Refused(f"{url}: not fetched within {seconds:.0f} s")
            chunk = resp.read1(1 << 16)
            if not chunk:
                return size
            size += len(chunk)
            if size > limit:
                raise Refused(f"{url}: larger than {limit} bytes")
            out.write(chunk)


def _fetch(url: str, limit: int | None = None, seconds: float | None = None) -> bytes:
    """`url`'s body in memory, for small things (the pointer): at most `limit` bytes within `seconds`."""
    buf = io.BytesIO()
    _download(url, buf, MAX_POINTER if limit is None else limit, POINTER_DEADLINE if seconds is None else seconds)
    return buf.getvalue()


def bundle_dir(want: str, url: str) -> tuple[str, bool]:
    """The checked, unpacked bundle `want` in the cache: (folder, fetched now)."""
    root = _private(os.path.join(_private(WORK), "bundles"))
    dest = os.path.join(root, want)
    if os.path.isfile(os.path.join(dest, "MANIFEST")):
        return dest, False
    tmp = tempfile.mkdtemp(prefix=".new-", dir=root)
    try:
        archive = os.path.join(tmp, "bundle.tar.gz")
        fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            _download(f"{url.rstrip('/')}/{want}.tar.gz", fh, MAX_BYTES, FETCH_DEADLINE)
        unpack_checked(archive, want, os.path.join(tmp, "tree"))
        os.rename(os.path.join(tmp, "tree"), dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    old = sorted((e for e in os.scandir(root) if e.is_dir() and HASH_RE.match(e.name) and e.name != want),
                 key=lambda e: e.stat().st_mtime, reverse=True)
    for entry in old[KEEP - 1:]:
        shutil.rmtree(entry.path, ignore_errors=True)
    return dest, True


def _changed_tasks(output: str) -> list[str]:
    """`role : task` of every task that reported changed (the default callback prints only those with
    display_ok_hosts off)."""
    out, task = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line[line.index("[") + 1:line.rindex("]")] if "]" in line else line
        elif line.startswith("changed: ") and task not in out:
            out.append(task)
    return out


def file_state(path: str) -> dict:
    """What the manifest keeps of one managed path: its kind, and for a file its sha256, for a link its target;
    mode and owner for all but a missing path (a task may manage a path by removing it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"kind": "absent"}
    entry: dict = {"mode": oct(stat.S_IMODE(st.st_mode)), "uid": st.st_uid, "gid": st.st_gid}
    if stat.S_ISLNK(st.st_mode):
        entry.update(kind="link", target=os.readlink(path))
    elif stat.S_ISDIR(st.st_mode):
        entry["kind"] = "dir"
    elif stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        entry.update(kind="file", sha256=digest.hexdigest())
    else:
        entry["kind"] = "other"
    return entry


def _write_private(path: str, data: dict) -> None:
    part = path + ".part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, sort_keys=True, indent=1)
    os.replace(part, path)


def record_manifest(host: str, want: str, listing_path: str) -> dict:
    """After a successful full run of `want`: the manifest of what it manages, from the callback's listing,
    each path as it is now (after the handlers)."""
    with open(listing_path) as fh:
        listing = json.load(fh)
    files = {path: {**file_state(path), "task": task} for path, task in sorted(listing.get("files", {}).items())}
    manifest = {"version": MANIFEST_VERSION, "host": host, "bundle": want, "recorded": int(time.time()),
                "files": files, "services": dict(sorted(listing.get("services", {}).items()))}
    _write_private(os.path.join(WORK, APPLIED), manifest)
    return manifest


def forget_manifest() -> None:
    """Before any run that changes the node other than a full run of the recorded bundle (or that may fail half
    way): the manifest no longer describes the node, so nothing may skip on it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(WORK, APPLIED))


def inactive(services: list[str]) -> list[str]:
    """Those of `services` that systemd does not report active (one systemctl call for all)."""
    if not services:
        return []
    try:
        proc = subprocess.run([SYSTEMCTL, "is-active", "--", *services], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"{s} (systemctl: {exc})" for s in services]
    states = proc.stdout.split()
    if len(states) != len(services):
        return [f"{s} (systemctl is-active: {proc.stdout.strip() or proc.stderr.strip()})" for s in services]
    return [f"{s} ({state})" for s, state in zip(services, states, strict=True) if state != "active"]


def verify_manifest(host: str, want: str) -> tuple[dict | None, list[str]]:
    """(what was verified, []) when the node still is as the last full run of `want` left it; otherwise
    (None, why not): no manifest, another bundle or host, or every path and service that differs."""
    try:
        with open(os.path.join(WORK, APPLIED)) as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        return None, ["no manifest (no full run recorded here)"]
    except (OSError, ValueError) as exc:
        return None, [f"manifest unreadable: {exc}"]
    if manifest.get("version") != MANIFEST_VERSION or manifest.get("host") != host:
        return None, [f"manifest of {manifest.get('host')!r}, version {manifest.get('version')}"]
    if manifest.get("bundle") != want:
        return None, [f"new bundle (last applied {str(manifest.get('bundle'))[:12]})"]
    problems = []
    for path, entry in manifest.get("files", {}).items():
        now = file_state(path)
        for key in ("kind", "sha256", "target", "mode", "uid", "gid"):
            if entry.get(key) != now.get(key):
                problems.append(f"{path}: {key} {now.get(key)} (was {entry.get(key)})")
                break
    services = sorted(manifest.get("services", {}))
    problems += [f"service {s}" for s in inactive(services)]
    if problems:
        return None, problems
    return {"files": len(manifest.get("files", {})), "services": len(services)}, []


def run(args: argparse.Namespace, folder: str | None = None) -> dict:
    """Skip when the manifest of `args.hash` verifies (unless --full); otherwise fetch, check and run the bundle
    (`folder`: an unpacked bundle to run instead, for tests)."""
    started = time.monotonic()
    result: dict = {"host": args.host, "bundle": args.hash, "changed": None, "failed": None, "rc": None}
    try:
        if not HASH_RE.match(args.hash):
            raise Refused(f"--hash {args.hash!r} is not a sha256")
        if not getattr(args, "full", False):
            verified, why = verify_manifest(args.host, args.hash)
            if verified is not None:
                result.update(changed=0, failed=0, rc=0, unchanged=True, verified=verified, changes=[],
                              seconds=round(time.monotonic() - started, 2))
                return result
            result["drift"] = why[:8] + ([f"... {len(why) - 8} more"] if len(why) > 8 else [])
        else:
            result["drift"] = ["--full"]
        if folder is None:
            folder, fetched = bundle_dir(args.hash, args.url)
        else:
            fetched = False
        result["fetched"] = fetched
        full = not (args.tags or args.skip_tags or args.check)
        if not args.check:
            forget_manifest()
        listing = os.path.join(_private(WORK), "manifest-listing.json")
        if os.path.exists(listing):
            os.unlink(listing)
        secrets = _private(os.path.join(WORK, "no-secrets"))  # a pull carries no secrets; munge stays push
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
               "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": os.path.join(folder, "python"),
               "ANSIBLE_CONFIG": os.path.join(folder, "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_LOCAL_TEMP": _private(os.path.join(WORK, "tmp")),
               # bytecode outside the checked folder, kept between runs (the runner is Ansible itself)
               "PYTHONPYCACHEPREFIX": _private(os.path.join(WORK, "pycache")),
               # what the run manages, listed by the run itself (the bundle's gpucluster_manifest callback)
               "ANSIBLE_CALLBACK_PLUGINS": f"{os.path.join(folder, CALLBACK_DIR)}:{os.path.join(folder, PREFORK_DIR)}",
               "ANSIBLE_CALLBACKS_ENABLED": CALLBACKS, "GPUCLUSTER_MANIFEST_OUT": listing}
        argv = [sys.executable, "-m", "ansible.cli.playbook", "-i", os.path.join(folder, "inventory", "hosts.yml"),
                os.path.join(folder, "playbooks", "site.yml"), "--connection", "local", "--limit", args.host,
                "-e", f"gpucluster_state_dir={folder}", "-e", f"gpucluster_secrets_dir={secrets}",
                "-e", "ansible_python_interpreter=/usr/bin/python3"]
        # munge's key is a secret; the bundle-signing key's public half is the node's trust anchor: push only
        skip = ",".join(t for t in ("munge", "signing", args.skip_tags) if t)
        argv += ["--skip-tags", skip]
        if args.tags:
            argv += ["--tags", args.tags]
        if args.check:
            argv.append("--check")
        if args.diff:
            argv.append("--diff")
        proc = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True, check=False)
        log = os.path.join(WORK, "last.log")
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(proc.stdout + proc.stderr)
        result["rc"] = proc.returncode
        recap = [m for m in (RECAP_RE.match(line) for line in proc.stdout.splitlines()) if m]
        mine = [m for m in recap if m.group("host") == args.host]
        if mine:
            m = mine[-1]
            result.update(ok=int(m.group("ok")), changed=int(m.group("changed")),
                          failed=int(m.group("failed")) + int(m.group("unreachable")))
        else:
            result.update(changed=0, failed=1)
        result["changes"] = _changed_tasks(proc.stdout)
        if proc.returncode != 0:
            text = (proc.stdout + proc.stderr).splitlines()
            tail = [ln for ln in text if ln.startswith(("fatal:", "ERROR", "[ERROR"))]
            result["error"] = " | ".join(tail[-3:])[-1500:] or f"ansible-playbook exited {proc.returncode} ({log})"
        elif full and result.get("failed") == 0:
            manifest = record_manifest(args.host, args.hash, listing)
            result["recorded"] = {"files": len(manifest["files"]), "services": len(manifest["services"])}
    except Refused as exc:
        result.update(failed=1, changed=0, error=f"bundle refused: {exc}")
    except Exception as exc:  # every failure ends in a result the operator sees, never a traceback
        result.update(failed=1, changed=0, error=f"{type(exc).__name__}: {str(exc)[:500]}")
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def store(args: argparse.Namespace) -> int:
    """Check a bundle read from stdin (as a node will, streamed, with the same limits) and publish it."""
    if not HASH_RE.match(args.hash):
        print(f"gpucluster-pull store: {args.hash!r} is not a sha256", file=sys.stderr)
        return 2
    target = os.path.join(PUBLISHED, f"{args.hash}.tar.gz")
    os.makedirs(PUBLISHED, mode=0o755, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=PUBLISHED, prefix=".part-")
    try:
        size = 0
        with os.fdopen(fd, "wb") as fh:
            for block in iter(lambda: sys.stdin.buffer.read(1 << 20), b""):
                size += len(block)
                if size > MAX_BYTES:
                    raise Refused(f"larger than {MAX_BYTES} bytes")
                fh.write(block)
        with tempfile.TemporaryDirectory(dir=_private(WORK)) as tmp:
            unpack_checked(part, args.hash, os.path.join(tmp, "check"))
    except Refused as exc:
        os.unlink(part)
        print(f"gpucluster-pull store: refused: {exc}", file=sys.stderr)
        return 1
    except BaseException:
        os.unlink(part)
        raise
    os.chmod(part, 0o644)
    os.replace(part, target)
    print(json.dumps({"stored": args.hash, "bytes": size}))
    return 0


def _json(data: bytes | str, what: str):
    """Parsed JSON, or Refused: malformed, or nested too deep for Python (a hostile document)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Refused(f"{what} is not JSON ({type(exc).__name__}: {str(exc)[:120]})") from None


def verify_pointer(envelope: bytes, signers: str, cluster: str, now: float | None = None,
                   fresh: bool = True) -> dict:
    """The pointer inside `envelope` ({"pointer": JSON text, "signature": ssh-keygen -Y signature}) when the
    cluster's key signed it, it names `cluster`, it has not expired (unless `fresh` is false: the server reading
    the serial it published) and it is well-formed; Refused otherwise. Nothing in it is trusted before that."""
    outer = _json(envelope, "pointer envelope")
    if not isinstance(outer, dict) or not isinstance(outer.get("pointer"), str) \
            or not isinstance(outer.get("signature"), str):
        raise Refused("pointer envelope unreadable: not {\"pointer\": TEXT, \"signature\": TEXT}")
    text, signature = outer["pointer"], outer["signature"]
    if not os.path.isfile(signers):
        raise Refused(f"{signers} is missing: install the cluster's signing key by push "
                      "(gpucluster configure INVENTORY --push --tags pull)")
    with tempfile.TemporaryDirectory(dir=_private(WORK)) as tmp:
        sig = os.path.join(tmp, "pointer.sig")
        with open(sig, "w") as fh:
            fh.write(signature)
        try:
            proc = subprocess.run([SSH_KEYGEN, "-Y", "verify", "-f", signers, "-I", SIGN_NAMESPACE,
                                   "-n", SIGN_NAMESPACE, "-s", sig], input=text.encode(), capture_output=True,
                                  timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Refused(f"ssh-keygen -Y verify: {exc}") from None
    if proc.returncode != 0:
        why = " ".join((proc.stderr or proc.stdout).decode(errors="replace").split())[-300:]
        raise Refused(f"pointer signature does not verify against {signers}: {why}")
    pointer = _json(text, "signed pointer")
    if not isinstance(pointer, dict) or pointer.get("version") != POINTER_VERSION:
        raise Refused(f"pointer version {pointer.get('version') if isinstance(pointer, dict) else None}, "
                      f"not {POINTER_VERSION} (published by an older gpucluster: publish it again)")
    if not isinstance(pointer.get("bundle"), str) or not HASH_RE.match(pointer["bundle"]):
        raise Refused("pointer bundle is not a sha256")
    for key in ("serial", "expires"):
        if not isinstance(pointer.get(key), int) or isinstance(pointer[key], bool) or pointer[key] < 1:
            raise Refused(f"pointer {key} is not a positive integer")
    hosts = pointer.get("hosts")
    if not (isinstance(hosts, list) and all(isinstance(h, str) and HOST_RE.match(h) for h in hosts)):
        raise Refused("pointer hosts is not a list of host names")
    if not isinstance(pointer.get("full", False), bool):
        raise Refused("pointer full is not true or false")
    if pointer.get("cluster") != cluster:
        raise Refused(f"pointer is for cluster {str(pointer.get('cluster'))[:64]!r}, this node is in {cluster!r}")
    now = time.time() if now is None else now
    if fresh and pointer["expires"] <= now:
        raise Refused(f"pointer expired {int(now - pointer['expires'])} s ago "
                      f"({time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(pointer['expires']))}): publish a new "
                      "one (gpucluster configure INVENTORY --pull --trigger timer)")
    return pointer


def _claimed_serial(envelope: bytes) -> int | None:
    """The serial a refused pointer claims (unverified): only so the operator finds the refusal among the results
    of that serial (gpucluster-pull results --serial N)."""
    try:
        serial = json.loads(json.loads(envelope)["pointer"]).get("serial")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return serial if isinstance(serial, int) and not isinstance(serial, bool) else None


def _timer_state() -> dict:
    try:
        with open(os.path.join(WORK, TIMER_STATE)) as fh:
            state = json.load(fh)
        return state if isinstance(state, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError):
        return {}


def result_namespace(cluster: str) -> str:
    """The ssh-keygen -Y namespace of a node's signed result: what it is (a pull result) and for which cluster,
    so no other signature a host key makes can pass for one (gpucluster.configure.pull checks the same)."""
    return f"gpucluster-result@{cluster}"


def sign_result(result: dict, host_key: str, cluster: str) -> bytes:
    """The body a node sends: {"result": JSON text, "signature": ssh-keygen -Y sign of it with this node's SSH
    host key}. Only root reads that key, so a user's job on the node cannot send a result the operator accepts
    (the operator verifies it against the host key in its known_hosts). Unsigned, with why, when signing fails."""
    text = json.dumps(result, sort_keys=True)
    envelope: dict = {"result": text, "signature": ""}
    with tempfile.TemporaryDirectory(dir=_private(WORK)) as tmp:
        path = os.path.join(tmp, "result.json")
        with open(path, "w") as fh:
            fh.write(text)
        try:
            proc = subprocess.run([SSH_KEYGEN, "-q", "-Y", "sign", "-f", host_key, "-n", result_namespace(cluster),
                                   path], capture_output=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
            if proc.returncode == 0:
                with open(path + ".sig") as fh:
                    envelope["signature"] = fh.read()
            else:
                envelope["unsigned"] = " ".join(proc.stderr.decode(errors="replace").split())[-300:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            envelope["unsigned"] = f"ssh-keygen -Y sign: {exc}"[:300]
    return json.dumps(envelope, sort_keys=True).encode()


def report(url: str, host: str, body: bytes) -> str:
    """PUT this node's signed result (sign_result) to the bundle server; '' or why it could not."""
    req = urllib.request.Request(f"{url.rstrip('/')}/results/{host}", data=body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read(MAX_RESULT)
    except OSError as exc:
        return f"result not reported to {url}: {exc}"
    return ""


def _refused(state: dict, digest: str, result: dict, why: str) -> dict:
    """A refused pointer: its result, and the same pointer not looked at again for RETRY_AFTER seconds."""
    state.update(failed_envelope=digest, failed_at=time.time())
    _write_private(os.path.join(_private(WORK), TIMER_STATE), state)
    result["error"] = f"pointer refused: {why}"
    return result


def timer(args: argparse.Namespace, folder: str | None = None) -> dict | None:
    """One tick of gpucluster-pull.timer: None when there is nothing to do (no pointer, or the pointer this node
    already converged to); otherwise the result of running the pointed bundle, also sent to the server."""
    state = _timer_state()
    try:
        envelope = _fetch(f"{args.url.rstrip('/')}/{POINTER}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None  # nothing published for the timer yet
        raise
    digest = _sha256(envelope)
    if digest == state.get("done_envelope"):
        return None  # the idle tick: the same pointer, already converged (no signature check, no Ansible)
    if digest == state.get("failed_envelope") and time.time() - float(state.get("failed_at") or 0) < RETRY_AFTER:
        return None  # refused, or its run failed, a moment ago: not again at every tick
    result: dict = {"host": args.host, "changed": 0, "failed": 1, "rc": None, "trigger": "timer", "bundle": ""}
    try:
        pointer = verify_pointer(envelope, args.signers, args.cluster)
    except Refused as exc:
        result["serial"] = _claimed_serial(envelope)
        return _refused(state, digest, result, str(exc))
    serial = pointer["serial"]
    result.update(serial=serial, bundle=pointer["bundle"])
    seen = int(state.get("seen") or 0)
    if serial < seen:
        return _refused(state, digest, result, f"serial {serial} is older than {seen}, the newest this node has "
                                               "seen (a replayed or rolled-back pointer)")
    if args.host not in pointer["hosts"]:
        state.update(seen=serial, done_envelope=digest)
        _write_private(os.path.join(_private(WORK), TIMER_STATE), state)
        return None  # published for other hosts (a --limit): nothing for this one
    state["seen"] = serial
    _write_private(os.path.join(_private(WORK), TIMER_STATE), state)
    run_args = argparse.Namespace(hash=pointer["bundle"], url=args.url, host=args.host, tags="", skip_tags="",
                                  check=False, diff=False, full=bool(pointer.get("full")))
    result = {**run(run_args, folder), "serial": serial, "trigger": "timer"}
    if result.get("failed") == 0 and result.get("rc") == 0:
        state.update(done=serial, done_envelope=digest, failed_envelope=None, failed_at=None)
    else:  # tried again RETRY_AFTER seconds later, and at once for a newer pointer
        state.update(failed_envelope=digest, failed_at=time.time())
    _write_private(os.path.join(WORK, TIMER_STATE), state)
    return result


def store_pointer(args: argparse.Namespace) -> int:
    """Publish the operator's signed pointer (read from stdin) after checking it as a node will (signature,
    cluster, expiry), and only when its serial is newer than the one published."""
    envelope = sys.stdin.buffer.read(MAX_POINTER + 1)
    if len(envelope) > MAX_POINTER:
        print(f"gpucluster-pull store-pointer: larger than {MAX_POINTER} bytes", file=sys.stderr)
        return 2
    try:
        pointer = verify_pointer(envelope, args.signers, args.cluster)
        target = os.path.join(PUBLISHED, POINTER)
        try:
            with open(target, "rb") as fh:
                current = verify_pointer(fh.read(MAX_POINTER + 1), args.signers, args.cluster, fresh=False)["serial"]
        except (FileNotFoundError, Refused):
            current = 0
        if pointer["serial"] <= current:
            raise Refused(f"serial {pointer['serial']} is not newer than the published {current}")
        if not os.path.isfile(os.path.join(PUBLISHED, f"{pointer['bundle']}.tar.gz")):
            raise Refused(f"bundle {pointer['bundle'][:12]} is not stored here (gpucluster-pull store it first)")
    except Refused as exc:
        print(f"gpucluster-pull store-pointer: refused: {exc}", file=sys.stderr)
        return 1
    os.makedirs(PUBLISHED, mode=0o755, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=PUBLISHED, prefix=".part-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(envelope)
    os.chmod(part, 0o644)
    os.replace(part, target)
    print(json.dumps({"pointer": pointer["bundle"], "serial": pointer["serial"]}))
    return 0


def _addresses(host: str) -> set[str]:
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return set()


def _plain_address(address: str) -> str:
    """An IPv4 client of an IPv6 socket as its IPv4 address (::ffff:10.0.0.7 is 10.0.0.7)."""
    return address[7:] if address.startswith("::ffff:") and "." in address else address


def _complete(buf: bytes) -> bool:
    """Whether `buf` holds a whole request (its head and the body its Content-Length announces), or as much as
    the server will ever read of one (a head past MAX_HEAD, a body past MAX_RESULT: answered without the rest)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return len(buf) > MAX_HEAD
    match = re.search(rb"(?im)^content-length:[ \t]*([0-9]{1,12})[ \t]*\r?$", buf[:end])
    if not match or int(match.group(1)) > MAX_RESULT:
        return True
    return len(buf) >= end + 4 + int(match.group(1))


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request, already read whole by the server's I/O thread: GET of a published name, PUT of a result.
    One request per connection (HTTP/1.0), so a client cannot keep a worker."""

    server_version = "gpucluster-pull"
    sys_version = ""

    def __init__(self, conn: socket.socket, address, server: BundleServer, request: bytes) -> None:
        self._request_bytes = request
        super().__init__(conn, address, server)

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._request_bytes)
        self.wfile = self.connection.makefile("wb", buffering=0)

    def finish(self) -> None:
        self.wfile.close()

    def handle(self) -> None:
        self.handle_one_request()

    def do_GET(self) -> None:
        name = self.path[1:]
        if not (name == POINTER or (name.endswith(".tar.gz") and HASH_RE.match(name[:-len(".tar.gz")]))):
            self.send_error(404, "only the published bundles and pointer")
            return
        try:
            fd = os.open(os.path.join(self.server.directory, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            self.send_error(404, "not published")
            return
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                self.send_error(404, "not published")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            # a client that reads slower than SEND_RATE is cut off, so a slow reader holds a worker a bounded time
            deadline = time.monotonic() + self.server.timeout + size / SEND_RATE
            for block in iter(lambda: fh.read(1 << 16), b""):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{name}: not read within {self.server.timeout + size / SEND_RATE:.0f} s")
                self.connection.settimeout(min(self.server.timeout, left))
                self.connection.sendall(block)

    def do_PUT(self) -> None:
        host = self.path[len("/results/"):] if self.path.startswith("/results/") else ""
        if not HOST_RE.match(host) or host not in self.server.names():
            # only a host of the published pointer, by its inventory name: one result file per host, whatever
            # spelling of an address or name a client tries
            self.send_error(404, "PUT /results/NAME, NAME a host of the published pointer")
            return
        try:
            size = int(self.headers.get("Content-Length", "-1"))
        except ValueError:
            size = -1
        if size < 0 or size > MAX_RESULT:
            self.send_error(413, f"a result is at most {MAX_RESULT} bytes, with a Content-Length")
            return
        body = self.rfile.read(size)
        if len(body) != size:
            self.send_error(400, "the body is shorter than its Content-Length")
            return
        if _plain_address(self.client_address[0]) not in _addresses(host):
            self.send_error(403, f"{self.client_address[0]} is not an address of {host}")
            return
        try:
            envelope = _json(body, "the result")
            if not (isinstance(envelope, dict) and isinstance(envelope.get("result"), str)
                    and isinstance(envelope.get("signature"), str)
                    and isinstance(envelope.get("unsigned", ""), str)
                    and set(envelope) <= {"result", "signature", "unsigned"}):
                raise Refused("not {\"result\": TEXT, \"signature\": TEXT}")
            inner = _json(envelope["result"], "the result text")
            if not isinstance(inner, dict) or inner.get("host") != host:
                raise Refused("the result does not name NAME as its host")
        except Refused as exc:
            self.send_error(400, str(exc)[:200])
            return
        record = {**envelope, "host": host, "received": time.time()}
        fd, part = tempfile.mkstemp(dir=self.server.results, prefix=".part-")
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, sort_keys=True)
        os.chmod(part, 0o644)
        os.replace(part, os.path.join(self.server.results, f"{host}.json"))  # the latest result per host only
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args) -> None:
        pass  # a fleet's ticks would flood the journal; errors still go through log_error

    def log_error(self, format: str, *args) -> None:
        sys.stderr.write(f"{self.client_address[0]} {(format % args)!r}\n")


class BundleServer:
    """The bundle server: GET serves the published bundles and the pointer (nothing secret), 404 for anything
    else; PUT /results/NAME takes one signed result of at most MAX_RESULT bytes, only for a host the published
    pointer names and only from an address that name resolves to, into results/NAME.json.

    One I/O thread reads every request whole (a connection costs no thread while it is idle or trickling), then
    hands it to a pool of `workers` threads. A request must arrive whole within `timeout` seconds of the
    connection, or the connection is closed (slowloris). At most `max_connections` wait for their request at
    once; one more closes the oldest of them, so a flood of idle connections cannot keep a new one out: a real
    client sends its request as it connects and leaves the waiting list at once."""

    def __init__(self, port: int, directory: str, results: str, bind: str, workers: int = SERVER_WORKERS,
                 max_connections: int = SERVER_MAX_CONNECTIONS, timeout: float = SERVER_TIMEOUT) -> None:
        if not bind:
            raise ValueError("the bundle server needs an address to bind (--bind)")
        family, kind, proto, _name, address = socket.getaddrinfo(
            bind, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST | socket.AI_PASSIVE)[0]
        self.socket = socket.socket(family, kind, proto)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(address)
        self.socket.listen(min(max_connections, 4096))
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.directory, self.results, self.timeout = directory, results, float(timeout)
        self.max_connections = max(1, int(max_connections))
        self.pool = ThreadPoolExecutor(max_workers=max(1, int(workers)), thread_name_prefix="serve")
        self.pending: dict[socket.socket, tuple[tuple, float, bytearray]] = {}  # oldest first
        self.busy = 0
        self.stats = {"accepted": 0, "answered": 0, "evicted": 0, "timed_out": 0}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = False
        self._stopped = threading.Event()
        self._names: tuple[tuple, frozenset[str]] = ((), frozenset())

    def names(self) -> frozenset[str]:
        """The hosts of the published pointer (written only by store-pointer, after its checks), read again
        whenever the file changes."""
        path = os.path.join(self.directory, POINTER)
        try:
            st = os.stat(path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if key == self._names[0]:
                return self._names[1]
            with open(path, "rb") as fh:
                pointer = json.loads(json.loads(fh.read(MAX_POINTER))["pointer"])
            hosts = frozenset(h for h in pointer["hosts"] if isinstance(h, str) and HOST_RE.match(h))
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return frozenset()
        self._names = (key, hosts)
        return hosts

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop:
                for key, _events in sel.select(timeout=0.25):
                    if key.data == "listen":
                        self._accept(sel)
                    elif key.data == "wake":
                        self._wake_r.recv(4096)
                    else:
                        self._read(sel, key.fileobj)
                now = time.monotonic()
                while self.pending:
                    conn = next(iter(self.pending))
                    if now - self.pending[conn][1] <= self.timeout:
                        break
                    self._drop(sel, conn)
                    self.stats["timed_out"] += 1
        finally:
            for conn in list(self.pending):
                self._drop(sel, conn)
            sel.close()
            self._stopped.set()

    def _drop(self, sel, conn: socket.socket) -> None:
        del self.pending[conn]
        sel.unregister(conn)
        conn.close()

    def _accept(self, sel) -> None:
        for _ in range(256):
            try:
                conn, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError:  # out of file descriptors: make room, as for a full waiting list
                if self.pending:
                    self._drop(sel, next(iter(self.pending)))
                    self.stats["evicted"] += 1
                return
            with self._lock:
                full = len(self.pending) + self.busy >= self.max_connections
            if full and self.pending:
                self._drop(sel, next(iter(self.pending)))
                self.stats["evicted"] += 1
            elif full:  # every slot is a request being answered: this one waits for the next free slot
                conn.close()
                self.stats["evicted"] += 1
                continue
            conn.setblocking(False)
            self.pending[conn] = (address, time.monotonic(), bytearray())
            sel.register(conn, selectors.EVENT_READ, "conn")
            self.stats["accepted"] += 1

    def _read(self, sel, conn: socket.socket) -> None:
        if conn not in self.pending:
            return
        try:
            data = conn.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, conn)
            return
        address, _since, buf = self.pending[conn]
        buf += data
        if _complete(buf):
            del self.pending[conn]
            sel.unregister(conn)
            with self._lock:
                self.busy += 1
            self.pool.submit(self._answer, conn, address, bytes(buf))

    def _answer(self, conn: socket.socket, address, request: bytes) -> None:
        try:
            conn.setblocking(True)
            conn.settimeout(self.timeout)
            _Handler(conn, address, self, request)
            self.stats["answered"] += 1
        except Exception as exc:  # one line per failed answer, never a traceback per client
            sys.stderr.write(f"{address[0]} {type(exc).__name__}: {str(exc)[:200]!r}\n")
        finally:
            conn.close()
            with self._lock:
                self.busy -= 1

    def shutdown(self) -> None:
        self._stop = True
        self._wake_w.send(b"x")
        self._stopped.wait(10)

    def server_close(self) -> None:
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def make_server(port: int, directory: str, results: str, bind: str, **limits) -> BundleServer:
    """The bundle server bound to `bind` (an address, never every interface by default); `limits`: workers,
    max_connections, timeout (BundleServer)."""
    return BundleServer(port, directory, results, bind, **limits)


def serve(args: argparse.Namespace) -> int:
    os.makedirs(args.results, exist_ok=True)
    try:
        server = make_server(args.port, args.directory, args.results, args.bind, workers=args.workers,
                             max_connections=args.max_connections, timeout=args.timeout)
    except (OSError, ValueError) as exc:
        print(f"gpucluster-pull serve: cannot listen on {args.bind} port {args.port}: {exc}", file=sys.stderr)
        return 2
    server.serve_forever()
    return 0


def results(args: argparse.Namespace) -> int:
    """One JSON line per node result held here (as the node signed it, with the name it was filed under), those
    of pointer serial `args.serial` only where given."""
    try:
        names = sorted(os.listdir(args.results))
    except FileNotFoundError:
        names = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            with open(os.path.join(args.results, name), "rb") as fh:
                record = json.loads(fh.read(4 * MAX_RESULT))
            serial = json.loads(record["result"]).get("serial") if args.serial is not None else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue
        if args.serial is not None and serial != args.serial:
            continue
        print(json.dumps(record, sort_keys=True))
    return 0


def _lock(blocking: bool):
    """An exclusive lock on this node's pull folder (held until the returned file is closed), or None when
    another converge holds it and `blocking` is false."""
    import fcntl

    fh = open(os.path.join(_private(WORK), ".lock"), "a")  # noqa: SIM115 (held for the process's run)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        fh.close()
        return None
    return fh


def _cluster(value: str) -> str:
    if not CLUSTER_RE.match(value):
        raise argparse.ArgumentTypeError(f"{value[:80]!r} is not a cluster name ([A-Za-z0-9._-], at most 64)")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpucluster-pull", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("store", help="check a bundle read from stdin and publish it for nodes to fetch")
    s.add_argument("hash", help="the bundle's sha256 (of its MANIFEST)")
    r = sub.add_parser("run", help="fetch, check and run a bundle for this node; print one JSON line")
    r.add_argument("--hash", required=True, help="the bundle's sha256 (of its MANIFEST), as the operator sent it")
    r.add_argument("--url", required=True, help="where bundles are served (http://CONTROLLER:PORT)")
    r.add_argument("--host", required=True, help="this node's inventory name")
    r.add_argument("--tags", default="", help="only these concerns (Ansible --tags)")
    r.add_argument("--skip-tags", default="", help="not these concerns (munge is always skipped: it is a secret)")
    r.add_argument("--check", action="store_true", help="dry run")
    r.add_argument("--diff", action="store_true", help="show file changes")
    r.add_argument("--full", action="store_true", help="run the roles even when the manifest of this bundle "
                   "verifies (what the manifest does not cover: packages, command tasks)")
    sp = sub.add_parser("store-pointer", help="check the operator's signed pointer (stdin) and publish it")
    sp.add_argument("--signers", default=SIGNERS, help=argparse.SUPPRESS)
    sp.add_argument("--cluster", required=True, type=_cluster, help="the cluster the pointer must name")
    t = sub.add_parser("timer", help="one tick of gpucluster-pull.timer: converge to a new signed pointer")
    t.add_argument("--url", required=True, help="where bundles are served (http://CONTROLLER:PORT)")
    t.add_argument("--host", required=True, help="this node's inventory name")
    t.add_argument("--cluster", required=True, type=_cluster, help="this node's cluster (a pointer must name it)")
    t.add_argument("--signers", default=SIGNERS, help=argparse.SUPPRESS)
    t.add_argument("--host-key", default=HOST_KEY, help="the SSH host key that signs this node's result")
    v = sub.add_parser("serve", help="serve bundles and the pointer over HTTP; take the nodes' results")
    v.add_argument("--port", type=int, required=True)
    v.add_argument("--bind", required=True, help="the address to listen on (the controller's cluster address)")
    v.add_argument("--workers", type=int, default=SERVER_WORKERS, help="threads answering requests")
    v.add_argument("--max-connections", type=int, default=SERVER_MAX_CONNECTIONS,
                   help="connections waiting for their request at once; one more closes the oldest")
    v.add_argument("--timeout", type=float, default=SERVER_TIMEOUT,
                   help="seconds for a request to arrive whole, and for each send")
    v.add_argument("--directory", default=PUBLISHED)
    v.add_argument("--results", default=RESULTS)
    rs = sub.add_parser("results", help="the nodes' last results, one JSON line each")
    rs.add_argument("--serial", type=int, default=None, help="only results of this pointer serial")
    rs.add_argument("--results", default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "store":
        return store(args)
    if args.command == "store-pointer":
        return store_pointer(args)
    if args.command == "serve":
        return serve(args)
    if args.command == "results":
        return results(args)
    if args.command == "timer":
        lock = _lock(blocking=False)
        if lock is None:
            return 0  # another converge holds this node (the fan-out, or the tick before)
        try:
            result = timer(args)
        except Exception as exc:  # every failure ends in a result the operator sees, never a traceback
            result = {"host": args.host, "changed": 0, "failed": 1, "rc": None, "trigger": "timer", "bundle": "",
                      "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        if result is None:
            return 0
        why = report(args.url, args.host, sign_result(result, args.host_key, args.cluster))
        if why:
            result["report"] = why
        print(json.dumps(result, sort_keys=True), flush=True)
        return 0 if result.get("failed") == 0 and result.get("rc") == 0 else 1
    lock = _lock(blocking=True)  # one converge at a time on a node: the fan-out waits for a timer's run to end
    result = run(args)
    del lock
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result.get("failed") == 0 and result.get("rc") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
