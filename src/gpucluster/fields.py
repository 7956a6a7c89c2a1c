"""Strict field types for the spec and the catalog, and the bounds their consumers impose.

Pydantic's lax mode reads `count: true` as 1 and `accounting: 1` as true; YAML 1.1 makes that a trap
(`memory_gb: yes` is a boolean). These types accept only what the YAML means: a number is a number
(never a boolean or quoted text), text is text, a boolean is `true`/`false`, and no float is NaN or
infinite (so `plan --json` stays JSON). The loader turns their errors into findings whose fix names
the trap ("write a number", "quote it").

Every bound below comes from what consumes the value; docs/spec.md lists them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, Strict, StringConstraints
from pydantic_core import PydanticCustomError

Int = Annotated[int, Strict()]
Num = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Bool = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]

# ---- bounds ------------------------------------------------------------------------------------
SLURM_MAX_NODES = 65_536  # slurmctld's node table; also hostlist's MAX_RANGE (64K hosts in one range)
MAX_ALL_NODES = 2 * SLURM_MAX_NODES  # compute nodes plus as many service nodes: what the planner and inventory take
MAX_PORTS = 4_096  # ports of one switch at one speed (largest catalog part: an 800-port director)
MAX_SPEED_GBPS = 3_200  # link speed in Gb/s (1.6T Ethernet and XDR have headroom below it)
MAX_INDEX = 10**18 - 1  # first_index: 18 digits; slurmctld parses the index as a C unsigned long (2^64)
HOST_LABEL = 63  # RFC 1123 label; Slurm's hostlist buffers are MAXHOSTNAMELEN (64) with the NUL
SLURM_MAX_CPUS = 65_535  # slurm.conf CPUs= is a 16-bit count
PATH_MAX = 4_096
NAME_MAX = 255
MAX_LIST = 256  # entries of any list or mapping in the spec (groups, partitions, features, catalog parts)
MAX_GROUPS = 1_024  # node groups


def _whole(value: object) -> object:
    """Literal[2, 3] and friends: pydantic would read 2.0 as 2; YAML users who wrote 2.0 meant a float."""
    if isinstance(value, float):
        raise PydanticCustomError("int_from_float", "Input should be a whole number")
    return value


WholeLiteral = BeforeValidator(_whole)


def _normal_path(value: str) -> str:
    """One spelling per path: '.' components and a trailing '/' go; '..' and '//' are refused, since the
    checks compare paths as text (a mount under /etc must not hide as /mnt/../etc)."""
    if "//" in value:
        raise PydanticCustomError("path", "'{path}' has an empty component (//)",
                                  {"path": value, "fix": "write each directory once, with one '/' between"})
    parts = value.split("/")
    if ".." in parts:
        raise PydanticCustomError("path", "'{path}' climbs with '..'",
                                  {"path": value, "fix": "write the absolute path without '..'"})
    long = next((p for p in parts if len(p) > NAME_MAX), None)
    if long is not None:
        raise PydanticCustomError("path", "a component of the path is longer than {n} characters",
                                  {"n": NAME_MAX, "fix": "shorten it"})
    return "/" + "/".join(p for p in parts if p not in ("", "."))


# Absolute paths on the nodes (mounts, exports, Prolog=): a safe alphabet, normalised.
AbsPath = Annotated[str, Strict(), StringConstraints(pattern=r"^/[A-Za-z0-9._/-]*$", max_length=PATH_MAX),
                    AfterValidator(_normal_path)]
NodePath = Annotated[str, Strict(), StringConstraints(pattern=r"^/[A-Za-z0-9._/-]+$", max_length=PATH_MAX),
                     AfterValidator(_normal_path)]
# Words that land unquoted in slurm.conf (Feature=) and in the sourced nccl-env.sh (NCCL_IB_HCA=)
Word = Annotated[str, Strict(), StringConstraints(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=64)]
# Catalog keys: land in bom.csv and in messages
PartKey = Annotated[str, Strict(), StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
Label = Annotated[str, Strict(), StringConstraints(max_length=128)]  # free text: a part's display name

__all__ = [
    "HOST_LABEL",
    "MAX_ALL_NODES",
    "MAX_GROUPS",
    "MAX_INDEX",
    "MAX_LIST",
    "MAX_PORTS",
    "MAX_SPEED_GBPS",
    "NAME_MAX",
    "PATH_MAX",
    "SLURM_MAX_CPUS",
    "SLURM_MAX_NODES",
    "AbsPath",
    "Bool",
    "Int",
    "Label",
    "NodePath",
    "Num",
    "PartKey",
    "Text",
    "WholeLiteral",
    "Word",
]
