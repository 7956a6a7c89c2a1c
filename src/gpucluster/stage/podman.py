"""Staged clusters: one podman container per node, systemd as PID 1, sshd published on loopback.

Everything a staged cluster creates (network, containers, key pair, known_hosts) is named after the
cluster plus a short hash of its state directory and labelled with both, so two checkouts or CI
runs on one machine never collide, and down() finds and removes exactly what up() made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.aptsources import SUITE

from ._proc import Log, StageError, run
from .image import ensure_image

LABEL_CLUSTER = "gpucluster.cluster"
LABEL_STATE = "gpucluster.state"
LABEL_NODE = "gpucluster.node"
LABEL_SPEC = "gpucluster.spec"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")
_HOST_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_READY_TIMEOUT_S = 180
_MIN_INOTIFY_INSTANCES = 1024
_HOSTKEY_WHEN_SSH_ACTIVE = "systemctl -q is-active ssh.service && cat /etc/ssh/ssh_host_ed25519_key.pub"
_MARKER = ".gpucluster-stage"
_STATE_FILES = ("id_ed25519", "id_ed25519.pub", "known_hosts", "ssh_config", "ports.json", "addresses.json")
# STAGING STAND-INS for the GPUs of nodes that run Slurm's cgroup plugins: character devices of major
# 120, which the kernel's devices.txt reserves for LOCAL/EXPERIMENTAL USE and no driver claims. Each
# GPU of a node gets its own number (minor = its index), so Slurm's device cgroup can allow one and
# deny the others; /dev/null for all of them would make "deny the GPUs a job did not get" deny
# /dev/null itself. Opening one fails with ENXIO (no driver) once the device cgroup let it through,
# and with EPERM where the cgroup denies it: the difference a job's GPU isolation is tested by.
STAND_IN_MAJOR = 120
_STAND_IN_DIR = "stand-ins"
# PID 1 of a node with writable cgroups: podman mounts the node's cgroup v1 hierarchies read-only; in a
# private cgroup namespace each is the node's own subtree, so remounting them writable lets slurmd create
# job cgroups there and nowhere else. Then systemd, as in every node.
_CGROUP_INIT = ('set -e; for m in $(awk \'$3 == "cgroup" {print $2}\' /proc/self/mounts | sort -u); '
                'do mount -o remount,bind,rw "$m"; done; exec /sbin/init')


@dataclass(frozen=True)
class StageNode:
    """One staged node. gpu_devices are STAGING STAND-INS: /dev/null mapped to each path."""

    name: str
    groups: tuple[str, ...] = ()
    gpu_devices: tuple[str, ...] = ()
    fuse: bool = False
    memory_mb: int | None = None
    caps: tuple[str, ...] = ()  # extra capabilities, e.g. DAC_READ_SEARCH (NFS-Ganesha's open_by_handle_at)
    tmpfs: tuple[str, ...] = ()  # paths mounted as tmpfs (gone when the node restarts)
    # Paths on a podman volume of the node's own: the host's file system, kept across restarts. NFS exports go
    # here: the overlayfs root gives no file handles, and NFS-Ganesha 6 will not export a tmpfs.
    volumes: tuple[str, ...] = ()
    address: str | None = None  # static IPv4 on the cluster's network (up() assigns it from the subnet)
    # Slurm's cgroup plugins run here (proctrack/cgroup, task/cgroup, ConstrainDevices): a private cgroup
    # namespace whose v1 hierarchies the node may write, CAP_SYS_ADMIN, and GPU stand-ins with their own
    # device numbers (STAND_IN_MAJOR) instead of /dev/null.
    cgroups: bool = False
    # Nested OCI containers (srun --container): podman masks paths of the node's /proc and /sys (/proc/kcore,
    # /sys/firmware, ...) and mounts others read-only; the kernel lets a user namespace mount a fresh /proc or
    # sysfs only where no such mount covers part of the node's own, so a rootless runc inside the node could not.
    # A real node has none of these masks. unmask=ALL removes them (nothing else: no capability, no device).
    unmask: bool = False


@dataclass(frozen=True)
class StageConfig:
    """Where a staged cluster keeps its state and how its containers run.

    runtime: crun fails on the development machines (hybrid cgroups, rlimits), runc works.
    ulimits: raising rlimits beyond these is refused there; pass others where the host allows them.
    image: a prebuilt image ref; None builds or reuses the one for the current recipe of `suite`.
    suite: the Debian release of the nodes (image.SUITES: the one whose Slurm the spec renders for).
    """

    cluster: str
    state_dir: Path
    runtime: str = "/usr/sbin/runc"
    ulimits: tuple[str, ...] = ("nofile=1024:4096", "nproc=4096:4096")
    image: str | None = None
    suite: str = SUITE


@dataclass
class StagedCluster:
    """How to reach a staged cluster: every node is ("127.0.0.1", port) with the cluster's key."""

    nodes: dict[str, tuple[str, int]]
    ssh_key: Path
    known_hosts: Path
    ssh_config: Path
    network: str
    containers: dict[str, str] = field(default_factory=dict)
    ssh_user: str = "root"
    addresses: dict[str, str] = field(default_factory=dict)  # node -> its static address on `network`


@dataclass(frozen=True)
class NodeStatus:
    name: str
    container: str
    container_id: str
    state: str  # podman's container state: running, exited, created, ...
    port: int | None
    systemd: str | None  # `systemctl is-system-running` when the container runs


# ---------------------------------------------------------------- naming


def state_hash(cfg: StageConfig) -> str:
    return hashlib.sha256(str(Path(cfg.state_dir).resolve()).encode()).hexdigest()[:8]


def network_name(cfg: StageConfig) -> str:
    return f"gpc-{cfg.cluster}-{state_hash(cfg)}"


def container_name(cfg: StageConfig, node: str) -> str:
    return f"{network_name(cfg)}-{node}"


def volume_name(cfg: StageConfig, node: str, path: str) -> str:
    """The node's podman volume for `path` (e.g. gpc-staging-1a2b3c4d-nfs01-export_home)."""
    return f"{container_name(cfg, node)}-{path.strip('/').replace('/', '_')}"


def _paths(cfg: StageConfig) -> dict[str, Path]:
    d = Path(cfg.state_dir)
    return {name: d / name for name in _STATE_FILES}


def _validate(cfg: StageConfig, nodes: list[StageNode]) -> None:
    problems = []
    if not _NAME_RE.match(cfg.cluster):
        problems.append(f"cluster name {cfg.cluster!r}: use 1-40 of [a-z0-9_.-], starting with a letter "
                        "or digit (it names the podman network and containers)")
    seen: set[str] = set()
    for n in nodes:
        if not _HOST_RE.match(n.name):
            problems.append(f"node name {n.name!r}: not a valid lower-case host name")
        if n.name in seen:
            problems.append(f"node name {n.name!r}: given twice")
        seen.add(n.name)
        for dev in n.gpu_devices:
            if not re.match(r"^/dev/[A-Za-z0-9_.-]+$", dev):
                problems.append(f"node {n.name}: gpu device {dev!r} is not a /dev/NAME path")
        problems += [f"node {n.name}: capability {c!r} is not a name like DAC_READ_SEARCH"
                     for c in n.caps if not re.match(r"^[A-Z_]+$", c)]
        problems += [f"node {n.name}: tmpfs or volume path {p!r} is not an absolute /path"
                     for p in (*n.tmpfs, *n.volumes) if not re.match(r"^/[A-Za-z0-9._/-]+$", p)]
        if n.memory_mb is not None and n.memory_mb < 64:
            problems.append(f"node {n.name}: memory_mb={n.memory_mb} is too small for systemd (>= 64)")
    if cfg.runtime.startswith("/") and not Path(cfg.runtime).exists():
        problems.append(f"runtime {cfg.runtime} does not exist: install it (scripts/stage-deps.sh) "
                        "or choose another runtime")
    if any(n.fuse for n in nodes) and not Path("/dev/fuse").exists():
        problems.append("a node asks for FUSE but this host has no /dev/fuse")
    if problems:
        raise StageError("invalid staging request:\n  " + "\n  ".join(problems))


def _warn_host_limits(log: Log) -> None:
    """systemd in each node holds several inotify instances charged to host root; 128 (the kernel's
    default) runs out at about 15 nodes, and later nodes come up degraded."""
    path = Path("/proc/sys/fs/inotify/max_user_instances")
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text()) < _MIN_INOTIFY_INSTANCES:
            log(f"stage: WARNING: fs.inotify.max_user_instances={path.read_text().strip()} is low for "
                "systemd containers; nodes may come up degraded once the host runs ~15 of them. "
                "scripts/stage-deps.sh raises it (sysctl fs.inotify.max_user_instances=8192).")


# ---------------------------------------------------------------- podman queries


def _podman(*args: str, what: str | None = None, check: bool = True, input: str | None = None,
            timeout: float = 120) -> str:
    cmd = ["podman", *args]
    return run(cmd, what=what or f"podman {args[0]}", check=check, input=input, timeout=timeout).stdout


def _containers(cfg: StageConfig) -> list[dict]:
    out = _podman("ps", "-a", "--format", "json",
                  "--filter", f"label={LABEL_STATE}={state_hash(cfg)}",
                  "--filter", f"label={LABEL_CLUSTER}={cfg.cluster}")
    return json.loads(out or "[]")


def _ssh_port(container: dict) -> int | None:
    for p in container.get("Ports") or []:
        if p.get("container_port") == 22 and p.get("host_port"):
            return int(p["host_port"])
    return None


def _exec(container: str, *cmd: str, input: str | None = None, check: bool = True,
          timeout: float = 60) -> str:
    args = ["exec", "-i"] if input is not None else ["exec"]
    return _podman(*args, container, *cmd, input=input, check=check, timeout=timeout,
                   what=f"podman exec in {container}")


# ---------------------------------------------------------------- helpers


@contextlib.contextmanager
def _lock(cfg: StageConfig) -> Iterator[None]:
    """Serialise up()/down() on one state directory (two terminals, or a CLI and a test)."""
    d = Path(cfg.state_dir)
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    with (d / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _claim_state_dir(cfg: StageConfig) -> None:
    """Record whether up() found the state directory new or empty. Only then may down() delete it
    whole, with what other layers keep there (the CLI's per-cluster secrets, role outputs); a
    directory that held files before is never removed, only the files up() wrote."""
    d = Path(cfg.state_dir)
    marker = d / _MARKER
    if marker.exists():
        return
    owned = not d.exists() or not any(p.name != ".lock" for p in d.iterdir())
    d.mkdir(parents=True, exist_ok=True)
    _write_if_changed(marker, json.dumps({"cluster": cfg.cluster, "owned": owned}) + "\n")


def _owns_state_dir(cfg: StageConfig) -> bool:
    try:
        info = json.loads((Path(cfg.state_dir) / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("owned") is True and info.get("cluster") == cfg.cluster


def _write_if_changed(path: Path, text: str, mode: int = 0o600) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)
    return True


def _ensure_key(paths: dict[str, Path], cfg: StageConfig, log: Log) -> None:
    key = paths["id_ed25519"]
    if key.exists() and paths["id_ed25519.pub"].exists():
        return
    key.unlink(missing_ok=True)
    paths["id_ed25519.pub"].unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpucluster-stage-{cfg.cluster}",
         "-f", str(key)], what="ssh-keygen")
    key.chmod(0o600)
    paths["id_ed25519.pub"].chmod(0o600)
    log(f"stage: generated SSH key pair {key}")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port(taken: set[int]) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port
    raise StageError("could not find a free TCP port on 127.0.0.1")


def _network_subnet(net: str) -> str | None:
    """The IPv4 subnet podman gave the cluster's network (None when it has none)."""
    info = json.loads(_podman("network", "inspect", net, "--format", "json") or "[]")
    info = info[0] if isinstance(info, list) and info else info
    for sub in (info or {}).get("subnets") or []:
        if ":" not in str(sub.get("subnet", "")):
            return str(sub["subnet"])
    return None


def _with_addresses(nodes: list[StageNode], subnet: str | None, kept: dict[str, str] | None = None) -> list[StageNode]:
    """Each node gets a fixed address, as a real fleet's nodes have reserved ones: a node that is stopped and
    started, or rebooted, keeps its address, so /etc/hosts on the others and slurmctld's view of it stay true
    (podman would otherwise lease it a new one). A node keeps the address `kept` gives it (the last up()); the
    others take the free ones from .10 upwards in the order of the plan, so a grown cluster's new nodes never
    move an old one (a moved address would recreate its container under its running jobs)."""
    if subnet is None:
        return nodes
    kept = {n.name: kept[n.name] for n in nodes if kept and n.name in kept}
    taken = set(kept.values())
    pool = (str(a) for a in itertools.islice(ipaddress.ip_network(subnet).hosts(), 9, None) if str(a) not in taken)
    out = []
    for n in nodes:
        address = kept.get(n.name) or next(pool, None)
        if address is None:
            raise StageError(f"network subnet {subnet} has no room for {len(nodes)} staged nodes from .10 upwards")
        out.append(dataclasses.replace(n, address=address))
    return out


def _spec_hash(cfg: StageConfig, node: StageNode, image: str) -> str:
    """What a container was created from; a different value means up() must recreate it."""
    spec = [image, cfg.runtime, *cfg.ulimits, *node.gpu_devices, str(node.fuse), str(node.memory_mb),
            network_name(cfg)]
    spec += [f"cap:{c}" for c in node.caps] + [f"tmpfs:{p}" for p in node.tmpfs]  # absent: hash unchanged
    spec += [f"cgroups:{STAND_IN_MAJOR}"] if node.cgroups else []
    spec += ["unmask:ALL"] if node.unmask else []
    spec += [f"volume:{p}" for p in node.volumes]
    spec += [f"ip:{node.address}"] if node.address else []
    spec += ["restart:always"]  # a node that reboots itself comes back (RebootProgram: the rollout's reboots)
    return hashlib.sha256("\0".join(spec).encode()).hexdigest()[:12]


def _run_args(cfg: StageConfig, node: StageNode, image: str, port: int) -> list[str]:
    args = [
        "run", "-d",
        "--name", container_name(cfg, node.name),
        "--hostname", node.name,
        "--label", f"{LABEL_CLUSTER}={cfg.cluster}",
        "--label", f"{LABEL_STATE}={state_hash(cfg)}",
        "--label", f"{LABEL_NODE}={node.name}",
        "--label", f"{LABEL_SPEC}={_spec_hash(cfg, node, image)}",
        "--label", f"gpucluster.groups={','.join(node.groups)}",
        "--runtime", cfg.runtime,
        # podman then mounts tmpfs on /run, /run/lock, /tmp, the cgroup tree writable for systemd,
        # sets container=podman and stops with SIGRTMIN+3; nothing else is needed under runc here.
        "--systemd=always",
        # A reboot inside the node (systemctl reboot: Slurm's RebootProgram) ends the container; podman starts it
        # again, as a machine comes back from a reboot. `podman stop` and stage down still stop it for good.
        "--restart", "always",
        "--network", network_name(cfg),
        "--network-alias", node.name,
        *(["--ip", node.address] if node.address else []),
        "-p", f"127.0.0.1:{port}:22",
    ]
    for limit in cfg.ulimits:
        args += ["--ulimit", limit]
    for i, dev in enumerate(node.gpu_devices):
        # STAGING STAND-IN: a char device, not a GPU (/dev/null, or its own number where cgroups constrain it)
        source = _stand_in_path(cfg, i) if node.cgroups else Path("/dev/null")
        args += ["--device", f"{source}:{dev}"]
    if node.cgroups:
        args += ["--cgroupns", "private"]
    if node.unmask:
        args += ["--security-opt", "unmask=ALL"]
    if node.fuse:
        args += ["--device", "/dev/fuse"]
    if node.fuse or node.cgroups:
        args += ["--cap-add", "SYS_ADMIN"]
    if node.memory_mb:
        args += ["--memory", f"{node.memory_mb}m"]
    for cap in node.caps:
        args += ["--cap-add", cap]
    for path in node.tmpfs:
        args += ["--tmpfs", f"{path}:rw,exec,mode=0755"]
    for path in node.volumes:
        args += ["--mount", f"type=volume,src={volume_name(cfg, node.name, path)},dst={path}"]
    return [*args, image, *(["/bin/sh", "-c", _CGROUP_INIT] if node.cgroups else ["/sbin/init"])]


def _ensure_volumes(cfg: StageConfig, nodes: list[StageNode], log: Log) -> None:
    """Each node's volumes, labelled like the network so down() finds them; an existing one is kept (a node
    recreated on a new image keeps its export's files, as a real server keeps its disk)."""
    for node in nodes:
        for path in node.volumes:
            name = volume_name(cfg, node.name, path)
            if run(["podman", "volume", "exists", name], check=False).returncode == 0:
                continue
            _podman("volume", "create", "--label", f"{LABEL_CLUSTER}={cfg.cluster}",
                    "--label", f"{LABEL_STATE}={state_hash(cfg)}", "--label", f"{LABEL_NODE}={node.name}", name)
            log(f"stage: node {node.name}: created volume {name} for {path}")


def _stand_in_path(cfg: StageConfig, index: int) -> Path:
    return Path(cfg.state_dir) / _STAND_IN_DIR / f"gpu{index}"


def _ensure_stand_ins(cfg: StageConfig, nodes: list[StageNode]) -> None:
    """The host-side device files podman copies into nodes with cgroups (--device SOURCE:PATH keeps the
    source's numbers): char STAND_IN_MAJOR:i, in the cluster's private state folder."""
    count = max((len(n.gpu_devices) for n in nodes if n.cgroups), default=0)
    if not count:
        return
    folder = Path(cfg.state_dir) / _STAND_IN_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    for i in range(count):
        path = _stand_in_path(cfg, i)
        want = os.makedev(STAND_IN_MAJOR, i)
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
                continue
            path.unlink()
        # 0666 like a GPU's device file; the folder (0700) keeps it from everyone but root on the host
        os.mknod(path, 0o666 | stat.S_IFCHR, want)
        path.chmod(0o666)


def _create(cfg: StageConfig, node: StageNode, image: str, port: int, taken: set[int], log: Log) -> int:
    """podman run; when the port was grabbed meanwhile, try another one."""
    for _attempt in range(3):
        if port in taken or not _port_free(port):
            port = _free_port(taken)
        try:
            _podman(*_run_args(cfg, node, image, port), what=f"podman run for node {node.name}")
            return port
        except StageError as exc:
            # podman run may leave a created-but-not-started container behind: never reuse it.
            _podman("rm", "-f", container_name(cfg, node.name), check=False)
            if "address already in use" not in str(exc):
                raise
            taken.add(port)
    raise StageError(f"node {node.name}: no free port on 127.0.0.1 after 3 tries")


def _diagnose(container: str) -> str:
    out = _podman("logs", "--tail", "20", container, check=False)
    failed = _exec(container, "systemctl", "--failed", "--no-legend", "--no-pager", check=False)
    journal = _exec(container, "journalctl", "-u", "ssh.service", "-u", "gpucluster-ssh-hostkeys.service",
                    "-n", "20", "--no-pager", check=False)
    return f"podman logs:\n{out}\nfailed units:\n{failed}\nssh journal:\n{journal}"


def _wait_ready(cfg: StageConfig, ports: dict[str, int], log: Log) -> dict[str, str]:
    """Wait until sshd runs in every node and answers on its published port; return host keys."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    pending = dict(ports)
    keys: dict[str, str] = {}
    while pending:
        for name, port in list(pending.items()):
            c = container_name(cfg, name)
            # one exec per node and round: on two cores, polling competes with the nodes' boot
            try:
                res = run(["podman", "exec", c, "sh", "-c", _HOSTKEY_WHEN_SSH_ACTIVE], check=False, timeout=30)
            except StageError:  # a slow exec on a loaded machine (seen past 30 s at load average 60): next round
                continue
            pub = res.stdout.split()
            if res.returncode != 0 or len(pub) < 2:
                running = _podman("inspect", "--format", "{{.State.Running}}", c, check=False).strip()
                if running != "true":
                    raise StageError(f"node {name}: container {c} is not running\n{_diagnose(c)}")
                continue
            if not _ssh_banner(port):
                continue
            keys[name] = f"{pub[0]} {pub[1]}"
            del pending[name]
        if not pending:
            break
        if time.monotonic() > deadline:
            name = next(iter(pending))
            raise StageError(f"node {name}: sshd not reachable on 127.0.0.1:{pending[name]} after "
                             f"{_READY_TIMEOUT_S}s\n{_diagnose(container_name(cfg, name))}")
        time.sleep(1)
    return keys


def _recorded_keys(known_hosts: Path) -> dict[int, str]:
    """port -> "type key" from the known_hosts this stage wrote ("[127.0.0.1]:PORT type key" lines)."""
    out = {}
    with contextlib.suppress(OSError):
        for line in known_hosts.read_text().splitlines():
            parts = line.split()
            m = re.fullmatch(r"\[127\.0\.0\.1\]:(\d+)", parts[0]) if len(parts) >= 3 else None
            if m:
                out[int(m.group(1))] = f"{parts[1]} {parts[2]}"
    return out


def _ssh_ok(paths: dict[str, Path], port: int) -> bool:
    """Our key logs in as root on 127.0.0.1:port, the host key checked against the recorded one."""
    argv = ["ssh", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={paths['known_hosts']}",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10",
            "-i", str(paths["id_ed25519"]), "-p", str(port), "-l", "root", "--", "127.0.0.1", "true"]
    try:
        return run(argv, check=False, timeout=60).returncode == 0
    except StageError:
        return False


def _ssh_banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.settimeout(3)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _authorize(container: str, pubkey: str) -> bool:
    script = ('umask 077; mkdir -p /root/.ssh; k=$(cat); '
              'if [ "$(cat /root/.ssh/authorized_keys 2>/dev/null)" = "$k" ]; then echo unchanged; '
              'else printf "%s\\n" "$k" > /root/.ssh/authorized_keys; echo changed; fi')
    return _exec(container, "sh", "-c", script, input=pubkey.strip()).strip() == "changed"


def _ssh_config(cfg: StageConfig, ports: dict[str, int], paths: dict[str, Path]) -> str:
    lines = [f"# staged cluster {cfg.cluster}: written by gpucluster stage up, removed by down", ""]
    for name, port in sorted(ports.items()):
        lines += [
            f"Host {name}",
            "  HostName 127.0.0.1",
            f"  Port {port}",
            "  User root",
            f"  IdentityFile {paths['id_ed25519']}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {paths['known_hosts']}",
            "  StrictHostKeyChecking yes",
            "",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------- public API


def _network(cfg: StageConfig, paths: dict[str, Path], nodes: list[StageNode],
             log: Log) -> tuple[str, list[StageNode]]:
    """The cluster's podman network, created when missing, and `nodes` with their fixed addresses on it
    (_with_addresses: the ones the last up() recorded kept)."""
    net = network_name(cfg)
    if run(["podman", "network", "exists", net], check=False).returncode != 0:
        _podman("network", "create", "--label", f"{LABEL_CLUSTER}={cfg.cluster}",
                "--label", f"{LABEL_STATE}={state_hash(cfg)}", net)
        log(f"stage: created podman network {net}")
    kept: dict[str, str] = {}
    if paths["addresses.json"].exists():
        kept = {str(k): str(v) for k, v in json.loads(paths["addresses.json"].read_text()).items()}
    return net, _with_addresses(nodes, _network_subnet(net), kept)


def _remove_unstaged(cfg: StageConfig, nodes: list[StageNode], log: Log) -> dict[str, dict]:
    """The cluster's containers by node name, as listed; those of nodes no longer staged are removed."""
    wanted = {n.name: n for n in nodes}
    existing = {c["Labels"].get(LABEL_NODE, ""): c for c in _containers(cfg)}
    for name, c in existing.items():
        if name not in wanted:
            log(f"stage: removing container {c['Names'][0]}: node {name!r} is no longer staged")
            _rm(cfg, [c["Id"]])
    return existing


def _reuse_containers(cfg: StageConfig, nodes: list[StageNode], existing: dict[str, dict], image: str,
                      stored: dict[str, int], log: Log) -> tuple[dict[str, int], set[str], list[StageNode]]:
    """Keep each node's container while its configuration and image are the same (started when stopped),
    and remove it otherwise, its port going into `stored` for the next one. Returns the kept nodes' SSH ports,
    the nodes left running as they were, and the nodes that need a new container."""
    ports: dict[str, int] = {}
    unchanged: set[str] = set()
    to_create: list[StageNode] = []
    for node in nodes:
        c = existing.get(node.name)
        if c is not None and c["Labels"].get(LABEL_SPEC) != _spec_hash(cfg, node, image):
            log(f"stage: node {node.name}: configuration or image changed, recreating its container")
            _rm(cfg, [c["Id"]])
            stored.setdefault(node.name, _ssh_port(c) or 0)
            c = None
        if c is None:
            to_create.append(node)
            continue
        port = _ssh_port(c)
        if port is None:
            raise StageError(f"node {node.name}: container {c['Names'][0]} publishes no SSH port; "
                             "run down() and up() again")
        ports[node.name] = port
        if c["State"] != "running":
            _podman("start", c["Id"])
            log(f"stage: node {node.name}: started existing container (ssh 127.0.0.1:{port})")
        else:
            unchanged.add(node.name)
            log(f"stage: node {node.name}: unchanged (ssh 127.0.0.1:{port})")
    return ports, unchanged, to_create


def _create_containers(cfg: StageConfig, to_create: list[StageNode], image: str, ports: dict[str, int],
                       stored: dict[str, int], log: Log) -> None:
    """Create the containers of `to_create`, each on the port it had when it has one, else on a free one, and
    add their ports to `ports`."""
    taken = set(ports.values())
    for node in to_create:
        port = _create(cfg, node, image, stored.get(node.name) or _free_port(taken), taken, log)
        taken.add(port)
        ports[node.name] = port
        extra = ""
        if node.gpu_devices:
            numbers = f"character devices {STAND_IN_MAJOR}:N" if node.cgroups else "/dev/null"
            extra = f"; {', '.join(node.gpu_devices)} are STAGING STAND-INS ({numbers}), not GPUs"
        if node.cgroups:
            extra += "; writable cgroup v1 hierarchies in a private cgroup namespace for Slurm"
        log(f"stage: node {node.name}: created container {container_name(cfg, node.name)} "
            f"(ssh 127.0.0.1:{port}{extra})")


def _ready(cfg: StageConfig, paths: dict[str, Path], ports: dict[str, int], unchanged: set[str],
           log: Log) -> dict[str, str]:
    """Each node's host key once it answers SSH, with the cluster's public key installed for root where our
    key does not log in already."""
    # A node left running as it was, whose host key this stage recorded, is ready when our key logs in over
    # SSH against that key: no podman exec (an exec into a production-profile node was seen to fail for good,
    # its name=systemd cgroup gone, while the node ran and answered SSH).
    recorded = _recorded_keys(paths["known_hosts"])
    proven = {n: recorded[ports[n]] for n in sorted(unchanged)
              if ports[n] in recorded and _ssh_ok(paths, ports[n])}
    host_keys = {**proven, **_wait_ready(cfg, {n: p for n, p in ports.items() if n not in proven}, log)}
    pubkey = paths["id_ed25519.pub"].read_text()
    for name in ports:
        if name in proven:  # our key already logged in there
            continue
        if _authorize(container_name(cfg, name), pubkey):
            log(f"stage: node {name}: installed the cluster's public key for root")
    return host_keys


def _write_state_files(cfg: StageConfig, paths: dict[str, Path], ports: dict[str, int], host_keys: dict[str, str],
                       nodes: list[StageNode]) -> None:
    """known_hosts, ports.json, addresses.json and ssh_config for the nodes now up, each written only when it
    changed; the next up() keeps the ports and addresses recorded here."""
    known = "".join(f"[127.0.0.1]:{ports[n]} {host_keys[n]}\n" for n in sorted(ports))
    _write_if_changed(paths["known_hosts"], known)
    _write_if_changed(paths["ports.json"], json.dumps(dict(sorted(ports.items())), indent=2) + "\n")
    _write_if_changed(paths["addresses.json"], json.dumps({n.name: n.address for n in nodes if n.address},
                                                         indent=2, sort_keys=True) + "\n")
    _write_if_changed(paths["ssh_config"], _ssh_config(cfg, ports, paths))


def up(cfg: StageConfig, nodes: list[StageNode], log: Log = print) -> StagedCluster:
    """Bring the staged cluster to exactly `nodes`; a repeated call with the same input changes nothing."""
    _validate(cfg, nodes)
    _warn_host_limits(log)
    started = time.monotonic()
    _claim_state_dir(cfg)
    with _lock(cfg):
        image = cfg.image or ensure_image(log, suite=cfg.suite)
        paths = _paths(cfg)
        _ensure_key(paths, cfg, log)
        _ensure_stand_ins(cfg, nodes)
        _ensure_volumes(cfg, nodes, log)
        net, nodes = _network(cfg, paths, nodes, log)
        existing = _remove_unstaged(cfg, nodes, log)
        stored: dict[str, int] = {}
        if paths["ports.json"].exists():
            stored = {k: int(v) for k, v in json.loads(paths["ports.json"].read_text()).items()}
        ports, unchanged, to_create = _reuse_containers(cfg, nodes, existing, image, stored, log)
        _create_containers(cfg, to_create, image, ports, stored, log)
        host_keys = _ready(cfg, paths, ports, unchanged, log)
        _write_state_files(cfg, paths, ports, host_keys, nodes)
        log(f"stage: cluster {cfg.cluster}: {len(ports)} node(s) up in {time.monotonic() - started:.1f}s "
            f"(network {net}, ssh config {paths['ssh_config']})")
        return StagedCluster(
            nodes={n: ("127.0.0.1", p) for n, p in sorted(ports.items())},
            ssh_key=paths["id_ed25519"],
            known_hosts=paths["known_hosts"],
            ssh_config=paths["ssh_config"],
            network=net,
            containers={n: container_name(cfg, n) for n in sorted(ports)},
            addresses={n.name: n.address for n in nodes if n.address},
        )


def _rm(cfg: StageConfig, ids: list[str]) -> None:
    """podman rm -f, retried: podman 4.3 fails ("could not be stopped ... state improper: stopped", or "given
    PIDs did not die within timeout" on a loaded machine) when a container finishes its systemd shutdown just as
    the stop timeout sends SIGKILL; the next try finds it stopped."""
    err = ""
    left = list(ids)
    for _attempt in range(3):
        if not left:
            return
        res = run(["podman", "rm", "-f", "-t", "5", *left], check=False, timeout=180, what="podman rm")
        err = res.stderr
        still = {c["Id"] for c in _containers(cfg)}
        left = [i for i in left if i in still]
    if left:
        names = {c["Id"]: c["Names"][0] for c in _containers(cfg)}
        raise StageError(f"could not remove {len(left)} container(s) of cluster {cfg.cluster}: "
                         f"{', '.join(names.get(i, i) for i in left)}", cmd=["podman", "rm", "-f", "-t", "5", *left],
                         stderr=err)


def _remove_containers(cfg: StageConfig, log: Log) -> None:
    containers = _containers(cfg)
    _rm(cfg, [c["Id"] for c in containers])
    if containers:
        log(f"stage: removed {len(containers)} container(s) of cluster {cfg.cluster}")


def _volumes(cfg: StageConfig) -> list[str]:
    """The cluster's volumes: both labels match. podman 4.3's `volume ls` ORs its label filters (networks and
    containers AND them), so one filter is asked for and the other is checked here: down() of one cluster
    must never reach the volumes of another cluster of the same name (a demo left up while the tests run)."""
    out = _podman("volume", "ls", "--format", "json", "--filter", f"label={LABEL_STATE}={state_hash(cfg)}")
    want = {LABEL_STATE: state_hash(cfg), LABEL_CLUSTER: cfg.cluster}
    return [v["Name"] for v in json.loads(out or "[]")
            if all((v.get("Labels") or {}).get(k) == val for k, val in want.items())]


def down(cfg: StageConfig, log: Log = print) -> None:
    """Remove the cluster's containers, network and state directory; safe to call when nothing is up.

    The state directory goes whole when up() created it (secrets and outputs other layers put there
    belong to this staged cluster too); otherwise only the files up() wrote are removed.
    """
    d = Path(cfg.state_dir)
    with _lock(cfg):
        _remove_containers(cfg, log)
        nets = _podman("network", "ls", "--format", "{{.Name}}",
                       "--filter", f"label={LABEL_STATE}={state_hash(cfg)}",
                       "--filter", f"label={LABEL_CLUSTER}={cfg.cluster}").split()
        if network_name(cfg) not in nets and run(
            ["podman", "network", "exists", network_name(cfg)], check=False
        ).returncode == 0:
            nets.append(network_name(cfg))
        for net in nets:
            # No -f: that would also remove containers that are not ours if any joined the network.
            _podman("network", "rm", net)
            log(f"stage: removed podman network {net}")
        volumes = _volumes(cfg)
        if volumes:
            _podman("volume", "rm", *volumes)  # no -f: a volume some other container still uses stays
            log(f"stage: removed {len(volumes)} volume(s) of cluster {cfg.cluster}")
        if _owns_state_dir(cfg):
            shutil.rmtree(d)
            log(f"stage: removed state directory {d}")
            return
        for path in [*_paths(cfg).values(), d / _MARKER]:
            for p in (path, path.with_name(path.name + ".tmp")):
                p.unlink(missing_ok=True)
        if (d / _STAND_IN_DIR).is_dir():
            shutil.rmtree(d / _STAND_IN_DIR)
        (d / ".lock").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        d.rmdir()
    if d.exists():
        log(f"stage: kept {d}: it holds files gpucluster stage did not create: "
            f"{', '.join(sorted(os.listdir(d)))}")


def status(cfg: StageConfig) -> list[NodeStatus]:
    """What podman knows about the cluster's containers, and systemd's state inside running ones."""
    result = []
    for c in sorted(_containers(cfg), key=lambda c: c["Labels"].get(LABEL_NODE, "")):
        name = c["Names"][0]
        systemd = None
        if c["State"] == "running":
            systemd = _exec(name, "systemctl", "is-system-running", check=False, timeout=20).strip()
        result.append(NodeStatus(
            name=c["Labels"].get(LABEL_NODE, ""), container=name, container_id=c["Id"],
            state=c["State"], port=_ssh_port(c), systemd=systemd,
        ))
    return result
