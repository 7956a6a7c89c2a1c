#!/usr/bin/python3
"""GPU error classes from the kernel log: NVIDIA Xid and NVSwitch SXid lines, amdgpu RAS and reset lines, each
mapped to one action on the ladder record < drain < reboot < service by a table (XIDS, CLASSES), never by code.

What is read, and from where (the gpu-xid check's `kernel_log`):
- "kmsg" (the default): /dev/kmsg, the kernel's own log buffer. Every record carries a sequence number, so "since
  the last run" is exact: the position is (boot id, last sequence number read); a new boot starts at its first
  record. No journald or tool process is needed (slurmd runs the checks as root, who may read it).
- a path: a text file of kernel lines (dmesg or `journalctl -k` output, /var/log/kern.log, a test's file). The
  position is (device, inode, byte offset); a new inode (rotated) or a shorter file (truncated) is read from the
  start. Only whole lines are taken: a line still being written is read on the next run.
The position lives in the check's `data` in state.json (runner.record keeps it), so a run that never finished
reads the same lines again: an error is counted twice sooner than missed.

Everything read is data: at most MAX_BYTES a run, MAX_LINE characters a line; a line is only matched against the
patterns below, and the message is built from the table's words, the numbers and the PCI address those patterns
let through (hex digits), never from the rest of the line. Standard library only (this file runs on nodes).
"""

from __future__ import annotations

import errno
import os
import re

LADDER = ("record", "drain", "reboot", "service")
# What each rung asks for. record: kept in state.json, the node stays in service. drain: the check fails on the
# run that read it (the node drains, and resumes like any drain once resume_after runs pass). reboot and service:
# the check fails on every run until the node boots again, since only a GPU reset, a reboot or a repair clears the
# fault; the run's `ladder` says which, for the step that acts on it.
STICKY = ("reboot", "service")

CATALOG = "docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
# NVIDIA's catalog gives an immediate action per XID. The ladder has no GPU-reset rung: RESET_GPU and
# RESTART_BM (restart the bare-metal node) are `reboot` (a reboot resets every GPU); RESTART_APP and IGNORE
# (the application's fault, the GPU stays healthy) are `record`; a fault NVIDIA routes to an RMA is `service`.
# XID -> (action, what it is, source).
XIDS: dict[int, tuple[str, str, str]] = {
    8: ("record", "GPU stopped processing", f"{CATALOG}: RESTART_APP"),
    13: ("record", "Graphics Engine Exception", f"{CATALOG}: RESTART_APP (an application fault, e.g. out of bounds)"),
    31: ("record", "GPU memory page fault", f"{CATALOG}: RESTART_APP (an illegal address of the application)"),
    32: ("record", "Invalid or corrupted push buffer stream", f"{CATALOG}: RESTART_APP"),
    43: ("record", "GPU stopped processing", f"{CATALOG}: IGNORE (the application's fault; the GPU stays healthy)"),
    45: ("record", "Preemptive cleanup, due to previous errors",
         f"{CATALOG}: WORKFLOW_XID_45 (follow the other XIDs logged with it; alone: the application was stopped)"),
    46: ("reboot", "GPU stopped processing", f"{CATALOG}: RESET_GPU"),
    48: ("reboot", "Double Bit ECC Error",
         f"{CATALOG}: WORKFLOW_XID_48 (a GPU reset or node reboot is needed to clear this error)"),
    61: ("reboot", "Internal micro-controller breakpoint/warning",
         f"{CATALOG}: unused on Ampere and later; older GPUs: reset the GPU (as 62)"),
    62: ("reboot", "Internal micro-controller halt", f"{CATALOG}: RESET_GPU"),
    63: ("record", "GPU memory remapping event",
         f"{CATALOG}: IGNORE (a row marked for remapping at the next reset; gpu-ecc reports it pending)"),
    64: ("service", "GPU memory remapping failure",
         f"{CATALOG}: RESET_GPU, then CONTACT_SUPPORT; a failed row remap is an RMA condition "
         "(docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt)"),
    68: ("record", "NVDEC0 Exception", f"{CATALOG}: RESTART_APP"),
    74: ("reboot", "NVLINK Error",
         f"{CATALOG}: WORKFLOW_NVLINK_ERR (a GPU reset or node reboot is needed to clear this error)"),
    79: ("reboot", "GPU has fallen off the bus", f"{CATALOG}: RESTART_BM (restart the node), then CONTACT_SUPPORT"),
    92: ("record", "High single-bit ECC error rate", f"{CATALOG}: IGNORE, then CONTACT_SUPPORT if it persists"),
    94: ("record", "Contained memory error",
         f"{CATALOG}: RESTART_APP (only the application that hit it; reset the GPU when convenient)"),
    95: ("reboot", "Uncontained memory error",
         f"{CATALOG}: RESET_GPU (the GPU must be reset before applications can restart)"),
    109: ("reboot", "Context Switch Timeout Error", f"{CATALOG}: RESET_GPU"),
    119: ("reboot", "GSP RPC Timeout", f"{CATALOG}: RESET_GPU (a GPU reset or node power cycle if it persists)"),
    120: ("reboot", "GSP Error", f"{CATALOG}: RESET_GPU (a GPU reset or node power cycle if it persists)"),
    121: ("record", "C2C Error", f"{CATALOG}: IGNORE (corrected errors on the C2C link to a Grace CPU)"),
    136: ("reboot", "Link Training Failed", f"{CATALOG}: RESET_GPU"),
    140: ("reboot", "ECC Unrecovered Error", f"{CATALOG}: RESET_GPU (then CONTACT_SUPPORT if it persists)"),
    143: ("reboot", "GPU Initialization Error", f"{CATALOG}: RESET_GPU"),
    154: ("record", "GPU Recovery Action Changed",
          f"{CATALOG}: informational, it names the recovery the other XIDs need (CLASSES: xid154-*)"),
    155: ("reboot", "NVLINK: SW Defined Error", f"{CATALOG}: RESET_GPU"),
    156: ("reboot", "Resource Retirement Event", f"{CATALOG}: RESET_GPU"),
    157: ("service", "Resource Retirement Failure",
          f"{CATALOG}: IGNORE, then CONTACT_SUPPORT (no repair is possible for lack of spare resources)"),
    158: ("reboot", "GPU Fatal Timeout", f"{CATALOG}: RESET_GPU"),
}
UNKNOWN_XID = ("record", "not in the table", "an XID the table does not name is recorded, never drained: a newer "
               "driver's informational XID must not drain a fleet; health.xid_actions names it")

FM_GUIDE = "docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide (Error Handling)"
KERNEL_RAS = "docs.kernel.org/gpu/amdgpu/ras.html"
# The classes that are not one NVIDIA XID number: class -> (action, what it is, source).
CLASSES: dict[str, tuple[str, str, str]] = {
    "xid154-none": ("record", "GPU recovery action: None", f"{CATALOG}: XID 154 text 'None'"),
    "xid154-drain-p2p": ("drain", "GPU recovery action: Drain P2P", f"{CATALOG}: XID 154 text 'Drain P2P'"),
    "xid154-drain-and-reset": ("reboot", "GPU recovery action: Drain and Reset",
                               f"{CATALOG}: XID 154 text 'Drain and Reset'"),
    "xid154-gpu-reset": ("reboot", "GPU recovery action: GPU Reset Required",
                         f"{CATALOG}: XID 154 text 'GPU Reset Required'"),
    "xid154-node-reboot": ("reboot", "GPU recovery action: Node Reboot Required",
                           f"{CATALOG}: XID 154 text 'Node Reboot Required'"),
    "sxid-fatal": ("reboot", "NVSwitch fatal error",
                   f"{FM_GUIDE}: a fatal SXid needs the GPUs and NVSwitches of the baseboard reset"),
    "sxid-non-fatal": ("record", "NVSwitch non-fatal error", f"{FM_GUIDE}: non-fatal SXids need no action"),
    "amdgpu-reset": ("record", "amdgpu reset the GPU",
                     "drivers/gpu/drm/amd/amdgpu/amdgpu_device.c: the driver's own recovery from a hang; the jobs "
                     "on that GPU ended, the GPU is back"),
    "amdgpu-reset-failed": ("reboot", "amdgpu could not reset the GPU",
                            "drivers/gpu/drm/amd/amdgpu/amdgpu_device.c: the GPU stays unusable until a reboot"),
    "amdgpu-uncorrectable": ("reboot", "amdgpu uncorrectable hardware errors",
                             f"{KERNEL_RAS}: uncorrectable errors need a GPU reset (a reboot on the ladder)"),
    "amdgpu-fatal": ("reboot", "amdgpu unrecoverable hardware error",
                     f"{KERNEL_RAS}: RAS Reboot Behavior for Unrecoverable Errors"),
    "amdgpu-bad-pages": ("service", "amdgpu bad page records over the threshold",
                         "amdgpu_ras_eeprom.c: 'Replace this GPU or increase the threshold' (bad_page_threshold)"),
}
RECOVERY_ACTIONS = {"None": "xid154-none", "Drain P2P": "xid154-drain-p2p", "Drain and Reset": "xid154-drain-and-reset",
                    "GPU Reset Required": "xid154-gpu-reset", "Node Reboot Required": "xid154-node-reboot"}

MAX_BYTES = 16 << 20  # read per run; more new log than this and the oldest of it is skipped (said so)
MAX_LINE = 4096  # characters of one line matched; the rest is cut
MAX_EVENTS = 200  # events classified per run; more are counted, not listed
KEEP = 20  # events kept in state.json (the most recent), besides the open ones
KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
INIT_STAT = "/proc/1/stat"  # PID 1: its start tells a container's boots apart (boot_id)

_PCI = r"(?:PCI:)?(?P<dev>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
NV_XID = re.compile(rf"NVRM: Xid \({_PCI}\): (?P<code>\d{{1,5}}),")
XID154 = re.compile(r"GPU recovery action changed from [^()]{0,20}\([A-Za-z0-9 ]{1,40}\) to [^()]{0,20}"
                    r"\((?P<to>[A-Za-z0-9 ]{1,40})\)")
SXID = re.compile(rf"nvidia-nvswitch(?P<switch>\d{{1,3}}): SXid \({_PCI}\): (?P<code>\d{{1,6}}), "
                  r"(?P<severity>Non-fatal|Fatal)\b")
AMDGPU = re.compile(r"amdgpu (?P<dev>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): (?P<rest>.*)")
# amdgpu lines, in the order tried: (pattern, class). The count of uncorrectable errors must be above 0 and not
# spelled "no ... errors" (the all-clear line shares the words); "in total in" lines repeat a count already read.
AMD_LINES = (
    (re.compile(r"RAS records:\d{1,9} exceed threshold:\d{1,9}"), "amdgpu-bad-pages"),
    (re.compile(r"uncorrectable hardware error\s?\((?P<event>[A-Z0-9_]{1,40})\) detected"), "amdgpu-fatal"),
    (re.compile(r"(?<![\w-])(?P<count>\d{1,12}) (?:new )?uncorrectable hardware errors detected in "
                r"(?P<block>[A-Za-z0-9_]{1,20}) block"), "amdgpu-uncorrectable"),
    (re.compile(r"GPU reset\(\d{1,9}\) failed|ASIC reset failed|GPU Recovery Failed"), "amdgpu-reset-failed"),
    (re.compile(r"GPU reset begin!"), "amdgpu-reset"),
)
_KMSG_RECORD = re.compile(r"(?P<prio>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]{0,40};(?P<text>.*)")


def rank(action: str) -> int:
    return LADDER.index(action)


def device(raw: str) -> str:
    """'PCI:0000:3B:00' -> '0000:3b:00.0': the address nvidia-smi and lspci print (function 0 when none given)."""
    dev = raw.lower()
    return dev if "." in dev else f"{dev}.0"


def row(key: int | str, overrides: dict | None = None) -> tuple[str, str, str]:
    """(action, what, source) of an XID number or a class name, with the site's overrides (health.xid_actions:
    XID number -> action, for XIDS rows only) over the table."""
    if isinstance(key, int):
        action, what, source = XIDS.get(key, UNKNOWN_XID)
        site = (overrides or {}).get(str(key))
        if site in LADDER:
            return site, what, f"health.xid_actions (the table: {action})"
        return action, what, source
    return CLASSES[key]


def classify(line: str, overrides: dict | None = None) -> dict | None:
    """One kernel log line -> {kind, code, class, device, action, what}, or None when it is no GPU error line."""
    line = line[:MAX_LINE]
    if "NVRM: Xid" in line:
        m = NV_XID.search(line)
        if not m:
            return None
        code = int(m.group("code"))
        event = {"kind": "xid", "code": code, "device": device(m.group("dev"))}
        to = XID154.search(line) if code == 154 else None
        if to and to.group("to").strip() in RECOVERY_ACTIONS and str(code) not in (overrides or {}):
            cls = RECOVERY_ACTIONS[to.group("to").strip()]
            action, what, _source = row(cls)
            return {**event, "class": cls, "action": action, "what": what}
        action, what, _source = row(code, overrides)
        return {**event, "class": f"xid{code}", "action": action, "what": what}
    if "SXid" in line:
        m = SXID.search(line)
        if not m:
            return None
        cls = "sxid-fatal" if m.group("severity") == "Fatal" else "sxid-non-fatal"
        action, what, _source = row(cls)
        return {"kind": "sxid", "code": int(m.group("code")), "device": device(m.group("dev")), "class": cls,
                "action": action, "what": what}
    return _classify_amdgpu(line)


def _classify_amdgpu(line: str) -> dict | None:
    m = AMDGPU.search(line)
    if not m:
        return None
    for pattern, cls in AMD_LINES:
        hit = pattern.search(m.group("rest"))
        if not hit:
            continue
        if cls == "amdgpu-uncorrectable" and int(hit.group("count")) == 0:
            return None
        action, what, _source = row(cls)
        block = hit.groupdict().get("block") or hit.groupdict().get("event")
        return {"kind": "amdgpu", "code": 0, "device": device(m.group("dev")), "class": cls, "action": action,
                "what": f"{what} ({block})" if block else what}
    return None


def describe(event: dict) -> str:
    """'XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot' (the words are the table's)."""
    name = {"xid": f"XID {event['code']}", "sxid": f"SXid {event['code']}", "amdgpu": "amdgpu"}[event["kind"]]
    return f"{name} on {event['device']} ({event['what']}): {event['action']}"


# ---------------------------------------------------------------- reading the log since the last run


def boot_id(root: str = "/") -> str:
    """This boot: the kernel's boot id, and when PID 1 started (field 22 of /proc/1/stat, in clock ticks since the
    kernel's boot). On a machine both change together at a boot; in a container (a staged node) the kernel is the
    host's and only PID 1's start tells one boot of the container from the next. Where either is unreadable, the
    other alone."""
    try:
        with open(os.path.join(root, BOOT_ID.lstrip("/"))) as fh:
            kernel = fh.read(64).strip()
    except OSError:
        kernel = ""
    try:
        with open(os.path.join(root, INIT_STAT.lstrip("/"))) as fh:
            fields = fh.read(4096).rpartition(")")[2].split()
        started = fields[19] if len(fields) > 19 and fields[19].isdigit() else ""
    except OSError:
        started = ""
    return f"{kernel}.{started}" if kernel and started else kernel or started


def read_file(path: str, position: dict) -> tuple[list[str], dict, str]:
    """The whole lines added to `path` since `position` ({device, inode, offset}); (lines, new position, note)."""
    note = ""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        same = position.get("inode") == st.st_ino and position.get("device") == st.st_dev
        offset = position.get("offset", 0) if same and isinstance(position.get("offset"), int) else 0
        if offset > st.st_size or offset < 0:
            offset = 0  # truncated in place: read it again from the start
        if st.st_size - offset > MAX_BYTES:
            note = f"{st.st_size - offset - MAX_BYTES} bytes of the log skipped (more than {MAX_BYTES} new)"
            offset = st.st_size - MAX_BYTES
        fh.seek(offset)
        data = fh.read(MAX_BYTES)
    end = data.rfind(b"\n") + 1  # whole lines only: a line being written is read next time
    lines = data[:end].decode("utf-8", "replace").splitlines()
    return lines, {"device": st.st_dev, "inode": st.st_ino, "offset": offset + end}, note


def read_kmsg(path: str, position: dict, boot: str) -> tuple[list[str], dict, str]:
    """The records of /dev/kmsg after `position` ({boot, seq}) of this boot; (texts, new position, note)."""
    last = position.get("seq", -1) if position.get("boot") == boot and isinstance(position.get("seq"), int) else -1
    chunks, size, lost = [], 0, 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while size < MAX_BYTES:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:  # the end of the buffer
                break
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    raise
                lost += 1  # the buffer wrapped past records not yet read
                continue
            if not chunk:  # a regular file (tests): its end
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    texts, seq = [], last
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        m = _KMSG_RECORD.fullmatch(line)
        if not m:
            continue  # a record's continuation lines (" SUBSYSTEM=pci") and anything else
        number = int(m.group("seq"))
        if number > last:
            texts.append(m.group("text"))
            seq = max(seq, number)
    note = f"the kernel log buffer wrapped {lost} times before it was read" if lost else ""
    return texts, {"boot": boot, "seq": seq}, note


# ---------------------------------------------------------------- one scan: the gpu-xid check


def _read(kernel_log: str, position: dict, boot: str, root: str) -> tuple[list[str], dict, str]:
    if kernel_log in ("", "kmsg"):
        return read_kmsg(os.path.join(root, KMSG.lstrip("/")), position, boot)
    return read_file(kernel_log, position)


def _unique(events: list[dict]) -> list[dict]:
    """One event per (class, device), the first seen; the most severe first."""
    seen: dict[tuple, dict] = {}
    for e in events:
        seen.setdefault((e["class"], e["device"]), e)
    return sorted(seen.values(), key=lambda e: -rank(e["action"]))


def _said(events: list[dict], limit: int = 3) -> str:
    more = f" (+{len(events) - limit} more)" if len(events) > limit else ""
    return "; ".join(describe(e) for e in events[:limit]) + more


def scan(kernel_log: str, previous: dict, overrides: dict | None = None, root: str = "/") -> tuple[bool, str, dict]:
    """The kernel log since the last run (`previous`: the data the last scan returned) -> (ok, message, data).
    Fails for every event at drain or above read now, and for every reboot/service event of this boot read before
    (they stay open until the node boots again). `data` is what the next scan starts from: the position, the open
    events, the most recent events, and `ladder`, the highest action asked for (None when no GPU error was seen)."""
    previous = previous if isinstance(previous, dict) else {}
    boot = boot_id(root)
    still = [e for e in previous.get("open", []) if isinstance(e, dict) and e.get("action") in STICKY]
    still = still if previous.get("boot") == boot else []  # a new boot cleared every GPU's state
    position = previous.get("position") if isinstance(previous.get("position"), dict) else {}
    base = {"boot": boot, "position": position, "open": still, "recent": previous.get("recent", [])[-KEEP:]}
    try:
        lines, position, note = _read(kernel_log, position, boot, root)
    except OSError as exc:
        where = KMSG if kernel_log in ("", "kmsg") else kernel_log
        why = f"cannot read {where}: {exc.strerror or exc}"
        if still:
            return False, f"{_said(_unique(still))} ({why})", {**base, "ladder": _top(still)}
        # No /dev/kmsg (a container) is no GPU error; a file the config names and cannot be read is a fault.
        return (True, f"not checked: {why}", base) if where == KMSG else (False, why, base)
    events, skipped = [], 0
    for line in lines:
        event = classify(line, overrides)
        if event is None:
            continue
        if len(events) < MAX_EVENTS:
            events.append(event)
        else:
            skipped += 1
    opened = _unique(still + [e for e in events if e["action"] in STICKY])
    failing = _unique(opened + [e for e in events if rank(e["action"]) >= rank("drain")])
    counts = _counts(previous.get("counts"))  # every error read since the state file began, by class (a counter)
    for e in events:
        counts[e["class"]] = counts.get(e["class"], 0) + 1
    data = {**base, "position": position, "open": opened[:50], "recent": (base["recent"] + events)[-KEEP:],
            "ladder": _top(events + opened), "counts": counts}
    extra = "; ".join(x for x in (note, f"{skipped} more GPU error lines not listed" if skipped else "") if x)
    extra = f" ({extra})" if extra else ""
    if failing:
        return False, _said(failing) + extra, data
    if events:
        return True, f"{len(events)} recorded since the last run: {_said(_unique(events))}{extra}", data
    return True, f"no GPU error in the kernel log since the last run ({len(lines)} lines read){extra}", data


def _counts(value) -> dict[str, int]:
    """The counts a state file holds: {class: whole number}, anything else dropped; at most MAX_EVENTS classes."""
    if not isinstance(value, dict):
        return {}
    kept = {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
    return dict(sorted(kept.items())[:MAX_EVENTS])


def _top(events: list[dict]) -> str | None:
    return max((e["action"] for e in events), key=rank) if events else None
