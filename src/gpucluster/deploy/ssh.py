"""One SSH session to a node with paramiko: strict host key checking, one command, readable failures.

Host keys come only from the known_hosts file named in the stack config; an unknown host or a key
that differs is refused (RejectPolicy), never added. The private key comes from a path or from the
key text (a Pulumi secret), never from an agent or ~/.ssh guesses, so what `pulumi up` uses is what
the stack config says.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import paramiko


class NodeError(Exception):
    """A node could not be reached or asked: the message says what to do about it."""


@dataclass(frozen=True)
class SshTarget:
    host: str  # the node's name in the spec
    address: str  # where to connect
    port: int
    user: str
    known_hosts: str
    key_path: str | None = None
    key_text: str | None = None
    timeout: float = 15.0

    @property
    def where(self) -> str:
        return f"{self.address}:{self.port}" if self.port != 22 else self.address

    @property
    def known_hosts_name(self) -> str:
        """The name a known_hosts line carries for this address (OpenSSH's [host]:port form)."""
        return f"[{self.address}]:{self.port}" if self.port != 22 else self.address


_KEY_TYPES = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)


def load_key(target: SshTarget) -> paramiko.PKey:
    if target.key_text:
        for kind in _KEY_TYPES:
            try:
                return kind.from_private_key(io.StringIO(target.key_text))
            except (paramiko.SSHException, ValueError):
                continue
        raise NodeError("sshPrivateKey is not an unencrypted OpenSSH private key (ed25519, ecdsa or rsa)")
    if not target.key_path:
        raise NodeError("no SSH key: set gpucluster:sshKeyPath or the secret gpucluster:sshPrivateKey")
    path = Path(target.key_path).expanduser()
    if not path.is_file():
        raise NodeError(f"SSH key {path} does not exist (gpucluster:sshKeyPath)")
    for kind in _KEY_TYPES:
        try:
            return kind.from_private_key_file(str(path))
        except (paramiko.SSHException, ValueError):
            continue
        except OSError as exc:
            raise NodeError(f"cannot read SSH key {path}: {exc.strerror or exc}") from None
    raise NodeError(f"SSH key {path} is not an unencrypted OpenSSH private key (ed25519, ecdsa or rsa)")


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def connect(target: SshTarget, pkey: paramiko.PKey | None = None) -> paramiko.SSHClient:
    known = Path(target.known_hosts).expanduser()
    if not known.is_file():
        raise NodeError(f"known_hosts file {known} does not exist (gpucluster:knownHosts); "
                        "collect the nodes' host keys first (ssh-keyscan, verified out of band)")
    client = paramiko.SSHClient()
    try:
        client.load_host_keys(str(known))
    except (OSError, paramiko.SSHException) as exc:
        raise NodeError(f"cannot read known_hosts {known}: {exc}") from None
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            target.address, port=target.port, username=target.user, pkey=pkey or load_key(target),
            allow_agent=False, look_for_keys=False, timeout=target.timeout,
            banner_timeout=target.timeout, auth_timeout=target.timeout,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise NodeError(
            f"host key refused: {target.known_hosts_name} offered {_fingerprint(exc.key)} but {known} "
            f"has {_fingerprint(exc.expected_key)}; if the machine was reinstalled, verify its new key out "
            "of band and replace the line in known_hosts"
        ) from None
    except paramiko.AuthenticationException:
        client.close()
        raise NodeError(f"{target.user}@{target.where} refused the SSH key: authorise it for that user") from None
    except paramiko.SSHException as exc:
        client.close()
        text = str(exc)
        if "not found in known_hosts" in text:
            raise NodeError(f"host key refused: {target.known_hosts_name} is not in {known}; add its key "
                            "(verified out of band) before enrolling") from None
        raise NodeError(f"SSH to {target.where} failed: {text}") from None
    except (TimeoutError, OSError) as exc:
        client.close()
        raise NodeError(f"cannot reach {target.where}: {getattr(exc, 'strerror', None) or exc}") from None
    return client


def run(client: paramiko.SSHClient, command: str, target: SshTarget, stdin: str | None = None) -> tuple[int, str, str]:
    try:
        chan_in, out, err = client.exec_command(command, timeout=target.timeout * 4)
        if stdin is not None:
            chan_in.write(stdin)
        chan_in.channel.shutdown_write()
        text = out.read().decode("utf-8", "replace")
        errors = err.read().decode("utf-8", "replace")
        return out.channel.recv_exit_status(), text, errors
    except (TimeoutError, paramiko.SSHException, OSError) as exc:
        raise NodeError(f"running a command on {target.where} failed: {exc}") from None
