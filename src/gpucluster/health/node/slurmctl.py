"""The node's state in Slurm, read and changed with scontrol: the thin layer under decide.py.

Parsing is pure (`parse_node`, on `scontrol show node -o` lines) and shared with `gpucluster health
status` on the controller side; the calls have short timeouts so a slow slurmctld costs seconds of the
runner's budget, never a hung HealthCheckProgram.
"""

from __future__ import annotations

import re
import subprocess

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


def show(node: str, env: dict, timeout: float = 5) -> tuple[dict[str, str] | None, str]:
    """(the node's fields, '') or (None, why scontrol could not say)."""
    rc, text = _scontrol(["show", "node", "-o", node], env, timeout)
    if rc != 0:
        return None, text
    nodes = parse_nodes(text)
    return (nodes[node], "") if node in nodes else (None, f"scontrol does not know node {node}")


def drain(node: str, reason: str, env: dict, timeout: float = 5) -> tuple[bool, str]:
    rc, text = _scontrol(["update", f"nodename={node}", "state=drain", f"reason={reason}"], env, timeout)
    return rc == 0, text


def resume(node: str, env: dict, timeout: float = 5) -> tuple[bool, str]:
    rc, text = _scontrol(["update", f"nodename={node}", "state=resume"], env, timeout)
    return rc == 0, text
