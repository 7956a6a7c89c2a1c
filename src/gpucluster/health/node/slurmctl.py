"""The node's state in Slurm, read and changed with scontrol: the thin layer under decide.py.

Parsing is pure (`parse_node`, on `scontrol show node -o` lines) and shared with `gpucluster health
status` on the controller side; the calls have short timeouts so a slow slurmctld costs seconds of the
runner's budget, never a hung HealthCheckProgram. A run's calls go through a `Session`, which falls back
to a private munged (privmunge.py) when scontrol cannot get a credential from the node's own.
"""

from __future__ import annotations

import re
import subprocess
import time

try:
    from . import privmunge
except ImportError:  # run as a script on a node: the files sit side by side
    import privmunge

_REASON = re.compile(r"(?:^|\s)Reason=(?P<text>.*?)(?:\s\[(?P<user>[^\]@\s]+)@(?P<time>[^\]\s]+)\])?"
                     r"(?=\s+(?:Comment|Extra|ResumeAfterTime)=|\s*$)")
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=(\S*)")


def parse_node(line: str) -> dict[str, str]:
    """One `scontrol show node -o` line: every simple Key=value, plus Reason (which holds spaces and
    '=') split into reason, reason_user and reason_time ('' when the node has no reason)."""
    line = line.strip()
    m = _REASON.search(line)
    head = line[: m.start()] if m else line
    out = dict(_FIELD.findall(head))
    out["reason"] = m.group("text").strip() if m else ""
    out["reason_user"] = (m.group("user") or "") if m else ""
    out["reason_time"] = (m.group("time") or "") if m else ""
    if m:
        out.update(dict(_FIELD.findall(line[m.end():])))
    return out


def parse_nodes(text: str) -> dict[str, dict[str, str]]:
    return {n["NodeName"]: n for n in (parse_node(line) for line in text.splitlines()
                                        if line.startswith("NodeName="))}


def _scontrol(args: list[str], env: dict, timeout: float) -> tuple[int, str]:
    try:
        res = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"scontrol {args[0]} did not answer within {timeout:g}s"
    except OSError as exc:
        return 127, f"scontrol: {exc.strerror or exc}"
    if res.returncode == 0:
        return 0, res.stdout.strip()
    return res.returncode, " ".join((res.stderr or res.stdout).split())  # one line for the state file


class Session:
    """The scontrol calls of one run, each within `call_timeout` and all before `deadline` (monotonic).

    When a call fails because this node cannot get a munge credential (its munged is down), the session
    starts a private munged with the node's own key (privmunge.py), repeats the call through it, and keeps
    it for the run's other calls; `close()` (or leaving the `with`) stops it. `auth` then says so, for the
    state file: a node whose munged died drains itself (`gpc:munge: ...`) instead of only going silent."""

    def __init__(self, env: dict, munge_key: str | None = privmunge.KEY, run_dir: str = privmunge.BASE,
                 deadline: float | None = None, call_timeout: float = 5) -> None:
        self.env, self.munge_key, self.run_dir = dict(env), munge_key, run_dir
        self.deadline, self.call_timeout = deadline, call_timeout
        self.private: privmunge.PrivateMunged | None = None
        self.auth = ""  # "" (the node's munged), or how the private munged went

    def _timeout(self) -> float:
        if self.deadline is None:
            return self.call_timeout
        return max(1.0, min(self.call_timeout, self.deadline - time.monotonic()))

    def _start_private(self, why: str) -> bool:
        """True when the private munged runs and self.env points scontrol at it; else self.auth says why not."""
        if self.private is not None or not self.munge_key:
            return False
        self.private = privmunge.PrivateMunged(self.munge_key, privmunge.node_slurm_conf(self.env), self.run_dir,
                                               timeout=min(3.0, self._timeout()))
        try:
            self.env.update(self.private.start())
        except (privmunge.PrivateMungeError, OSError) as exc:
            self.auth = f"private munged failed: {exc}"
            return False
        self.auth = f"private munged (the node's did not answer: {why[:160]})"
        return True

    def call(self, args: list[str]) -> tuple[int, str]:
        rc, text = _scontrol(args, self.env, self._timeout())
        if rc != 0 and privmunge.munge_failure(text) and self._start_private(_munge_line(text)):
            rc, text = _scontrol(args, self.env, self._timeout())
        return rc, text

    def show(self, node: str) -> tuple[dict[str, str] | None, str]:
        rc, text = self.call(["show", "node", "-o", node])
        if rc != 0:
            return None, text
        nodes = parse_nodes(text)
        return (nodes[node], "") if node in nodes else (None, f"scontrol does not know node {node}")

    def drain(self, node: str, reason: str) -> tuple[bool, str]:
        rc, text = self.call(["update", f"nodename={node}", "state=drain", f"reason={reason}"])
        return rc == 0, text

    def resume(self, node: str) -> tuple[bool, str]:
        rc, text = self.call(["update", f"nodename={node}", "state=resume"])
        return rc == 0, text

    def close(self) -> None:
        if self.private is not None:
            self.private.stop()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def _munge_line(text: str) -> str:
    """The part of scontrol's message that says what munge lacked."""
    m = re.search(r"munge encode failed: ([^(]*)", text, re.IGNORECASE)
    return m.group(1).strip() if m else text
