"""The rollout's state file: JSON, rewritten whole and atomically (a temporary file, fsync, rename) after
every step, so Ctrl-C, a lost SSH session or SIGKILL leave either the last state or the one before, never
half of one. It lives in the cluster's private state folder (paths.private_dir): <state>/rollout.json.

Reading it trusts nothing but its owner: the file decides which nodes are drained, rebooted and resumed,
and its node names reach scontrol (over SSH on an inventory). So `load`, which --status and --resume both
go through, takes it only from a private folder (this user's, no one else can write it, nor any folder
above it: paths.unsafe_ancestor), opens it without following a link (O_NOFOLLOW; a FIFO or a device is
refused without blocking), only a regular file of this user's that no one else can write, at most
MAX_BYTES, and then checks every field (`problems`): types, allowed values, node names that are host
names, waves and nodes that agree. Anything else is a UsageError (exit 2) naming the file, the field, the
rule and the fix; the engine never meets a state it did not write."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path

from gpucluster.errors import UsageError, shown
from gpucluster.inventory.values import HOSTNAME_RE
from gpucluster.paths import check_private_dir, private_dir, read_regular, unsafe_ancestor

VERSION = 1
NAME = "rollout.json"
# A 24,000-node rollout's state is about 5 MB (each node: its outcome, wave and a detail of at most
# DETAIL_CHARS); 64 MiB leaves room for ten times that, and bounds what a bad file can make us read.
MAX_BYTES = 64 << 20
DETAIL_CHARS = 1000  # the engine cuts a node's detail (a Slurm reason, a check's message) to this

CHANGES = ("reboot", "drain", "reconfigure")
CONTROLLER_ORDER = ("slurmdbd", "slurmctld")  # Slurm's upgrade order; then slurmd, wave by wave
OUTCOMES = ("pending", "draining", "waiting", "applied", "rebooting", "done", "failed", "by-hand")
WAVE_STATUS = ("pending", "running", "done")
BY = ("leaf", "su", "block", "node")
# An id goes into a Slurm reason ("gpc:rollout ID") and a reservation's name ("gpc-ID-wN"); a unit is a
# leaf, scalable unit, pod or host name: one word of plain characters each, never an option or a template.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
FIX = ("the file is written by `gpucluster rollout` alone; move it aside (mv {path} {path}.refused) to start "
       "anew, and check who else could write to that folder")


def state_path(folder: str | os.PathLike) -> Path:
    """Where a new rollout writes its state: the folder is created (0700) or checked (paths.private_dir)."""
    return private_dir(folder, what="rollout state folder") / NAME


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


def check_folder(folder: str | os.PathLike) -> None:
    """The rule of paths.private_dir (paths.check_private_dir), applied to a folder that must already be there,
    without creating or changing anything (--status and --resume only read): a plain folder, not a link, this
    user's, that no one else can write, below folders no one else can swap."""
    p = Path(folder)
    why = unsafe_ancestor(p)
    if why:
        raise UsageError(f"{p}: the rollout state folder is not private: {why}; give --state-dir a path under "
                         "your home, or fix the folder's owner and mode")
    try:
        info = os.lstat(p)
    except FileNotFoundError:
        raise UsageError(f"{p / NAME}: no rollout state here; start one with `gpucluster rollout TARGET`") from None
    except OSError as exc:
        raise UsageError(f"{p}: cannot read the rollout state folder ({exc.strerror or exc})") from None
    check_private_dir(p, info, "rollout state folder",
                      plain_fix=": whoever can change it decides which state is read; give --state-dir the real "
                                "folder",
                      owner_fix="; another user could choose what the rollout drains and resumes: use your own "
                                "state folder")


def _read(path: Path) -> bytes:
    """The file's bytes: opened without following a link and without blocking, checked on the open file
    (what is checked is what is read: paths.read_regular), read to at most MAX_BYTES, this user's and closed
    to other writers."""
    try:
        raw, info = read_regular(path, MAX_BYTES, follow_links=False)
    except FileNotFoundError:
        raise UsageError(f"{path}: no rollout state here; start one with `gpucluster rollout TARGET`") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{path}: the rollout state file is a link (to {os.path.realpath(path)}), and is "
                             f"never followed; {FIX.format(path=path)}") from None
        if exc.errno == errno.EINVAL:
            raise UsageError(f"{path}: the rollout state file is not a regular file (a FIFO, a device, a socket "
                             f"or a folder); {FIX.format(path=path)}") from None
        if exc.errno == errno.EFBIG:
            raise UsageError(f"{path}: the rollout state file is larger than {MAX_BYTES} bytes, more than any "
                             f"rollout writes; {FIX.format(path=path)}") from None
        raise UsageError(f"{path}: cannot read the rollout state file ({exc.strerror or exc}); "
                         f"{FIX.format(path=path)}") from None
    if info.st_uid != os.geteuid():
        raise UsageError(f"{path}: the rollout state file belongs to uid {info.st_uid}, not to you (uid "
                         f"{os.geteuid()}); only a state this user wrote is acted on: {FIX.format(path=path)}")
    if info.st_mode & 0o022:
        raise UsageError(f"{path}: the rollout state file can be written by other users (mode "
                         f"{stat.S_IMODE(info.st_mode):04o}); {FIX.format(path=path)}")
    return raw


def load(path: str | os.PathLike) -> dict:
    """The state at `path`, checked as the module says; a UsageError otherwise."""
    path = Path(os.path.abspath(path))
    check_folder(path.parent)
    raw = _read(path)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: [[[[... nested past Python's stack
        why = str(exc) if isinstance(exc, ValueError) else "nested too deep"
        raise UsageError(f"{path}: not a rollout state file (not JSON: {shown(why, 120)}); "
                         f"{FIX.format(path=path)}") from None
    if isinstance(data, dict) and "version" in data and data["version"] != VERSION \
            and isinstance(data["version"], int) and not isinstance(data["version"], bool):
        raise UsageError(f"{path}: version: state version {data['version']}, this gpucluster reads {VERSION}; "
                         "finish that rollout with the gpucluster that wrote it, or move the file aside")
    found = problems(data)
    if found:
        listed = "\n".join(f"  {path}: {field}: {rule}" for field, rule in found[:12])
        more = f"\n  and {len(found) - 12} more" if len(found) > 12 else ""
        raise UsageError(f"{path}: not a rollout state file gpucluster wrote:\n{listed}{more}\n"
                         f"{FIX.format(path=path)[0].upper()}{FIX.format(path=path)[1:]}")
    return data


# ------------------------------------------------------------------------------------------------ schema
def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _json(v: object) -> str:
    """A value of the file's as JSON writes it ("1" a string, 1 a number), escaped and cut (errors.shown)."""
    return shown(json.dumps(v), 60)


def host_name(v: object) -> bool:
    """A Slurm node name as a host name: letters, digits, '-' and '.', starting and ending with a letter or
    digit (inventory.values.HOSTNAME_RE), so it never reads as an option (`-o...`) or a template (`{{`)."""
    return isinstance(v, str) and bool(HOSTNAME_RE.match(v)) and ".." not in v


def problems(data: object) -> list[tuple[str, str]]:
    """Every (field, rule broken) of a state, in reading order; [] when the engine may act on it."""
    if not isinstance(data, dict):
        return [("(top)", f"a JSON object is expected, not {type(data).__name__}")]
    out = _field_problems(data)
    waves, nodes = data.get("waves"), data.get("nodes")
    if not isinstance(waves, list) or not isinstance(nodes, dict):
        return out
    in_wave = _wave_problems(waves, out)
    _node_problems(nodes, in_wave, out)
    return out


def _field_problems(data: dict) -> list[tuple[str, str]]:
    """The top-level fields: each known, of its type and in its range."""
    out: list[tuple[str, str]] = []

    def need(key: str, ok: bool, rule: str) -> None:
        if not ok:
            out.append((key, f"{rule}, not {_json(data[key]) if key in data else 'missing'}"))

    keys = ("version", "id", "cluster", "source", "change", "by", "max_unavailable", "halt_share", "controller",
            "waves", "nodes", "started", "updated", "finished", "halted")
    for key in sorted(set(data) - set(keys), key=str):
        out.append((shown(key, 40), "not a field of a rollout state"))
    need("version", data.get("version") == VERSION and _int(data.get("version")), f"the number {VERSION}")
    for key in ("id", "cluster"):
        need(key, isinstance(data.get(key), str) and bool(NAME_RE.match(data[key])),
             "a name of letters, digits, '.', '_' and '-' (at most 128)")
    need("source", isinstance(data.get("source"), str) and len(data["source"]) <= 4096
         and data["source"].isprintable(), "a path (printable, at most 4096 characters)")
    need("change", data.get("change") in CHANGES, f"one of {', '.join(CHANGES)}")
    need("by", data.get("by") in BY, f"one of {', '.join(BY)}")
    need("max_unavailable", _int(data.get("max_unavailable")) and data["max_unavailable"] >= 1,
         "a whole number of nodes, at least 1")
    need("halt_share", _number(data.get("halt_share")) and 0 <= data["halt_share"] <= 1, "a share from 0 to 1")
    for key in ("started", "updated"):
        need(key, _number(data.get(key)) and data[key] >= 0, "a time (seconds since 1970)")
    need("finished", isinstance(data.get("finished"), bool), "true or false")
    need("halted", data.get("halted", 0) is None or (isinstance(data.get("halted"), str)
                                                    and len(data["halted"]) <= 2 * DETAIL_CHARS), "null or a message")
    ctl = data.get("controller")
    need("controller", isinstance(ctl, dict) and sorted(ctl) == sorted(CONTROLLER_ORDER)
         and all(v in ("pending", "done") for v in ctl.values()),
         f"{{{', '.join(CONTROLLER_ORDER)}}} each pending or done")
    need("waves", isinstance(data.get("waves"), list), "a list of waves")
    need("nodes", isinstance(data.get("nodes"), dict), "an object of node outcomes")
    return out


def _wave_problems(waves: list, out: list[tuple[str, str]]) -> dict[str, int]:
    """The waves' problems added to `out`; returns node -> the wave that lists it."""
    in_wave: dict[str, int] = {}
    for i, w in enumerate(waves):
        at = f"waves[{i}]"
        if not isinstance(w, dict) or sorted(w) != ["index", "nodes", "status", "units"]:
            out.append((at, "an object of index, units, nodes and status"))
            continue
        if not _int(w["index"]) or w["index"] != i + 1:
            out.append((f"{at}.index", f"{i + 1} (waves are numbered in order from 1), not {_json(w['index'])}"))
        if w["status"] not in WAVE_STATUS:
            out.append((f"{at}.status", f"one of {', '.join(WAVE_STATUS)}, not {_json(w['status'])}"))
        for key, ok, rule in (("units", lambda u: isinstance(u, str) and bool(NAME_RE.match(u)),
                               "a unit name (letters, digits, '.', '_', '-')"),
                              ("nodes", host_name, "a host name (letters, digits, '-' and '.' inside)")):
            items = w[key]
            if not isinstance(items, list) or not items:
                out.append((f"{at}.{key}", f"a list that is not empty, not {_json(items)}"))
                continue
            for j, item in enumerate(items):
                if not ok(item):
                    out.append((f"{at}.{key}[{j}]", f"{shown(item)} is not {rule}"))
                elif key == "nodes":
                    if item in in_wave:
                        out.append((f"{at}.nodes[{j}]", f"{item} is in wave {in_wave[item]} already: a node is in "
                                                        "one wave"))
                    in_wave[item] = i + 1
    return in_wave


def _node_problems(nodes: dict, in_wave: dict[str, int], out: list[tuple[str, str]]) -> None:
    """The node outcomes' problems added to `out`: each a host name, of its shape, in the wave that lists it."""
    for name, rec in nodes.items():
        at = f"nodes.{shown(name, 80)}"
        if not host_name(name):
            out.append((at, f"{shown(name)} is not a host name (letters, digits, '-' and '.' inside)"))
            continue
        if not isinstance(rec, dict) or sorted(rec) != ["detail", "outcome", "wave"]:
            out.append((at, "an object of outcome, wave and detail"))
            continue
        if rec["outcome"] not in OUTCOMES:
            out.append((f"{at}.outcome", f"one of {', '.join(OUTCOMES)}, not {_json(rec['outcome'])}"))
        if not isinstance(rec["detail"], str) or len(rec["detail"]) > 2 * DETAIL_CHARS:
            out.append((f"{at}.detail", f"a message of at most {2 * DETAIL_CHARS} characters"))
        want = in_wave.get(name, 0)
        if not _int(rec["wave"]) or rec["wave"] != want:
            out.append((f"{at}.wave", f"{want} (the wave that lists it; 0: left out at the start), not "
                                      f"{_json(rec['wave'])}"))
        elif want == 0 and rec["outcome"] != "by-hand":
            out.append((f"{at}.outcome", "by-hand: a node in no wave was left out at the start"))
    for name in in_wave:
        if name not in nodes:
            out.append((f"nodes.{name}", "missing: every node of a wave has an outcome"))
