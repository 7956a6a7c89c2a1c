"""Reaching Slurm from the operator's machine, in one place: rollout, `diff --inventory`, `fabric test`,
`validate --via-slurm` and `health status` run Slurm's clients (and the few commands around them: a bundle
unpacked, a file read) through one `Client`.

- Where: here (no host: the clients of a controller or login node, with the environment's SLURM_CONF), or on
  an inventory host over SSH, as Ansible reaches it. The SSH command line is the host's own `ssh_argv`
  (inventory.Host): gpucluster's host-key option first, batch mode, its address, port, user and key; the
  client adds SSH_OPTIONS.
- What: an argv list. Over SSH every argument is quoted for the remote shell (shlex), so a node name, a reason
  or a script arrives as one word, never as shell syntax; a command that needs a shell says so itself
  (["sh", "-c", SCRIPT, "sh", ARG...]). Standard input is the `input` given, else nothing.
- Errors: one class, SlurmError (an OperationError: the CLI prints it and exits 1). A command that could not
  run (no answer within the timeout, no ssh or no client here) raises it, naming the host, the command and
  the time. A command that ran returns its CompletedProcess whatever its exit status (Slurm's refusals are
  read: "Duplicate reservation"); `check` and `failed` make a non-zero exit the same error.
- Which host: `slurm_host` picks it from an inventory (a login node, else a controller).

Floor 0: the host and the inventory are taken as they are (anything with the attributes named below), so
every package that reaches Slurm can import this module."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpucluster.errors import OperationError, UsageError, shown
from gpucluster.slurmtext import printable

SSH_OPTIONS = ("ConnectTimeout=15", "ServerAliveInterval=15")  # -o settings after the host's own
TIMEOUT = 120.0  # seconds a command may take unless its call says otherwise
SUBMIT_GROUPS = ("slurm_login", "slurm_controller")  # where Slurm's clients are, in the order they are asked


class SlurmError(OperationError):
    """A Slurm client command (or the SSH session to the host that runs it) failed: the message names the
    command, where it ran and what went wrong."""


class SshHost(Protocol):
    """An inventory host (inventory.reader.Host): its name, and its ssh command line for a remote command."""

    name: str

    def ssh_argv(self, command: str, *options: str) -> list[str]: ...


class HostInventory(Protocol):
    """An inventory (inventory.reader.Inventory): its file, its hosts, its groups."""

    path: object
    hosts: dict

    def group(self, name: str) -> list[str]: ...


def slurm_host(inv: HostInventory, purpose: str, groups: Sequence[str] = SUBMIT_GROUPS) -> SshHost:
    """The first host of the first of `groups` that has one (a login node, else a controller). UsageError when
    none has: `purpose` says what the host was for ("to submit the test jobs from")."""
    for group in groups:
        members = inv.group(group)
        if members:
            return inv.hosts[members[0]]
    raise UsageError(f"{inv.path}: no {' or '.join(groups)} host {purpose}; write the inventory with "
                     "`gpucluster inventory SPEC` (docs/inventory.md)")


def command_text(cmd: Sequence[str], limit: int = 160) -> str:
    """A command as an error message shows it: quoted as a shell would read it, control characters escaped, cut
    to `limit` characters."""
    return shown(shlex.join(cmd), limit)


def tail(res: subprocess.CompletedProcess, n: int = 400) -> str:
    """The last `n` characters of a command's stderr and stdout, on one line, printable (text or bytes)."""
    def text(value) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else value or ""

    return printable(" ".join((text(res.stderr) + " " + text(res.stdout)).split()))[-n:]


def failed(cmd: Sequence[str], res: subprocess.CompletedProcess, where: str = "", *, hint: str = "") -> SlurmError:
    """The error of a command that ran and exited non-zero: the command, where it ran, its exit status and the
    tail of its output, then `hint` (what to look at)."""
    on = f" on {where}" if where else ""
    text = f"{command_text(cmd)}{on} failed (exit {res.returncode}): {tail(res) or 'no output'}"
    return SlurmError(f"{text}; {hint}" if hint else text)


@dataclass(frozen=True)
class Client:
    """Runs a command here (`host` None) or on `host` over SSH: `client(argv)` -> CompletedProcess, text unless
    `binary`. A slurmtext.Runner, so slurmtext's readers and the rollout take it as it is."""

    host: SshHost | None = None
    timeout: float = TIMEOUT
    options: tuple[str, ...] = SSH_OPTIONS

    @property
    def where(self) -> str:
        return self.host.name if self.host is not None else "this machine"

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """The command line that runs `cmd`: itself here; over SSH the host's ssh argv, whose remote command is
        `cmd` with every argument quoted for the remote shell."""
        cmd = [str(a) for a in cmd]
        if not cmd:
            raise ValueError("no command to run")
        return cmd if self.host is None else self.host.ssh_argv(shlex.join(cmd), *self.options)

    def __call__(self, cmd: Sequence[str], *, input: str | bytes | None = None, timeout: float | None = None,
                 binary: bool = False) -> subprocess.CompletedProcess:
        argv = self.argv(cmd)
        limit = self.timeout if timeout is None else timeout
        try:
            return subprocess.run(argv, input=input, stdin=subprocess.DEVNULL if input is None else None,
                                  capture_output=True, text=not binary, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{command_text(cmd)} on {self.where}: no answer within {limit:g} s") from None
        except FileNotFoundError:
            if self.host is None:
                raise SlurmError(f"{argv[0]} not found on this machine: run this where the Slurm clients are (a "
                                 "controller or login node)") from None
            raise SlurmError(f"{argv[0]} not found: install the OpenSSH client to reach {self.where}") from None
        except OSError as exc:
            raise SlurmError(f"{command_text(cmd)} on {self.where}: {argv[0]}: {exc.strerror or exc}") from None

    def check(self, cmd: Sequence[str], *, hint: str = "", **kw) -> subprocess.CompletedProcess:
        """As a call, and a non-zero exit is a SlurmError too (`failed`, naming this client's host)."""
        res = self(cmd, **kw)
        if res.returncode != 0:
            raise failed(cmd, res, self.where, hint=hint)
        return res
