"""A progress bar for work that may take a while, shown only where a person is watching.

Usage (inventory, render, anything that walks a large plan):

    from gpucluster.progress import progress

    with progress("writing inventory", total=len(hosts), unit="hosts") as advance:
        for host in hosts:
            ...
            advance()            # or advance(n) for n items at once

The bar goes to stderr, and only when stderr is a terminal, so pipes, logs and tests see nothing. It
appears once the work has run for `delay` seconds (2 s by default): a fast run never flickers a bar,
a slow one shows life. It disappears when the block ends (the command prints its own summary).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


def wanted(stream: TextIO) -> bool:
    """A bar only on an interactive terminal that is not declared dumb."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


class _Bar:
    def __init__(self, label: str, total: int | None, unit: str, stream: TextIO, delay: float, enabled: bool):
        self.label, self.total, self.unit, self.stream = label, total, unit, stream
        self.delay, self.enabled = delay, enabled
        self.done = 0
        self.started = time.monotonic()
        self.bar = None
        self.task = None

    def advance(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.bar is None:
            if time.monotonic() - self.started < self.delay:
                return
            self._start()
        self.bar.update(self.task, completed=self.done)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, highlight=False)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn(self.unit), TimeElapsedColumn(), console=console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=self.total, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@contextmanager
def progress(label: str, total: int | None = None, *, unit: str = "", stream: TextIO | None = None,
             delay: float = 2.0, enabled: bool | None = None) -> Iterator[Callable[..., None]]:
    """Yield advance(n=1). `enabled=None` decides from the stream (a terminal or not)."""
    out = stream or sys.stderr
    bar = _Bar(label, total, unit, out, delay, wanted(out) if enabled is None else enabled)
    try:
        yield bar.advance
    finally:
        bar.close()


class _Status:
    """One line that says what is happening now: redrawn in place on a terminal; elsewhere (a log, CI)
    printed when it changes, at most every `every` seconds, so a long quiet step still shows life."""

    def __init__(self, stream: TextIO, live: bool, every: float, write: Callable[[str], None] | None):
        self.stream, self.live, self.every = stream, live, every
        self.write = write
        self.text = ""
        self.printed_at: float | None = None  # nothing printed yet: the first line goes out at once
        self.printed = ""
        self.display = None

    def update(self, text: str) -> None:
        self.text = text
        if self.live:
            if self.display is None:
                from rich.console import Console
                from rich.live import Live
                from rich.text import Text

                self._text = Text
                self.display = Live(Text(text, overflow="ellipsis", no_wrap=True),
                                    console=Console(file=self.stream, highlight=False), transient=True,
                                    auto_refresh=False)
                self.display.start()
            self.display.update(self._text(text, overflow="ellipsis", no_wrap=True), refresh=True)
            return
        now = time.monotonic()
        due = self.printed_at is None or now - self.printed_at >= self.every
        if text and text != self.printed and due:
            if self.write is not None:
                self.write(text)
            else:
                self.stream.write(text + "\n")
                self.stream.flush()
            self.printed, self.printed_at = text, now

    def close(self) -> None:
        if self.display is not None:
            self.display.stop()


@contextmanager
def status_line(*, stream: TextIO | None = None, every: float = 30.0, live: bool | None = None,
                write: Callable[[str], None] | None = None) -> Iterator[Callable[[str], None]]:
    """Yield update(text): the current state of a long step (configure's running task, validate's counts).
    On a terminal the line is redrawn in place and vanishes at the end; elsewhere it is printed (or given
    to `write`) when it changed and `every` seconds have passed since the last print."""
    out = stream or sys.stdout
    st = _Status(out, wanted(out) if live is None else live, every, write)
    try:
        yield st.update
    finally:
        st.close()

