"""Subprocess helpers for the stage layer: every failure becomes a StageError that names the command."""

from __future__ import annotations

import collections
import shlex
import subprocess
import threading
from collections.abc import Callable, Sequence

from gpucluster.errors import OperationError

Log = Callable[[str], None]

_TAIL_LINES = 25


class StageError(OperationError):
    """A podman, debootstrap or ssh-keygen call failed, or a staged node did not come up.

    The message carries the command and the tail of its stderr so the CLI can print it as is.
    """

    def __init__(self, message: str, *, cmd: Sequence[str] | None = None, stderr: str = "") -> None:
        self.cmd = list(cmd) if cmd else None
        self.stderr_tail = tail(stderr)
        parts = [message]
        if self.cmd:
            parts.append(f"  command: {shlex.join(self.cmd)}")
        if self.stderr_tail:
            parts.append("  stderr (last lines):")
            parts.extend(f"    {line}" for line in self.stderr_tail.splitlines())
        super().__init__("\n".join(parts))


def tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(
    cmd: Sequence[str],
    *,
    input: str | None = None,
    timeout: float | None = 300,
    check: bool = True,
    what: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command with captured text output; raise StageError on failure when check is set."""
    try:
        proc = subprocess.run(
            list(cmd), input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise StageError(f"{what or 'command'} failed: {cmd[0]} is not installed "
                         "(run scripts/stage-deps.sh)", cmd=cmd) from exc
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise StageError(f"{what or 'command'} timed out after {timeout:.0f}s", cmd=cmd, stderr=err) from exc
    if check and proc.returncode != 0:
        raise StageError(
            f"{what or 'command'} failed with exit status {proc.returncode}",
            cmd=cmd,
            stderr=proc.stderr or proc.stdout,
        )
    return proc


def run_streaming(
    cmd: Sequence[str],
    *,
    on_line: Callable[[str], None],
    timeout: float,
    what: str,
) -> None:
    """Run a long command, handing each output line to on_line; keep the tail for the error message."""
    lines: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    try:
        proc = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except FileNotFoundError as exc:
        raise StageError(f"{what} failed: {cmd[0]} is not installed (run scripts/stage-deps.sh)",
                         cmd=cmd) from exc
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            lines.append(line)
            on_line(line)
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        reason = f"was killed after {timeout:.0f}s" if rc < 0 else f"failed with exit status {rc}"
        raise StageError(f"{what} {reason}", cmd=cmd, stderr="\n".join(lines))
