"""Hardware facts of a node, and how they compare with its node group in the spec.

Pure functions: the shell script below is what runs on the node (over SSH, see `ssh.py`); `parse_facts`
turns its output into `Facts`; `compare` turns (expectation, facts) into mismatches and notes. Tests
feed recorded outputs straight into these, so every rule is checked without a machine.

The rules follow what the consumers of the spec do with a node:
- CPU layout and memory: Slurm drains a node that has *less* than slurm.conf says, and is content
  with more. Less is a mismatch; more is a note (the surplus is not scheduled).
- GPUs: gres.conf names exact device files and NCCL expects every GPU; the count must be equal, and
  where nvidia-smi/rocm-smi answer, every GPU's name must contain the catalog's GRES type.
- HCAs: NCCL's NCCL_IB_HCA and the inventory list them by name, so every named one must exist, on the
  link layer of the fabric (RoCE: Ethernet, InfiniBand: InfiniBand).
- Staged nodes have stand-ins: GPUs are device files mapped from /dev/null (counted the same way),
  and the fabric is the container's virtual ethernet, so the HCA rule becomes "at least this many
  network interfaces besides lo" and says so in a note.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields

# Runs under /bin/sh on the node; reads /sys, /proc and /dev only, plus the vendor SMI tools when they
# are installed. Every section starts with a marker line so a missing tool leaves an empty section.
FACTS_SCRIPT = r"""
LC_ALL=C; export LC_ALL
echo '@hostname'; uname -n
echo '@cpu'
for d in /sys/devices/system/cpu/cpu[0-9]*; do
  [ -r "$d/topology/physical_package_id" ] || continue
  if [ -r "$d/online" ] && [ "$(cat "$d/online")" = 0 ]; then continue; fi
  echo "${d##*/} $(cat "$d/topology/physical_package_id") $(cat "$d/topology/core_id")"
done
echo '@meminfo'; grep -E '^MemTotal:' /proc/meminfo
echo '@nvidia-smi'
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; fi
echo '@rocm-smi'
if command -v rocm-smi >/dev/null 2>&1; then rocm-smi --showproductname --csv 2>/dev/null; fi
echo '@dev'
for f in /dev/nvidia[0-9]* /dev/dri/renderD*; do if [ -e "$f" ]; then echo "$f"; fi; done
echo '@net'
for n in /sys/class/net/*; do if [ -e "$n" ]; then echo "${n##*/} $(cat "$n/type" 2>/dev/null)"; fi; done
echo '@ib'
for n in /sys/class/infiniband/*; do
  if [ -e "$n" ]; then echo "${n##*/} $(cat "$n/ports/1/link_layer" 2>/dev/null)"; fi
done
echo '@end'
"""

_NVIDIA_DEV = re.compile(r"^/dev/nvidia\d+$")
_AMD_DEV = re.compile(r"^/dev/dri/renderD\d+$")


@dataclass(frozen=True)
class Facts:
    """What a node has. gpu_source says how the GPUs were counted: nvidia-smi, rocm-smi, device files."""

    hostname: str
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    cpus: int
    memory_mb: int
    gpus: int
    gpu_source: str
    gpu_names: tuple[str, ...] = ()
    gpu_devices: tuple[str, ...] = ()
    nics: tuple[str, ...] = ()  # network interfaces besides lo
    hcas: dict[str, str] = field(default_factory=dict)  # RDMA device -> link layer of port 1

    def as_dict(self) -> dict:
        """Plain data for resource outputs (tuples become lists)."""
        out = asdict(self)
        for key in ("gpu_names", "gpu_devices", "nics"):
            out[key] = list(out[key])
        return out

    def to_text(self) -> str:
        """One compact JSON string per node in resource outputs: a refresh diff shows the node's old and
        new line, and the SDK (de)serialises one value per node instead of twenty."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> Facts:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict) -> Facts:
        data = dict(data)
        for key in ("gpu_names", "gpu_devices", "nics"):
            data[key] = tuple(data.get(key) or ())
        data["hcas"] = dict(data.get("hcas") or {})
        _ints(cls, data)
        return cls(**data)


@dataclass(frozen=True)
class Expectation:
    """What the spec says one node of a group has; plain data so it travels as a resource input.

    `fields` maps each rule to the spec field it comes from (node_groups[2].gpus_per_node), so a
    mismatch names the field to change; `where` adds file:line for the message, and is left out of
    diffs (editing a comment in the spec must not re-enroll a cluster).
    """

    group: str
    hostname_check: bool
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    memory_gb: int
    gpus: int
    gpu_vendor: str | None
    gpu_type: str | None  # the catalog's slurm_type: a substring of the name the SMI tool reports
    hcas: tuple[str, ...]
    link_layer: str | None  # Ethernet (RoCE) or InfiniBand
    stand_in_nics: bool  # staged: the fabric is virtual ethernet; count interfaces, not HCAs
    nics: int
    fields: dict[str, str] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["hcas"] = list(self.hcas)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Expectation:
        """Resource inputs drop None values on their way through the engine: those come back as None."""
        data = {f.name: data.get(f.name) for f in fields(cls) if f.name in data or f.type.endswith("None")}
        data["hcas"] = tuple(data.get("hcas") or ())
        _ints(cls, data)
        data["fields"] = dict(data.get("fields") or {})
        data["where"] = dict(data.get("where") or {})
        return cls(**data)


@dataclass(frozen=True)
class Mismatch:
    field: str  # the spec field, e.g. node_groups[1].gpus_per_node
    spec: str
    node: str
    detail: str = ""

    def render(self, where: str = "") -> str:
        text = f"{self.field}: the spec says {self.spec}, the node has {self.node}"
        if self.detail:
            text += f" ({self.detail})"
        return f"{text} [{where}]" if where else text


def _ints(cls, data: dict) -> None:
    """Numbers travel through the engine as doubles (protobuf Struct): give int fields ints again."""
    for f in fields(cls):
        if f.type == "int" and isinstance(data.get(f.name), float):
            data[f.name] = int(data[f.name])


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("@") and " " not in line:
            current = out.setdefault(line[1:], [])
        elif current is not None and line:
            current.append(line)
    return out


class FactsError(ValueError):
    """The node's answer is not what the facts script prints (no /sys, a restricted shell, ...)."""


def parse_facts(text: str) -> Facts:
    s = _sections(text)
    if "end" not in s:
        raise FactsError("the facts script did not finish (no @end marker): is /bin/sh a POSIX shell?")
    cpus: list[tuple[int, int]] = []
    for line in s.get("cpu", []):
        parts = line.split()
        if len(parts) == 3 and parts[1].lstrip("-").isdigit() and parts[2].lstrip("-").isdigit():
            cpus.append((int(parts[1]), int(parts[2])))
    if not cpus:
        raise FactsError("no CPU topology under /sys/devices/system/cpu")
    sockets = len({pkg for pkg, _ in cpus})
    cores = len(set(cpus))
    mem_kb = 0
    for line in s.get("meminfo", []):
        m = re.match(r"MemTotal:\s+(\d+)\s*kB", line)
        if m:
            mem_kb = int(m.group(1))
    devices = tuple(sorted(s.get("dev", []), key=_natural))
    failed = ("no devices", "nvidia-smi has failed")
    names = tuple(n for n in s.get("nvidia-smi", []) if not n.lower().startswith(failed))
    source = "nvidia-smi"
    if not names:
        rows = [r.split(",") for r in s.get("rocm-smi", [])]
        names = tuple(r[1].strip() for r in rows if len(r) > 1 and r[0].strip().lower().startswith("card"))
        source = "rocm-smi"
    if names:
        gpus = len(names)
    else:
        nvidia = [d for d in devices if _NVIDIA_DEV.match(d)]
        amd = [d for d in devices if _AMD_DEV.match(d)]
        gpus = max(len(nvidia), len(amd))
        source = "device files"
    nics = tuple(sorted(n.split()[0] for n in s.get("net", []) if n.split()[0] != "lo"))
    hcas = {}
    for line in s.get("ib", []):
        parts = line.split(maxsplit=1)
        hcas[parts[0]] = parts[1] if len(parts) > 1 else ""
    host = (s.get("hostname") or [""])[0]
    return Facts(
        hostname=host,
        sockets=sockets,
        cores_per_socket=cores // sockets,
        threads_per_core=len(cpus) // cores,
        cpus=len(cpus),
        memory_mb=mem_kb // 1024,
        gpus=gpus,
        gpu_source=source,
        gpu_names=names,
        gpu_devices=devices,
        nics=nics,
        hcas=dict(sorted(hcas.items())),
    )


def _natural(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def _devices_text(devices: tuple[str, ...]) -> str:
    if not devices:
        return "none under /dev"
    if len(devices) > 4:
        return f"{devices[0]} … {devices[-1]}"
    return " ".join(devices)


def compare(expect: Expectation, facts: Facts, host: str) -> tuple[list[Mismatch], list[str]]:
    """Mismatches (the node cannot serve as this group's node) and notes (it can, with a remark)."""
    bad: list[Mismatch] = []
    notes: list[str] = []
    f = expect.fields

    def fld(key: str) -> str:
        return f.get(key, key)

    if expect.hostname_check and facts.hostname.split(".")[0] != host:
        bad.append(Mismatch("hostname", host, facts.hostname or "(empty)",
                            "SSH reached a different machine: check DNS or the address"))
    for key, want, have in (("cpu.sockets", expect.sockets, facts.sockets),
                            ("cpu.cores_per_socket", expect.cores_per_socket, facts.cores_per_socket),
                            ("cpu.threads_per_core", expect.threads_per_core, facts.threads_per_core)):
        if have < want:
            bad.append(Mismatch(fld(key), str(want), str(have), "Slurm drains a node with fewer CPUs than configured"))
        elif have > want:
            notes.append(f"{fld(key)}: the node has {have}, the spec {want}; Slurm schedules the spec's")
    want_mb = expect.memory_gb * 1024
    if facts.memory_mb < want_mb:
        bad.append(Mismatch(fld("memory_gb"), f"{expect.memory_gb} GB ({want_mb} MiB)",
                            f"{facts.memory_mb} MiB", "RealMemory above MemTotal drains the node"))
    if facts.gpus != expect.gpus:
        detail = (f"device files {_devices_text(facts.gpu_devices)}" if facts.gpu_source == "device files"
                  else f"{facts.gpu_source}: {', '.join(facts.gpu_names)}")
        bad.append(Mismatch(fld("gpus_per_node"), str(expect.gpus), str(facts.gpus), detail))
    elif expect.gpus and expect.gpu_type and facts.gpu_names:
        wrong = [n for n in facts.gpu_names if expect.gpu_type.lower() not in n.lower()]
        if wrong:
            bad.append(Mismatch(fld("gpu"), f"GPUs of type {expect.gpu_type}", ", ".join(sorted(set(wrong))),
                                f"reported by {facts.gpu_source}"))
    elif expect.gpus and facts.gpu_source == "device files":
        notes.append(f"{expect.gpus} GPUs counted from device files; the model was not checked "
                     "(no nvidia-smi or rocm-smi on the node)")
    if expect.stand_in_nics:
        if len(facts.nics) < expect.nics:
            bad.append(Mismatch(fld("nics_per_node"), f"{expect.nics} interfaces", f"{len(facts.nics)}",
                                f"staged: network interfaces besides lo: {', '.join(facts.nics) or 'none'}"))
        elif expect.nics:
            notes.append("staged: the fabric is a stand-in (virtual ethernet); HCAs were not checked")
    elif expect.hcas:
        missing = [h for h in expect.hcas if h not in facts.hcas]
        if missing:
            have = ", ".join(facts.hcas) or "none"
            bad.append(Mismatch(fld("hcas"), ", ".join(expect.hcas), f"RDMA devices {have}",
                                f"missing {', '.join(missing)} under /sys/class/infiniband"))
        if expect.link_layer:
            wrong = sorted(h for h in expect.hcas if h in facts.hcas and facts.hcas[h] != expect.link_layer)
            if wrong:
                bad.append(Mismatch("fabric.type", f"link layer {expect.link_layer}",
                                    ", ".join(f"{h}: {facts.hcas[h] or 'unknown'}" for h in wrong)))
    return bad, notes


def drift(before: dict, after: dict) -> list[str]:
    """Fields whose value changed between two fact dicts of one node, as readable lines."""
    out = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            out.append(f"{key}: {_short(before.get(key))} -> {_short(after.get(key))}")
    return out


def _short(value) -> str:
    if isinstance(value, list) and len(value) > 4:
        return f"[{value[0]} … {value[-1]}] ({len(value)})"
    return str(value)
