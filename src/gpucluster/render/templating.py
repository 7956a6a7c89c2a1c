"""The Jinja environment: strict undefined, templates from the repository's `templates/` folder."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import hostlist
from jinja2 import BytecodeCache, Environment, FileSystemBytecodeCache, FileSystemLoader, StrictUndefined


def templates_dir() -> Path:
    """`templates/` at the repository root (the package carries a link to it); overridable for users."""
    override = os.environ.get("GPUCLUSTER_TEMPLATES")
    if override:
        return Path(override)
    return (Path(__file__).resolve().parent.parent / "templates").resolve()


def _yesno(value: bool) -> str:
    return "yes" if value else "no"


def _hostlist(names) -> str:
    return hostlist.collect_hostlist(list(names))


def _bytecode_cache() -> BytecodeCache | None:
    """Compiled templates kept between runs (Jinja keys each by the template's source checksum, so an
    edited template is compiled again): compiling them is ~50 ms of every render. Under
    $GPUCLUSTER_CACHE_DIR, else $XDG_CACHE_HOME/gpucluster/jinja, else ~/.cache/gpucluster/jinja;
    none when that folder cannot be made (a read-only home costs only the time)."""
    base = os.environ.get("GPUCLUSTER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpucluster")
    folder = os.path.join(base, "jinja")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not os.access(folder, os.W_OK):
            return None
    except OSError:
        return None
    return FileSystemBytecodeCache(folder)


@cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(templates_dir())),
        bytecode_cache=_bytecode_cache(),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["yesno"] = _yesno
    env.filters["hostlist"] = _hostlist
    return env
