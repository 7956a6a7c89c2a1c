"""Run a rendered Slurm config for real on this machine: the config's actual consumer.

``SlurmCluster`` copies a rendered config directory into a private temp dir, adapts only what one
machine running as root needs (see :mod:`gpucluster.emulate.adapt`), starts a private munged
with a freshly generated key and slurmctld in the foreground, and optionally one ``slurmd -N NAME``
per emulated node. Every process is tracked by PID and stopped on exit, on error, and at interpreter
exit (:mod:`gpucluster.emulate.procs`).

``line`` picks the Slurm major line that runs the config: the host's packages by default, or one of
:data:`gpucluster.emulate.roots.LINES` (24.11 and 26.05 run inside cached Debian roots through
chroot). The private dir then lies inside that root, and the daemons see it at its inner path.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType

import hostlist

from gpucluster import slurmtext
from gpucluster.emulate.adapt import Adaptation, Layout, SlurmConf, adapt_gres_conf, adapt_slurm_conf
from gpucluster.emulate.procs import (
    ORDER_MUNGED,
    ORDER_SLURMCTLD,
    ORDER_SLURMD,
    ProcessTracker,
    Tracked,
    proc_status_kib,
    pss_kib,
    reset_peak_rss,
)
from gpucluster.emulate.roots import Runtime, runtime
from gpucluster.emulate.switchtree import Topology, parse_show_topology
from gpucluster.outputs import write_file

KEEP_ENV = "GPUCLUSTER_EMULATE_KEEP"
# The RebootProgram of every emulated node (slurm.conf RebootProgram, replaced by the adaptation). slurmd runs
# it through system() when slurmctld sends REQUEST_REBOOT_NODES (scontrol reboot): it finds the node's name on
# the command line of the slurmd above it and leaves a request for the harness, which stops that slurmd and,
# after `reboot_delay` seconds, starts it again with -b ("Report node reboot now": slurmd registers a boot time
# of now). slurmctld then sees a node that rebooted after the request, exactly as for a real machine: it clears
# REBOOT_ISSUED and applies nextstate. Stand-in for: the machine's reboot (kernel, firmware, the boot itself).
REBOOT_SCRIPT = """#!/bin/sh
# gpucluster emulate: the emulated reboot (see gpucluster/emulate/harness.py, REBOOT_SCRIPT)
req="$1"
p=$PPID
while [ "${p:-1}" -gt 1 ]; do
    set -- $(tr '\\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)
    case "$1" in
        *slurmd)
            while [ $# -gt 1 ]; do
                if [ "$1" = -N ]; then
                    printf '%s\\n' "$p" > "$req/.$2.tmp" && mv "$req/.$2.tmp" "$req/$2" && exit 0
                fi
                shift
            done ;;
    esac
    p=$(sed 's/.*) [A-Za-z] \\([0-9]*\\).*/\\1/' "/proc/$p/stat" 2>/dev/null)
done
echo "gpucluster emulated reboot: no slurmd -N above pid $$" >&2
exit 1
"""
# A configless slurmd's private /run: a tmpfs whose munge/munge.socket.2 (libmunge's built-in socket, the one
# slurmd asks before it has fetched AuthInfo) links to this cluster's munged; $1 is that socket's path.
CONFIGLESS_ENTER = ('mount -t tmpfs tmpfs /run && mkdir -p /run/munge '
                    '&& ln -s "$1" /run/munge/munge.socket.2 && shift && exec "$@"')
# The same inside a Debian root (roots._ENTER plus the link): $1 the socket as the daemons see it, $2 the root.
CONFIGLESS_ROOT_ENTER = ('s="$1"; r="$2"; shift 2; mount -t proc proc "$r/proc" && mount --bind /etc/hosts '
                         '"$r/etc/hosts" && mount -t tmpfs tmpfs "$r/run" && mkdir -p "$r/run/munge" '
                         '&& ln -s "$s" "$r/run/munge/munge.socket.2" && exec chroot "$r" "$@"')
_PORT_LO, _PORT_HI = 20000, 32000  # below Linux's ephemeral range (32768-60999)


class SlurmStartError(RuntimeError):
    """slurmctld, slurmd or munged did not come up; the message carries the daemon's log tail."""


class SlurmConfigError(SlurmStartError):
    """slurmctld came up but logged that it did not understand (part of) the config."""


# slurmctld 22.05 only *warns* about these (the job then runs on a topology other than the rendered
# one), so the harness treats them as fatal unless strict=False.
CONFIG_ERROR_PATTERNS = (
    "Invalid hostnames in switch configuration",  # unknown node in topology.conf
    "lack access to",  # a node under no leaf ("switches lack access", 26.05: "Blocks lack access")
    "Multiple leaf switches contain nodes",  # a node under two leaves
    "lookup failure for node",
    "fix your gres.conf",
    "Parse error",
    "Invalid GRES",
    "is defunct",  # 24.11+: a key that does nothing any more ("The option X is defunct")
    "Invalid ReconfigFlag",
    "Invalid HealthCheckNodeState",  # an unknown state is ignored, the check runs in others
)


def _cgroup_disabled(text: str) -> tuple[str, Adaptation]:
    """Inside a Debian root there is no /sys/fs/cgroup, and slurmd 24.11+ refuses to start without its
    cgroup plugin ("cgroup filesystem not mounted"); the emulated nodes use proctrack/linuxproc and
    task/none anyway, so the plugin is switched off for them (CgroupPlugin=disabled, 23.11+)."""
    old = slurmtext.settings(text, lower=True).get("cgroupplugin")
    kept = [ln for ln in text.splitlines() if not ln.strip().lower().startswith("cgroupplugin")]
    return ("".join(f"{ln}\n" for ln in kept) + "CgroupPlugin=disabled\n",
            Adaptation("cgroup.conf", "CgroupPlugin", old, "disabled",
                       "no cgroup filesystem inside the Debian root; the emulated nodes track by linuxproc"))


class SlurmCommandError(RuntimeError):
    """A Slurm client command failed."""


def free_port_block(count: int, *, rng: random.Random | None = None, tries: int = 200) -> int:
    """First port of ``count`` consecutive TCP ports that are free right now on every address."""
    rng = rng or random.Random()
    for _ in range(tries):
        base = rng.randrange(_PORT_LO, _PORT_HI - count)
        if all(_port_free(p) for p in range(base, base + count)):
            return base
    raise SlurmStartError(f"no block of {count} free ports in {_PORT_LO}-{_PORT_HI}")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} not written)"
    return "\n".join(data[-lines:]) or f"({path} empty)"


def parse_show_blocks(text: str) -> dict[str, dict]:
    """``scontrol show topology`` of topology/block -> name -> {nodes, size, aggregated}; base blocks are
    BlockName lines, the blocks Slurm built from BlockSizes are AggregatedBlock lines."""
    out: dict[str, dict] = {}
    for line in text.splitlines():
        raw = slurmtext.record(line)
        name = raw.get("BlockName") or raw.get("AggregatedBlock")
        if name is None:
            continue
        nodes = raw.get("Nodes", "")
        out[name] = {
            "nodes": set(hostlist.expand_hostlist(nodes)) if nodes and nodes != "(null)" else set(),
            "size": int(raw.get("BlockSize", 0) or 0),
            "aggregated": "AggregatedBlock" in raw,
        }
    return out


def parse_show_nodes(text: str) -> dict[str, dict]:
    """``scontrol show node -o`` -> name -> raw fields plus typed state/gres/cpus/memory."""
    nodes: dict[str, dict] = {}
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        raw = slurmtext.record(line)
        name = raw["NodeName"]
        state = raw.get("State", "")
        gres = raw.get("Gres", "(null)")
        nodes[name] = {
            **raw,
            "state": state,
            "states": set(state.split("+")) if state else set(),
            "gres": "" if gres == "(null)" else gres,
            "cpus": int(raw.get("CPUTot", 0) or 0),
            "memory": int(raw.get("RealMemory", 0) or 0),
            "partitions": set(filter(None, raw.get("Partitions", "").split(","))),
            "registered": raw.get("SlurmdStartTime", "None") != "None" and "NOT_RESPONDING" not in state,
        }
    return nodes


class SlurmCluster:
    """A private slurmctld (plus optional emulated slurmd) running a rendered config.

    ``slurmd_nodes``: nodes to run a ``slurmd -N`` for (None: controller only). ``absent_state``:
    State= given to config nodes that get no slurmd (``FUTURE``/``CLOUD``; None keeps them as
    rendered). ``overrides``: deliberate slurm.conf settings for an experiment (recorded apart
    from the adaptations). ``line``: the Slurm major line to run ("22.05", "24.11", "26.05"; None:
    whatever the host has).
    """

    def __init__(
        self,
        conf_dir: Path,
        *,
        slurmd_nodes: Sequence[str] | None = None,
        workdir: Path | None = None,
        absent_state: str | None = None,
        overrides: Mapping[str, str | None] | None = None,
        start_timeout: float = 60.0,
        slurmd_batch: int = 16,
        keep: bool | None = None,
        strict: bool = True,
        line: str | None = None,
        reboot_delay: float = 2.0,
        configless: bool = False,
    ) -> None:
        self.conf_dir = Path(conf_dir)
        self.line = line
        self.runtime = Runtime()
        self.slurmd_nodes = list(slurmd_nodes or [])
        self._own_workdir = workdir is None
        self._workdir_arg = workdir
        self.absent_state = absent_state
        self.overrides = dict(overrides or {})
        self.start_timeout = start_timeout
        self.slurmd_batch = max(1, slurmd_batch)
        self.keep = bool(os.environ.get(KEEP_ENV)) if keep is None else keep
        self.strict = strict
        self.tracker = ProcessTracker()
        self.adaptations: list[Adaptation] = []
        self.node_ports: dict[str, int] = {}
        self._daemon_ports = (0, 0)
        self._log_from: dict[Path, int] = {}  # a restarted daemon's log is checked from its restart on
        # a restarted slurmctld recovers finished jobs that named nodes since removed (a shrink) and logs
        # "lookup failure for node" for each: about those jobs, not about the config
        self._log_ignore: tuple[str, ...] = ("lookup failure for node",)
        self.slurmd: dict[str, Tracked] = {}
        self.ctld: Tracked | None = None
        self.munged: Tracked | None = None
        self.ready_s: float | None = None  # slurmctld spawn -> first UP ping
        self.slurmd_ready_s: float | None = None  # first slurmd spawn -> all registered
        self.stop_notes: list[str] = []
        self.reboot_delay = reboot_delay
        self.configless = configless
        self.reboots: list[tuple[str, float, float]] = []  # (node, request seen, slurmd -b started), monotonic
        self._reboot_stop = threading.Event()
        self._reboot_threads: list[threading.Thread] = []
        self._spawns: queue.Queue[tuple[str, float]] = queue.Queue()
        self.workdir = Path()
        self.inner = PurePosixPath()  # the private dir as the daemons see it (inside a root: /tmp/...)

    # ----------------------------------------------------------------------------------- paths
    @property
    def etc(self) -> Path:
        return self.workdir / "etc"

    @property
    def conf_path(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def inner_conf(self) -> PurePosixPath:
        return self.inner / "etc" / "slurm.conf"

    @property
    def ctld_log(self) -> Path:
        return self.workdir / "log" / "slurmctld.log"

    def slurmd_log(self, node: str) -> Path:
        return self.workdir / "log" / f"slurmd-{node}.log"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.inner_conf)
        return self.tracker.env(env)

    # --------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self.line is None:
            for tool in ("slurmctld", "scontrol", "munged"):
                if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
                    raise SlurmStartError(f"{tool} not found: apt-get install slurmctld slurmd slurm-client munge")
        else:
            self.runtime = runtime(self.line)
        self._prepare_workdir()
        self._write_configs()
        self._start_munged()
        self._start_slurmctld()
        if self.slurmd_nodes:
            self._start_slurmd()
            self._start_reboot_watcher()

    def stop(self) -> list[str]:
        """Stop every process this cluster started; remove the private dir unless kept.

        Jobs are cancelled first so slurmstepd (which ignores SIGTERM by design) ends on its own;
        what is left is stopped by PID (:meth:`ProcessTracker.stop`)."""
        self._reboot_stop.set()
        for t in self._reboot_threads:
            t.join(timeout=15)
        if self.slurmd and self.ctld is not None and self.ctld.popen.poll() is None:
            with contextlib.suppress(Exception):
                self.cancel_all(wait=15.0)
        self.stop_notes = self.tracker.stop()
        if self._own_workdir and not self.keep and self.workdir != Path() and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.stop_notes

    def _prepare_workdir(self) -> None:
        if self._workdir_arg is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="gpucluster-slurm-", dir=self.runtime.tmp_base()))
        else:
            self.workdir = Path(self._workdir_arg)
            self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.inner = self.runtime.inner_path(self.workdir)
        except ValueError:
            raise SlurmStartError(f"{self.workdir}: Slurm {self.line} runs inside {self.runtime.root}; "
                                  f"give a workdir under {self.runtime.tmp_base()} or none") from None
        # munged insists that every directory above its socket is searchable by all
        self.workdir.chmod(0o755)
        for sub in ("etc", "state", "spool", "log", "run", "dev", "bin", "reboot"):
            (self.workdir / sub).mkdir(exist_ok=True)
        (self.workdir / "munge").mkdir(mode=0o755, exist_ok=True)
        (self.workdir / "munge" / "key").mkdir(mode=0o700, exist_ok=True)

    def _write_configs(self) -> None:
        """Adapt the rendered config dir and write it over etc/. Every file is written whole and renamed into
        place, adapted before it lands: a running cluster's slurmd and slurmstepd read these files at any
        moment (a batch step reads cgroup.conf as it launches), and a copy of the rendered file followed by its
        adaptation let a step launched in between read the unadapted one and fail ("cgroup filesystem not
        mounted"), which requeued the job."""
        src = self.conf_dir / "slurm.conf"
        if not src.is_file():
            raise SlurmStartError(f"{src}: no slurm.conf in the config dir")
        rendered = [f for f in sorted(self.conf_dir.iterdir()) if f.is_file()]
        files = {f.name: f.read_bytes() for f in rendered}
        modes = {f.name: f.stat().st_mode & 0o7777 for f in rendered}
        n = len(self.slurmd_nodes)
        rng = random.Random()
        kept = {k: v for k, v in self.node_ports.items() if k in set(self.slurmd_nodes)}
        if self.ctld is None:  # the first start: one block for the daemons and every node
            base = free_port_block(2 + n, rng=rng)
            self._daemon_ports = (base, base + 1)
            node_base = base + 2
        else:  # a new config for a running cluster (load_config): the same ports, new ones for new nodes
            node_base = free_port_block(max(1, n - len(kept)), rng=rng)
        layout = Layout(
            workdir=self.inner,
            hostname=socket.gethostname().split(".")[0],
            ctld_port=self._daemon_ports[0],
            slurmd_port=self._daemon_ports[1],
            munge_socket=self.inner / "munge" / "munge.socket",
            emulated=tuple(self.slurmd_nodes),
            node_port_base=node_base,
            node_ports=kept,
            absent_state=self.absent_state,
            reboot_program=self._reboot_program() if self.slurmd_nodes else None,
        )
        text, notes, ports = adapt_slurm_conf(src.read_text(), layout, overrides=self.overrides)
        if self.configless and "enable_configless" not in (SlurmConf.parse(text).param("SlurmctldParameters") or ""):
            raise SlurmStartError(f"{src}: configless asked for, but SlurmctldParameters has no enable_configless; "
                                  "render the spec with configless Slurm (the default) or start without configless")
        files["slurm.conf"] = text.encode()
        # slurmd reads gres.conf on emulated nodes; slurmctld reads it for CLOUD nodes (and refuses
        # AutoDetect there)
        if "gres.conf" in files and (self.slurmd_nodes or (self.absent_state or "").upper() == "CLOUD"):
            gtext, gnotes, stand_ins = adapt_gres_conf(files["gres.conf"].decode(), self.inner)
            for p in stand_ins:
                # slurmd wants a character device; /dev/null is one and is harmless to open (inside a
                # root the link resolves to the root's own /dev/null)
                host = self.runtime.host_path(p)
                host.parent.mkdir(parents=True, exist_ok=True)
                if not host.is_symlink():
                    host.symlink_to("/dev/null")
            files["gres.conf"] = gtext.encode()
            notes += gnotes
        if self.slurmd_nodes and self.runtime.root is not None:
            ctext, note = _cgroup_disabled(files.get("cgroup.conf", b"").decode())
            files["cgroup.conf"] = ctext.encode()
            notes.append(note)
        for name, data in files.items():
            write_file(self.etc / name, data, mode=modes.get(name, 0o644))
        self.node_ports = ports
        self.adaptations = notes
        (self.workdir / "ADAPTATIONS.txt").write_text("".join(f"{a}\n" for a in notes))

    def _start_munged(self) -> None:
        mdir = self.workdir / "munge"
        key = mdir / "key" / "munge.key"
        # a fresh key per cluster, never printed or copied anywhere else
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(128))
        sock = mdir / "munge.socket"
        log = self.workdir / "log" / "munged.log"
        inner = self.inner / "munge"
        argv = [
            "munged",
            "--foreground",
            f"--socket={inner / 'munge.socket'}",
            f"--key-file={inner / 'key' / 'munge.key'}",
            f"--pid-file={inner / 'munged.pid'}",
            f"--log-file={self.inner / 'log' / 'munged.log'}",
            f"--seed-file={inner / 'key' / 'munged.seed'}",
            "--num-threads=16",
        ]
        self.munged = self.tracker.spawn("munged", self.runtime.argv(argv), env=self.env, log=log,
                                         order=ORDER_MUNGED)
        deadline = time.monotonic() + 15
        while not sock.exists():
            if self.munged.popen.poll() is not None or time.monotonic() > deadline:
                raise SlurmStartError(f"munged did not start; last lines of {log}:\n{tail(log)}")
            time.sleep(0.05)

    def _start_slurmctld(self) -> None:
        stderr_log = self.workdir / "log" / "slurmctld.stderr"
        argv = self.runtime.argv(["slurmctld", "-D", "-f", str(self.inner_conf)])
        t0 = time.monotonic()
        self.ctld = self.tracker.spawn("slurmctld", argv, env=self.env, log=stderr_log, order=ORDER_SLURMCTLD)
        deadline = t0 + self.start_timeout
        while True:
            rc = self.ctld.popen.poll()
            if rc is not None:
                raise SlurmStartError(
                    f"slurmctld exited with status {rc} while loading {self.conf_path} "
                    f"(rendered from {self.conf_dir}).\n{self._ctld_tails()}"
                )
            res = self.run(["scontrol", "ping"], timeout=30)
            if " is UP" in res.stdout:
                self.ready_s = time.monotonic() - t0
                self._check_log(self.ctld_log, "slurmctld")
                return
            if time.monotonic() > deadline:
                raise SlurmStartError(
                    f"slurmctld did not answer ping within {self.start_timeout:.0f}s "
                    f"({res.stdout.strip()} {res.stderr.strip()}).\n{self._ctld_tails()}"
                )
            time.sleep(0.2)

    def config_errors(self, log: Path) -> list[str]:
        try:
            text = log.read_text(errors="replace")[self._log_from.get(log, 0):]
        except OSError:
            return []
        ignore = self._log_ignore if log in self._log_from else ()
        return [ln for ln in text.splitlines()
                if any(p in ln for p in CONFIG_ERROR_PATTERNS) and not any(i in ln for i in ignore)]

    def _check_log(self, log: Path, who: str) -> None:
        if not self.strict:
            return
        errors = self.config_errors(log)
        if errors:
            shown = "\n".join(errors[:20])
            raise SlurmConfigError(
                f"{who} started but did not understand the config in {self.conf_dir} "
                f"({len(errors)} config errors; strict=False to ignore):\n{shown}\n{self._ctld_tails()}"
            )

    def _ctld_tails(self) -> str:
        return (
            f"--- last lines of {self.ctld_log}:\n{tail(self.ctld_log)}\n"
            f"--- slurmctld stderr:\n{tail(self.workdir / 'log' / 'slurmctld.stderr', 15)}"
        )

    # ------------------------------------------------------------------ changing the running cluster
    def load_config(self, conf_dir: Path, nodes: Sequence[str]) -> None:
        """Write a new rendered config (a grown or shrunk cluster) over this one's, emulating `nodes` from now
        on; daemons and ports stay as they are: what a daemon reads of it depends on how it is told (the
        release's class for adding nodes: restart_slurmctld and restart_slurmd, or `scontrol reconfigure`)."""
        self.conf_dir = Path(conf_dir)
        self.slurmd_nodes = list(nodes)
        self._write_configs()

    def restart_slurmctld(self) -> None:
        """Stop slurmctld (SIGTERM: it saves its state) and start it again on the current config; without -c
        or -R it recovers the jobs, and the nodes drained or down with their reasons (slurmctld(8))."""
        assert self.ctld is not None
        self._log_from[self.ctld_log] = self.ctld_log.stat().st_size if self.ctld_log.exists() else 0
        self.ctld.popen.send_signal(signal.SIGTERM)
        try:
            self.ctld.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise SlurmStartError(f"slurmctld did not stop on SIGTERM in 60 s\n{self._ctld_tails()}") from None
        self._start_slurmctld()

    def stop_slurmd(self, nodes: Iterable[str]) -> None:
        """Stop these nodes' slurmd (SIGTERM): running job steps go on without it, as on a real node."""
        for node in nodes:
            t = self.slurmd.get(node)
            if t is not None and t.popen.poll() is None:
                t.popen.send_signal(signal.SIGTERM)
        for node in nodes:
            t = self.slurmd.get(node)
            if t is not None:
                try:
                    t.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    t.popen.kill()
                    t.popen.wait()

    def start_slurmd(self, nodes: Sequence[str]) -> None:
        """Start slurmd for these nodes (new ones, or ones stopped) and wait until each has registered."""
        deadline = time.monotonic() + self.start_timeout + 1.0 * len(nodes)
        for i in range(0, len(nodes), self.slurmd_batch):
            batch = list(nodes[i : i + self.slurmd_batch])
            for node in batch:
                (self.workdir / "spool" / node).mkdir(exist_ok=True)
                argv = self._slurmd_argv(node)
                self.slurmd[node] = self.tracker.spawn(f"slurmd[{node}]", argv, env=self._slurmd_env,
                                                       log=self.workdir / "log" / "slurmd.stderr",
                                                       order=ORDER_SLURMD)
            self.wait_registered(batch, deadline=deadline)

    def restart_slurmd(self, nodes: Sequence[str]) -> None:
        self.stop_slurmd(nodes)
        self.start_slurmd(nodes)

    # ------------------------------------------------------------------------------ configless
    def _slurmd_argv(self, node: str, *flags: str) -> list[str]:
        """One emulated node's slurmd: reading the private slurm.conf (-f), or configless (--conf-server).

        Configless, slurmd holds no slurm.conf of its own: it fetches slurm.conf, gres.conf, topology.conf and
        cgroup.conf from slurmctld (REQUEST_CONFIG) and keeps them in SlurmdSpoolDir/conf-cache, spool/<node>/
        here (SlurmdSpoolDir=spool/%n, %n is the -N name). Before it has a config it knows no AuthInfo, so it
        asks libmunge's built-in socket, /run/munge/munge.socket.2 (22.05 logs "Failed to access" without
        it): each configless slurmd runs in a private mount namespace with a tmpfs on /run that holds only a
        link from that name to this cluster's private munged (CONFIGLESS_ENTER). Nothing on the host changes."""
        if not self.configless:
            return self.runtime.argv(["slurmd", *flags, "-D", "-N", node, "-f", str(self.inner_conf)])
        inner = self.runtime.argv(["slurmd", *flags, "-D", "-N", node, "--conf-server",
                                   f"127.0.0.1:{self._daemon_ports[0]}"])
        sock = str(self.inner / "munge" / "munge.socket")
        if self.runtime.root is None:
            return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                    CONFIGLESS_ENTER, "sh", sock, *inner]
        # inside a root, runtime.argv enters a private namespace and chroots ("sh", root, program...): the same,
        # with the /run link made inside the root
        assert inner[:7] == ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c"], inner
        return [*inner[:7], CONFIGLESS_ROOT_ENTER, "sh", sock, *inner[9:]]

    @property
    def _slurmd_env(self) -> dict[str, str]:
        """Configless, slurmd must not see SLURM_CONF: it would read that file and never ask the controller."""
        env = self.env
        if self.configless:
            env.pop("SLURM_CONF", None)
        return env

    def conf_cache(self, node: str) -> Path:
        """The folder where a configless slurmd keeps the configs slurmctld served it (SlurmdSpoolDir/conf-cache)."""
        return self.workdir / "spool" / node / "conf-cache"

    def _reboot_program(self) -> str:
        """Write the emulated RebootProgram (REBOOT_SCRIPT) and return its command line as slurmd sees it."""
        script = self.workdir / "bin" / "reboot"
        script.write_text(REBOOT_SCRIPT)
        script.chmod(0o755)
        return f'"{self.inner / "bin" / "reboot"} {self.inner / "reboot"}"'

    def _start_reboot_watcher(self) -> None:
        t = threading.Thread(target=self._watch_reboots, name="emulated-reboots", daemon=True)
        self._reboot_threads.append(t)
        t.start()

    def _watch_reboots(self) -> None:
        """Serve the requests REBOOT_SCRIPT leaves, one thread per reboot so a wave's nodes reboot together.

        This thread lives as long as the cluster and starts every slurmd again itself: a child's
        PR_SET_PDEATHSIG (procs._child_setup) fires when the *thread* that forked it ends."""
        folder = self.workdir / "reboot"
        while not self._reboot_stop.wait(0.2):
            while True:
                try:
                    node, seen = self._spawns.get_nowait()
                except queue.Empty:
                    break
                if self._reboot_stop.is_set():
                    return
                argv = self._slurmd_argv(node, "-b")
                self.slurmd[node] = self.tracker.spawn(f"slurmd[{node}]", argv, env=self._slurmd_env,
                                                       log=self.workdir / "log" / "slurmd.stderr",
                                                       order=ORDER_SLURMD)
                self.reboots.append((node, seen, time.monotonic()))
            for req in sorted(folder.iterdir()):
                if req.name.startswith(".") or req.name not in self.slurmd:
                    continue
                req.unlink(missing_ok=True)
                t = threading.Thread(target=self._reboot, args=(req.name, time.monotonic()), daemon=True)
                self._reboot_threads.append(t)
                t.start()

    def _reboot(self, node: str, seen: float) -> None:
        """The node goes down (its slurmd stops, as on a machine that reboots), and comes back after the delay."""
        old = self.slurmd[node]
        with contextlib.suppress(ProcessLookupError):
            old.popen.send_signal(signal.SIGTERM)
        try:
            old.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            old.popen.kill()
            old.popen.wait()
        if not self._reboot_stop.wait(self.reboot_delay):
            self._spawns.put((node, seen))

    def _start_slurmd(self) -> None:
        """One ``slurmd -D -N`` per node, in batches: each slurmd spends CPU on hwloc at start, and
        this machine has two cores; a batch must register before the next one starts."""
        err_log = self.workdir / "log" / "slurmd.stderr"
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout + 1.0 * len(self.slurmd_nodes)
        nodes = self.slurmd_nodes
        for node in nodes:  # slurmd wants its spool before it creates it
            (self.workdir / "spool" / node).mkdir(exist_ok=True)
        for i in range(0, len(nodes), self.slurmd_batch):
            batch = nodes[i : i + self.slurmd_batch]
            for node in batch:
                argv = self._slurmd_argv(node)
                self.slurmd[node] = self.tracker.spawn(
                    f"slurmd[{node}]", argv, env=self._slurmd_env, log=err_log, order=ORDER_SLURMD
                )
            self.wait_registered(batch, deadline=deadline)
        self.slurmd_ready_s = time.monotonic() - t0
        self._check_log(self.slurmd_log(nodes[0]), f"slurmd -N {nodes[0]}")

    def wait_registered(self, nodes: Iterable[str], *, deadline: float) -> None:
        pending = set(nodes)
        while pending:
            dead = [n for n in pending if n in self.slurmd and self.slurmd[n].popen.poll() is not None]
            if dead:
                n = sorted(dead)[0]
                raise SlurmStartError(
                    f"slurmd -N {n} exited with status {self.slurmd[n].popen.returncode}; "
                    f"last lines of {self.slurmd_log(n)}:\n{tail(self.slurmd_log(n))}\n"
                    f"--- slurmd stderr:\n{tail(self.workdir / 'log' / 'slurmd.stderr', 15)}"
                )
            spec = hostlist.collect_hostlist(sorted(pending))
            res = self.run(["scontrol", "show", "node", "-o", spec], timeout=60)
            pending -= {n for n, rec in parse_show_nodes(res.stdout).items() if rec["registered"]}
            if not pending:
                return
            if time.monotonic() > deadline:
                n = sorted(pending)[0]
                raise SlurmStartError(
                    f"{len(pending)} emulated nodes did not register ({hostlist.collect_hostlist(sorted(pending))})"
                    f"; last lines of {self.slurmd_log(n)}:\n{tail(self.slurmd_log(n))}\n{self._ctld_tails()}"
                )
            time.sleep(0.3)

    # ----------------------------------------------------------------------------------- clients
    def run(self, cmd: Sequence[str], *, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (sinfo, squeue, sbatch, ...) against this cluster, from its Slurm line."""
        res = subprocess.run(self.runtime.argv(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise SlurmCommandError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def scontrol(self, *args: str) -> str:
        return self.run(["scontrol", *args], check=True).stdout

    def topology(self, name: str | None = None) -> Topology:
        """What slurmctld understood of a tree topology: name -> {level, nodes, switches, linkspeed}.
        name: one topology of topology.yaml (25.05+); None: the cluster default (or topology.conf's)."""
        return parse_show_topology(self.scontrol("show", "topology", *([name] if name else [])))

    def blocks(self, name: str | None = None) -> dict[str, dict]:
        """What slurmctld understood of a block topology: block -> {nodes, size, aggregated}."""
        return parse_show_blocks(self.scontrol("show", "topology", *([name] if name else [])))

    def partitions(self) -> dict[str, dict[str, str]]:
        """``scontrol show partition -o``: name -> raw fields (Nodes, Topology on 25.05+, ...)."""
        out = {}
        for line in self.scontrol("show", "partition", "-o").splitlines():
            raw = slurmtext.record(line)
            if "PartitionName" in raw:
                out[raw["PartitionName"]] = raw
        return out

    def nodes(self, *, future: bool = False) -> dict[str, dict]:
        """``scontrol show node -o`` parsed: name -> fields (state, gres, cpus, memory, ...)."""
        args = ["show", "node", "-o"] + (["--future"] if future else [])
        return parse_show_nodes(self.scontrol(*args))

    def job_ids(self, states: str = "all") -> list[str]:
        res = self.run(["squeue", "-h", "-t", states, "-o", "%i"], check=True)
        return res.stdout.split()

    def cancel_all(self, *, wait: float = 30.0) -> bool:
        """Cancel every job; True once none is pending, running or completing."""
        ids = self.job_ids("PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING")
        if ids:
            self.run(["scancel", *ids])
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not self.job_ids("PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING"):
                return True
            time.sleep(0.3)
        return False

    # ----------------------------------------------------------------------------------- metrics
    @property
    def ctld_pid(self) -> int:
        assert self.ctld is not None
        return self.ctld.pid

    def ctld_peak_rss_kib(self) -> int | None:
        return proc_status_kib(self.ctld_pid, "VmHWM")

    def ctld_rss_kib(self) -> int | None:
        return proc_status_kib(self.ctld_pid, "VmRSS")

    def reset_ctld_peak(self) -> bool:
        return reset_peak_rss(self.ctld_pid)

    def slurmd_rss_kib(self) -> list[int]:
        return [v for t in self.slurmd.values() if (v := proc_status_kib(t.pid, "VmRSS")) is not None]

    def slurmd_pss_kib(self) -> list[int]:
        """Proportional set size per slurmd: shared libraries split across the sharers."""
        return [v for t in self.slurmd.values() if (v := pss_kib(t.pid)) is not None]

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.ctld_log, lines)

