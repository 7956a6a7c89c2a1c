"""The health run's verdict as Prometheus metrics, for node_exporter's textfile collector.

After each run the runner writes `gpucluster_health.prom` into the collector's folder (the config's
`textfile_dir`; Debian's prometheus-node-exporter reads /var/lib/prometheus/node-exporter), whole or not at all
(a temporary file renamed over it). node_exporter adds the node's own labels (instance); the topology labels
(group, unit, rack) come from the scrape targets (docs/metrics.md). The names and labels here are a contract
the rendered rules and alerts read:

    gpucluster_health_check_ok{check}               1 passed, 0 failed, on the last run
    gpucluster_health_check_fails{check}            failing runs in a row (0 when it passed)
    gpucluster_health_last_run_timestamp_seconds    when the last run started
    gpucluster_health_lifecycle{state}              1 for the node's lifecycle state, 0 for the others
    gpucluster_health_breaker_held                  1 when the last run's drain was held by the circuit breaker
    gpucluster_health_gpu_errors_open{class}        GPU errors open until a reboot or a repair, by class
    gpucluster_health_xid_events_total{class}       GPU errors read from the kernel log, by class (a counter kept
                                                    in the state file: it starts over only with that file)

A label value is data (a site check's name): escaped as the exposition format says. Standard library only.
"""

from __future__ import annotations

import os

try:
    from . import nodestate
except ImportError:  # run as a script on a node: the files sit side by side
    import nodestate

FILE = "gpucluster_health.prom"


def label(value) -> str:
    """A label value in the text exposition format: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, text: str, samples: list[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
    return lines + [f"{name}{labels} {value:g}" for labels, value in samples]


def render(summary: dict) -> str:
    """The metrics of one run's summary (the state file runner.run() writes)."""
    checks = {n: c for n, c in summary.get("checks", {}).items() if isinstance(c, dict)}
    names = sorted(checks)
    life = nodestate.load(summary.get("lifecycle"))["state"]
    data = checks.get("gpu-xid", {}).get("data")
    opened: dict[str, int] = {}
    for e in data.get("open", []) if isinstance(data, dict) else []:
        if isinstance(e, dict):
            opened[str(e.get("class"))] = opened.get(str(e.get("class")), 0) + 1
    out = _family("gpucluster_health_check_ok", "gauge", "1 when the check passed on the last health run",
                  [(f'{{check="{label(n)}"}}', 1 if checks[n].get("ok") else 0) for n in names])
    out += _family("gpucluster_health_check_fails", "gauge", "failing health runs in a row of the check",
                   [(f'{{check="{label(n)}"}}', int(checks[n].get("fails", 0) or 0)) for n in names])
    out += _family("gpucluster_health_last_run_timestamp_seconds", "gauge", "when the last health run started",
                   [("", float(summary.get("started", 0) or 0))])
    out += _family("gpucluster_health_lifecycle", "gauge", "1 for the node's lifecycle state",
                   [(f'{{state="{s}"}}', 1 if s == life else 0) for s in nodestate.STATES])
    out += _family("gpucluster_health_breaker_held", "gauge", "1 when the circuit breaker held the last run's drain",
                   [("", 1 if summary.get("action") == "held" else 0)])
    out += _family("gpucluster_health_gpu_errors_open", "gauge", "GPU errors open until a reboot or repair",
                   [(f'{{class="{label(c)}"}}', n) for c, n in sorted(opened.items())])
    counts = data.get("counts") if isinstance(data, dict) and isinstance(data.get("counts"), dict) else {}
    out += _family("gpucluster_health_xid_events_total", "counter", "GPU errors read from the kernel log",
                   [(f'{{class="{label(c)}"}}', int(n)) for c, n in sorted(counts.items())
                    if isinstance(n, int) and not isinstance(n, bool)])
    return "\n".join(out) + "\n"


def write(folder: str, summary: dict) -> str | None:
    """Write the metrics file into `folder` (None: not configured, nothing written); None or why it failed. A
    missing folder is not made: no node_exporter there, nothing to feed."""
    if not folder or not os.path.isdir(folder):
        return None
    path = os.path.join(folder, FILE)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(render(summary))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None
