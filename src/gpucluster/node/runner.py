#!/usr/bin/python3
"""Slurm's HealthCheckProgram: run this node's checks, each within its budget, then drain or resume.

slurmd runs it at start (before the node registers) and every HealthCheckInterval, with an almost empty
environment (SLURMD_NODENAME, no PATH), kills it after 60 s, and blocks registration while it runs. So:
- every check is its own process group, killed at its budget ("timed out after Ns" is a failure);
- the whole run stops at `run_budget` seconds (config), below Slurm's 60, whatever the checks do;
- it always exits 0: the verdict goes to Slurm through scontrol (decide.py), never through an exit
  status that would keep slurmd from registering; when the node's munged is down, through a private
  munged with the node's key (privmunge.py), so that node drains too;
- a second run while one is going exits at once (a lock), so slow runs never pile up.

State (per check: last result and since when; passing runs in a row) is kept in <state_dir>/state.json,
which `gpucluster health status` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

try:
    from . import breaker, decide, nodestate, promtext, slurmctl, xid
except ImportError:  # run as a script on a node: the files sit side by side
    import breaker
    import decide
    import nodestate
    import promtext
    import slurmctl
    import xid

DEFAULT_CONFIG = "/etc/gpucluster/health/config.json"
DEFAULT_STATE_DIR = "/var/lib/gpucluster/health"  # the config names it (render/health/config.py: STATE_DIR)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER_CHECK = "runner"  # the name in a drain reason when the runner itself failed (gpc:runner: ...)
# The most a whole run may take: slurmd kills its HealthCheckProgram at 60 s. The spec keeps run_budget
# (check_timeout + 10) at or below 55; what is left of this after the checks is the scontrol calls'.
HARD_LIMIT_S = 55.0
STOP_RESERVE_S = 1.5  # kept back from the scontrol calls for stopping a private munged and saving state
REPORT_LOCK_WAIT_S = 65.0  # a report waits this long for a run to finish (a run ends within 60 s)
# A node is rebooted for a GPU error at most once in this long: a GPU that fails again after its reboot is drained
# for a person instead of rebooted in a loop (the breaker's tokens count nodes, not reboots).
REBOOT_AGAIN_AFTER_S = 24 * 3600.0


def node_name(given: str | None = None) -> str:
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def environment(config: dict) -> dict[str, str]:
    """slurmd gives no PATH: the system's, after the caller's own when there is one (a run by hand)."""
    path = ":".join(p for p in (os.environ.get("PATH", ""), PATH) if p)
    env = {"PATH": path, "LANG": "C.UTF-8", **{str(k): str(v) for k, v in config.get("env", {}).items()}}
    for key in ("GPC_HEALTH_ROOT", "SLURM_CONF"):
        if key in os.environ and key not in env:
            env[key] = os.environ[key]
    return env


def site_checks(folder: str, default_timeout: float, taken: set[str]) -> list[dict]:
    """Executables in the site folder, in name order: `10-lustre.sh` is the check `lustre`."""
    out = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        path = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        base = re.sub(r"[^a-z0-9-]+", "-", re.sub(r"^\d+[-_]", "", name.rsplit(".", 1)[0].lower())).strip("-")
        base = base or "site"
        check = base if base not in taken else f"site-{base}"
        taken.add(check)
        out.append({"name": check, "kind": "site", "path": path, "timeout": default_timeout})
    return out


def seconds_text(x: float) -> str:
    """'20s' for a budget; fractions only below a second (a run near its end gives checks what is left)."""
    return f"{round(x)}s" if round(x) >= 1 else f"{x:.1f}s"


def _result(name: str, ok: bool, message: str, seconds: float, timed_out: bool = False, data=None) -> dict:
    out = {"name": name, "ok": ok, "message": message, "seconds": round(seconds, 3), "timed_out": timed_out}
    return {**out, "data": data} if isinstance(data, dict) else out


def run_one(check: dict, config_path: str, env: dict, limit: float) -> dict:
    """One check in its own process group; killed with the group when it overruns `limit` seconds."""
    name = check["name"]
    if check.get("kind") == "site":
        argv = [check["path"]]
    else:
        argv = [sys.executable, os.path.join(HERE, "checks.py"), "--config", config_path, "--check", name]
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL, cwd="/")
    except OSError as exc:
        return _result(name, False, f"cannot start: {exc.strerror or exc}", 0.0)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel (dead NFS): abandoned
            proc.communicate(timeout=1)
        return _result(name, False, f"timed out after {seconds_text(limit)}", time.monotonic() - started, True)
    seconds = time.monotonic() - started
    if check.get("kind") == "site":
        text = next((line.strip() for line in (out + "\n" + err).splitlines() if line.strip()), "")
        return _result(name, proc.returncode == 0, text[:200] or f"exit {proc.returncode}", seconds)
    try:
        data = json.loads(out.strip().splitlines()[-1])
        # `data`: what a check keeps for its next run (gpu-xid: where it stopped reading the kernel log)
        return _result(name, bool(data["ok"]), str(data["message"]), seconds, data=data.get("data"))
    except (ValueError, IndexError, KeyError, TypeError):
        tail = (err or out).strip().splitlines()
        return _result(name, False, f"check crashed: {tail[-1][:160] if tail else f'exit {proc.returncode}'}",
                       seconds)


def run_checks(checks: list[dict], config_path: str, env: dict, run_budget: float) -> list[dict]:
    """All checks at once; each within its own budget, all within the run's. Results in check order."""
    deadline = time.monotonic() + run_budget
    results: dict[str, dict] = {}

    def work(check: dict) -> None:
        limit = min(float(check.get("timeout", 20)), max(0.5, deadline - time.monotonic()))
        results[check["name"]] = run_one(check, config_path, env, limit)

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in checks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 2)
    late = f"timed out after {seconds_text(run_budget)} (the run's budget)"
    return [results.get(c["name"]) or _result(c["name"], False, late, run_budget, True) for c in checks]


# ---------------------------------------------------------------- state


def load_state(path: str) -> dict:
    try:
        with open(path) as fh:
            state = json.load(fh)
        return state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        return {}


def save_state(path: str, state: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def record(state: dict, results: list[dict], now: float) -> dict:
    """Per check: its last result, since when it has had that outcome, and how many runs in a row it has
    failed (`fails`, 0 when it passed: decide.HYSTERESIS reads it). A check's `data` (what it keeps for its next
    run) is kept from the last run that gave one: a check that timed out must not start over. The active checks'
    results (reported by their Slurm jobs, `active: true`) are kept as they were: a passive run does not repeat
    them, and dropping them would hide the last DCGM, NCCL or IB verdict from `health status`."""
    before = state.get("checks", {})
    before = before if isinstance(before, dict) else {}
    checks = {name: dict(c) for name, c in before.items() if isinstance(c, dict) and c.get("active")}
    for r in results:
        old = before.get(r["name"])
        old = old if isinstance(old, dict) else {}
        since = old.get("since", now) if old.get("ok") == r["ok"] else now
        fails = 0 if r["ok"] else _count(old.get("fails")) + 1
        data = r.get("data", old.get("data"))
        checks[r["name"]] = {**r, "since": since, "last": now, "fails": fails, **({"data": data} if data else {})}
    return checks


def _count(value) -> int:
    """A count read back from the state file (written by an older runner, or by hand): 0 unless a whole number."""
    return value if isinstance(value, int) and value >= 0 else 0


def ladder(checks: dict) -> str | None:
    """The highest action the GPU error ladder (xid.py: record < drain < reboot < service) asked for in this
    run's check data (gpu-xid's), for a later step to act on; None when no check asked."""
    data = [c["data"] for c in checks.values() if isinstance(c, dict) and isinstance(c.get("data"), dict)]
    asked = [d.get("ladder") for d in data]
    asked = [a for a in asked if a in xid.LADDER]
    return max(asked, key=xid.LADDER.index) if asked else None


# ---------------------------------------------------------------- one run


def session(config: dict, env: dict, deadline: float | None = None) -> slurmctl.Session:
    """This run's scontrol calls: through the node's munged, else a private one with the node's key. Every
    call ends by `deadline` (monotonic) less STOP_RESERVE_S, which is kept for stopping that munged."""
    return slurmctl.Session(env, munge_key=config.get("munge_key", slurmctl.privmunge.KEY),
                            run_dir=config.get("run_dir", slurmctl.privmunge.BASE),
                            deadline=None if deadline is None else deadline - STOP_RESERVE_S)


def resumable(checks: list[dict], reason: str) -> set[str]:
    """The checks whose passing runs may lift a gpc: drain: this run's, a config error, and a check the node
    no longer runs (a site check an operator removed, a check the spec now skips: its verdict no longer
    counts, or a buggy check would keep every node it drained out for good); never an active check's, never
    service-required's or acceptance's (nodestate.HELD: a person's)."""
    names = {c["name"] for c in checks} | {"config", RUNNER_CHECK}
    by = decide.check_of(reason)
    return names | ({by} if by and by not in decide.ACTIVE and by not in nodestate.HELD
                    and by != nodestate.DOMAIN_REASON else set())


def state_dir_of(config: dict) -> str:
    return config.get("state_dir", DEFAULT_STATE_DIR)


def _open(config_path: str, node: str | None) -> tuple[dict, dict[str, str], str, str]:
    """What a run or a report starts from: the config, the checks' environment, the state folder (made if
    missing) and the Slurm node name."""
    with open(config_path) as fh:
        config = json.load(fh)
    state_dir = state_dir_of(config)
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    return config, environment(config), state_dir, node_name(node)


def run(config_path: str, node: str | None = None, act: bool = True, t0: float | None = None) -> dict:
    """One run: the checks, then the decision applied in Slurm; all of it by t0 (monotonic, the program's
    start) + run_budget, never later than t0 + HARD_LIMIT_S."""
    t0 = time.monotonic() if t0 is None else t0
    config_path = os.path.abspath(config_path)  # the checks run from /, not from the caller's folder
    config, env, state_dir, node = _open(config_path, node)
    env["SLURMD_NODENAME"] = node  # site checks may want to know which node they check
    checks = list(config.get("checks", []))
    checks += site_checks(config.get("site_dir", "/etc/gpucluster/health.d"), float(config.get("check_timeout", 20)),
                          {c["name"] for c in checks})
    started = time.time()
    run_budget = min(float(config.get("run_budget", 30)), HARD_LIMIT_S)
    deadline = t0 + run_budget  # the checks', then scontrol's: one budget for the whole run
    results = run_checks(checks, config_path, env, max(0.5, deadline - time.monotonic()))
    state_path = os.path.join(state_dir, "state.json")
    state = load_state(state_path)
    failures = [(r["name"], r["message"]) for r in results if not r["ok"]]
    summary = {"node": node, "started": started, "checks": record(state, results, started),
               "passes": int(state.get("passes", 0)),
               **({"rebooted": state["rebooted"]} if isinstance(state.get("rebooted"), (int, float)) else {})}
    streaks = {name: c["fails"] for name, c in summary["checks"].items() if "fails" in c}
    before = nodestate.load(state.get("lifecycle"))
    summary["lifecycle"] = before
    asked = ladder(summary["checks"])
    if asked:
        summary["ladder"] = asked
    with session(config, env, deadline) as ctl:
        info, why_not = ctl.show(node)
        if info is None:
            summary.update(action="none", why=f"node state unknown, nothing changed: {why_not}")
        else:
            d = decide.decide(info.get("State", ""), info.get("reason", ""), failures, int(state.get("passes", 0)),
                              int(config.get("resume_after", 3)), resumable(checks, info.get("reason", "")),
                              streaks, int(config.get("fail_after", 1)))
            d = reboot_for(summary["checks"], info, d, summary.get("rebooted"), started) or d
            d = with_domain(info.get("reason", ""), d, failures) or d
            life = nodestate.current(info.get("State", ""), info.get("reason", ""), before["state"])
            if life is not None and life != before["state"]:  # moved since the last run (a boot, an operator)
                before = nodestate.advance(before, started, life, seen_why(before["state"], life, info))
            first = f"{failures[0][0]}: {failures[0][1]}" if failures else ""
            d = nodestate.escalation(before, started, life, d, asked, config, first) or d
            summary.update(action=d.action, why=d.why, passes=d.passes, slurm_state=info.get("State", ""),
                           reason=d.reason if d.action in ("drain", "reboot") else info.get("reason", ""))
            if act:
                apply(ctl, config, node, info, d, summary)
            after = life_after(info, summary, before["state"])
            summary["lifecycle"] = nodestate.advance(before, started, after, summary["why"], summary["checks"])
        if ctl.auth:
            summary["auth"] = ctl.auth
    summary["seconds"] = round(time.time() - started, 3)
    save_state(state_path, summary)
    failed = promtext.write(config.get("textfile_dir", ""), summary)  # node_exporter's textfile collector
    if failed:
        print(f"gpucluster-health: metrics not written: {failed}", file=sys.stderr)
    return summary


def reboot_for(checks: dict, info: dict, d: decide.Decision, rebooted: float | None = None,
               now: float | None = None) -> decide.Decision | None:
    """A reboot instead of `d`, when a failing check's GPU error ladder asks for one (`reboot`, not `service`: a
    repair is a person's) and the node is in service, or drained by that same check: never a node drained or
    downed by hand or for another check (nextstate=RESUME would lift that drain), never one whose reboot is
    already pending (REBOOT_REQUESTED, REBOOT_ISSUED). `rebooted`: when this node last asked for one (time.time());
    within REBOOT_AGAIN_AFTER_S of it, `d` stands (the drain), its why saying so. None: `d` stands."""
    state, reason = info.get("State", ""), info.get("reason", "")
    if slurmctl.rebooting(state):
        return None
    for name, c in checks.items():
        data = c.get("data") if isinstance(c, dict) else None
        if c.get("ok") is False and isinstance(data, dict) and data.get("ladder") == "reboot":
            if breaker.out_of_service(state) and decide.check_of(reason) != name:
                return None
            ago = (time.time() if now is None else now) - rebooted if rebooted is not None else None
            if ago is not None and 0 <= ago < REBOOT_AGAIN_AFTER_S:  # the fault came back after its reboot
                what = f"{name} again {ago / 3600:.1f} h after its reboot: {c.get('message', '')}"
                return decide.Decision("drain", nodestate.service_reason(what), 0,
                                       f"service required, not rebooted: this node asked for a reboot {ago / 3600:.1f}"
                                       f" h ago (one in {REBOOT_AGAIN_AFTER_S / 3600:g} h)")
            why = f"{name} asks for a reboot (Slurm reboots the node once its jobs have ended)"
            return decide.Decision("reboot", decide.reason_for([(name, str(c.get("message", "")))]), 0, why)
    return None


def with_domain(reason: str, d: decide.Decision, failures: list) -> decide.Decision | None:
    """The why of a tray its NVLink domain's guard drained (gpc:domain:<domain>) and whose checks pass: it stays
    drained, and comes back when the controller resumes the domain (domainguard.py); None: `d` stands."""
    if d.action == "none" and not failures and decide.check_of(reason) == nodestate.DOMAIN_REASON:
        return decide.Decision("none", reason, 0, "drained with its NVLink domain: the controller's domain guard "
                               "resumes it with the domain")
    return None


def seen_why(before: str | None, now: str, info: dict) -> str:
    """Why the record moved between runs, as Slurm shows it."""
    if before == nodestate.REBOOTING and now == nodestate.PRODUCTION:
        return "back in service after its reboot"
    if before is None:
        return f"first run: Slurm shows {info.get('State', '')}"
    reason = decide.clean(info.get("reason", ""))[:120]
    return f"seen in Slurm: {info.get('State', '')}" + (f" ({reason})" if reason else "")


def life_after(info: dict, summary: dict, before: str | None) -> str | None:
    """The lifecycle state after this run: what was applied in Slurm (a drain, a reboot asked, a resume), else what
    Slurm showed before it (a held or failed action changed nothing)."""
    if summary.get("applied") is True:
        if summary["action"] == "reboot":
            return nodestate.REBOOTING
        if summary["action"] == "resume":
            return nodestate.PRODUCTION
        if summary["action"] == "drain":
            return nodestate.current("IDLE+DRAIN", summary.get("reason", ""), before)
    return nodestate.current(info.get("State", ""), info.get("reason", ""), before)


def apply(ctl, config: dict, node: str, info: dict, d: decide.Decision, summary: dict) -> None:
    """The decision in Slurm, only if Slurm's reason is still the one decided on (slurmctl.Session.update_if): an
    operator may have drained the node, or given it their own reason, since it was read. A drain or a reboot
    the circuit breaker holds is recorded in the summary; nothing changes in Slurm. A reboot Slurm refuses
    (no RebootProgram) falls back to the drain, so the node still takes no new job."""
    if d.action in ("drain", "reboot") and admitted(ctl, config, node, info, d, summary):
        if d.action == "reboot":
            ok, text = ctl.reboot(node, d.reason, seen=info)
            if ok:
                summary["rebooted"] = summary.get("started", time.time())
            elif text.startswith("scontrol reboot failed"):
                summary.update(action="drain", why=f"{d.why}; drained instead: {text}")
                ok, text = ctl.drain(node, d.reason, seen=info)
        else:
            ok, text = ctl.drain(node, d.reason, seen=info)
        summary["applied"] = True if ok else text
        if not ok:
            summary["reason"] = info.get("reason", "")  # Slurm's, unchanged
    elif d.action == "resume":
        ok, text = ctl.resume(node, seen=info)
        summary["applied"] = True if ok else text
        if ok:
            summary["reason"] = ""


def admitted(ctl, config: dict, node: str, info: dict, d, summary: dict) -> bool:
    """Whether the circuit breaker (breaker.py) lets this drain through. A node already drained (a reason
    rewritten for another check) takes no token; a held drain is recorded as action `held` with the why."""
    if decide.is_drained(info.get("State", "")):
        return True
    ok, why = breaker.admit(ctl, config, node, decide.check_of(d.reason) or RUNNER_CHECK)
    summary["breaker"] = why
    if not ok:
        summary.update(action="held", why=f"{d.why}; {why}", reason=info.get("reason", ""))
    return ok


def stale_after(config: dict) -> float:
    """Seconds without a run after which the node's timer runs the checks itself: slurmd's runs come every
    interval (slurmctld's background loop, a second or two late), so a quarter interval of grace keeps the
    timer from running just before slurmd does and counting one interval twice toward resume_after."""
    interval = float(config.get("interval", 300))
    return float(config.get("stale_after", interval + max(2.0, interval // 4)))


def stale(config_path: str, now: float | None = None) -> bool:
    """Whether no run started for stale_after seconds: slurmd runs the checks only while it can talk to
    slurmctld (a node whose munged died never gets the RPC), so a timer looks too (every third of the
    interval), and runs them when slurmd has not."""
    with open(config_path) as fh:
        config = json.load(fh)
    state = load_state(os.path.join(state_dir_of(config), "state.json"))
    last = float(state.get("started", 0) or 0)
    return (time.time() if now is None else now) - last >= stale_after(config)


def lock(state_dir: str, wait: float = 0.0):
    """The run lock (<state_dir>/.lock), held until the returned file is closed; None when another run
    holds it after `wait` seconds. A run and a report take the same one: both rewrite state.json."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    fh = open(os.path.join(state_dir, ".lock"), "w")  # noqa: SIM115 - held for the whole run
    end = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fh
        except OSError:
            if time.monotonic() >= end:
                fh.close()
                return None
            time.sleep(0.1)


def report(config_path: str, check: str, ok: bool | None, message: str, node: str | None = None) -> dict:
    """An active check's verdict (from its Slurm job): recorded beside the passive ones; a failure
    drains the node like theirs. A pass changes nothing in Slurm: the node was running the job.
    ok None: the check could not run (its tool is missing): recorded as not run, never as passed, and
    the node is not drained for it (the job itself exits 1, so sacct shows it too)."""
    t0 = time.monotonic()
    config, env, state_dir, node = _open(config_path, node)
    path = os.path.join(state_dir, "state.json")
    state = load_state(path)
    now = time.time()
    result = _result(check, bool(ok), message, 0.0)
    checks = state.get("checks", {})
    old = checks.get(check, {})
    checks[check] = {**result, "since": old.get("since", now) if old.get("ok") == bool(ok) else now, "last": now,
                     "active": True, **({"not_run": True} if ok is None else {})}
    state["checks"] = checks
    if ok is False:
        with session(config, env, t0 + HARD_LIMIT_S) as ctl:
            info, why_not = ctl.show(node)
            if info is None:
                state["why"] = f"{check} failed; node state unknown, nothing changed: {why_not}"
            else:
                before = nodestate.load(state.get("lifecycle"))
                life = nodestate.current(info.get("State", ""), info.get("reason", ""), before["state"])
                d = decide.decide(info.get("State", ""), info.get("reason", ""), [(check, message)], 0, 1)
                d = nodestate.escalation(before, now, life, d, None, config, f"{check}: {message}") or d
                state.update(action=d.action, why=d.why, passes=0)
                if d.action == "drain":
                    done, text = ctl.drain(node, d.reason, seen=info)
                    state["applied"] = True if done else text
                    state["reason"] = d.reason
                    life = nodestate.current("IDLE+DRAIN", d.reason, life) if done else life
                state["lifecycle"] = nodestate.advance(before, now, life, d.why, checks)
    save_state(path, state)
    return state


def move(state_dir: str, to: str, why: str, textfile_dir: str = "") -> str:
    """Record a move an operator's command made (`gpucluster health accept`: acceptance, then production) in the
    node's lifecycle record, and in its metrics at once (not a run later)."""
    path = os.path.join(state_dir, "state.json")
    state = load_state(path)
    before = nodestate.load(state.get("lifecycle"))
    state["lifecycle"] = nodestate.advance(before, time.time(), to, why, state.get("checks", {}))
    save_state(path, state)
    promtext.write(textfile_dir, state)
    return f"{before['state'] or 'no state'} -> {to}"


def clear_xid(state_dir: str) -> str:
    """Close the GPU errors gpu-xid keeps open until a reboot (xid.STICKY), for an operator who recovered the GPU
    another way (a GPU reset by hand); where the log was read up to is kept, so nothing is read twice."""
    path = os.path.join(state_dir, "state.json")
    state = load_state(path)
    data = state.get("checks", {}).get("gpu-xid", {}).get("data")
    if not isinstance(data, dict) or not data.get("open"):
        return "no open GPU error to clear"
    closed = [f"{e.get('class')} on {e.get('device')}" for e in data["open"] if isinstance(e, dict)]
    data["open"] = []
    save_state(path, state)
    return decide.clean(f"cleared {len(closed)} open GPU errors: {'; '.join(closed)}")


def failed_run(config_path: str, node: str | None, what: str, t0: float) -> tuple[bool, str]:
    """The runner itself failed (an exception): drain the node with `gpc:runner: <what>` as a failing check
    would, so a broken runner never leaves a node looking healthy. (drained or left as an operator set it,
    how); False when Slurm could not be told."""
    try:
        with open(config_path) as fh:
            config = json.load(fh)
        config = config if isinstance(config, dict) else {}
    except (OSError, ValueError):
        config = {}
    env = environment(config) if isinstance(config.get("env", {}), dict) else environment({})
    with session(config, env, t0 + HARD_LIMIT_S) as ctl:
        name = node_name(node)
        info, why_not = ctl.show(name)
        if info is None:
            return False, f"node state unknown, nothing changed: {why_not}"
        d = decide.decide(info.get("State", ""), info.get("reason", ""), [(RUNNER_CHECK, what)], 0, 1)
        if d.action != "drain":
            return True, d.why
        held: dict = {}
        if not admitted(ctl, config, name, info, d, held):  # a runner broken on every node is a shared cause
            return True, held["why"]
        ok, text = ctl.drain(name, d.reason, seen=info)
        return ok, d.reason if ok else text


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    p = argparse.ArgumentParser(description="gpucluster node health checks (Slurm HealthCheckProgram).")
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--node", help="Slurm node name (default: $SLURMD_NODENAME, else the short hostname)")
    p.add_argument("--no-act", action="store_true", help="decide and record, but change nothing in Slurm")
    p.add_argument("--if-stale", action="store_true",
                   help="only if no run started within the interval (the node's timer, beside slurmd's runs)")
    p.add_argument("--report", metavar="CHECK", help="record an active check's verdict (from its Slurm job)")
    p.add_argument("--clear-xid", action="store_true",
                   help="close the GPU errors gpu-xid keeps open until a reboot (the GPU was recovered another way)")
    p.add_argument("--lifecycle", choices=(nodestate.ACCEPTANCE, nodestate.PRODUCTION),
                   help="record this move in the node's lifecycle (an operator's command: gpucluster health accept)")
    p.add_argument("--why", default="", help="with --lifecycle: why, for the record")
    verdict = p.add_mutually_exclusive_group()
    verdict.add_argument("--failed", metavar="MESSAGE", help="with --report: the check failed, and why")
    verdict.add_argument("--passed", metavar="MESSAGE", help="with --report: the check passed")
    verdict.add_argument("--not-run", metavar="MESSAGE", help="with --report: the check could not run, and why")
    args = p.parse_args(argv)
    try:
        with open(args.config) as fh:
            config = json.load(fh)
        state_dir = state_dir_of(config)
    except (OSError, ValueError) as exc:
        # Unchecked is not healthy: say so in Slurm. A good config later resumes the node (gpc: reason).
        why = getattr(exc, "strerror", None) or exc
        reason = decide.reason_for([("config", f"cannot read {args.config}: {why}")])
        with session({}, environment({}), t0 + HARD_LIMIT_S) as ctl:
            ok, text = ctl.drain(node_name(args.node), reason)
        print(f"gpucluster-health: {reason}" + ("" if ok else f" (scontrol: {text})"), file=sys.stderr)
        return 0
    held = None
    try:
        if args.clear_xid:
            held = lock(state_dir, REPORT_LOCK_WAIT_S)
            print(f"gpucluster-health: {clear_xid(state_dir) if held else 'a run holds the lock: nothing cleared'}")
            return 0 if held else 1
        if args.lifecycle:
            held = lock(state_dir, REPORT_LOCK_WAIT_S)
            moved = move(state_dir, args.lifecycle, args.why, str(config.get("textfile_dir", ""))) if held else None
            print(f"gpucluster-health: {moved or 'a run holds the lock'}")
            return 0 if held else 1
        if args.report:
            if args.failed is None and args.passed is None and args.not_run is None:
                p.error("--report needs --passed, --failed or --not-run")
            held = lock(state_dir, REPORT_LOCK_WAIT_S)
            if held is None:
                print(f"gpucluster-health: {args.report} not recorded: a run held {state_dir}/.lock for "
                      f"{REPORT_LOCK_WAIT_S:g} s", file=sys.stderr)
                return 1
            ok = False if args.failed is not None else None if args.not_run is not None else True
            message = args.failed if ok is False else args.not_run if ok is None else args.passed
            state = report(args.config, args.report, ok, message, args.node)
            word = {True: "passed", False: "failed", None: "not run"}[ok]
            print(f"gpucluster-health: {args.report} {word}: {state.get('why', 'recorded')}")
            return 0
        held = lock(state_dir)
        if held is None:
            print("gpucluster-health: a run is still going; this one exits")
            return 0
        if args.if_stale and not stale(args.config):
            return 0
        summary = run(args.config, args.node, act=not args.no_act, t0=t0)
    except Exception as exc:  # the runner itself broke: never a silent exit 0, never a node left looking fine
        what = f"{type(exc).__name__}: {exc}"
        ok, text = failed_run(args.config, args.node, what, t0)
        print(f"gpucluster-health: the runner failed: {what}; " + (text if ok else f"Slurm not told: {text}"),
              file=sys.stderr)
        return 0 if ok else 1  # Slurm told (drained): exit 0 as always; not told: slurmd logs the exit status
    finally:
        if held is not None:
            held.close()
    failed = [f"{n}: {c['message']}" for n, c in summary["checks"].items() if not c["ok"]]
    print(f"gpucluster-health {summary['node']}: {summary['action']} ({summary['why']})"
          + (f"; failed: {'; '.join(failed)}" if failed else "") + (f"; scontrol: {summary['auth']}"
                                                                    if summary.get("auth") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
