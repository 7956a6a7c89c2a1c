"""Pack the compiled state into one bundle a node can converge from: facts.json and rendered/, the roles,
plugins and playbooks, the inventory (no secrets), gpucluster's own code the roles' filters call, and the
controller's ansible-core, so node and controller run the same Ansible.

Why a manifest hash: the bundle's name is the sha256 of its MANIFEST (one `sha256  path` line per file,
sorted), so the same inputs always give the same name, a node can check every byte before running any of
it (gpucluster-pull unpack_checked), and the fan-out needs to send only 64 hex characters per host.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpucluster.errors import UsageError
from gpucluster.paths import private_dir

# The Ansible settings a node runs the bundle with: the repository's ansible.cfg, less what only the
# controller has (the profile callback's collection, SSH settings), plus quiet output (only changes).
NODE_ANSIBLE_CFG = """\
# Written by gpucluster (gpucluster.configure.bundle): the settings a node converges itself with.
[defaults]
roles_path = roles
library = plugins/modules
module_utils = plugins/module_utils
filter_plugins = plugins/filter
action_plugins = plugins/action
gathering = smart
fact_caching = memory
inject_facts_as_vars = False
interpreter_python = /usr/bin/python3
retry_files_enabled = False
show_task_path_on_failure = True
display_ok_hosts = False
display_skipped_hosts = False
nocolor = True

[connection]
# Modules run through the interpreter's stdin, without a temporary file per task (local connection too).
pipelining = True
"""

PROJECT_PARTS = ("roles", "plugins", "playbooks")
SKIP_NAMES = {"__pycache__", ".pytest_cache"}
SKIP_SUFFIXES = (".pyc", ".retry")


@dataclass(frozen=True)
class Bundle:
    """A built bundle: its name (sha256 of MANIFEST), the tar.gz, how many files and bytes."""

    hash: str
    path: Path
    files: int
    size: int


def _walk(root: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """(name in the bundle, file) under root, links followed (the package's templates/ is one), caches left out."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_NAMES)
        for name in sorted(filenames):
            if name.endswith(SKIP_SUFFIXES):
                continue
            path = Path(dirpath) / name
            yield f"{prefix}/{path.relative_to(root).as_posix()}", path


def _module_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise UsageError(f"{name} is not importable here: install gpucluster with its ops extras (scripts/setup.sh)")
    return Path(spec.origin).parent


def bundle_files(compiled: Path, project: Path, inventory: Path) -> dict[str, bytes]:
    """{name in the bundle: bytes} of everything a node needs, MANIFEST not yet included."""
    files: dict[str, bytes] = {"compiled/facts.json": node_facts(compiled / "facts.json")}
    for name, path in _walk(compiled / "rendered", "compiled/rendered"):
        files[name] = path.read_bytes()
    for part in PROJECT_PARTS:
        for name, path in _walk(project / part, part):
            files[name] = path.read_bytes()
    inv_dir = inventory.parent
    files["inventory/hosts.yml"] = inventory.read_bytes()
    for sub in ("group_vars", "host_vars"):
        if (inv_dir / sub).is_dir():
            for name, path in _walk(inv_dir / sub, f"inventory/{sub}"):
                files[name] = path.read_bytes()
    files["ansible.cfg"] = NODE_ANSIBLE_CFG.encode()
    # The roles' filters call gpucluster (templates, Slurm key tables, apt sources) and python-hostlist; the
    # runner is the controller's own ansible-core. All pure Python.
    for name, path in _walk(_module_dir("gpucluster"), "python/gpucluster"):
        files[name] = path.read_bytes()
    hostlist = importlib.util.find_spec("hostlist")
    if hostlist is None or not hostlist.origin:
        raise UsageError("python-hostlist is not importable here: install gpucluster's dependencies")
    files["python/hostlist.py"] = Path(hostlist.origin).read_bytes()
    for name, path in _walk(_module_dir("ansible"), "python/ansible"):
        files[name] = path.read_bytes()
    return files


def node_facts(path: Path) -> bytes:
    """facts.json as a node reads it: paths into gpucluster's own code (the health scripts) made relative to the
    bundle, where that code travels (python/gpucluster); the roles' filters resolve them against the bundle."""
    package = str(_module_dir("gpucluster"))

    def rewrite(value):
        if isinstance(value, dict):
            return {k: rewrite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rewrite(v) for v in value]
        if isinstance(value, str) and (value == package or value.startswith(package + "/")):
            return "python/gpucluster" + value[len(package):]
        return value

    return json.dumps(rewrite(json.loads(path.read_bytes())), indent=1, sort_keys=True).encode()


def manifest(files: dict[str, bytes]) -> bytes:
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items())).encode()


def refuse_secrets(files: dict[str, bytes], secrets: dict[str, str]) -> None:
    """A bundle is served over HTTP to every node: refuse it when any file holds a secret's value."""
    needles = {key: str(value).encode() for key, value in secrets.items() if value and len(str(value)) >= 12}
    for name, data in files.items():
        for key, needle in needles.items():
            if needle in data:
                raise UsageError(f"{name}: holds the value of the secret {key}; a bundle is readable by every "
                                 "node: keep secrets in the secrets file (configure --secrets), never in the "
                                 "inventory or the spec")


# Inventory variables that let someone log in or become root: a bundle is served over plain HTTP to every node,
# and a node converges with --connection local as root, so it needs none of them (Ansible's connection variables,
# https://docs.ansible.com/ansible/latest/inventory_guide/intro_inventory.html#connecting-to-hosts-behavioral-inventory-parameters).
CONNECTION_SECRET_RE = re.compile(r"^(?:ansible_[a-z0-9_]*(?:pass|password|passwd|passphrase)|"
                                  r"(?:become|sudo|su|ssh|vault)_pass(?:word)?|ansible_(?:ssh_)?private_key)$",
                                  re.IGNORECASE)
SECRET_TEXT_RE = re.compile(r"\$ANSIBLE_VAULT;|!vault\b|-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")


class _Vault(str):
    """A `!vault` value: an encrypted secret, whatever it holds."""


class _InventoryLoader(yaml.SafeLoader):
    """Reads an inventory file as data: `!unsafe` values as strings, `!vault` ones marked."""


_InventoryLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node)
                                 if isinstance(node, yaml.ScalarNode) else None)
_InventoryLoader.add_constructor("!vault", lambda loader, node: _Vault(loader.construct_scalar(node)))


def _line_of(text: str, needle: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    return 1


def _secret_findings(data, text: str, path: str = "") -> list[tuple[int, str]]:
    """(line, what) of every connection secret in one parsed inventory document."""
    found: list[tuple[int, str]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and CONNECTION_SECRET_RE.match(key):
                found.append((_line_of(text, key), f"{where}: a connection secret"))
            else:
                found += _secret_findings(value, text, where)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += _secret_findings(value, text, f"{path}[{i}]")
    elif isinstance(data, _Vault):
        found.append((_line_of(text, "!vault"), f"{path}: a vault-encrypted value"))
    return found


def refuse_connection_secrets(files: dict[str, bytes], inventory_dir: Path) -> None:
    """A bundle is served over HTTP to every node: refuse it when an inventory file holds a connection secret
    (ansible_password, ansible_become_password, ansible_ssh_pass, ...), a vault-encrypted value or a private key.
    Refused, not stripped: a node needs none of them (it runs as root, --connection local), and a secret in the
    inventory folder is one the operator meant to keep somewhere else; every finding is reported at once."""
    findings: list[str] = []
    for name, data in sorted(files.items()):
        if not name.startswith("inventory/"):
            continue
        where = inventory_dir / name[len("inventory/"):]
        text = data.decode(errors="replace")
        found: list[tuple[int, str]] = []
        try:
            for document in yaml.load_all(text, Loader=_InventoryLoader):  # a SafeLoader subclass: data only
                found += _secret_findings(document, text)
        except yaml.YAMLError:  # not YAML (an INI file, a broken one): its keys as text
            for number, line in enumerate(text.splitlines(), 1):
                for word in re.findall(r"[A-Za-z0-9_]+(?=[\"']?\s*[:=])", line):
                    if CONNECTION_SECRET_RE.match(word):
                        found.append((number, f"{word}: a connection secret"))
        for number, line in enumerate(text.splitlines(), 1):
            match = SECRET_TEXT_RE.search(line)
            if match and not any(n == number for n, _ in found):
                what = "a private key" if "PRIVATE" in match.group(0) else "a vault-encrypted value"
                found.append((number, what))
        findings += [f"{where}:{number}: {what}" for number, what in sorted(set(found))]
    if findings:
        raise UsageError("the pull bundle would carry secrets from the inventory, and it is served over HTTP to "
                         "every node:\n  " + "\n  ".join(findings[:20])
                         + (f"\n  ... {len(findings) - 20} more" if len(findings) > 20 else "")
                         + "\nNodes converge with --connection local as root and need none of them: keep "
                         "connection secrets out of the inventory folder (ansible.cfg's become_password_file or "
                         "ANSIBLE_BECOME_PASSWORD_FILE, an ssh-agent for keys), then pull again")


def pack(files: dict[str, bytes]) -> bytes:
    """A reproducible tar.gz: sorted names, no owners, no times, 0644 files (a node makes its own folders)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    import gzip

    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def build(compiled: Path, project: Path, inventory: Path, state: Path,
          secrets: dict[str, str] | None = None) -> Bundle:
    """Build (or find) the bundle of this compiled state under <state>/bundles/<hash>.tar.gz (0700 folder)."""
    files = bundle_files(compiled, project, inventory)
    refuse_connection_secrets(files, inventory.parent)
    refuse_secrets(files, secrets or {})
    text = manifest(files)
    digest = hashlib.sha256(text).hexdigest()
    folder = private_dir(state / "bundles", what="bundle folder")
    path = folder / f"{digest}.tar.gz"
    if not path.is_file():
        data = pack({**files, "MANIFEST": text})
        part = folder / f".{digest}.part"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(part, path)
        for old in sorted(folder.glob("*.tar.gz"), key=lambda p: p.stat().st_mtime)[:-5]:
            old.unlink(missing_ok=True)
    (folder / "current.json").write_text(json.dumps({"hash": digest, "files": len(files) + 1}) + "\n")
    return Bundle(hash=digest, path=path, files=len(files) + 1, size=path.stat().st_size)
