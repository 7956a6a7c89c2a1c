"""Counting the expensive steps across processes: with GPUCLUSTER_TRACE=FILE set, every spec parse and
every plan appends one line (`parse PID` / `plan PID`) to FILE. `gpucluster demo` sets it for its own
run and prints the counts: one compiled load means one parse and one plan on the controller."""

from __future__ import annotations

import os

SETTING = "GPUCLUSTER_TRACE"


def mark(event: str) -> None:
    path = os.environ.get(SETTING)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{event} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # counting must never fail the work it counts


def counts(path: str | os.PathLike) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as fh:
            for line in fh:
                event = line.split(" ", 1)[0]
                out[event] = out.get(event, 0) + 1
    except OSError:
        pass
    return out
