#!/usr/bin/python3
"""One node health check: `checks.py --config FILE --check NAME` prints {"ok": bool, "message": str}
as one JSON line and exits 0 (pass) or 1 (fail).

Why one process per check: the runner gives each check a time budget and kills the whole process group
when it overruns (a stat on a dead NFS server, a wedged nvidia-smi), so a hung check costs its budget
and never the runner, slurmd or a job prolog. Standard library only: nodes have python3, not gpucluster.

What a check reads is where the host keeps it (/sys, /dev, /dev/kmsg, /proc/self/mountinfo, the tools on PATH);
GPC_HEALTH_ROOT prefixes the file paths so the tests can hand it a fake tree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

try:
    from . import xid
except ImportError:  # run as a script on a node: the files sit side by side
    import xid

BUILTIN = ("gpu-count", "gpu-ecc", "gpu-xid", "fabric-manager", "nvlink-fabric", "hca-ports", "link-flap", "munge",
           "disk-tmp", "disk-spool")
NA = ("", "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]")
STAND_IN = (1, 3)  # /dev/null mapped at a GPU's path: a stand-in on staged nodes, not a GPU
# Staged nodes whose Slurm constrains devices get a number of their own per GPU instead: major 120, which the
# kernel reserves for local/experimental use and no driver claims (gpucluster.stage.podman.STAND_IN_MAJOR).
STAND_IN_MAJOR = 120


class CheckError(Exception):
    """The check could not look (a tool failed or hung): a failure, with what went wrong."""


def host_path(path: str) -> str:
    return os.path.join(os.environ.get("GPC_HEALTH_ROOT", "/"), path.lstrip("/"))


def first_line(text: str, limit: int = 160) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return " ".join(line.split())[:limit]
    return ""


def run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run a tool in its own process group; kill the group when it overruns."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:
        raise CheckError(f"{argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise CheckError(f"{os.path.basename(argv[0])} did not answer within {timeout:g}s") from None
    return proc.returncode, out, err


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: leave it, the budget is what matters
        proc.communicate(timeout=1)


def tool(name: str, *fallbacks: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    return next((f for f in fallbacks if os.access(f, os.X_OK)), None)


def budget(check: dict) -> float:
    """Seconds a tool may take inside the check: a little under the runner's budget for it."""
    return max(1.0, float(check.get("timeout", 20)) - 1.0)


# ---------------------------------------------------------------- GPUs


def parse_nvidia_csv(text: str, fields: list[str]) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=... --format=csv,noheader[,nounits]` lines -> one dict per GPU."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(fields):
            rows.append(dict(zip(fields, values, strict=True)))
    return rows


def parse_rocm_csv(text: str) -> list[dict[str, str]]:
    """`rocm-smi --showproductname --csv`: a header starting 'device,' then one 'cardN,...' row per GPU
    (ROCm prints warnings around it; header spelling differs between releases, so keys are lower case)."""
    lines = [line.strip() for line in text.splitlines()]
    head = next((i for i, line in enumerate(lines) if line.lower().startswith("device,")), None)
    if head is None:
        return []
    keys = [k.strip().lower() for k in lines[head].split(",")]
    rows = []
    for line in lines[head + 1:]:
        if not line.lower().startswith("card"):
            continue
        values = [v.strip() for v in line.split(",")]
        rows.append(dict(zip(keys, values + [""] * (len(keys) - len(values)), strict=False)))
    return rows


def device_files(pattern: str) -> list[tuple[str, str]]:
    """[(path, stand-in numbers or "")] of character devices named like `pattern` (a regex on the name) under
    /dev/...: "1:3" for /dev/null, "120:N" for a stand-in of its own number, "" for a device file."""
    folder, _, name_re = pattern.rpartition("/")
    out = []
    try:
        names = sorted(os.listdir(host_path(folder)), key=lambda n: [int(p) if p.isdigit() else p
                                                                    for p in re.split(r"(\d+)", n)])
    except OSError:
        return out
    for name in names:
        if not re.fullmatch(name_re, name):
            continue
        try:
            st = os.stat(host_path(f"{folder}/{name}"))
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            numbers = (os.major(st.st_rdev), os.minor(st.st_rdev))
            kind = "1:3" if numbers == STAND_IN else f"{STAND_IN_MAJOR}:N" if numbers[0] == STAND_IN_MAJOR else ""
            out.append((f"{folder}/{name}", kind))
    return out


def gpu_count(check: dict) -> tuple[bool, str]:
    want, model, vendor = int(check["count"]), str(check.get("model", "")).lower(), check["vendor"]
    names: list[str] | None = None
    if vendor == "nvidia":
        smi = tool("nvidia-smi")
        if smi:
            rc, out, err = run([smi, "--query-gpu=index,name,pci.bus_id", "--format=csv,noheader"], budget(check))
            if rc != 0:
                return False, f"nvidia-smi failed: {first_line(err or out) or f'exit {rc}'}"
            names = [g["name"] for g in parse_nvidia_csv(out, ["index", "name", "bus"])]
            how = "nvidia-smi"
    else:
        smi = tool("rocm-smi", "/opt/rocm/bin/rocm-smi")
        if smi:
            rc, out, err = run([smi, "--showproductname", "--csv"], budget(check))
            if rc != 0:
                return False, f"rocm-smi failed: {first_line(err or out) or f'exit {rc}'}"
            names = [",".join(r.values()) for r in parse_rocm_csv(out)]
            how = "rocm-smi"
    if names is None:
        return _count_device_files(check, want)
    if len(names) != want:
        return False, f"{len(names)} of {want} GPUs ({how})"
    for i, name in enumerate(names):
        if model and not names_model(name, model):
            return False, f"GPU {i} is '{first_line(name, 60)}', not {model} ({how})"
    if check.get("memory_gb"):
        short = _memory_short(check, smi, vendor)
        if short:
            return False, short
    return True, f"{want} of {want} GPUs ({how}: {first_line(names[0], 60) if names else '-'})"


def names_model(name: str, model: str) -> bool:
    """The model as a word of the tool's name: 'b200' is in 'NVIDIA B200' but not in 'NVIDIA GB200' (a GB200
    tray is not a B200 node), 'h100' in 'NVIDIA H100 80GB HBM3', 'mi355x' in 'AMD Instinct MI355X'."""
    return re.search(rf"(?<![a-z0-9]){re.escape(model.lower())}(?![a-z0-9])", name.lower()) is not None


# A GPU reporting less than this share of its catalog memory is short of memory: the catalog figure is what the
# tool reports (GB or GiB, within 7%), so 10% below it is a smaller SKU, or memory the driver took offline.
MEMORY_FLOOR = 0.90


def _memory_short(check: dict, smi: str, vendor: str) -> str:
    """'' when every GPU reports at least MEMORY_FLOOR of the catalog's memory_gb, else what is short."""
    want_mib = float(check["memory_gb"]) * 1000 * MEMORY_FLOOR  # MiB (1 GB is 954 MiB; the floor takes it)
    if vendor == "nvidia":
        rc, out, err = run([smi, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"], budget(check))
        if rc != 0:
            return f"nvidia-smi failed: {first_line(err or out) or f'exit {rc}'}"
        sizes = {g["index"]: g["mib"] for g in parse_nvidia_csv(out, ["index", "mib"])}
    else:
        rc, out, err = run([smi, "--showmeminfo", "vram", "--csv"], budget(check))
        if rc != 0:
            return f"rocm-smi failed: {first_line(err or out) or f'exit {rc}'}"
        sizes = {}
        for i, row in enumerate(parse_rocm_csv(out)):
            total = next((v for k, v in row.items() if "total memory" in k.lower() and "used" not in k.lower()), "")
            sizes[str(i)] = str(int(total) // (1 << 20)) if total.strip().isdigit() else ""
    if not sizes:
        return "no GPU memory size reported"
    for index, mib in sizes.items():
        if not mib.isdigit():
            return f"GPU {index}: memory size '{first_line(mib, 30)}' unreadable"
        if int(mib) < want_mib:
            return (f"GPU {index}: {int(mib)} MiB, below {MEMORY_FLOOR:.0%} of the {check['memory_gb']} GB "
                    f"{check.get('model', '')} has")
    return ""


def _count_device_files(check: dict, want: int) -> tuple[bool, str]:
    """No vendor tool (no driver installed): the device files Slurm's gres.conf names are what there is."""
    found = device_files(check["devices"])
    stand_ins = sum(1 for _p, s in found if s)
    kinds = " or ".join(sorted({s for _p, s in found if s}))
    note = f"; {stand_ins} stand-ins (character device {kinds}), not GPUs" if stand_ins else ""
    if len(found) == want:
        return True, f"{want} of {want} GPUs (device files, no vendor tool{note})"
    have = {p for p, _s in found}
    folder, prefix = check["devices"].rpartition("/")[0], check.get("device_prefix")
    first = int(check.get("device_first", 0))
    expected = [f"{folder}/{prefix}{first + i}" for i in range(want)] if prefix else []
    missing = [p for p in expected if p not in have]
    what = f"{', '.join(missing[:3])} missing" if missing else "device files"
    return False, f"{len(found)} of {want} GPUs ({what}{note})"


def gpu_ecc(check: dict) -> tuple[bool, str]:
    limit = int(check.get("max_uncorrected", 0))
    if check["vendor"] == "nvidia":
        smi = tool("nvidia-smi")
        if not smi:
            return True, "not checked: nvidia-smi is not installed (no NVIDIA driver)"
        fields = ["index", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending",
                  "remapped_rows.failure"]
        rc, out, err = run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], budget(check))
        if rc != 0:
            return False, f"nvidia-smi failed: {first_line(err or out) or f'exit {rc}'}"
        bad = []
        gpus = parse_nvidia_csv(out, fields)
        for g in gpus:
            i = g["index"]
            if g["ecc.mode.current"] == "Disabled":
                bad.append(f"GPU {i}: ECC is disabled")
            n = g["ecc.errors.uncorrected.volatile.total"]
            if n not in NA and n.isdigit() and int(n) > limit:
                bad.append(f"GPU {i}: {n} uncorrected ECC errors since the driver loaded")
            if g["remapped_rows.failure"] == "Yes":
                bad.append(f"GPU {i}: row remapping failed (replace the GPU)")
            if g["remapped_rows.pending"] == "Yes":
                bad.append(f"GPU {i}: row remapping pending (reset the GPU)")
        if not gpus:
            return False, "nvidia-smi listed no GPU"
        return (False, "; ".join(bad)) if bad else (True, f"no uncorrected ECC errors on {len(gpus)} GPUs")
    return _amd_ras(limit)


def _amd_ras(limit: int) -> tuple[bool, str]:
    """amdgpu's RAS counters: /sys/class/drm/cardN/device/ras/<block>_err_count holds 'ue: N' and 'ce: N'."""
    base = host_path("/sys/class/drm")
    try:
        cards = sorted(n for n in os.listdir(base) if re.fullmatch(r"card\d+", n))
    except OSError:
        cards = []
    bad, seen = [], 0
    for card in cards:
        ras = os.path.join(base, card, "device", "ras")
        if not os.path.isdir(ras):
            continue
        seen += 1
        ue = 0
        for name in sorted(os.listdir(ras)):
            if name.endswith("_err_count"):
                try:
                    text = _read(os.path.join(ras, name))
                except OSError:
                    continue
                m = re.search(r"^ue:\s*(\d+)", text, re.M)
                ue += int(m.group(1)) if m else 0
        if ue > limit:
            bad.append(f"{card}: {ue} uncorrected ECC errors")
    if not seen:
        return True, "not checked: no amdgpu RAS counters in /sys/class/drm (no AMD driver loaded)"
    return (False, "; ".join(bad)) if bad else (True, f"no uncorrected ECC errors on {seen} GPUs")


def gpu_xid(check: dict) -> tuple[bool, str, dict]:
    """GPU errors the driver logged since the last run (xid.py: NVIDIA Xid and SXid, amdgpu RAS and resets), each
    mapped by the table to record, drain, reboot or service; fails for drain and above. Where the last run stopped
    reading is in state.json (the runner keeps this check's data there), read here and never written."""
    try:
        with open(os.path.join(check["state_dir"], "state.json")) as fh:
            state = json.load(fh)
        previous = state["checks"]["gpu-xid"]["data"]
    except (OSError, ValueError, KeyError, TypeError):
        previous = {}
    overrides = check.get("xid_actions") if isinstance(check.get("xid_actions"), dict) else {}
    return xid.scan(str(check.get("kernel_log", "kmsg")), previous, overrides,
                    os.environ.get("GPC_HEALTH_ROOT", "/"))


def unit_inactive(check: dict, unit: str, what: str) -> str | None:
    """Why `unit` is not running (systemctl is-active), or None when it is; `what` names it when systemctl is
    missing."""
    systemctl = tool("systemctl")
    if not systemctl:
        return f"systemctl not found: cannot tell whether {what} runs"
    rc, out, _err = run([systemctl, "is-active", unit], budget(check))
    state = first_line(out) or f"exit {rc}"
    if state != "active":
        return f"{unit} is {state}"
    return None


def fabric_manager(check: dict) -> tuple[bool, str]:
    unit = check.get("unit", "nvidia-fabricmanager.service")
    why = unit_inactive(check, unit, "Fabric Manager")
    if why:
        return False, why
    smi = tool("nvidia-smi")
    if smi:
        rc, out, _err = run([smi, "--query-gpu=index,fabric.state,fabric.status", "--format=csv,noheader"],
                           budget(check))
        if rc == 0:
            for g in parse_nvidia_csv(out, ["index", "state", "status"]):
                if g["state"] not in NA and g["state"] != "Completed":
                    return False, f"GPU {g['index']}: NVLink fabric {g['state']} ({g['status']})"
                if g["state"] == "Completed" and g["status"] not in NA and g["status"] != "Success":
                    return False, f"GPU {g['index']}: NVLink fabric registration {g['status']}"
    return True, f"{unit} active"


# ---------------------------------------------------------------- NVLink fabric of an NVL72 tray


def parse_smi_query(text: str) -> tuple[list[dict], str]:
    """`nvidia-smi -q` -> ([one nested dict per GPU section, in the tool's (index) order], 'Attached GPUs' value).

    The format is indentation: a GPU section starts at column 0 (`GPU 00000008:01:00.0`), its fields and
    sub-sections are indented under it (`    Fabric`, `        State : Completed`, `        Health`, ...). A
    line with a value after its colon is a field, one without is a sub-section holding the deeper lines; the
    first of a repeated key wins. Tabs count as 4 columns; lines outside a GPU section (Timestamp, Driver
    Version) are skipped but for `Attached GPUs`."""
    gpus: list[dict] = []
    attached = ""
    stack: list[tuple[int, dict]] = []
    for raw in text.splitlines():
        line = raw.rstrip().expandtabs(4)
        body = line.strip()
        if not body:
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = (p.strip() for p in body.partition(":"))
        if indent == 0:
            if re.fullmatch(r"GPU\s+[0-9A-Fa-f:.]+", body):  # `GPU 00000008:01:00.0`: a GPU's section
                gpus.append({"_bus": body.split(None, 1)[1]})
                stack = [(0, gpus[-1])]
            else:
                stack = []
                if key == "Attached GPUs":
                    attached = value
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if sep and value:
            parent.setdefault(key, value)
        else:  # `    Fabric`, or `    Platform Info :` with nothing after the colon: a sub-section
            child: dict = {}
            parent.setdefault(key, child)
            stack.append((indent, child))
    return gpus, attached


def parse_nvlink_status(text: str) -> dict[str, tuple[int, dict[int, str]]]:
    """`nvidia-smi nvlink -s` -> {GPU UUID: (index, {link number: what it says})}: a `GPU 0: NAME (UUID: GPU-...)`
    line, then one `Link N: 53.125 GB/s` (or `Link N: <inactive>`) line per link."""
    out: dict[str, tuple[int, dict[int, str]]] = {}
    links: dict[int, str] | None = None
    for line in text.splitlines():
        gpu = re.match(r"\s*GPU (\d+):.*\(UUID: (\S+?)\)\s*$", line)
        if gpu:
            links = {}
            out[gpu.group(2)] = (int(gpu.group(1)), links)
            continue
        link = re.match(r"\s*Link (\d+): (.*?)\s*$", line)
        if link and links is not None:
            links[int(link.group(1))] = link.group(2)
    return out


def link_mbytes(value: str) -> int | None:
    """'53.125 GB/s' -> 53125 (MB/s); None for `<inactive>` or anything that is no rate."""
    m = re.fullmatch(r"([\d.]+)\s*GB/s", value.strip())
    try:
        return round(float(m.group(1)) * 1000) if m else None
    except ValueError:
        return None


def _gbs(mbytes: int) -> str:
    return f"{mbytes / 1000:g} GB/s"


NO_UUID = ("", "00000000-0000-0000-0000-000000000000", *NA)


def _fabric_problem(fabric: dict) -> str:
    """What is wrong with one GPU's `Fabric` section on its own ('' when nothing): registration first (NVML: the
    Status means something only once the State is Completed), then the identity the registration gave it."""
    state, status = fabric.get("State", "absent"), fabric.get("Status", "absent")
    clique, uuid = fabric.get("CliqueId", "absent"), fabric.get("ClusterUUID", "absent")
    if state != "Completed":
        return f"fabric State {state}, not Completed"
    if status != "Success":
        return f"fabric Status {status}, not Success (CliqueId {clique})"
    if not clique.isdigit() or int(clique) == 0:
        return f"CliqueId {clique} (in no clique)"
    if uuid in NO_UUID:
        return f"ClusterUUID missing ({uuid or 'empty'})"
    return ""


def _odd_ones(values: list[tuple[int, str]], what: str) -> list[tuple[int, str]]:
    """GPUs whose value differs from the tray's most common one (ties: the first GPU's)."""
    if len({v for _i, v in values}) < 2:
        return []
    counts: dict[str, int] = {}
    for _i, v in values:
        counts[v] = counts.get(v, 0) + 1
    common = max(counts, key=lambda v: counts[v])  # max keeps the first of equal counts
    first = next(i for i, v in values if v == common)
    return [(i, f"{what} {v}, GPU {first} has {common}") for i, v in values if v != common]


def _link_problems(index: int, links: dict[int, str], want: int, rate: int) -> list[tuple[int, str]]:
    up = {n: link_mbytes(v) for n, v in links.items()}
    down = [n for n, r in sorted(up.items()) if r is None]
    problems = []
    if len(up) - len(down) < want:
        first = f" (link {down[0]}: {links[down[0]]})" if down else ""
        problems.append((index, f"{len(up) - len(down)} of {want} NVLinks up{first}"))
    slow = [(n, r) for n, r in sorted(up.items()) if r is not None and rate and r < rate]
    if slow:
        more = f" (+{len(slow) - 1} more)" if len(slow) > 1 else ""
        problems.append((index, f"link {slow[0][0]} at {links[slow[0][0]]}, catalog {_gbs(rate)}{more}"))
    return problems


def _grouped(problems: list[tuple[int, str]]) -> str:
    """'GPU 0, 1: text; GPU 2: other': the same fault on several GPUs is said once (a drain reason is short)."""
    order: dict[str, list[int]] = {}
    for i, text in problems:
        order.setdefault(text, []).append(i)
    return "; ".join(f"GPU {', '.join(str(i) for i in ids)}: {text}" for text, ids in order.items())


def nvlink_fabric(check: dict) -> tuple[bool, str]:
    """A tray of a rack-scale NVLink domain (GB200/GB300 NVL72), per GPU: IMEX runs, the fabric registration is
    Completed / Success, the GPU is in a clique (CliqueId not 0) of a cluster (ClusterUUID), the tray's GPUs share
    both, and each GPU has the catalog's NVLinks up at the catalog's rate. Passing, it says the tray's CliqueId
    and ClusterUUID, which the state file keeps: the rack-level comparison across trays reads them from there."""
    unit = check.get("unit")
    why = unit_inactive(check, unit, unit) if unit else None
    if why:
        return False, why
    smi = tool("nvidia-smi")
    if not smi:
        return False, "nvidia-smi not found: cannot read the NVLink fabric (no NVIDIA driver)"
    rc, out, err = run([smi, "-q"], budget(check))
    if rc != 0:
        return False, f"nvidia-smi -q failed: {first_line(err or out) or f'exit {rc}'}"
    gpus, attached = parse_smi_query(out)
    want = int(check["count"])
    if len(gpus) != want:
        minors = {g.get("Minor Number", "") for g in gpus}
        gone = [f"/dev/nvidia{i}" for i in range(want) if str(i) not in minors]
        note = f"; {', '.join(gone[:3])} not among them" if gone and len(gpus) < want else ""
        return False, f"nvidia-smi -q lists {len(gpus)} of {want} GPUs (Attached GPUs: {attached or '?'}{note})"
    problems: list[tuple[int, str]] = []
    registered: list[tuple[int, dict]] = []
    for i, g in enumerate(gpus):
        fabric = g.get("Fabric") if isinstance(g.get("Fabric"), dict) else {}
        problem = _fabric_problem(fabric)
        if problem:
            problems.append((i, problem))
        else:
            registered.append((i, fabric))
    problems += _odd_ones([(i, f["CliqueId"]) for i, f in registered], "CliqueId")
    problems += _odd_ones([(i, f["ClusterUUID"]) for i, f in registered], "ClusterUUID")
    links, rate = int(check.get("links") or 0), int(check.get("link_mbytes_per_s") or 0)
    if links:
        rc, out, err = run([smi, "nvlink", "-s"], budget(check))
        if rc != 0:
            return False, f"nvidia-smi nvlink -s failed: {first_line(err or out) or f'exit {rc}'}"
        status = parse_nvlink_status(out)
        if not status:
            return False, "nvidia-smi nvlink -s lists no GPU"
        for i, g in enumerate(gpus):
            uuid = g.get("GPU UUID", "")
            if uuid not in status:
                problems.append((i, f"{uuid or g['_bus']} not in nvidia-smi nvlink -s"))
                continue
            problems += _link_problems(i, status[uuid][1], links, rate)
    if problems:
        return False, _grouped(problems)
    clique, cluster = registered[0][1]["CliqueId"], registered[0][1]["ClusterUUID"]
    speed = f", {links} NVLinks each at {_gbs(rate)}" if links and rate else f", {links} NVLinks each" if links else ""
    return True, f"{want} GPUs in clique {clique} of cluster {cluster}: fabric Completed / Success{speed}"


# ---------------------------------------------------------------- HCAs


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


def _ports(hca: str) -> list[str]:
    try:
        return sorted(os.listdir(host_path(f"/sys/class/infiniband/{hca}/ports")), key=lambda p: int(p))
    except (OSError, ValueError):
        return []


def hca_ports(check: dict) -> tuple[bool, str]:
    """Every planned HCA is there, each port ACTIVE (state '4: ACTIVE') at the planned rate or more."""
    rate = float(check.get("rate_gbps", 0))
    bad = []
    for hca in check["hcas"]:
        ports = _ports(hca)
        if not ports:
            bad.append(f"{hca} missing from /sys/class/infiniband (HCA gone or driver not loaded)")
            continue
        for port in ports:
            base = host_path(f"/sys/class/infiniband/{hca}/ports/{port}")
            try:
                state, speed = _read(f"{base}/state"), _read(f"{base}/rate")
            except OSError as exc:
                bad.append(f"{hca}/{port}: {exc.strerror}")
                continue
            if not state.endswith("ACTIVE") or "INIT" in state:
                bad.append(f"{hca}/{port} is {state.split(':', 1)[-1].strip()}")
                continue
            m = re.match(r"([\d.]+) Gb/sec", speed)
            if rate and (not m or float(m.group(1)) < rate):
                bad.append(f"{hca}/{port} at {speed}, planned {rate:g} Gb/sec")
    if bad:
        return False, "; ".join(bad)
    return True, f"{len(check['hcas'])} HCAs ACTIVE at {rate:g} Gb/sec or more"


def link_flap(check: dict) -> tuple[bool, str]:
    """link_downed counts a port's link going down; a rise since the last run is a flapping link."""
    limit = int(check.get("max_increase", 0))
    state_file = os.path.join(check["state_dir"], "link-flap.json")
    try:
        with open(state_file) as fh:
            before = json.load(fh)
    except (OSError, ValueError):
        before = {}
    now, bad = {}, []
    for hca in check["hcas"]:
        for port in _ports(hca):
            try:
                value = int(_read(host_path(f"/sys/class/infiniband/{hca}/ports/{port}/counters/link_downed")))
            except (OSError, ValueError):
                continue
            key = f"{hca}/{port}"
            now[key] = value
            rise = value - int(before[key]) if key in before else 0
            if rise > limit:
                bad.append(f"{key}: link_downed {before[key]} -> {value} (+{rise} since the last run)")
    _write_json(state_file, now)
    if bad:
        return False, "; ".join(bad)
    if not before:
        return True, f"baseline of {len(now)} ports recorded"
    return True, f"no link went down on {len(now)} ports since the last run"


def _write_json(path: str, data) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


# ---------------------------------------------------------------- mounts, munge, disks


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mountinfo(text: str) -> dict[str, str]:
    """{mount point: fs type} from /proc/self/mountinfo (the last mount at a path is the visible one)."""
    out = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        out[_unescape(fields[4])] = right.split()[0] if right.split() else ""
    return out


def mount(check: dict) -> tuple[bool, str]:
    path, want = check["path"], check.get("fstype", "")
    try:
        mounts = mountinfo(_read(host_path("/proc/self/mountinfo")))
    except OSError as exc:
        return False, f"cannot read /proc/self/mountinfo: {exc.strerror}"
    if path not in mounts:
        record = check.get("skip_record")
        if record and os.path.exists(host_path(record)):
            return True, f"not mounted, as the role recorded: {first_line(_read(host_path(record)), 120)}"
        return False, f"{path} not mounted"
    fstype = mounts[path]
    if want and not fstype.startswith(want):
        return False, f"{path} is {fstype}, not {want}"
    # A dead server hangs stat in the kernel: ask from a child and give up on it after the budget.
    wait = min(float(check.get("stat_timeout", 5)), budget(check))  # its own words before the runner's kill
    probe = [sys.executable, "-c", "import os,sys; os.statvfs(sys.argv[1]); os.listdir(sys.argv[1])",
             host_path(path)]
    try:
        rc, _out, err = run(probe, wait)
    except CheckError:
        return False, f"{path} ({fstype}) did not answer within {wait:g}s"
    if rc != 0:
        return False, f"{path} ({fstype}): {first_line(err).rpartition(': ')[2] or f'exit {rc}'}"
    return True, f"{path} ({fstype}) answers"


def munge(check: dict) -> tuple[bool, str]:
    munge_bin, unmunge_bin = tool("munge"), tool("unmunge")
    if not (munge_bin and unmunge_bin):
        return False, "munge or unmunge not found (package munge)"
    rc, cred, err = run([munge_bin, "-n"], budget(check))
    if rc != 0:
        return False, f"munge -n failed: {first_line(err) or f'exit {rc}'}"
    try:
        proc = subprocess.run([unmunge_bin], input=cred, capture_output=True, text=True, timeout=budget(check),
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return False, f"unmunge did not answer within {budget(check):g}s"
    if proc.returncode != 0:
        return False, f"unmunge failed: {first_line(proc.stderr or proc.stdout) or f'exit {proc.returncode}'}"
    return True, "munge -n | unmunge: Success"


def disk(check: dict) -> tuple[bool, str]:
    path, need = check["path"], float(check.get("min_free_pct", 5))
    try:
        st = os.statvfs(host_path(path))
    except OSError as exc:
        return False, f"{path}: {exc.strerror}"
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    pct = 100.0 * free / total if total else 0.0
    text = f"{path} {pct:.1f}% free ({_size(free)} of {_size(total)})"
    if pct < need:
        return False, f"{text} < {need:g}%"
    return True, text


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


KINDS = {"gpu-count": gpu_count, "gpu-ecc": gpu_ecc, "gpu-xid": gpu_xid, "service": fabric_manager,
         "nvlink-fabric": nvlink_fabric, "hca-ports": hca_ports, "link-flap": link_flap, "mount": mount,
         "munge": munge, "disk": disk}


def run_with_data(check: dict) -> tuple[bool, str, dict | None]:
    """(ok, message, data): `data` is what the check keeps for its next run (None for most checks)."""
    try:
        out = KINDS[check["kind"]](check)
    except CheckError as exc:
        return False, str(exc), None
    return (out[0], out[1], out[2] if len(out) > 2 else None)


def run_check(check: dict) -> tuple[bool, str]:
    ok, message, _data = run_with_data(check)
    return ok, message


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one node health check and print its result as JSON.")
    p.add_argument("--config", required=True)
    p.add_argument("--check", required=True)
    args = p.parse_args(argv)
    started = time.monotonic()
    data = None
    try:
        with open(args.config) as fh:
            config = json.load(fh)
        check = next(c for c in config["checks"] if c["name"] == args.check)
        check = {"state_dir": config.get("state_dir", "/var/lib/gpucluster/health"), **check}
        ok, message, data = run_with_data(check)
    except StopIteration:
        ok, message = False, f"no check named {args.check} in {args.config}"
    except Exception as exc:  # a broken check fails, with its error, rather than vanishing
        ok, message = False, f"check error: {type(exc).__name__}: {exc}"
    out = {"ok": ok, "message": message, "seconds": round(time.monotonic() - started, 3)}
    print(json.dumps({**out, "data": data} if data is not None else out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
