"""`gpucluster configure INVENTORY --pull`: compile once, pack the bundle once, publish it on the Slurm
controller, then have every fleet node fetch it, check its hash and converge itself (gpucluster-pull, from
the pull_runner role) with bounded concurrency. One line per host comes back: changed, failed, the bundle.

Why the controller's cost stays flat: per host it starts one `ssh NODE gpucluster-pull run --hash H ...` and
reads one JSON line; the ~170 tasks run on the node, with the node's CPU. Push costs an Ansible worker per
host per task on the controller (docs/roles.md, "Converging a fleet", has the measured figures).
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import resource
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.errors import UsageError
from gpucluster.inventory.reader import Inventory, inventory_file, load_inventory
from gpucluster.inventory.statedir import state_dirs
from gpucluster.outputs import write_file
from gpucluster.paths import ansible_dir, private_dir

Log = Callable[[str], None]

# Hosts that converge by push whatever the mode: few, and they hold the secrets (munge key, slurmdbd password,
# MariaDB) that a bundle, readable by every node, must never carry.
PUSH_ONLY_GROUPS = ("slurm_controller", "slurm_dbd")
# configure's default: pull when the fleet (hosts outside PUSH_ONLY_GROUPS) has at least this many hosts.
PULL_ABOVE = 64
# How many nodes converge at once by default: each one runs its own Ansible, so the bound is the bundle
# server's and the network's, not this machine's CPU.
CONCURRENCY = 64
PORT = 8079
SSH_OPTIONS = ("ConnectTimeout=15", "ServerAliveInterval=15")
# The timer trigger: the cluster's bundle-signing key (generated once by the pull_runner role, in the private
# secrets folder) signs {bundle, serial}; nodes verify it against the public half push installed.
SIGNING_KEY = "bundle-signing.key"
SIGN_NAMESPACE = "gpucluster-bundle"
POINTER_VERSION = 2  # names its cluster, expires, lists its hosts (gpucluster-pull verify_pointer)
# How long a signed pointer stays good: a node refuses it after that (a reimaged node that remembers no serial
# still refuses an old pointer). Long enough for a node that was down over a weekend to converge on return.
POINTER_TTL_S = 7 * 86400
CLUSTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
HASH_RE = re.compile(r"^[0-9a-f]{64}\Z")
# A node's result: at most this many bytes (the bundle server's limit too), every field checked before use.
MAX_RESULT = 64 * 1024
# What a node's text may not carry to the operator's terminal: C0 and C1 controls (escape sequences), DEL, and
# the Unicode marks that reorder or hide text (bidi overrides, zero-width characters).
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
TRIGGERS = ("ssh", "timer")
POLL_S = 5.0      # the first wait between two reads of the results; each next one 1.5 times longer,
POLL_MAX_S = 30.0  # up to this: a 30-minute wait costs about 70 ssh sessions (measured: 0.05 CPU-s each)


@dataclass
class HostResult:
    host: str
    changed: int = 0
    failed: int = 0
    bundle: str = ""
    seconds: float = 0.0
    fetched: bool = False
    changes: list[str] = field(default_factory=list)
    error: str = ""
    unchanged: bool = False  # the node verified its manifest of this bundle and did not run Ansible
    verified: dict[str, int] = field(default_factory=dict)  # files, services checked on that fast path
    drift: list[str] = field(default_factory=list)  # why the roles ran: what differed, a new bundle, --full

    def line(self) -> str:
        if self.unchanged and not self.failed:
            return (f"{self.host}  unchanged  bundle={self.bundle[:12]}  verified {self.verified.get('files', 0)} "
                    f"files, {self.verified.get('services', 0)} services  {self.seconds:.2f}s")
        verdict = "FAILED" if self.failed else "ok"
        text = (f"{self.host}  {verdict}  changed={self.changed} failed={self.failed} bundle={self.bundle[:12] or '-'}"
                f"{' (fetched)' if self.fetched else ''}  {self.seconds:.1f}s")
        if self.drift:
            text += "  ran the roles: " + "; ".join(self.drift[:3]) + (" ..." if len(self.drift) > 3 else "")
        if self.changes:
            text += "  changed: " + "; ".join(self.changes[:6]) + (" ..." if len(self.changes) > 6 else "")
        if self.error:
            text += f"  error: {self.error}"
        return text


@dataclass
class PullResult:
    bundle: str
    hosts: dict[str, HostResult]
    elapsed: float
    push_hosts: list[str]
    cpu_seconds: float = 0.0  # this process and its children (ssh), measured around the run
    serial: int = 0  # the signed pointer's serial (--trigger timer); 0 for the ssh fan-out

    @property
    def ok(self) -> bool:
        if self.serial and not self.hosts:  # published for the timers, not waited for
            return True
        return bool(self.hosts) and not any(r.failed for r in self.hosts.values())

    @property
    def changed(self) -> int:
        return sum(r.changed for r in self.hosts.values())

    @property
    def unchanged(self) -> list[str]:
        """Hosts that verified their manifest and skipped Ansible (the fast no-op)."""
        return sorted(h for h, r in self.hosts.items() if r.unchanged and not r.failed)


def fleet(inv: Inventory, limit: str | None = None) -> tuple[list[str], list[str]]:
    """(hosts that pull, hosts that stay push) among those `limit` selects."""
    chosen = inv.select(limit)
    push = {h for g in PUSH_ONLY_GROUPS for h in inv.group(g)}
    return [h for h in chosen if h not in push], [h for h in chosen if h in push]


def wants_pull(inventory: str | os.PathLike, limit: str | None = None) -> bool:
    """configure's default mode: pull at PULL_ABOVE fleet hosts or more (docs/roles.md says why)."""
    pull, _push = fleet(load_inventory(inventory_file(inventory)), limit)
    return len(pull) >= PULL_ABOVE


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class BadResult(ValueError):
    """A node's result that is not what gpucluster-pull writes: refused, and that host's failure."""


def clean(text: object, limit: int = 300) -> str:
    """A node's text as it may be printed here: no control characters (escape sequences, bidi overrides), at most
    `limit` characters."""
    flat = CONTROL_RE.sub("?", str(text))
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def _count(data: dict, key: str, top: int = 10**6) -> int:
    value = data.get(key, 0)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise BadResult(f"{key} is not a count (0-{top})")
    return value


def _texts(data: dict, key: str, items: int, limit: int) -> list[str]:
    value = data.get(key) or []
    if not isinstance(value, list) or len(value) > items or not all(isinstance(v, str) for v in value):
        raise BadResult(f"{key} is not a list of at most {items} strings")
    return [clean(v, limit) for v in value]


def _flag(data: dict, key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise BadResult(f"{key} is not true or false")
    return value


def host_result(host: str, data: object, want: str, serial: int | None = None) -> HostResult:
    """The HostResult of one node's result object, every field checked (type, range, length) and every text
    cleaned; BadResult for anything gpucluster-pull does not write. `serial`: the pointer it must answer."""
    if not isinstance(data, dict):
        raise BadResult("not a JSON object")
    if data.get("host") != host:
        raise BadResult(f"names host {clean(data.get('host'), 64)!r}, not {host}")
    if serial is not None and data.get("serial") != serial:
        raise BadResult(f"answers pointer serial {clean(data.get('serial'), 24)}, not {serial}")
    bundle = data.get("bundle") or ""
    if not isinstance(bundle, str) or (bundle and not HASH_RE.match(bundle)):
        raise BadResult("bundle is not a sha256")
    seconds = data.get("seconds") or 0
    if (not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds)
            or not 0 <= seconds <= 10**7):
        raise BadResult("seconds is not a duration")
    error = data.get("error") or ""
    if not isinstance(error, str):
        raise BadResult("error is not a string")
    verified = data.get("verified") or {}
    if not isinstance(verified, dict) or not set(verified) <= {"files", "services"}:
        raise BadResult("verified is not {files, services}")
    rc = data.get("rc")
    if rc is not None and (not isinstance(rc, int) or isinstance(rc, bool) or not -1024 <= rc <= 1024):
        raise BadResult("rc is not an exit status")
    trigger = data.get("trigger")
    if trigger not in (None, "timer"):
        raise BadResult("trigger is not timer")
    return HostResult(host, changed=_count(data, "changed"), failed=_count(data, "failed"), bundle=bundle,
                      seconds=float(seconds), fetched=_flag(data, "fetched"),
                      changes=_texts(data, "changes", 10000, 200),
                      error=clean(error, 1500), unchanged=_flag(data, "unchanged"),
                      verified={k: _count(verified, k) for k in ("files", "services") if k in verified},
                      drift=_texts(data, "drift", 64, 300))


def _parse(host: str, proc: subprocess.CompletedProcess, want: str) -> HostResult:
    """The fan-out's result of one host: the last JSON line gpucluster-pull printed there, checked."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 127 or "gpucluster-pull: not found" in proc.stderr or "No such file" in proc.stderr:
        return HostResult(host, failed=1, error="gpucluster-pull is not installed here: install the runner by push "
                                                "first (gpucluster configure INVENTORY --push --tags pull)")
    if not lines:
        err = " ".join((proc.stderr or proc.stdout or f"ssh exited {proc.returncode}").split())[-600:]
        return HostResult(host, failed=1, error=clean(err, 600))
    try:
        if len(lines[-1]) > MAX_RESULT:
            raise BadResult(f"larger than {MAX_RESULT} bytes")
        try:
            data = json.loads(lines[-1])
        except (ValueError, RecursionError) as exc:
            raise BadResult(f"not JSON: {clean(lines[-1], 120)}") from exc
        got = host_result(host, {"host": host, **data} if isinstance(data, dict) and "host" not in data else data,
                          want)
    except BadResult as exc:
        return HostResult(host, failed=1, error=f"unreadable result: {exc}")
    if got.bundle != want:
        got.failed, got.error = 1, f"ran bundle {got.bundle[:12]}, not {want[:12]}"
    if proc.returncode and not got.failed:
        got.failed, got.error = 1, got.error or f"exited {proc.returncode}"
    return got


def _store(inv: Inventory, command: str, data: bytes, what: str) -> None:
    """Send `data` to `command` on every Slurm controller (each checks it before publishing)."""
    for host in inv.group("slurm_controller"):
        proc = subprocess.run(inv.hosts[host].ssh_argv(command, *SSH_OPTIONS), input=data, capture_output=True,
                              timeout=300, check=False)
        if proc.returncode != 0:
            err = " ".join(proc.stderr.decode(errors="replace").split())[-400:]
            raise UsageError(f"{host}: cannot publish {what} ({err or f'exit {proc.returncode}'}); is the runner "
                             "installed? gpucluster configure INVENTORY --push --tags pull")


def publish(inv: Inventory, bundle, log: Log) -> str:
    """Store the bundle on every Slurm controller (checked there too); the URL nodes fetch it from."""
    servers = inv.group("slurm_controller")
    if not servers:
        raise UsageError(f"{inv.path}: no slurm_controller host to serve the bundle from (docs/inventory.md)")
    _store(inv, f"gpucluster-pull store {bundle.hash}", bundle.path.read_bytes(), "the bundle")
    url = str(inv.vars.get("gpucluster_bundle_url") or f"http://{servers[0]}:{PORT}")
    log(f"pull: bundle {bundle.hash[:12]} ({bundle.files} files, {bundle.size // 1024} KiB) published on "
        f"{', '.join(servers)}; nodes fetch it from {url}")
    return url


def sign_pointer(key: Path, pointer: dict, workdir: Path) -> bytes:
    """The envelope nodes verify: {"pointer": JSON text, "signature": ssh-keygen -Y sign of that text}."""
    text = json.dumps(pointer, sort_keys=True)
    private_dir(workdir, what="signing folder")
    target = workdir / "pointer.json"
    target.write_text(text)
    sig = workdir / "pointer.json.sig"
    sig.unlink(missing_ok=True)
    proc = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", SIGN_NAMESPACE, str(target)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    if proc.returncode != 0:
        raise UsageError(f"{key}: cannot sign the pointer ({' '.join(proc.stderr.split())[-300:]})")
    envelope = json.dumps({"pointer": text, "signature": sig.read_text()}, sort_keys=True).encode()
    target.unlink()
    sig.unlink()
    return envelope


def cluster_name(inv: Inventory) -> str:
    """The cluster a pointer names and a node's result is signed for (all.vars.gpucluster_cluster)."""
    name = str(inv.vars.get("gpucluster_cluster") or "")
    if not CLUSTER_RE.match(name):
        raise UsageError(f"{inv.path}: all.vars.gpucluster_cluster {clean(name, 80)!r} is not a cluster name "
                         "([A-Za-z0-9._-], at most 64): use an inventory written by gpucluster")
    return name


def publish_pointer(inv: Inventory, bundle_hash: str, hosts: list[str], full: bool, secrets_dir: Path,
                    work: Path, log: Log, provided_key_b64: str = "", ttl: float = POINTER_TTL_S) -> int:
    """Sign and publish, on every Slurm controller, the pointer the nodes' timers converge to; its serial. The key
    is the operator's (pull_runner_signing_key_b64 of the secrets file, signed from a private copy) or the one
    push generated in the secrets folder. The pointer names the cluster, the hosts that converge to it (the
    bundle server takes results from those only) and when it expires (`ttl` seconds from now)."""
    cluster = cluster_name(inv)
    if ttl <= 0:
        raise UsageError(f"a pointer lifetime of {ttl} s: give a positive number of seconds")
    key = secrets_dir / SIGNING_KEY
    if provided_key_b64:
        key = private_dir(work, what="signing folder") / "operator-signing.key"
        write_file(key, base64.b64decode(provided_key_b64), mode=0o600)
    elif not key.is_file():
        raise UsageError(f"{key}: no bundle-signing key for this cluster. Push the pull runner first: gpucluster "
                         "configure INVENTORY --push --tags pull (it generates the key and installs its public "
                         "half and the timer on every node), or give --secrets FILE with pull_runner_signing_key_b64")
    serial = time.time_ns() // 1000  # microseconds: newer than any pointer published before from this clock
    now = int(time.time())
    pointer = {"version": POINTER_VERSION, "bundle": bundle_hash, "serial": serial, "full": full,
               "cluster": cluster, "published": now, "expires": now + int(ttl), "hosts": sorted(hosts)}
    try:
        envelope = sign_pointer(key, pointer, work)
    finally:
        if provided_key_b64:
            key.unlink(missing_ok=True)
    _store(inv, shlex.join(["gpucluster-pull", "store-pointer", "--cluster", cluster]), envelope, "the pointer")
    log(f"pull: pointer to bundle {bundle_hash[:12]} signed and published (serial {serial}, {len(hosts)} hosts, "
        f"expires in {int(ttl) // 3600} h); nodes converge at their next timer tick")
    return serial


def result_namespace(cluster: str) -> str:
    """The ssh-keygen -Y namespace a node signs its result in (gpucluster-pull result_namespace): the purpose and
    the cluster, so no other signature made with a host key passes for a result."""
    return f"gpucluster-result@{cluster}"


def known_hosts_file(host) -> Path:
    """The known_hosts file the inventory reaches `host` with: the first UserKnownHostsFile of its ssh arguments
    (ssh keeps the first value; gpucluster's own comes first), else ~/.ssh/known_hosts."""
    args = shlex.split(host.ssh()["extra_args"])
    for i, arg in enumerate(args):
        option = args[i + 1] if arg == "-o" and i + 1 < len(args) else arg[2:] if arg.startswith("-o") else ""
        name, _, value = option.partition("=")
        if name.strip().lower() == "userknownhostsfile" and value.strip():
            return Path(value.strip().split()[0]).expanduser()
    return Path("~/.ssh/known_hosts").expanduser()


def host_keys(host, known_hosts: Path) -> list[str]:
    """`TYPE BASE64` of every key known_hosts holds for `host` (by the address and port the inventory reaches it
    at, then by its name), revoked keys left out; the operator already trusts these for ssh."""
    names = [f"[{host.address}]:{host.port}" if host.port and host.port != 22 else host.address, host.name]
    keys, revoked = [], set()
    for name in dict.fromkeys(names):
        proc = subprocess.run(["ssh-keygen", "-F", name, "-f", str(known_hosts)], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=60, check=False)
        for line in proc.stdout.splitlines():
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if fields[0] == "@revoked" and len(fields) >= 4:
                revoked.add(f"{fields[2]} {fields[3]}")
            elif not fields[0].startswith("@") and len(fields) >= 3:
                keys.append(f"{fields[1]} {fields[2]}")
    return [k for k in dict.fromkeys(keys) if k not in revoked]


def verify_result(host, record: dict, cluster: str, known_hosts: Path, keys: list[str], folder: Path) -> object:
    """The result object inside a record of `gpucluster-pull results` when `host`'s SSH host key (from the
    operator's known_hosts) signed it for this cluster's results; BadResult otherwise."""
    text, signature = record.get("result"), record.get("signature")
    if not isinstance(text, str) or not isinstance(signature, str):
        raise BadResult("not a signed result (no result text and signature)")
    if not signature:
        raise BadResult(f"unsigned (the node says: {clean(record.get('unsigned') or 'nothing', 200)}); only a "
                        "result signed with the node's SSH host key is accepted")
    if not keys:
        raise BadResult(f"no host key for {host.name} ({host.address}) in {known_hosts}: cannot check its signature")
    namespace = result_namespace(cluster)
    signers = folder / "allowed_signers"
    signers.write_text("".join(f'{host.name} namespaces="{namespace}" {key}\n' for key in keys))
    sig = folder / "result.sig"
    sig.write_text(signature)
    proc = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", host.name, "-n", namespace,
                           "-s", str(sig)], input=text.encode(), capture_output=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise BadResult(f"signature does not verify against {host.name}'s host key in {known_hosts}: "
                        f"{clean(' '.join(proc.stderr.decode(errors='replace').split()), 200)}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadResult("signed text is not JSON") from exc


def _read_results(inv: Inventory, server: str, serial: int) -> str:
    command = shlex.join(["gpucluster-pull", "results", "--serial", str(serial)])
    proc = subprocess.run(inv.hosts[server].ssh_argv(command, *SSH_OPTIONS), capture_output=True, text=True,
                          errors="replace", stdin=subprocess.DEVNULL, timeout=300, check=False)
    return proc.stdout


def collect(inv: Inventory, serial: int, hosts: list[str], want: str, wait: float, log: Log,
            poll: float = POLL_S, read: Callable[[], str] | None = None) -> dict[str, HostResult]:
    """The timers' results for `serial`, read from the bundle server with one ssh per poll (whatever the number
    of hosts), until every host of `hosts` has answered or `wait` seconds have passed. The polls grow apart
    (POLL_S, then 1.5 times longer each, up to POLL_MAX_S), so a long wait costs a bounded number of them.

    Every result must be signed by its node's SSH host key (as the operator's known_hosts holds it) and be what
    gpucluster-pull writes, field by field; anything else is that host's failure line, never "converged", and
    the other hosts carry on. A valid result seen later for that host, before the wait ends, replaces it.
    `read`: the results text (tests; default one ssh to the first Slurm controller)."""
    server = inv.group("slurm_controller")[0]
    cluster = cluster_name(inv)
    read = read or (lambda: _read_results(inv, server, serial))
    deadline = time.monotonic() + wait
    got: dict[str, HostResult] = {}
    bad: dict[str, str] = {}
    keys: dict[str, tuple[Path, list[str]]] = {}
    wanted = set(hosts)  # a fleet's results are read every poll: one set lookup per line, not a list scan
    with tempfile.TemporaryDirectory(prefix="gpucluster-results-") as tmp:
        while True:
            for line in read().splitlines():
                if len(line) > 4 * MAX_RESULT:
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                name = record.get("host") if isinstance(record, dict) else None
                if not isinstance(name, str) or name not in wanted or name in got:
                    continue
                host = inv.hosts[name]
                if name not in keys:
                    known = known_hosts_file(host)
                    keys[name] = (known, host_keys(host, known))
                try:
                    data = verify_result(host, record, cluster, *keys[name], Path(tmp))
                    one = host_result(name, data, want, serial)
                except BadResult as exc:
                    bad[name] = f"result refused: {exc}"
                    continue
                if one.bundle != want:  # a converged claim counts only for the bundle of this pointer
                    one.failed, one.error = 1, one.error or f"ran bundle {one.bundle[:12] or '-'}, not {want[:12]}"
                bad.pop(name, None)
                got[name] = one
                log(one.line())
            if len(got) + len(bad) == len(hosts) or time.monotonic() >= deadline:
                break
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
            poll = min(poll * 1.5, POLL_MAX_S)
    for host in hosts:
        if host in bad:
            got[host] = HostResult(host, failed=1, bundle=want, error=bad[host])
            log(got[host].line())
        elif host not in got:
            got[host] = HostResult(host, failed=1, bundle=want,
                                   error=f"no result within {wait:.0f} s (its timer has not run the pointer yet; "
                                         "gpucluster-pull.timer on the node, /var/lib/gpucluster/pull/last.log)")
            log(got[host].line())
    return got


def pull(inventory: str | os.PathLike, *, limit: str | None = None, tags: str | None = None,
         check: bool = False, diff: bool = False, full: bool = False, secrets: dict[str, str] | None = None,
         state_dir: str | os.PathLike | None = None, project: str | os.PathLike | None = None,
         concurrency: int = CONCURRENCY, trigger: str = "ssh", wait: float = 1800.0,
         log: Log = print) -> PullResult:
    """Converge the fleet hosts of `inventory` by pull; never raises for host failures. `secrets` are the values
    of the operator's checked secrets file (configure.secrets.checked_secrets): only to refuse a bundle that
    holds one; none of them travels. A node whose manifest of this bundle verifies skips its Ansible run
    (gpucluster-pull); `full` makes every node run the roles anyway.

    `trigger`: "ssh" runs gpucluster-pull on each node over ssh, `concurrency` at a time (one ssh per host);
    "timer" signs and publishes a pointer to the bundle, which each node's gpucluster-pull.timer picks up by
    itself, and reads their results from the bundle server for up to `wait` seconds (one ssh per poll)."""
    from gpucluster.compiled import ensure_compiled
    from gpucluster.configure.bundle import build
    from gpucluster.configure.playbook import playbook_options

    cpu0, started = _cpu(), time.monotonic()
    if concurrency < 1:
        raise UsageError(f"--concurrency {concurrency}: give at least 1")
    if trigger not in TRIGGERS:
        raise UsageError(f"--trigger {trigger}: give one of {', '.join(TRIGGERS)}")
    if trigger == "timer" and (tags or check or diff):
        raise UsageError("--trigger timer converges the whole bundle: --tags, --check and --diff go with the ssh "
                         "fan-out (--trigger ssh)")
    if wait < 0:
        raise UsageError(f"--wait {wait}: give 0 (do not wait) or more seconds")
    inv = load_inventory(inventory_file(inventory))
    hosts, push_hosts = fleet(inv, limit)
    if not hosts:
        raise UsageError(f"{inv.path}: no host to pull{f' in --limit {limit}' if limit else ''}: the Slurm controller "
                         "and slurmdbd hosts converge by push (gpucluster configure INVENTORY --push)")
    spec = inv.vars.get("gpucluster_spec")
    if not spec:
        raise UsageError(f"{inv.path}: not a gpucluster inventory (no gpucluster_spec)")
    state, secrets_dir = state_dirs(inv.vars, state_dir)
    compiled, _fresh = ensure_compiled(str(spec), state)
    values = {k: str(v) for k, v in (secrets or {}).items()}
    bundle = build(compiled, ansible_dir(project), inv.path, state, values)
    url = publish(inv, bundle, log)
    if trigger == "timer":
        serial = publish_pointer(inv, bundle.hash, hosts, full, Path(secrets_dir),
                                 Path(state) / "bundles" / "signing", log,
                                 values.get("pull_runner_signing_key_b64", ""))
        results = collect(inv, serial, hosts, bundle.hash, wait, log) if wait else {}
        return PullResult(bundle=bundle.hash, hosts=results, elapsed=time.monotonic() - started,
                          push_hosts=push_hosts, cpu_seconds=_cpu() - cpu0, serial=serial)
    remote = ["gpucluster-pull", "run", "--hash", bundle.hash, "--url", url, *playbook_options(tags, check, diff)]
    if full:
        remote.append("--full")
    width = min(concurrency, len(hosts))
    log(f"pull: {len(hosts)} hosts, {width} at a time{' (check mode: nothing is changed)' if check else ''}")

    def one(host: str) -> HostResult:
        command = shlex.join([*remote, "--host", host])
        try:
            proc = subprocess.run(inv.hosts[host].ssh_argv(command, *SSH_OPTIONS), capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=3600, check=False)
        except subprocess.TimeoutExpired:
            return HostResult(host, failed=1, error="no answer within an hour")
        result = _parse(host, proc, bundle.hash)
        log(result.line())
        return result

    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="pull") as pool:
        results = {r.host: r for r in pool.map(one, hosts)}
    return PullResult(bundle=bundle.hash, hosts=results, elapsed=time.monotonic() - started, push_hosts=push_hosts,
                      cpu_seconds=_cpu() - cpu0)


def summary(result: PullResult) -> str:
    failed = sorted(h for h, r in result.hosts.items() if r.failed)
    changed = sorted(h for h, r in result.hosts.items() if r.changed)
    lines = [""]
    if failed:
        lines.append(f"failed hosts: {', '.join(failed)}")
    if changed:
        lines.append(f"changed hosts: {', '.join(changed)}")
    if result.push_hosts:
        lines.append(f"by push, not pulled: {', '.join(result.push_hosts)} (gpucluster configure INVENTORY --push "
                     f"--limit {':'.join(result.push_hosts)})")
    if result.serial and not result.hosts:
        lines.append(f"published for the nodes' timers: bundle {result.bundle}, serial {result.serial} (not waited "
                     f"for; gpucluster configure INVENTORY --pull --trigger timer --wait SECONDS waits), "
                     f"{result.cpu_seconds:.2f} CPU-s here")
        return "\n".join(lines)
    verdict = "converged by pull" if result.ok else "NOT converged"
    fast = f" ({len(result.unchanged)} verified their manifest, no Ansible run)" if result.unchanged else ""
    lines.append(f"{verdict}: {len(result.hosts)} hosts{fast}, {result.changed} changes, bundle {result.bundle}, "
                 f"{result.elapsed:.1f} s, {result.cpu_seconds:.2f} CPU-s here")
    return "\n".join(lines)
