"""`gpucluster`: infrastructure as code for GPU training clusters. One cluster spec (YAML) gives the fabric plan,
the rendered Slurm and NCCL files, the Ansible inventory, a converged cluster and its validation. Bad input exits
2 with located findings and no traceback."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from types import ModuleType

from gpucluster import __version__
from gpucluster.errors import (
    OperationError,
    SpecError,
    UsageError,
    in_order,
    summary,
)
from gpucluster.words import plain

# Subcommands in --help order, each registered by its module in gpucluster/commands/, named for the command: each
# parses its arguments, calls the library, and prints. The parser imports only the module of the command given
# (all of them for --help), through subcommand_module; a module imports the library code only when it runs.
COMMANDS = ("check", "plan", "render", "expand", "stage", "inventory", "configure", "secrets", "validate", "emulate",
            "fabric", "health", "demo", "diff", "rollout")


def subcommand_module(command: str) -> ModuleType:
    """The CLI module that registers `command`, imported now (a plain import: tests/test_architecture.py
    reads it, and a missing module fails loudly)."""
    if command == "check":
        from gpucluster.commands import check as module
    elif command == "plan":
        from gpucluster.commands import plan as module
    elif command == "render":
        from gpucluster.commands import render as module
    elif command == "expand":
        from gpucluster.commands import expand as module
    elif command == "stage":
        from gpucluster.commands import stage as module
    elif command == "inventory":
        from gpucluster.commands import inventory as module
    elif command == "configure":
        from gpucluster.commands import configure as module
    elif command == "secrets":
        from gpucluster.commands import secrets as module
    elif command == "validate":
        from gpucluster.commands import validate as module
    elif command == "emulate":
        from gpucluster.commands import emulate as module
    elif command == "fabric":
        from gpucluster.commands import fabric as module
    elif command == "health":
        from gpucluster.commands import health as module
    elif command == "demo":
        from gpucluster.commands import demo as module
    elif command == "diff":
        from gpucluster.commands import diff as module
    elif command == "rollout":
        from gpucluster.commands import rollout as module
    else:
        raise KeyError(command)
    return module


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for `gpucluster COMMAND ...`; without a command, the whole tree (every subcommand)."""
    parser = argparse.ArgumentParser(prog="gpucluster", description=plain(__doc__),
                                     epilog="Each command's own help: gpucluster COMMAND --help. Every command and "
                                            "flag: docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"gpucluster {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = (command,) if command in COMMANDS else COMMANDS  # --help, --version, a typo: every command
    for name in wanted:
        subcommand_module(name).register(sub)
    return parser


def closed_pipe() -> int:
    """The reader of stdout went away (`gpucluster plan X | head -1`): end quietly with the status a shell
    gives a process SIGPIPE killed (128 + 13), as cat or grep would. Stdout is pointed at /dev/null so the
    interpreter's last flush of what is still buffered does not fail again."""
    import signal

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


def _print_refused(exc: SpecError, args: argparse.Namespace) -> None:
    """Every command that reads a spec or a flag ends a refused run alike: each finding as
    `level: file:line: field: message; fix [rule]`, in reading order, then the summary line."""
    findings = in_order(exc.findings)
    if not findings:
        return
    from gpucluster.report.terminal import Screen

    err = Screen(sys.stderr, rich=False if getattr(args, "no_color", False) else None)
    for f in findings:
        err.finding(f)
    err.line(summary(findings, exc.fail_on))


class _Interrupt:
    """Ctrl-C while a command runs: Python's own handler (KeyboardInterrupt), which also remembers that it fired.
    CPython drops an exception raised where nothing can receive it (a finalizer: a generator closed by the
    garbage collector, a `__del__`), so a KeyboardInterrupt can vanish; the command then still ends with 130 once
    its work is done, never as if nobody had asked. A handler someone else set (or SIG_IGN) is left alone."""

    def __init__(self) -> None:
        self.seen = False
        self.installed = False

    def __enter__(self) -> _Interrupt:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._raise)
            self.installed = True
        return self

    def _raise(self, signum: int, frame: object) -> None:
        self.seen = True
        raise KeyboardInterrupt

    def __exit__(self, *_exc: object) -> None:
        if self.installed:
            import signal

            signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    # The CLI loads no pydantic plugins: their discovery scans every installed distribution's entry
    # points (~40 ms per command). Set only for this process, never by `import gpucluster`.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    if getattr(args, "no_color", False):
        os.environ["NO_COLOR"] = "1"  # one switch for every printer of this process and what it runs
    with _Interrupt() as interrupt:
        return _run(args, interrupt)


def _run(args: argparse.Namespace, interrupt: _Interrupt) -> int:
    try:
        rc = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return 130 if interrupt.seen else rc
    except BrokenPipeError:
        return closed_pipe()
    except SpecError as exc:
        _print_refused(exc, args)
        return 2
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OperationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
