"""Run playbooks/site.yml through ansible-runner, print progress from its events, summarise the result.

Why ansible-runner rather than a subprocess: its events carry the host, role, task, result and
timing of every step, so progress, per-role times and per-host failure messages come from data,
not from parsing Ansible's screen output. Plain `ansible-playbook -i INV playbooks/site.yml`
from the repository root runs the same plays with the same ansible.cfg.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucluster.errors import UsageError
from gpucluster.inventory.reader import Inventory, inventory_file, limit_terms
from gpucluster.inventory.statedir import state_dirs
from gpucluster.paths import ansible_dir, private_dir
from gpucluster.progress import status_line
from gpucluster.words import plural

Log = Callable[[str], None]

HIDDEN = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass
class ConfigureResult:
    """What one `gpucluster configure` run did. `ok` is True when every host converged."""

    rc: int
    status: str
    hosts: dict[str, HostStats]
    failures: dict[str, list[str]]
    role_times: dict[str, float]
    elapsed: float
    artifacts: Path | None
    warnings: list[str] = field(default_factory=list)
    changes: dict[str, list[str]] = field(default_factory=dict)  # host -> "role : task" that changed
    log_path: Path | None = None  # where a caller kept the progress lines, if it did
    diffs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # host -> [(task, unified diff)]
    check: bool = False  # a --check run: the changes are what would change

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, s in self.hosts.items() if s.failed or s.unreachable)


# ---------------------------------------------------------------- locating things


def project_dir(given: str | os.PathLike | None = None) -> Path:
    """The folder holding ansible.cfg, playbooks/ and roles/ (gpucluster.paths: --project-dir,
    $GPUCLUSTER_HOME, the checkout this package runs from, or the current folder)."""
    return ansible_dir(given)


# ---------------------------------------------------------------- progress


def diff_text(diff) -> str:
    """A unified diff from Ansible's `diff` result (a dict or a list of them with before/after, or
    `prepared` text); "" when there is none. Secrets never reach it: no_log results carry no diff."""
    import difflib

    items = diff if isinstance(diff, list) else [diff] if isinstance(diff, dict) else []
    out = []
    for d in items:
        if not isinstance(d, dict):
            continue
        if d.get("prepared"):
            out.append(str(d["prepared"]).rstrip("\n"))
            continue
        before, after = d.get("before"), d.get("after")
        if not isinstance(before, str) or not isinstance(after, str) or before == after:
            continue
        lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                     str(d.get("before_header") or "before"), str(d.get("after_header") or "after"))
        out.append("".join(lines).rstrip("\n"))
    return "\n".join(out)


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def failure_message(event_data: dict) -> str:
    """One readable line from a failed or unreachable result."""
    res = event_data.get("res") or {}
    if res.get("censored"):
        return f"{res['censored']} (a no_log task: rerun it with -v on a test cluster)"
    parts = []
    msg = str(res.get("msg") or "").strip()
    if msg:
        parts.append(msg)
    for key in ("stderr", "stdout", "module_stderr"):
        text = str(res.get(key) or "").strip()
        if text and text not in msg:
            parts.append(f"{key}: {text[-600:]}")
    if not parts and res.get("results"):  # a loop: the failed items
        for item in res["results"]:
            if isinstance(item, dict) and item.get("failed"):
                parts.append(f"item {item.get('item')!r}: {str(item.get('msg') or '').strip()}")
    text = " | ".join(" ".join(p.split()) for p in parts) or "failed without a message"
    return text[:1500]


@dataclass
class _Task:
    name: str
    role: str
    play: str
    start: float
    action: str = ""
    hosts: dict[str, str] = field(default_factory=dict)  # host -> ok/changed/failed/unreachable/skipped
    started: dict[str, float] = field(default_factory=dict)  # host -> when the task started there
    messages: dict[str, list[str]] = field(default_factory=dict)  # debug message -> hosts


class Progress:
    """Turns ansible-runner events into progress lines, per-role times and per-host failures."""

    def __init__(self, log: Log = print, verbose: bool = False) -> None:
        self.log = log
        self.verbose = verbose
        self.t0 = time.monotonic()
        self.task: _Task | None = None
        self.play = ""
        self.role_times: dict[str, float] = defaultdict(float)
        self.failures: dict[str, list[str]] = defaultdict(list)
        self.changes: dict[str, list[str]] = defaultdict(list)
        self.diffs: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self.stats: dict[str, HostStats] = {}
        self.warnings: list[str] = []
        self._last_role = None

    def _stamp(self) -> str:
        return f"[{time.monotonic() - self.t0:6.1f}s]"

    def _close_task(self, end: float | None) -> None:
        task, self.task = self.task, None
        if task is None:
            return
        end = end or time.time()
        self.role_times[task.role or f"play: {task.play}"] += max(0.0, end - task.start)
        counts: dict[str, list[str]] = defaultdict(list)
        for host, status in sorted(task.hosts.items()):
            counts[status].append(host)
        if not task.hosts or set(counts) == {"skipped"}:
            return
        if task.role != self._last_role and task.role:
            self.log(f"{self._stamp()} -- role {task.role}")
        self._last_role = task.role
        parts = [f"{len(counts[s])} {s}" for s in ("ok", "changed", "failed", "unreachable") if counts.get(s)]
        line = f"{self._stamp()}    {task.name}: {', '.join(parts)}  ({end - task.start:.1f}s)"
        if counts.get("changed") and len(counts["changed"]) <= 8:
            line += f"  changed: {', '.join(counts['changed'])}"
        self.log(line)
        for msg, hosts in task.messages.items():
            self.log(f"           {', '.join(hosts)}: {msg}")

    def __call__(self, event: dict) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        created = _ts(event.get("created"))
        if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            self._close_task(created)
            name = str(data.get("task") or data.get("name") or "?")
            role = str(data.get("role") or "")
            if name.startswith(f"{role} : "):
                name = name[len(role) + 3:]
            self.task = _Task(name=("handler: " if "handler" in kind else "") + name, role=role, play=self.play,
                              start=created or time.time(), action=str(data.get("task_action") or ""))
        elif kind == "playbook_on_play_start":
            self._close_task(created)
            self.play = str(data.get("name") or data.get("play") or "")
            self.log(f"{self._stamp()} == {self.play}")
            self._last_role = None
        elif kind == "runner_on_start" and self.task is not None:
            self.task.started.setdefault(str(data.get("host") or "?"), created or time.time())
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            self._host_result(kind, data, str(event.get("stdout") or ""))
        elif kind == "playbook_on_stats":
            self._close_task(created)
            self._stats(data)
        elif kind in ("warning", "verbose") or (kind == "" and "WARNING" in str(event.get("stdout", ""))):
            text = " ".join(str(event.get("stdout") or "").split())
            if "[WARNING]" in text or "[DEPRECATION" in text:
                self.warnings.append(text)
                self.log(f"{self._stamp()} {text}")
        elif self.verbose and event.get("stdout"):
            self.log(str(event["stdout"]))
        return True

    def _host_result(self, kind: str, data: dict, stdout: str = "") -> None:
        host = str(data.get("host") or "?")
        res = data.get("res") or {}
        task = self.task
        where = f"{task.role + ' : ' if task and task.role else ''}{task.name if task else '?'}"
        if kind == "runner_on_ok":
            # A no_log result reaches the event censored, without its `changed`; the screen line keeps it.
            changed = res.get("changed") or ("censored" in res and stdout.lstrip().startswith("changed"))
            status = "changed" if changed else "ok"
            if status == "changed":
                self.changes[host].append(where)
                text = diff_text(res.get("diff"))
                if text:
                    self.diffs[host].append((where, text))
        elif kind == "runner_on_skipped":
            status = "skipped"
        elif kind == "runner_on_failed" and data.get("ignore_errors"):
            status = "ok"
        else:
            status = "unreachable" if kind == "runner_on_unreachable" else "failed"
            msg = failure_message(data)
            if status == "unreachable":
                msg += " (is the node up and its sshd reachable? a staged node: podman start it, then rerun)"
            self.failures[host].append(f"[{where}] {status}: {msg}")
            self.log(f"{self._stamp()}    {status.upper()} {host}: [{where}] {msg}")
        if task is None:
            return
        prev = task.hosts.get(host)
        rank = ["skipped", "ok", "changed", "failed", "unreachable"]
        if prev is None or rank.index(status) > rank.index(prev):
            task.hosts[host] = status
        if status in ("ok", "changed") and task.action.endswith("debug") and res.get("msg") is not None:
            text = " ".join(str(res["msg"]).split())
            if text and text not in (HIDDEN, "All items completed"):
                task.messages.setdefault(text, []).append(host)

    def now(self) -> str:
        """What is running now, for the live line: the play, its current task, hosts done / failed /
        running there, and the host that has been running it longest."""
        task = self.task
        if task is None:
            return ""
        now = time.time()
        done = dict(task.hosts)
        running = {h: t for h, t in list(task.started.items()) if h not in done}
        failed = sum(s in ("failed", "unreachable") for s in done.values())
        where = f"{task.role} : " if task.role else ""
        line = (f"{self._stamp()} {self.play} | {where}{task.name}: {len(done)} done, {failed} failed, "
                f"{len(running)} running")
        if running:
            slowest = min(running, key=running.__getitem__)
            line += f"; slowest {slowest} ({now - running[slowest]:.0f} s)"
        return line

    def _stats(self, data: dict) -> None:
        keys = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
                "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
        for key, attr in keys.items():
            for host, count in (data.get(key) or {}).items():
                setattr(self.stats.setdefault(host, HostStats()), attr, int(count))


# ---------------------------------------------------------------- the run


# The operator's environment reaches Ansible only through these names (and ANSIBLE_*, which the run
# sets itself): ansible-runner records the environment it ran with in artifacts/<id>/command, and an
# operator's shell holds tokens and passwords that have no business there.
PASSED_ENV = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSH_AUTH_SOCK", "XDG_RUNTIME_DIR",
              "GPUCLUSTER_HOME", "GPUCLUSTER_TRACE", "GPUCLUSTER_STRATEGY_BASE")


def _runner_env(env: dict[str, str]) -> dict[str, str]:
    """What ansible-playbook runs with: ansible-runner's own settings plus the few names it needs."""
    keep = {k: v for k, v in env.items() if k.startswith(("ANSIBLE_", "AWX_", "RUNNER_")) or k in PASSED_ENV}
    keep["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/sbin", "/usr/local/bin",
                                    "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    return keep


# The strategy plugin that runs the plays. Mitogen's (`mitogen_linear`) keeps one Python interpreter per host,
# reached over one ssh connection, and runs each module inside it: no per-task ssh session, no AnsiballZ zip
# built, sent and unpacked for every task on every host (docs/roles.md, "Controller cost"). Ansible's own
# `linear` runs the same plays in the same order. GPUCLUSTER_ANSIBLE_STRATEGY chooses (`linear` forces
# Ansible's own), then an operator's ANSIBLE_STRATEGY; without either, Mitogen's where the ops extra
# installed it, else Ansible's.
STRATEGY_ENV = "GPUCLUSTER_ANSIBLE_STRATEGY"
DEFAULT_STRATEGY = "mitogen_linear"
PLAIN_STRATEGY = "linear"
# plugins/strategy/gpucluster_linear.py: the chosen strategy, with assert, set_fact, debug, include_* and the
# argument checks run in the controller process instead of a forked worker each. It reads its base's name here.
INPROCESS_STRATEGY = "gpucluster_linear"
STRATEGY_BASE_ENV = "GPUCLUSTER_STRATEGY_BASE"


def mitogen_strategy_dir() -> Path | None:
    """The installed ansible_mitogen's strategy plugins folder, or None where Mitogen is not installed."""
    import importlib.util

    found = importlib.util.find_spec("ansible_mitogen")
    if found is None or not found.origin:
        return None
    folder = Path(found.origin).parent / "plugins" / "strategy"
    return folder if (folder / "mitogen_linear.py").is_file() else None


def strategy_env(environ: dict[str, str] | None = None, proj: Path | None = None) -> dict[str, str]:
    """ANSIBLE_STRATEGY (and, for one of Mitogen's, ANSIBLE_STRATEGY_PLUGINS) for a run. A play's own
    `strategy:` still wins for that play; playbooks/ sets none. Where the project has gpucluster_linear
    (plugins/strategy/: the controller-only tasks run without a fork), the run uses it over the chosen one."""
    environ = os.environ if environ is None else environ
    chosen = _base_strategy_env(environ)
    folder = None if proj is None else proj / "plugins" / "strategy"
    if folder is None or not (folder / f"{INPROCESS_STRATEGY}.py").is_file():
        return chosen
    plugins = [str(folder)] + [p for p in chosen.get("ANSIBLE_STRATEGY_PLUGINS", "").split(os.pathsep) if p]
    return {"ANSIBLE_STRATEGY": INPROCESS_STRATEGY, "ANSIBLE_STRATEGY_PLUGINS": os.pathsep.join(plugins),
            STRATEGY_BASE_ENV: chosen["ANSIBLE_STRATEGY"]}


def _base_strategy_env(environ: dict[str, str]) -> dict[str, str]:
    """The strategy an operator or the default chose, and where Ansible finds it (Mitogen's folder)."""
    chosen = environ.get(STRATEGY_ENV, "").strip() or environ.get("ANSIBLE_STRATEGY", "").strip()
    folder = mitogen_strategy_dir()
    name = chosen or (DEFAULT_STRATEGY if folder is not None else PLAIN_STRATEGY)
    if not name.replace("_", "").replace(".", "").isalnum():
        raise UsageError(f"{STRATEGY_ENV}={name!r}: name a strategy plugin, e.g. {DEFAULT_STRATEGY} or "
                         f"{PLAIN_STRATEGY}")
    if not name.startswith("mitogen"):
        return {"ANSIBLE_STRATEGY": name}
    if folder is None:
        raise UsageError(f"{STRATEGY_ENV}={name}: Mitogen is not installed in this Python ({sys.executable}); "
                         f"install gpucluster's ops extra (pip install -e '.[ops]'), or set "
                         f"{STRATEGY_ENV}={PLAIN_STRATEGY}")
    plugins = [str(folder)] + [p for p in environ.get("ANSIBLE_STRATEGY_PLUGINS", "").split(os.pathsep) if p]
    return {"ANSIBLE_STRATEGY": name, "ANSIBLE_STRATEGY_PLUGINS": os.pathsep.join(dict.fromkeys(plugins))}


def private_secrets(secrets: str | os.PathLike, folder: Path) -> Path:
    """Check the operator's secrets file and write the bytes that were checked to a 0600 file in `folder`
    (the run's private folder): what Ansible reads. The operator's file may change after the check (its
    owner could swap it mid-run); this copy cannot. Removed when the run ends."""
    from gpucluster.configure.secrets import checked_secrets

    _values, raw = checked_secrets(secrets)
    copy = folder / "secrets.json"
    copy.unlink(missing_ok=True)
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
    return copy


# The most hosts one push reaches at once. Each fork is a forked Ansible worker plus its ssh master on the
# controller (tens of MB each, mostly shared pages); 256 of them fit a small controller. A fleet larger than
# that converges by pull (configure.pull), where the controller starts one ssh per node and nothing else.
FORKS_MAX = 256


def forks_for(hosts: int, environ: dict[str, str] | None = None) -> int:
    """Ansible's --forks for a run that reaches `hosts` hosts: one per host up to FORKS_MAX, so a task runs on
    every host in one batch instead of ceil(hosts / forks) batches (ansible.cfg's fixed 32 made a 256-host
    push wait 8 batches per task), and a 4-host run keeps no idle workers. An operator's ANSIBLE_FORKS wins."""
    given = (os.environ if environ is None else environ).get("ANSIBLE_FORKS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, min(hosts, FORKS_MAX))


def callback_env(proj: Path) -> dict[str, str]:
    """The callbacks a run enables: gpucluster_prefork (the Jinja plugins loaded once, before Ansible forks a
    worker per task; plugins/callback/) and no other, since the per-role times come from ansible-runner's events,
    not ansible.cfg's profile_roles. A project without it (an older checkout a bench runs) keeps its ansible.cfg's.
    ansible-runner adds its own callback folder after this one."""
    folder = proj / "plugins" / "callback"
    if not (folder / "gpucluster_prefork.py").is_file():
        return {}
    return {"ANSIBLE_CALLBACK_PLUGINS": str(folder), "ANSIBLE_CALLBACKS_ENABLED": "gpucluster_prefork"}


def _init(init_runner, pdd: Path, proj: Path, book: Path, inv: Path, extravars: dict, progress: Progress,
          verbose: bool, kwargs: dict):
    """ansible-runner's Runner for this run, with the minimal environment."""
    runner = init_runner(
        private_data_dir=str(pdd),
        project_dir=str(proj),
        playbook=str(book),
        inventory=str(inv),
        extravars=extravars,
        envvars={
            "ANSIBLE_CONFIG": str(proj / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            # ansible-runner turns host key checking off unless told otherwise; gpucluster keeps it on.
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            **callback_env(proj),
            **strategy_env(proj=proj),
        },
        event_handler=progress,
        quiet=True,
        suppress_env_files=True,
        rotate_artifacts=5,
        verbosity=2 if verbose else 0,
        **kwargs,
    )
    runner.config.env = _runner_env(runner.config.env)
    return runner


ROTATABLE = ("munge", "slurmdbd", "signing")  # the secrets the first play guards (roles/*/tasks/guard.yml)


def rotated_secrets(rotate: str | None) -> list[str]:
    """The secrets `--rotate` names, checked: each one of ROTATABLE, comma separated, no repeats."""
    if not rotate:
        return []
    names = [n.strip() for n in str(rotate).split(",")]
    bad = [n for n in names if n not in ROTATABLE]
    if bad or len(set(names)) != len(names):
        raise UsageError(f"--rotate {rotate!r}: name secrets from {', '.join(ROTATABLE)}, comma separated, each once "
                         f"(e.g. --rotate munge)")
    return names


def _extravars(state: Path, secrets_dir: Path, rotating: list[str], batch: int | None) -> dict[str, Any]:
    """The run's extra vars: the cluster's state and secrets folders, the secrets it may rotate and the Slurm
    play's batch size. Raises UsageError for a batch under 1 host."""
    extravars: dict[str, Any] = {"gpucluster_state_dir": str(state), "gpucluster_secrets_dir": str(secrets_dir)}
    if rotating:
        extravars["gpucluster_rotate_secrets"] = rotating
    if batch is not None:
        if batch < 1:
            raise UsageError(f"--batch {batch}: give at least 1 host per batch")
        extravars["gpucluster_batch"] = batch
    return extravars


def _cmdline(secrets: str | os.PathLike | None, pdd: Path, tags: str | None, check: bool,
             diff: bool) -> tuple[list[str], Path | None]:
    """ansible-playbook's options for the run, and the private copy of the secrets file they name (None without
    one): the caller removes it when the run ends."""
    cmdline = []
    copy = None
    if secrets is not None:
        # checked first (malformed, someone else's, readable by others: refused before anything runs); Ansible
        # reads a private copy of the checked bytes, never the operator's path
        copy = private_secrets(secrets, pdd)
        cmdline += ["--extra-vars", f"@{copy}"]
    return cmdline + playbook_options(tags, check, diff), copy


def playbook_options(tags: str | None, check: bool, diff: bool) -> list[str]:
    """The converge's --tags, --check and --diff as ansible-playbook takes them: a push hands them to Ansible,
    a pull to gpucluster-pull run on each node, which takes the same options and hands them on."""
    options = ["--tags", tags] if tags else []
    if check:
        options.append("--check")
    if diff:
        options.append("--diff")
    return options


def _runner_kwargs(limit: str | None, pdd: Path, loaded: Inventory, cmdline: list[str]) -> dict[str, Any]:
    """ansible-runner's limit, forks and command line for the run; a fleet's worth of --limit names goes to
    Ansible in a file in the run's folder."""
    kwargs: dict[str, Any] = {}
    if limit:
        terms = limit_terms(limit)
        if len(terms) > 200:  # a fleet's worth of names: Ansible reads them from a file (--limit @FILE)
            (pdd / "limit").write_text("\n".join(terms) + "\n")
            kwargs["limit"] = f"@{pdd / 'limit'}"
        else:
            kwargs["limit"] = ",".join(terms)
    kwargs["forks"] = forks_for(len(loaded.select(limit)))
    if cmdline:
        kwargs["cmdline"] = " ".join(shlex.quote(a) for a in cmdline)
    return kwargs


def _run_live(runner, progress: Progress, live: bool | None, log: Log, copy: Path | None) -> None:
    """Run the playbook while a line says what is running where, and remove the secrets copy when it ends,
    however it ends."""
    with status_line(every=30.0, live=live, write=log) as show:
        ticking = threading.Event()

        def tick() -> None:  # the live line: redrawn each second on a terminal, else logged every 30 s at most
            while not ticking.wait(1.0):
                show(progress.now())

        ticker = threading.Thread(target=tick, name="configure-progress", daemon=True)
        ticker.start()
        try:
            runner.run()
        finally:
            ticking.set()
            ticker.join()
            if copy is not None:
                copy.unlink(missing_ok=True)


def _result(runner, progress: Progress, elapsed: float, check: bool) -> ConfigureResult:
    """The run's outcome from ansible-runner's status and the hosts' events: rc 1 when either says it failed,
    and a failure that names no host still says where to look."""
    hosts = progress.stats
    failed = any(s.failed or s.unreachable for s in hosts.values())
    rc = 0 if runner.status == "successful" and runner.rc == 0 and not failed else 1
    failures = dict(progress.failures)
    if rc and not failures:
        failures["(ansible)"] = [f"ansible-runner ended {runner.status} (rc {runner.rc}) without a failed host; "
                                 f"see {runner.config.artifact_dir}/stdout"]
    return ConfigureResult(rc=rc, status=runner.status, hosts=hosts, failures=failures,
                           role_times=dict(progress.role_times), elapsed=elapsed,
                           artifacts=Path(runner.config.artifact_dir), warnings=progress.warnings,
                           changes=dict(progress.changes), diffs=dict(progress.diffs), check=check)


def configure(inventory: str | os.PathLike, *, playbook: str = "site.yml", limit: str | None = None,
              tags: str | None = None, project: str | os.PathLike | None = None,
              secrets: str | os.PathLike | None = None, check: bool = False, diff: bool = False,
              batch: int | None = None, state_dir: str | os.PathLike | None = None, rotate: str | None = None,
              verbose: bool = False, log: Log = print, live: bool | None = False) -> ConfigureResult:
    """Converge the cluster of `inventory` with playbooks/<playbook>; never raises for host failures.

    Runs in the cluster's private state folder (gpucluster.paths.private_dir: 0700, owned by this user,
    never a shared /tmp path), with a minimal environment. `secrets` is an extra-vars file (munge key,
    slurmdbd password) checked first; Ansible reads a private copy of the checked bytes (private_secrets),
    removed when the run ends, so its values stay out of the run's files. `check` and `diff` are Ansible's
    --check and --diff; `batch` runs the Slurm play that many hosts at a time (serial); `rotate` names the secrets
    (munge, slurmdbd, signing) the run may replace on hosts that hold another (rotated_secrets): without it the
    first play stops the run where a host holds a secret this run does not bring (playbooks/site.yml). While it runs, a
    line says what is running where: redrawn in place on a terminal (`live`; None decides from stdout),
    else logged every 30 s when it changed."""
    from ansible_runner.interface import init_runner

    from gpucluster.inventory.reader import load_inventory

    rotating = rotated_secrets(rotate)  # bad input is refused before anything is read or written
    inv = inventory_file(inventory).resolve()
    proj = project_dir(project)
    book = proj / "playbooks" / playbook
    if not book.is_file():
        raise UsageError(f"{book}: no such playbook")
    loaded = load_inventory(inv)
    inv_vars = loaded.vars
    cluster = inv_vars.get("gpucluster_cluster")
    if not cluster:
        raise UsageError(f"{inv}: not a gpucluster inventory (no gpucluster_cluster); write it with "
                         "`gpucluster inventory SPEC -o DIR`")
    state, secrets_dir = state_dirs(inv_vars, state_dir)
    spec = inv_vars.get("gpucluster_spec")
    if limit and spec and Path(str(spec)).is_file():
        # The compile play runs on localhost, which a --limit leaves out: compile here, or a limited run (the
        # controllers of a resize, a rollout's wave) would converge from the compile of an older spec. Current
        # already: a few ms of hashing (compiled.stamp_of), nothing parsed.
        from gpucluster.compiled import ensure_compiled

        ensure_compiled(str(spec), state)
    pdd = private_dir(state / "runner", what="Ansible run folder")
    extravars = _extravars(state, secrets_dir, rotating, batch)
    cmdline, copy = _cmdline(secrets, pdd, tags, check, diff)
    progress = Progress(log, verbose)
    mode = " (check mode: nothing is changed)" if check else ""
    log(f"configure: {book.relative_to(proj)} on {inv}{mode} (artifacts under {pdd}/artifacts)")
    started = time.monotonic()
    kwargs = _runner_kwargs(limit, pdd, loaded, cmdline)
    try:
        runner = _init(init_runner, pdd, proj, book, inv, extravars, progress, verbose, kwargs)
    except BaseException:
        if copy is not None:
            copy.unlink(missing_ok=True)
        raise
    _run_live(runner, progress, live, log, copy)
    return _result(runner, progress, time.monotonic() - started, check)


def summary(result: ConfigureResult) -> str:
    """The end-of-run report: per host counts, per role times, the failing hosts with their messages."""
    lines = ["", "summary"]
    width = max([len(h) for h in result.hosts] + [4])
    lines.append(f"  {'host':{width}s}  {'ok':>4s} {'changed':>7s} {'failed':>6s} {'unreachable':>11s} {'skipped':>7s}")
    for host in sorted(result.hosts):
        s = result.hosts[host]
        mark = "  <-- " + ("UNREACHABLE" if s.unreachable else "FAILED") if (s.failed or s.unreachable) else ""
        lines.append(f"  {host:{width}s}  {s.ok:4d} {s.changed:7d} {s.failed:6d} {s.unreachable:11d} "
                     f"{s.skipped:7d}{mark}")
    if result.role_times:
        lines.append("")
        lines.append("time per role (wall clock, all hosts in parallel)")
        rw = max(len(r) for r in result.role_times)
        for role, secs in sorted(result.role_times.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {role:{rw}s}  {secs:7.1f} s")
    if result.changes:
        lines.append("")
        lines.append("would change (check mode: nothing was changed)" if result.check else "changed")
        shown = 0
        for host in sorted(result.changes):
            for task in result.changes[host]:
                if shown < 40:
                    lines.append(f"  {host}: {task}")
                shown += 1
        if shown > 40:
            lines.append(f"  ... and {shown - 40} more")
    if result.diffs:
        # The same diff on many hosts is shown once, with the hosts it applies to (a fleet has thousands).
        grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
        for host in sorted(result.diffs):
            for task, text in result.diffs[host]:
                grouped[(task, text)].append(host)
        lines.append("")
        lines.append("differences")
        for (task, text), hosts in grouped.items():
            lines.append(f"  {_hostlist(hosts)}: [{task}]")
            lines.extend(f"    {line}" for line in text.splitlines())
    if result.failures:
        lines.append("")
        lines.append(f"failed hosts: {', '.join(sorted(result.failures))}")
        for host in sorted(result.failures):
            for msg in result.failures[host]:
                lines.append(f"  {host}: {msg}")
    if result.check:
        verdict = "check passed" if result.ok else "check FAILED"
        counted = f"{plural(result.changed, 'change')} would be made"
    else:
        verdict = "converged" if result.ok else "NOT converged"
        counted = plural(result.changed, "change")
    lines.append("")
    lines.append(f"{verdict}: {plural(len(result.hosts), 'host')}, {counted}, "
                 f"{result.elapsed:.1f} s"
                 + (f" (artifacts: {result.artifacts})" if result.artifacts else ""))
    return "\n".join(lines)


def _hostlist(hosts: list[str]) -> str:
    import hostlist

    return hostlist.collect_hostlist(hosts)
