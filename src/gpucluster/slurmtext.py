"""Reading Slurm's Key=Value text, in one place: slurm.conf lines, topology.conf records and
`scontrol show ... -o` records. Used by the renderer's checks, the validator, the emulator and the Ansible
filters (which run on the controller, where gpucluster is installed)."""

from __future__ import annotations

import re

# Lines of slurm.conf that are records (several Key=Value on one line), not settings.
RECORD_KEYS = frozenset(("nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname",
                         "blockname"))
_FIELD = re.compile(r"\s+(?=[A-Za-z][\w/:.]*=)")


def settings(text: str, *, lower: bool = False) -> dict[str, str]:
    """The single Key=Value settings of a slurm.conf text (comments, records and Include lines left out);
    with `lower`, keys as Slurm compares them (case-insensitively)."""
    out: dict[str, str] = {}
    for raw in str(text).splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        if key.lower() in RECORD_KEYS or key.lower() in ("include", "slurmctldhost") or " " in key:
            continue
        out[key.lower() if lower else key] = value.strip()
    return out


def all_settings(text: str) -> dict[str, tuple[str, ...]]:
    """Every Key=Value setting of a slurm.conf text by lower-case key, each value a key took in file order
    (SlurmctldHost is given once per controller); records and Include lines left out. What a comparison of
    two files needs, where `settings` gives the one value a reader wants."""
    out: dict[str, tuple[str, ...]] = {}
    for raw in str(text).splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip().lower()
        if key in RECORD_KEYS or key == "include" or " " in key:
            continue
        out[key] = (*out.get(key, ()), value.strip())
    return out


def record(line: str) -> dict[str, str]:
    """One record line (NodeName=..., SwitchName=..., or an `scontrol show ... -o` line) as a dict. Values
    may hold spaces where scontrol writes them (OS=Linux 6.1 #1 SMP ...): a field starts at `Key=`."""
    out: dict[str, str] = {}
    for tok in _FIELD.split(line.strip()):
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = v.strip()
    return out


def records(text: str, kind: str) -> list[dict[str, str]]:
    """Every record of a file or of scontrol's output whose first key is `kind` (NodeName, SwitchName...)."""
    prefix = f"{kind.lower()}="
    return [record(line) for line in str(text).splitlines() if line.strip().lower().startswith(prefix)]
