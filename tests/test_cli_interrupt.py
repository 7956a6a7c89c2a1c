"""Ctrl-C is never lost: a KeyboardInterrupt that CPython drops (raised inside a finalizer, where nothing can
receive it) still ends the command with 130 once its work is done; a caught one ends it with 130 at once; a
SIGINT handler set by someone else (or SIG_IGN) is left alone, and Python's own is back after the command."""

from __future__ import annotations

import argparse
import os
import signal
import sys

import pytest

from gpucluster import cli


@pytest.fixture(autouse=True)
def _pythons_handler():
    """Python's own SIGINT handler for each test, whatever this process inherited: a test run started in the
    background by a non-interactive shell starts with SIGINT ignored (SIG_IGN), and Python then keeps it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Finalized:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs here, inside __del__: its KeyboardInterrupt is unraisable
            pass


def _lost(_args: argparse.Namespace) -> int:
    _Finalized()  # freed at once
    return 0


def _raised(_args: argparse.Namespace) -> int:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):
        pass
    return 0


def test_a_ctrl_c_dropped_in_a_finalizer_still_ends_the_command_with_130(monkeypatch) -> None:
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with cli._Interrupt() as interrupt:
        assert cli._run(argparse.Namespace(func=_lost), interrupt) == 130
    assert dropped == [KeyboardInterrupt]  # CPython's "Exception ignored in": the command never saw it
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_that_arrives_ends_the_command_with_130() -> None:
    with cli._Interrupt() as interrupt:
        assert cli._run(argparse.Namespace(func=_raised), interrupt) == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_someone_elses_handler_is_left_alone() -> None:
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    try:
        with cli._Interrupt() as interrupt:
            assert cli._run(argparse.Namespace(func=_raised), interrupt) == 0
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("command", [["--help"]])
def test_main_restores_pythons_handler(command) -> None:
    with pytest.raises(SystemExit):
        cli.main(command)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
