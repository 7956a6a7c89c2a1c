"""The Jinja environment: strict undefined, templates from the repository's `templates/` folder."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import hostlist
from jinja2 import Environment, FileSystemLoader, StrictUndefined


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


@cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(templates_dir())),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["yesno"] = _yesno
    env.filters["hostlist"] = _hostlist
    return env
