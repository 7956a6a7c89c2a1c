"""Read a spec's bytes: a regular file (or `-`, standard input), never more than the size limit.

Why this much care: `gpucluster check /dev/zero` read 1.8 GB before its size check, a FIFO blocks
forever, and opening some devices has effects (a watchdog arms on open). So the path is stat'ed
before it is opened, only a regular file is opened (without blocking, without becoming a terminal's
controlling process), the opened file is checked to be the one stat'ed, and at most MAX_BYTES + 1
bytes are read, whatever the file claims its size is (/proc files claim 0).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from gpucluster.errors import Finding, SpecError

MAX_BYTES = 1024 * 1024  # the largest example is 2 kB; a spec of 1 MB parses in well under a second
STDIN = "-"
STDIN_NAME = "<stdin>"

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}
_FIX = "give the path of a YAML file (or - to read standard input)"


def read_source(path: str | Path) -> tuple[bytes, str]:
    """(bytes, name for findings) of the spec at `path`; `-` reads standard input. Raises SpecError."""
    if str(path) == STDIN:
        return _read_fd(sys.stdin.fileno(), STDIN_NAME), STDIN_NAME
    name = str(path)
    try:
        before = os.stat(path)
    except OSError as exc:
        raise _error(name, f"cannot read the spec: {exc.strerror or exc}") from None
    if not stat.S_ISREG(before.st_mode):
        kind = _KINDS.get(stat.S_IFMT(before.st_mode), "not a regular file")
        raise _error(name, f"the spec is {kind}, not a regular file")
    if before.st_size > MAX_BYTES:
        raise _too_big(name, before.st_size)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _error(name, f"cannot read the spec: {exc.strerror or exc}") from None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(now.st_mode):
            raise _error(name, "the spec was replaced while it was opened")
        return _read_fd(fd, name), name
    finally:
        os.close(fd)


def _read_fd(fd: int, name: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BYTES:
        try:
            chunk = os.read(fd, min(65536, MAX_BYTES + 1 - size))
        except BlockingIOError:
            raise _error(name, "the spec cannot be read without waiting (a device or /proc file?)") from None
        except OSError as exc:
            raise _error(name, f"cannot read the spec: {exc.strerror or exc}") from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_BYTES:
        raise _too_big(name, size, more=True)
    return b"".join(chunks)


def decode(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError([Finding((), f"not UTF-8 text (byte {exc.start}, line {line})", "save the file as UTF-8",
                                 "file", file=name, line=line, column=column)]) from None


def _error(name: str, message: str) -> SpecError:
    return SpecError([Finding((), message, _FIX, "file", file=name)])


def _too_big(name: str, size: int, more: bool = False) -> SpecError:
    what = f"more than {MAX_BYTES:,}" if more else f"{size:,}"
    return SpecError([Finding((), f"the spec is {what} bytes", f"keep it under {MAX_BYTES:,} bytes "
                              "(a spec describes groups, not nodes)", "file", file=name)])


__all__ = ["MAX_BYTES", "STDIN", "STDIN_NAME", "decode", "read_source"]
