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
    edited template is compiled again): compiling them is ~50 ms of every render. In the private cache
    folder (gpucluster.paths.cache_dir: 0700, ours; compiled templates are code, so never a folder anyone
    else can write); none when that folder cannot be had (a read-only home costs only the time)."""
    from gpucluster.errors import UsageError
    from gpucluster.paths import cache_dir

    try:
        folder = cache_dir("jinja")
    except UsageError:
        return None
    if not os.access(folder, os.W_OK):
        return None
    return FileSystemBytecodeCache(str(folder))


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
