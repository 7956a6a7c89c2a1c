#!/usr/bin/python
# ruff: noqa: E402  (Ansible modules put DOCUMENTATION and RETURN before the imports)
"""Refuse to replace a secret that a host already holds with one the run did not bring.

Why: the munge key, the slurmdbd password and the bundle-signing key are generated once per cluster, in the
state folder of the machine that first converged it, or written from the operator's secrets file. A run from
another state folder (a second operator, a lost laptop, an inventory written without --state-dir) brings
none of them; the roles would generate new ones and install them, and a new munge key on the controller
takes every slurmd down. This module is the guard the first play runs on every host, before anything
changes: `brought` (on the Ansible controller) says what this run would install, as a digest that reveals
nothing of the secret; `check` (on the host) compares it with what the host holds and fails, saying what
differs and how to pass the cluster's secrets, unless the operator asked to rotate that secret.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpucluster_secret_guard
short_description: Refuse to replace a host's secret with one the run did not bring
options:
  action:
    type: str
    required: true
    choices: [brought, check]
    description:
      - C(brought), on the Ansible controller: the digest of the secret this run would install (the provided
        value, else the state folder's file), or an empty digest when the run brings none (a role would
        generate one). Never generates, never writes.
      - C(check), on a host: compare the host's secret with I(brought); fail when it holds another one.
  kind:
    type: str
    choices: [bytes, password, ssh-ed25519]
    default: bytes
    description: As gpucluster_secret's kind; decides how a secret is read and digested.
  path: {type: path, description: "brought: the controller-side secret file (the state folder's)."}
  value_b64: {type: str, description: "brought: a provided secret, base64 (the operator's secrets file)."}
  name:
    type: str
    description: "check: what the secret is called in messages and in rotate (munge, slurmdbd, signing)."
  digest: {type: str, default: "", description: "check: the digest from brought; empty when the run brings none."}
  host_path: {type: path, description: "check: the host's file that holds the secret."}
  conf_key:
    type: str
    description: "check: the secret is the value of this KEY= line of host_path (StoragePass in slurmdbd.conf)."
  managed_marker:
    type: path
    description: >-
      check: a file that says gpucluster installed the host's secret. Without it a host's secret counts as the
      cluster's only where legacy_marker exists; else it is a package's default (Debian's munge makes a random
      key at install) and may be replaced.
  legacy_marker: {type: path, description: "check: a file only a finished gpucluster converge leaves."}
  rotate: {type: bool, default: false, description: "check: the operator asked to replace this secret."}
"""

RETURN = r"""
digest:
  type: str
  returned: action is brought
  description: "sha256 of the secret (of the public key for ssh-ed25519); empty when none is brought."
source: {type: str, returned: action is brought, description: "provided, existing or none."}
state:
  type: str
  returned: action is check
  description: "absent, unmanaged, same, rotated, or (when it fails) differs or not-brought."
"""

import base64
import binascii
import hashlib
import os

from ansible.module_utils.basic import AnsibleModule

SIGNER_TYPES = ("ssh-ed25519",)
FIX = ("pass the cluster's secrets: `gpucluster configure INVENTORY --secrets FILE` with the file "
       "`gpucluster secrets --generate` or `--pulumi-stack` wrote for this cluster, or `--state-dir DIR` of the "
       "state folder that converged it")


def digest_of(kind: str, data: bytes) -> str:
    """What two secrets are compared by: sha256 of the secret (of its public key for ssh-ed25519), hex."""
    if kind == "ssh-ed25519":
        from cryptography.hazmat.primitives import serialization as ser

        try:
            key = ser.load_ssh_private_key(data, password=None)
            public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
        except (ValueError, TypeError, AttributeError):
            raise ValueError("the secret is not an unencrypted OpenSSH private key") from None
        return hashlib.sha256(b" ".join(public.split()[:2])).hexdigest()
    if kind == "password":
        data = data.rstrip(b"\n")
    return hashlib.sha256(data).hexdigest()


def brought(kind: str, path: str | None, value_b64: str | None) -> tuple[str, str]:
    """(digest, source) of the secret this run installs: the provided value, else the file; ('', 'none')."""
    if value_b64:
        try:
            data = base64.b64decode(value_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the provided secret is not valid base64") from None
        return digest_of(kind, data), "provided"
    if path and os.path.isfile(path):
        with open(path, "rb") as fh:
            return digest_of(kind, fh.read()), "existing"
    return "", "none"


def _conf_value(text: bytes, key: str) -> bytes | None:
    """The value of the last `KEY=` line (Slurm keeps the last), or None."""
    found = None
    for line in text.splitlines():
        name, sep, value = line.partition(b"=")
        if sep and name.strip().lower() == key.lower().encode():
            found = value.strip()
    return found


def _signers(text: bytes) -> set[str]:
    """Digests of the public keys an allowed_signers file lists (comments and options skipped)."""
    out = set()
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith(b"#"):
            continue
        for i, word in enumerate(words[:-1]):
            if word.decode("ascii", "replace") in SIGNER_TYPES:
                out.add(hashlib.sha256(word + b" " + words[i + 1]).hexdigest())
    return out


def host_digests(kind: str, host_path: str, conf_key: str | None) -> set[str] | None:
    """The digests of the secret(s) the host holds, or None when it holds none."""
    try:
        with open(host_path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    if conf_key:
        value = _conf_value(data, conf_key)
        return {hashlib.sha256(value).hexdigest()} if value else None
    if kind == "ssh-ed25519":
        return _signers(data) or None
    return {digest_of(kind, data)}


def check(name: str, kind: str, digest: str, host_path: str, conf_key: str | None, managed_marker: str | None,
          legacy_marker: str | None, rotate: bool) -> tuple[str, str | None]:
    """(state, why it must stop or None)."""
    held = host_digests(kind, host_path, conf_key)
    if held is None:
        return "absent", None
    if managed_marker and not os.path.exists(managed_marker) and not (legacy_marker and
                                                                     os.path.exists(legacy_marker)):
        return "unmanaged", None  # a package's default (Debian's munge makes one at install): the cluster's replaces it
    if digest and digest in held:
        return "same", None
    if rotate:
        return "rotated", None
    where = f"{host_path}" + (f" ({conf_key}=)" if conf_key else "")
    if not digest:
        return "not-brought", (
            f"this host holds the cluster's {name} secret in {where}, and this run does not bring it: its state "
            f"folder has none and no --secrets gave one, so the run would generate a new one and replace it. "
            f"Nothing was changed. To go on, {FIX}. To replace it on purpose, add --rotate {name}")
    return "differs", (
        f"this host's {name} secret in {where} is not the one this run brings (digest {sorted(held)[0][:12]}, "
        f"the run's {digest[:12]}): the run would replace it. Nothing was changed. To go on, {FIX}. To replace it "
        f"on purpose, add --rotate {name}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "required": True, "choices": ["brought", "check"]},
            "kind": {"type": "str", "choices": ["bytes", "password", "ssh-ed25519"], "default": "bytes"},
            "path": {"type": "path"},
            "value_b64": {"type": "str", "no_log": True},
            "name": {"type": "str"},
            "digest": {"type": "str", "default": "", "no_log": False},
            "host_path": {"type": "path"},
            "conf_key": {"type": "str", "no_log": False},
            "managed_marker": {"type": "path"},
            "legacy_marker": {"type": "path"},
            "rotate": {"type": "bool", "default": False},
        },
        required_if=[("action", "check", ("name", "host_path"))],
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["action"] == "brought":
            digest, source = brought(p["kind"], p["path"], p["value_b64"])
            module.exit_json(changed=False, digest=digest, source=source)
        state, why = check(p["name"], p["kind"], p["digest"] or "", p["host_path"], p["conf_key"],
                           p["managed_marker"], p["legacy_marker"], p["rotate"])
    except (ValueError, OSError) as exc:
        module.fail_json(msg=f"{p['name'] or p['path']}: {exc}")
    if why:
        module.fail_json(msg=why, state=state)
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()
