#!/usr/bin/python3
"""gpucluster-slurm-metrics: what slurmctld knows, as Prometheus metrics, for node_exporter's textfile collector.

Runs on the controller, once per scrape interval (a systemd timer), and writes one file,
/var/lib/prometheus/node-exporter/gpucluster_slurm.prom, whole or not at all (a temporary file renamed over it):

- nodes by state, by state flag, and the nodes out of service by the class of their reason;
- jobs by state, and the pending jobs by Slurm's reason code;
- the main and backfill schedulers' cycle times and depths (sdiag);
- per topology unit of the plan (the leaf or scalable unit the planner cabled; docs/metrics.md): its free nodes,
  the units wholly free, and the largest block of consecutive free units, in nodes; the same per NVLink domain.

  gpucluster-slurm-metrics [--output FILE|-] [--plan FILE] [--timeout S]

One file, gpucluster.node.slurmmetrics in the repository, copied as it is: the standard library and the Prometheus
client library, which writes the exposition format (Debian's python3-prometheus-client on the controller).

Everything Slurm prints is data: a node's reason is free text anyone with scontrol rights writes, so it never
becomes a label as it is, only the class it falls in (`reason_class`); every label value is bounded (`label`)
and escaped by the client library. Commands run from argument lists, never a shell, each within `--timeout`
seconds. A command that fails leaves its metrics out of the file and says so (`gpucluster_slurm_up{source} 0`): no
old value is carried over, and `gpucluster_slurm_last_run_timestamp_seconds` tells a stale file from a fresh one.

The node table is read as JSON (`scontrol --json show node`; 22.05's scontrol has no --json: its `sinfo --json`),
so no reason can break a record; the job queue and sdiag as text whose fields are Slurm's own words, read token by
token against a pattern. The plan's units come from the rendered slurm-metrics.json: {cluster, units: [{unit,
group, pod, hosts}], nvlink_domains: [{nvlink_domain, group, hosts}]}, hosts as a Slurm hostlist.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

OUTPUT = "/var/lib/prometheus/node-exporter/gpucluster_slurm.prom"
PLAN = "/etc/gpucluster/slurm-metrics.json"
TIMEOUT = 10.0  # seconds per command
SOURCES = ("nodes", "jobs", "sdiag", "plan")
NODES_JSON = ("scontrol", "--json", "show", "node")  # 23.02 and later
NODES_JSON_2205 = ("sinfo", "--json")  # 22.05: one record per node, the same fields
# %T: the state word, %r: the reason (pending: Slurm's code, sometimes followed by its own detail).
JOBS = ("squeue", "--noheader", "--all", "--array", "--format=%T|%r")
SDIAG = ("sdiag",)
MAX_LABEL = 64  # characters of a label value, before escaping
MAX_HOSTS = 1_000_000  # names one plan hostlist may expand to

# The state words written on every run (0 when no node or job is in them), so a series never just vanishes.
NODE_STATES = ("idle", "mixed", "allocated", "drained", "draining", "down", "error", "future", "unknown")
NODE_FLAGS = ("drain", "reserved", "maintenance", "not_responding", "reboot_requested", "reboot_issued",
              "powered_down", "cloud", "fail", "completing", "planned")
JOB_STATES = ("pending", "running", "suspended", "completing", "configuring")
# An idle node with no flag but these is free: a powered-down node is powered up for the job that gets it.
FREE_FLAGS = frozenset(("CLOUD", "POWERED_DOWN", "DYNAMIC_NORM"))

# The reasons Slurm writes itself (slurmctld's node_mgr.c, ping_nodes.c, power_save.c, agent.c, proc_req.c,
# scontrol's reboot), by the start of the text: a small fixed set of classes.
SLURM_REASONS = (
    ("Not responding", "slurm:not-responding"),
    ("Kill task failed", "slurm:kill-task-failed"),
    ("Node unexpectedly rebooted", "slurm:unexpected-reboot"),
    ("reboot timed out", "slurm:reboot-timeout"),
    ("reboot requested", "slurm:reboot"),
    ("Reboot ASAP", "slurm:reboot"),
    ("ResumeTimeout reached", "slurm:power"),
    ("POWER_DOWN_ASAP", "slurm:power"),
    ("Prolog error", "slurm:prolog-epilog"),
    ("Epilog error", "slurm:prolog-epilog"),
    ("Prolog/Epilog failure", "slurm:prolog-epilog"),
    ("Job env setup error", "slurm:prolog-epilog"),
    ("batch job complete failure", "slurm:job-failure"),
    ("Duplicate jobid", "slurm:job-failure"),
    ("Low ", "slurm:registration"),  # Low RealMemory, Low CPUs, Low socket*core*thread count, Low TmpDisk
    ("CoreSpec differ", "slurm:registration"),
    ("Could not unpack gres data", "slurm:registration"),
    ("Reported active features", "slurm:registration"),
    ("RestrictedCoresPerGPU", "slurm:registration"),
    ("NO NETWORK ADDRESS FOUND", "slurm:no-address"),
)
_GRES_LOW = re.compile(r"gres/[\w:.-]+ count reported lower than configured")  # also a registration
REASON_CLASSES = ("operator", "other", "none", *dict.fromkeys(c for _p, c in SLURM_REASONS))
GPC = "gpc:"  # every reason gpucluster writes starts so (node/decide.py)
_CHECK = re.compile(r"[a-z0-9-]{1,40}")  # a gpucluster check or action as a reason names it
_WORD = re.compile(r"[a-z][a-z_]{0,31}")  # a Slurm state or flag word, lower-cased
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}(?=$|[\s,;:(])")  # a pending reason code at the start
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a node name as slurm.conf takes it
_JOB = re.compile(r"([A-Z][A-Z_]{0,31})\|(.*)")
_SDIAG = re.compile(r"\t([A-Za-z][A-Za-z ()]*?):\s+(\d+)\s*")
US = 1_000_000  # sdiag's microseconds in a second
# sdiag's lines (section, key) -> (metric, divisor): microseconds to seconds.
SDIAG_KEYS = {
    ("main", "Last cycle"): ("cycle_last_seconds", US), ("main", "Max cycle"): ("cycle_max_seconds", US),
    ("main", "Mean cycle"): ("cycle_mean_seconds", US), ("main", "Total cycles"): ("cycles", 1),
    ("main", "Mean depth cycle"): ("depth_mean", 1), ("main", "Last queue length"): ("queue_length", 1),
    ("backfill", "Last cycle"): ("cycle_last_seconds", US), ("backfill", "Max cycle"): ("cycle_max_seconds", US),
    ("backfill", "Mean cycle"): ("cycle_mean_seconds", US), ("backfill", "Total cycles"): ("cycles", 1),
    ("backfill", "Depth Mean"): ("depth_mean", 1), ("backfill", "Last depth cycle"): ("depth_last", 1),
    ("backfill", "Last queue length"): ("queue_length", 1),
}
SDIAG_HELP = {
    "cycle_last_seconds": "the scheduler's last cycle", "cycle_max_seconds": "the scheduler's longest cycle",
    "cycle_mean_seconds": "the scheduler's mean cycle", "cycles": "the scheduler's cycles since its statistics "
    "were reset (slurmctld start, midnight UTC, sdiag --reset)", "depth_mean": "jobs the scheduler looked at per "
    "cycle, mean", "depth_last": "jobs the scheduler looked at in its last cycle", "queue_length": "jobs in the "
    "scheduler's queue at its last cycle",
}


# ---- label values and the exposition format -----------------------------------------------------------------------

def label(value) -> str:
    """A label value: at most MAX_LABEL characters. The client library escapes it as the format says."""
    return str(value)[:MAX_LABEL]


def word(value) -> str:
    """A Slurm state word as a label value: lower-cased, or `other` when it is not a word."""
    text = str(value).lower()
    return text if _WORD.fullmatch(text) else "other"


def reason_class(reason: str) -> str:
    """The class of a node's reason: `gpc:<check>` for gpucluster's own (its check or action a plain name), one of
    Slurm's (SLURM_REASONS), `operator` for anything else a person wrote, `none` for no reason, `other` for a
    `gpc:` reason whose name is not one gpucluster writes."""
    reason = str(reason)
    if reason.startswith(GPC):
        name = re.split(r"[:\s]", reason[len(GPC):], maxsplit=1)[0]
        return f"{GPC}{name}" if _CHECK.fullmatch(name) else "other"
    for prefix, cls in SLURM_REASONS:
        if reason.startswith(prefix):
            return cls
    if _GRES_LOW.match(reason):
        return "slurm:registration"
    return "operator" if reason.strip() else "none"


def pending_reason(text: str) -> str:
    """A pending job's reason as a label value: Slurm's code at the start (`Resources`, `ReqNodeNotAvail`), or
    `other`."""
    m = _CODE.match(str(text).strip())
    return m.group(0) if m else "other"


def family(name: str, help_text: str, samples) -> list:
    """One gauge: a list of one family with a sample per (labels dict, value), labels with an empty value left out;
    an empty list without samples."""
    from prometheus_client.metrics_core import Metric

    samples = list(samples)
    if not samples:
        return []
    fam = Metric(name, help_text, "gauge")
    for labels, v in samples:
        fam.add_sample(name, {k: label(x) for k, x in labels.items() if x != ""}, float(v))
    return [fam]


class _Families:
    """Families as the collector generate_latest() reads."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def exposition(families: list) -> str:
    """The text format of the families, written by the Prometheus client library."""
    from prometheus_client.exposition import generate_latest

    return generate_latest(_Families(families)).decode()


def _counted(key: str, fixed, counts: dict[str, int]) -> list:
    """Samples of a count by label value: every fixed value (0 when absent), then the others in order."""
    return [({key: k}, counts.get(k, 0)) for k in dict.fromkeys([*fixed, *sorted(counts)])]


# ---- Slurm's output -------------------------------------------------------------------------------------------------

def parse_nodes(text: str) -> tuple[dict[str, tuple[str, frozenset, str]], int]:
    """`scontrol --json show node` or 22.05's `sinfo --json`: name -> (base state, flags, reason), upper-case
    words; and how many records did not read (no name, no state). A node listed twice keeps its first record.
    ValueError when the text is not such a document, or reports an error."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise ValueError("no 'nodes' list in the JSON document")
    if doc.get("errors"):
        raise ValueError(f"Slurm reported an error: {str(doc['errors'])[:200]}")
    nodes: dict[str, tuple[str, frozenset, str]] = {}
    skipped = 0
    for raw in doc["nodes"]:
        raw = raw if isinstance(raw, dict) else {}
        name, state, reason = raw.get("name"), raw.get("state"), raw.get("reason")
        words = [state, *(raw.get("state_flags") or [])] if isinstance(state, str) else state  # 22.05: word + flags
        if not isinstance(name, str) or not _NAME.fullmatch(name) or not isinstance(words, list) or not words \
                or not all(isinstance(w, str) for w in words):
            skipped += 1
            continue
        words = [w.upper() for w in words]
        nodes.setdefault(name, (words[0], frozenset(words[1:]), reason if isinstance(reason, str) else ""))
    return nodes, skipped


def node_state(base: str, flags: frozenset) -> str:
    """One state per node, as sinfo names them: drained (idle) or draining (busy) when the node drains, else its
    base state."""
    if "DRAIN" in flags and base in ("IDLE", "MIXED", "ALLOCATED"):
        return "drained" if base == "IDLE" else "draining"
    return word(base)


def out_of_service(base: str, flags: frozenset) -> bool:
    return base in ("DOWN", "ERROR") or bool(flags & {"DRAIN", "FAIL"})


def is_free(node) -> bool:
    """Idle, in no reservation, not draining, not rebooting: a job could start on it now."""
    return node is not None and node[0] == "IDLE" and node[1] <= FREE_FLAGS


def parse_jobs(text: str) -> tuple[dict[str, int], dict[str, int], int]:
    """squeue's `%T|%r` lines: jobs by state, pending jobs by reason code, and lines that did not read."""
    states: dict[str, int] = {}
    reasons: dict[str, int] = {}
    skipped = 0
    for line in text.splitlines():
        m = _JOB.fullmatch(line)
        if m is None:
            skipped += 1 if line.strip() else 0
            continue
        state = word(m.group(1))
        states[state] = states.get(state, 0) + 1
        if state == "pending":
            code = pending_reason(m.group(2))
            reasons[code] = reasons.get(code, 0) + 1
    return states, reasons, skipped


def parse_sdiag(text: str) -> dict[tuple[str, str], float]:
    """sdiag's main and backfill statistics: (metric, scheduler) -> value in base units (seconds)."""
    out: dict[tuple[str, str], float] = {}
    section = ""
    for line in text.splitlines():
        if not line.startswith("\t"):
            section = ("main" if line.startswith("Main schedule statistics") else
                       "backfill" if line.startswith("Backfilling stats") else "")
            continue
        m = _SDIAG.fullmatch(line)
        key = SDIAG_KEYS.get((section, m.group(1))) if m and section else None
        if key is not None:
            metric, divisor = key
            out[(metric, section)] = int(m.group(2)) / divisor if divisor != 1 else int(m.group(2))
    return out


# ---- the plan's units ---------------------------------------------------------------------------------------------

def _items(hostlist: str) -> list[str]:
    """A hostlist's comma-separated items, commas inside brackets kept."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist):
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in {hostlist[:80]!r}")
        if ch == "," and depth == 0:
            out.append(hostlist[start:i])
            start = i + 1
    out.append(hostlist[start:])
    return [item for item in out if item]


def expand(hostlist: str) -> list[str]:
    """Host names of a Slurm hostlist with at most one bracket a name (`gpu[0001-0032]`, `a[1,3-4]b`, `x1,x2`), as
    the renderer writes them. ValueError for anything else, or more than MAX_HOSTS names."""
    out: list[str] = []
    for item in _items(hostlist):
        m = re.fullmatch(r"([^\[\]]*)\[([0-9,-]+)\]([^\[\]]*)", item)
        if m is None:
            if "[" in item or "]" in item or not _NAME.fullmatch(item):
                raise ValueError(f"not a hostlist: {item[:80]!r}")
            out.append(item)
            continue
        head, ranges, tail = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo) or \
                    len(out) + int(hi or lo) - int(lo) >= MAX_HOSTS:
                raise ValueError(f"not a range, or too many hosts: {part[:40]!r} in {hostlist[:80]!r}")
            out += [f"{head}{i:0{len(lo)}d}{tail}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def read_plan(path: str) -> tuple[list[dict], list[dict]]:
    """The units and NVLink domains of the plan file, each with its `names` expanded. ValueError or OSError when
    the file does not read as one."""
    with open(path) as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    out = []
    for key, kind in (("units", "unit"), ("nvlink_domains", "nvlink_domain")):
        spans = doc.get(key, [])
        if not isinstance(spans, list):
            raise ValueError(f"'{key}' is not a list")
        for span in spans:
            if not isinstance(span, dict) or not all(isinstance(span.get(k, ""), str) for k in (kind, "group",
                                                                                                  "pod", "hosts")):
                raise ValueError(f"{key}: {str(span)[:80]} is not a {kind} of strings")
            span["names"] = expand(span.get("hosts", ""))
        out.append(spans)
    return out[0], out[1]


def largest_block(free: list[tuple[bool, int]]) -> int:
    """The most nodes in consecutive whole free spans: (wholly free, nodes) in plan order."""
    best = run = 0
    for whole, count in free:
        run = run + count if whole else 0
        best = max(best, run)
    return best


def span_families(units: list[dict], domains: list[dict], nodes: dict) -> list:
    """Free nodes per unit and per NVLink domain, whole free ones per node group, the largest free block of units."""
    out: list = []
    for spans, kind, what in ((units, "unit", "topology unit"), (domains, "nvlink_domain", "NVLink domain")):
        per_span, whole, order = [], {}, {}
        for s in spans:
            free = sum(1 for n in s["names"] if is_free(nodes.get(n)))
            labels = {"node_group": s.get("group", ""), "pod": s.get("pod", ""), kind: s.get(kind, "")}
            per_span.append((labels, free))
            full = bool(s["names"]) and free == len(s["names"])
            whole[s.get("group", "")] = whole.get(s.get("group", ""), 0) + full
            order.setdefault(s.get("group", ""), []).append((full, len(s["names"])))
        out += family(f"gpucluster_slurm_{kind}_free_nodes", f"free nodes of the {what}", per_span)
        out += family(f"gpucluster_slurm_{kind}s_free", f"{what}s of the node group with every node free",
                      [({"node_group": g}, n) for g, n in whole.items()])
        if kind == "unit":
            out += family("gpucluster_slurm_units_free_block_nodes", "nodes of the largest run of consecutive "
                          "wholly free topology units in plan order", [({"node_group": g}, largest_block(free))
                                                                       for g, free in order.items()])
    return out


# ---- one run ------------------------------------------------------------------------------------------------------

def run_command(argv, timeout: float) -> tuple[str | None, str]:
    """(stdout, "") of a command that succeeded, else (None, why)."""
    env = {**os.environ, "LC_ALL": "C"}
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]}: no answer within {timeout:g} s"
    except OSError as exc:
        return None, f"{argv[0]}: {exc.strerror or exc}"
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        return None, f"{' '.join(argv)}: exit {res.returncode}: {(lines or [''])[0][:200]}"
    return res.stdout, ""


def read_node_table(run, timeout: float) -> tuple[str | None, str]:
    """The node table as JSON: scontrol's, or sinfo's where scontrol has no --json (22.05)."""
    text, why = run(NODES_JSON, timeout)
    if text is None and "unrecognized option" in why:
        return run(NODES_JSON_2205, timeout)
    return text, why


def _source(run, timeout: float, which: str) -> tuple[object, str, float]:
    """(parsed output or None, why not, seconds) of one source."""
    t0 = time.monotonic()
    text, why = read_node_table(run, timeout) if which == "nodes" else run(JOBS if which == "jobs" else SDIAG,
                                                                           timeout)
    parsed = None
    if text is not None:
        try:
            parsed = {"nodes": parse_nodes, "jobs": parse_jobs, "sdiag": parse_sdiag}[which](text)
        except ValueError as exc:  # json's errors are ValueErrors too
            why = f"{which}: output does not read: {str(exc)[:200]}"
    return parsed, why, time.monotonic() - t0


def node_families(nodes: dict) -> list:
    """Nodes by state, by flag, and out of service by reason class."""
    states: dict[str, int] = {}
    flags: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for base, fl, reason in nodes.values():
        state = node_state(base, fl)
        states[state] = states.get(state, 0) + 1
        for f in fl:
            flags[word(f)] = flags.get(word(f), 0) + 1
        if out_of_service(base, fl):
            cls = reason_class(reason)
            reasons[cls] = reasons.get(cls, 0) + 1
    return (family("gpucluster_slurm_nodes", "nodes by state (drained: idle and draining; draining: busy and "
                   "draining)", _counted("state", NODE_STATES, states))
            + family("gpucluster_slurm_nodes_with_flag", "nodes with the state flag",
                     _counted("flag", NODE_FLAGS, flags))
            + family("gpucluster_slurm_nodes_out_of_service", "nodes drained, down or failed, by the class of "
                     "their reason", _counted("reason_class", REASON_CLASSES, reasons)))


def collect(run, plan_path: str, timeout: float, now: float) -> tuple[str, list[str]]:
    """The metrics file of one run, and why each source that failed failed. `run(argv, timeout)` runs a command."""
    parsed, whys, seconds = {}, [], {}
    for which in ("nodes", "jobs", "sdiag"):
        parsed[which], why, seconds[which] = _source(run, timeout, which)
        whys += [why] if why else []
    units = domains = None
    t0 = time.monotonic()
    try:
        units, domains = read_plan(plan_path)
    except (OSError, ValueError) as exc:
        whys.append(f"{plan_path}: {getattr(exc, 'strerror', None) or exc}")
    seconds["plan"] = time.monotonic() - t0
    up = {"nodes": parsed["nodes"] is not None, "jobs": parsed["jobs"] is not None,
          "sdiag": parsed["sdiag"] is not None, "plan": units is not None}
    skipped = {"nodes": parsed["nodes"][1] if up["nodes"] else 0, "jobs": parsed["jobs"][2] if up["jobs"] else 0}
    out = family("gpucluster_slurm_up", "1 when the source read on the last run", [({"source": s}, up[s])
                                                                                      for s in SOURCES])
    out += family("gpucluster_slurm_last_run_timestamp_seconds", "when the last run started", [({}, now)])
    out += family("gpucluster_slurm_source_duration_seconds", "seconds the source took on the last run",
                  [({"source": s}, round(seconds[s], 6)) for s in SOURCES])
    out += family("gpucluster_slurm_records_skipped", "records of the source's output that did not read",
                  [({"source": s}, n) for s, n in skipped.items() if up[s]])
    if up["nodes"]:
        out += node_families(parsed["nodes"][0])
        if up["plan"]:
            out += span_families(units, domains, parsed["nodes"][0])
    if up["jobs"]:
        states, reasons, _skipped = parsed["jobs"]
        out += family("gpucluster_slurm_jobs", "jobs by state", _counted("state", JOB_STATES, states))
        out += family("gpucluster_slurm_jobs_pending", "pending jobs by Slurm's reason code",
                      _counted("reason", (), reasons))
    if up["sdiag"]:
        for metric in SDIAG_HELP:  # every metric's schedulers together, in one order
            out += family(f"gpucluster_slurm_sched_{metric}", SDIAG_HELP[metric],
                          [({"scheduler": s}, v) for (m, s), v in parsed["sdiag"].items() if m == metric])
    return exposition(out), whys


def write_atomic(path: str, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it (no .prom suffix, so the collector never reads
    it half written), then renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpucluster-slurm-metrics", description=__doc__.splitlines()[0])
    p.add_argument("--output", default=OUTPUT, help=f"the file to write, '-' for stdout (default {OUTPUT})")
    p.add_argument("--plan", default=PLAN, help=f"the rendered slurm-metrics.json (default {PLAN})")
    p.add_argument("--timeout", type=float, default=TIMEOUT, help=f"seconds per command (default {TIMEOUT:g})")
    args = p.parse_args(argv)
    try:
        text, whys = collect(run_command, args.plan, args.timeout, round(time.time(), 3))
    except ImportError:
        print("gpucluster-slurm-metrics: prometheus_client is not installed (Debian: python3-prometheus-client)",
              file=sys.stderr)
        return 1
    for why in whys:
        print(f"gpucluster-slurm-metrics: {why}", file=sys.stderr)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    try:
        write_atomic(args.output, text)
    except OSError as exc:
        print(f"gpucluster-slurm-metrics: {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
