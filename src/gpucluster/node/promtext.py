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

A label value is data (a site check's name), written by the Prometheus client library (`prometheus_client`; on
nodes Debian's python3-prometheus-client), which escapes it as the exposition format says.
"""

from __future__ import annotations

import os

try:
    from . import nodestate
except ImportError:  # run as a script on a node: the files sit side by side
    import nodestate

FILE = "gpucluster_health.prom"
MISSING = "prometheus_client is not installed (Debian: python3-prometheus-client)"


class _Families:
    """The families of one run, as the collector generate_latest() reads."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def _family(kind, name: str, text: str, key: str | None, samples) -> object:
    fam = kind(name, text, labels=[key] if key else [])
    for value, amount in samples:
        fam.add_metric([str(value)] if key else [], amount)
    return fam


def render(summary: dict) -> str:
    """The metrics of one run's summary (the state file runner.run() writes). ImportError without prometheus_client:
    it is imported here, so that a node without it still runs its checks and drains."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import generate_latest

    checks = {n: c for n, c in summary.get("checks", {}).items() if isinstance(c, dict)}
    names = sorted(checks)
    life = nodestate.load(summary.get("lifecycle"))["state"]
    data = checks.get("gpu-xid", {}).get("data")
    opened: dict[str, int] = {}
    for e in data.get("open", []) if isinstance(data, dict) else []:
        if isinstance(e, dict):
            opened[str(e.get("class"))] = opened.get(str(e.get("class")), 0) + 1
    counts = data.get("counts") if isinstance(data, dict) and isinstance(data.get("counts"), dict) else {}
    gauge = GaugeMetricFamily
    families = [
        _family(gauge, "gpucluster_health_check_ok", "1 when the check passed on the last health run", "check",
                [(n, 1 if checks[n].get("ok") else 0) for n in names]),
        _family(gauge, "gpucluster_health_check_fails", "failing health runs in a row of the check", "check",
                [(n, int(checks[n].get("fails", 0) or 0)) for n in names]),
        _family(gauge, "gpucluster_health_last_run_timestamp_seconds", "when the last health run started", None,
                [(None, float(summary.get("started", 0) or 0))]),
        _family(gauge, "gpucluster_health_lifecycle", "1 for the node's lifecycle state", "state",
                [(s, 1 if s == life else 0) for s in nodestate.STATES]),
        _family(gauge, "gpucluster_health_breaker_held", "1 when the circuit breaker held the last run's drain", None,
                [(None, 1 if summary.get("action") == "held" else 0)]),
        _family(gauge, "gpucluster_health_gpu_errors_open", "GPU errors open until a reboot or repair", "class",
                sorted(opened.items())),
        _family(CounterMetricFamily, "gpucluster_health_xid_events", "GPU errors read from the kernel log", "class",
                [(c, int(n)) for c, n in sorted(counts.items()) if isinstance(n, int) and not isinstance(n, bool)]),
    ]
    return generate_latest(_Families(families)).decode()


def write(folder: str, summary: dict) -> str | None:
    """Write the metrics file into `folder` (None: not configured, nothing written); None or why it failed. A
    missing folder is not made: no node_exporter there, nothing to feed."""
    if not folder or not os.path.isdir(folder):
        return None
    path = os.path.join(folder, FILE)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        text = render(summary)
    except ImportError:
        return f"{path}: not written: {MISSING}"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None
