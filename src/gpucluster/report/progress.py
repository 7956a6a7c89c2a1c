"""A progress bar for work that may take a while, shown only where a person is watching.

Usage (inventory, render, anything that walks a large plan):

    from gpucluster.report.progress import progress

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
