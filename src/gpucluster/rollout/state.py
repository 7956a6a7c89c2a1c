"""The rollout's state file: JSON, rewritten whole and atomically (a temporary file, fsync, rename) after
every step, so Ctrl-C, a lost SSH session or SIGKILL leave either the last state or the one before, never
half of one. It lives in the cluster's private state folder (paths.private_dir): <state>/rollout.json."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from gpucluster.errors import UsageError
from gpucluster.paths import private_dir

VERSION = 1
NAME = "rollout.json"


def state_path(folder: str | os.PathLike) -> Path:
    return private_dir(folder) / NAME


def save(path: Path, state: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".rollout.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(state, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no rollout state here; start one with `gpucluster rollout TARGET`") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a rollout state file ({exc}); move it aside to start anew") from None
    if not isinstance(data, dict) or data.get("version") != VERSION or "waves" not in data:
        raise UsageError(f"{path}: written by another gpucluster (state version {data.get('version')!r}, this one "
                         f"reads {VERSION}); finish it with that version, or move it aside")
    return data
