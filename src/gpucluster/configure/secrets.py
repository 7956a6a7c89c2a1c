"""The cluster's secrets as an Ansible extra-vars file: written once (generated here, or from a Pulumi
stack's outputs), read by `gpucluster configure --secrets FILE`.

The file holds `munge_key_b64` (the munge key, base64), `slurm_dbd_password` and `pull_runner_signing_key_b64`
(the key that signs the pull timer's pointer: an OpenSSH ed25519 private key file, base64). It is written 0600
from its first byte, never inside a checkout or Pulumi project (that is how secrets end up in git),
and read only when no other user can read it. Values never reach a log: errors name the key, never
its value.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import secrets
import stat
import string
from pathlib import Path

import yaml

from gpucluster.errors import UsageError
from gpucluster.outputs import write_file

SECRET_VARS = ("munge_key_b64", "slurm_dbd_password", "pull_runner_signing_key_b64")
MUNGE_KEY_BYTES = 1024  # what `mungekey` makes; munged needs at least 32
MUNGE_KEY_MIN = 32
PASSWORD_RE = re.compile(r"^[A-Za-z0-9._~+=-]{16,128}$")  # lands in slurmdbd.conf and a MariaDB GRANT


def _ed25519():
    """(cryptography's serialization module, Ed25519PrivateKey): cryptography comes with Ansible."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        raise UsageError("the bundle-signing key needs the Python package cryptography, which comes with Ansible: "
                         "pip install 'gpucluster[ops]'") from None
    return serialization, Ed25519PrivateKey


def signing_key_b64() -> str:
    """A new bundle-signing key: an unencrypted OpenSSH ed25519 private key file, as base64 (one line of text), the
    form pull_runner_signing_key_b64 takes (this file's, and the Pulumi stack's ansibleSecrets)."""
    ser, Ed25519PrivateKey = _ed25519()
    key = Ed25519PrivateKey.generate().private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    return base64.b64encode(key).decode()


def is_signing_key(value: str) -> bool:
    """An unencrypted OpenSSH ed25519 private key file as base64: what the role's gpucluster_secret (kind
    ssh-ed25519) accepts, checked here so a wrong key is refused before anything runs, not at the last play."""
    ser, Ed25519PrivateKey = _ed25519()
    from cryptography.exceptions import UnsupportedAlgorithm

    try:
        key = ser.load_ssh_private_key(base64.b64decode(value, validate=True), password=None)
    except (binascii.Error, ValueError, TypeError, UnsupportedAlgorithm):
        return False
    return isinstance(key, Ed25519PrivateKey)


def generate() -> dict[str, str]:
    """A new munge key (1024 random bytes), a slurmdbd password (32 letters and digits) and a bundle-signing key."""
    alphabet = string.ascii_letters + string.digits
    return {"munge_key_b64": base64.b64encode(secrets.token_bytes(MUNGE_KEY_BYTES)).decode(),
            "slurm_dbd_password": "".join(secrets.choice(alphabet) for _ in range(32)),
            "pull_runner_signing_key_b64": signing_key_b64()}


def _inside_checkout(path: Path) -> Path | None:
    for d in (path.parent, *path.parent.parents):
        if (d / ".git").exists() or (d / "Pulumi.yaml").is_file():
            return d
    return None


def default_path(name: str) -> Path:
    """Per user, outside any checkout: $XDG_RUNTIME_DIR (tmpfs, gone at logout) or ~/.config."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "gpucluster" if runtime and Path(runtime).is_dir() else \
        Path.home() / ".config" / "gpucluster"
    return base / "secrets" / f"{name}.json"


def write_secrets_file(values: dict, path: Path) -> Path:
    """Write the extra-vars file: mode 0600 from creation, refused inside a git checkout or Pulumi project."""
    path = Path(path).expanduser().absolute()
    repo = _inside_checkout(path)
    if repo is not None:
        raise UsageError(f"{path} is inside {repo}: secrets are never written into a checkout; "
                         f"choose a path outside it (default {default_path('NAME')})")
    missing = [k for k in SECRET_VARS if k in values and values[k] in (None, "", "[secret]")]
    if missing:
        raise UsageError(f"no clear value for {', '.join(missing)}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_file(path, json.dumps(values, indent=2, sort_keys=True) + "\n", mode=0o600)  # 0600 from creation
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the secrets file ({exc.strerror or exc})") from None
    return path


MAX_SECRETS_BYTES = 1 << 20  # two values; a megabyte is far beyond any real file


def read_secrets_file(path: str | os.PathLike) -> dict[str, str]:
    """Check an extra-vars file before Ansible reads it (checked_secrets); the values by key."""
    return checked_secrets(path)[0]


def _private_folder(folder: Path) -> None:
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise UsageError(f"{folder}: cannot check the secrets file's folder ({exc.strerror or exc})") from None
    if st.st_uid != os.geteuid():
        raise UsageError(f"{folder}: the secrets file's folder belongs to uid {st.st_uid}, not to you (uid "
                         f"{os.geteuid()}): its owner can swap the file; keep secrets in a folder of your own")
    if st.st_mode & 0o077:
        raise UsageError(f"{folder}: the secrets file's folder is open to other users (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}); run chmod 700 {folder}")


def checked_secrets(path: str | os.PathLike) -> tuple[dict[str, str], bytes]:
    """(values, the bytes they were read from) of an extra-vars file: a regular file, read bounded, owned by
    this user and readable by no one else, in a folder of this user's that no one else can read; JSON or
    YAML, only the keys gpucluster knows, each well formed. Raises UsageError naming the key, never a value.
    The owner and mode are those of the file the bytes came from (fstat of the open file), so a file swapped
    after the check is never what Ansible gets: it gets a copy of these bytes (runner.private_secrets)."""
    from gpucluster.paths import read_regular

    p = Path(path).expanduser()
    _private_folder(p.absolute().parent)
    try:
        raw, st = read_regular(p, MAX_SECRETS_BYTES)
    except OSError as exc:
        raise UsageError(f"{p}: cannot read the secrets file ({exc.strerror or exc}); write one with "
                         "`gpucluster secrets --generate -o FILE` or `--pulumi-stack NAME`") from None
    if st.st_uid != os.geteuid():
        raise UsageError(f"{p}: the secrets file belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): its "
                         "owner can change it; write your own with `gpucluster secrets`")
    if st.st_mode & 0o077:
        raise UsageError(f"{p}: the secrets file can be read by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                         f"run chmod 600 {p}")
    try:
        data = yaml.safe_load(raw.decode())  # JSON is YAML
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{p}{where}: not a JSON or YAML mapping of secrets; write it with "
                         "`gpucluster secrets --generate -o FILE`") from None
    if not isinstance(data, dict) or not data:
        raise UsageError(f"{p}: not a mapping of secrets ({', '.join(SECRET_VARS)})")
    unknown = sorted(str(k) for k in data if k not in SECRET_VARS)
    if unknown:
        raise UsageError(f"{p}: unknown key(s) {', '.join(unknown)}; a secrets file holds only "
                         f"{', '.join(SECRET_VARS)}")
    if "munge_key_b64" in data:
        try:
            key = base64.b64decode(str(data["munge_key_b64"]), validate=True)
        except (binascii.Error, ValueError):
            raise UsageError(f"{p}: munge_key_b64 is not base64; write the output of `base64 -w0 munge.key`") from None
        if len(key) < MUNGE_KEY_MIN:
            raise UsageError(f"{p}: munge_key_b64 decodes to {len(key)} bytes; munged needs at least {MUNGE_KEY_MIN}")
    if "pull_runner_signing_key_b64" in data and not is_signing_key(str(data["pull_runner_signing_key_b64"])):
        raise UsageError(f"{p}: pull_runner_signing_key_b64 is not an OpenSSH private key file as base64 (unencrypted, "
                         "ed25519); write the output of `ssh-keygen -q -t ed25519 -N '' -f KEY && base64 -w0 KEY`")
    if "slurm_dbd_password" in data and not PASSWORD_RE.match(str(data["slurm_dbd_password"])):
        raise UsageError(f"{p}: slurm_dbd_password must be 16-128 characters of letters, digits and ._~+=-")
    return {k: str(v) for k, v in data.items()}, raw
