#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""A per-cluster secret file on the Ansible controller: generated once, or taken from a given value.

Why a module: the secret must never pass through Ansible variables, task results or logs. This
module writes it straight to a 0600 file in the cluster's secrets folder and returns only where it
is and whether it changed; roles copy the file to nodes with no_log.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_secret
short_description: Create a cluster secret file once (random), or write a provided value
options:
  path: {type: path, required: true, description: Secret file (its folder is created 0700).}
  kind:
    type: str
    choices: [bytes, password, ssh-ed25519]
    default: bytes
    description:
      - C(bytes) for binary keys (munge), C(password) for URL-safe text passwords, C(ssh-ed25519) for an
        unencrypted OpenSSH ed25519 private key (the bundle-signing key; I(size) does not apply).
  size: {type: int, default: 1024, description: Bytes (kind=bytes) or characters (kind=password) to generate.}
  min_size: {type: int, default: 32, description: Shortest acceptable provided or existing secret (bytes).}
  value_b64:
    type: str
    description: A provided secret, base64 (e.g. from a Pulumi secret). Written when it differs from the file.
"""

RETURN = r"""
path: {type: str, returned: always, description: The secret file.}
source: {type: str, returned: always, description: "generated, provided or existing (the value is never returned)."}
public_key:
  type: str
  returned: kind is ssh-ed25519
  description: "The key's public half, one OpenSSH line (not secret)."
"""

import base64
import binascii
import os
import secrets
import stat
import string

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpucluster_fileutil import atomic_write

_ALPHABET = string.ascii_letters + string.digits


def generate(kind: str, size: int) -> bytes:
    if kind == "ssh-ed25519":
        from cryptography.hazmat.primitives import serialization as ser
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return Ed25519PrivateKey.generate().private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                                          ser.NoEncryption())
    if kind == "password":
        return "".join(secrets.choice(_ALPHABET) for _ in range(size)).encode("ascii")
    return secrets.token_bytes(size)


def ssh_public_key(data: bytes, what: str) -> str:
    """The public half of an unencrypted OpenSSH ed25519 private key; ValueError naming `what` otherwise."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = ser.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError(f"{what} is not an unencrypted OpenSSH private key (ssh-keygen -t ed25519 -N '' writes "
                         "one)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{what} is an OpenSSH key but not ed25519 (ssh-keygen -t ed25519 -N '' writes one)")
    return key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()


def write_secret(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    atomic_write(path, data, 0o600, prefix=".secret-")  # mkstemp makes it 0600 from the first byte


def untrusted(path: str) -> str | None:
    """None when an existing secret file can be trusted: only this user can have written it or can swap it
    (the file and its folder ours, not links, not writable by others; every folder above owned by root or
    us, and writable by others only when sticky). Else why not: a planted key is known to whoever planted it.
    The same rule as gpucluster.paths.unsafe_ancestor (a module cannot import gpucluster)."""
    me = os.geteuid()
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file (a link or something else)"
    if st.st_uid != me:
        return f"{path} belongs to uid {st.st_uid}, not to this user (uid {me})"
    if st.st_mode & 0o022:
        return f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    folder = os.path.dirname(os.path.abspath(path))
    fst = os.lstat(folder)
    if stat.S_ISLNK(fst.st_mode) or fst.st_uid != me or fst.st_mode & 0o022:
        return f"its folder {folder} is a link, someone else's, or open to other users"
    above = os.path.dirname(folder)
    while True:
        ast = os.lstat(above)
        if stat.S_ISLNK(ast.st_mode) or ast.st_uid not in (0, me) or (ast.st_mode & 0o022
                                                                      and not ast.st_mode & stat.S_ISVTX):
            return f"{above}, above it, is a link, someone else's, or open to other users"
        if above == os.path.dirname(above):
            return None
        above = os.path.dirname(above)


def ensure(path: str, kind: str, size: int, min_size: int, value_b64: str | None,
           check_mode: bool = False) -> tuple[bool, str]:
    """(changed, source). Raises ValueError with a message saying what to change."""
    wanted = None
    if value_b64:
        try:
            wanted = base64.b64decode(value_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the provided secret is not valid base64; pass the output of `base64 -w0 FILE`") from None
        if kind == "ssh-ed25519":
            ssh_public_key(wanted, "the provided secret")
        elif len(wanted) < min_size:
            raise ValueError(f"the provided secret has {len(wanted)} bytes; at least {min_size} are needed")
    current = None
    if os.path.lexists(path):
        why = untrusted(path)
        if why:
            raise ValueError(f"the existing secret cannot be trusted: {why}; its owner may know it. Remove it "
                             "(a new one is generated) after checking who wrote it")
        with open(path, "rb") as fh:
            current = fh.read()
    changed = False
    if wanted is not None:
        if current != wanted:
            changed = True
            if not check_mode:
                write_secret(path, wanted)
        source = "provided"
    elif current is None:
        changed = True
        if not check_mode:
            write_secret(path, generate(kind, size))
        source = "generated"
    else:
        if kind == "ssh-ed25519":
            ssh_public_key(current, path)
        elif len(current) < min_size:
            raise ValueError(f"{path} holds only {len(current)} bytes (at least {min_size} are needed); "
                             "remove it to generate a new one, or provide a value")
        source = "existing"
    if not check_mode and os.path.exists(path) and (os.stat(path).st_mode & 0o777) != 0o600:
        os.chmod(path, 0o600)
        changed = True
    return changed, source


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "kind": {"type": "str", "choices": ["bytes", "password", "ssh-ed25519"], "default": "bytes"},
            "size": {"type": "int", "default": 1024},
            "min_size": {"type": "int", "default": 32},
            "value_b64": {"type": "str", "no_log": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        changed, source = ensure(p["path"], p["kind"], p["size"], p["min_size"], p["value_b64"], module.check_mode)
        extra = {}
        if p["kind"] == "ssh-ed25519" and os.path.exists(p["path"]):  # absent only in check mode, before generating
            with open(p["path"], "rb") as fh:
                extra["public_key"] = ssh_public_key(fh.read(), p["path"])
    except (ValueError, OSError) as exc:
        module.fail_json(msg=str(exc), path=p["path"])
    module.exit_json(changed=changed, path=p["path"], source=source, **extra)


if __name__ == "__main__":
    main()
