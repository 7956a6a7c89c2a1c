"""Bad metrics settings are refused by `gpucluster check`: exit 2, one error per field naming the file, the line, the
field, the rule and a fix, no traceback, nothing written. A scrape interval of 5 s to 2 minutes (a longer one leaves
gaps in Prometheus's 5-minute lookback), a unit share above 0 and at most 100 %, at least 1 node and 1 minute; the
same share bounds for Slurm's nodes out of service, a flap of at least 2 exits in 10 minutes to a day, a backfill
cycle above 0 and at most Slurm's own bf_max_time limit (3600 s). The metrics ports from 1024 to 65535, each on a port
no other metrics port and nothing else of the cluster listens on (spec/ports.py: the Slurm daemons, slurmdbd's
database, the pull server, NFS, MooseFS, the bandwidth check, DCGM's host engine), Grafana's only where Grafana is
asked for; the site's own Prometheus as an http(s) URL of a host, an optional port and path, no credentials, query
or fragment; Grafana only with metrics on (metrics.enabled: false with metrics.grafana: true is refused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import example_text, line_of

CASES = {
    "a scrape interval of 2 s": ("  scrape_interval: 2\n", "metrics.scrape_interval", "[greater_than_equal]",
                                 "5 or more"),
    "a scrape interval of 5 minutes": ("  scrape_interval: 300\n", "metrics.scrape_interval", "[less_than_equal]",
                                       "120 or less"),
    "a unit share of 0": ("  unit_degraded_pct: 0\n", "metrics.unit_degraded_pct", "[greater_than]",
                          "more than 0"),
    "a unit share over 100": ("  unit_degraded_pct: 101\n", "metrics.unit_degraded_pct", "[less_than_equal]",
                                "100.0 or less"),
    "a unit of 0 nodes": ("  unit_degraded_min_nodes: 0\n", "metrics.unit_degraded_min_nodes",
                          "[greater_than_equal]", "1 or more"),
    "no minute down": ("  down_minutes: 0\n", "metrics.down_minutes", "[greater_than_equal]", "1 or more"),
    "a share as a percent sign": ("  unit_degraded_pct: 25%\n", "metrics.unit_degraded_pct", "[float_parsing]",
                                  "write a number, without quotes or units"),
    "no Slurm share": ("  slurm_out_of_service_pct: 0\n", "metrics.slurm_out_of_service_pct", "[greater_than]",
                       "more than 0"),
    "a Slurm share over 100": ("  slurm_out_of_service_pct: 150\n", "metrics.slurm_out_of_service_pct",
                               "[less_than_equal]", "100.0 or less"),
    "a flap of one exit": ("  flap_count: 1\n", "metrics.flap_count", "[greater_than_equal]", "2 or more"),
    "a flap window of 5 minutes": ("  flap_minutes: 5\n", "metrics.flap_minutes", "[greater_than_equal]",
                                   "10 or more"),
    "a flap window over a day": ("  flap_minutes: 2000\n", "metrics.flap_minutes", "[less_than_equal]",
                                 "1,440 or less"),
    "no backfill time": ("  backfill_cycle_seconds: 0\n", "metrics.backfill_cycle_seconds", "[greater_than]",
                         "more than 0"),
    "a backfill cycle over an hour": ("  backfill_cycle_seconds: 7200\n", "metrics.backfill_cycle_seconds",
                                      "[less_than_equal]", "3600.0 or less"),
    "a misspelt key": ("  scrape_intervall: 30\n", "metrics.scrape_intervall", "[unknown-key]",
                       "did you mean 'scrape_interval'?"),
    "a privileged port": ("  node_exporter_port: 80\n", "metrics.node_exporter_port", "[greater_than_equal]",
                          "1,024 or more"),
    "a port past 65535": ("  prometheus_port: 70000\n", "metrics.prometheus_port", "[less_than_equal]",
                          "65,535 or less"),
    "a port as text": ("  dcgm_exporter_port: ':9400'\n", "metrics.dcgm_exporter_port", "[int_parsing]",
                       "write a whole number"),
    "a URL of another scheme": ("  external_url: ftp://prom.example.org\n", "metrics.external_url", "[value_error]",
                                "is not an http or https URL"),
    "a URL without a scheme": ("  external_url: prom.example.org:9090\n", "metrics.external_url",
                               "[value_error]", "is not an http or https URL"),
    "a URL with a password": ("  external_url: http://admin:secret@prom:9090\n", "metrics.external_url",
                              "[value_error]", "holds a user or password"),
    "a URL with a bad port": ("  external_url: http://prom:99999\n", "metrics.external_url", "[value_error]",
                              "has no valid port"),
    "a URL with port 0": ("  external_url: http://prom:0\n", "metrics.external_url", "[value_error]",
                          "has no valid port"),
    "a URL without a host": ("  external_url: 'http://:9090'\n", "metrics.external_url", "[value_error]",
                             "names no valid host"),
    "a URL with a bad host": ("  external_url: http://prom_1:9090\n", "metrics.external_url", "[value_error]",
                              "names no valid host"),
    "a URL with a query": ("  external_url: 'http://prom:9090/?x=1'\n", "metrics.external_url", "[value_error]",
                           "has a query or fragment"),
    "a URL with a space": ("  external_url: 'http://prom :9090'\n", "metrics.external_url", "[value_error]",
                           "not a URL"),
    "a URL with Jinja in its path": ("  external_url: 'http://prom:9090/{{7*191}}'\n", "metrics.external_url",
                                     "[value_error]", "a path character a URL does not hold"),
    "Grafana as text": ("  grafana: 'yes'\n", "metrics.grafana", "[bool_type]", "write true or false"),
    "a privileged Grafana port": ("  grafana_port: 80\n", "metrics.grafana_port", "[greater_than_equal]",
                                  "1,024 or more"),
    "a Grafana port past 65535": ("  grafana_port: 65536\n", "metrics.grafana_port", "[less_than_equal]",
                                  "65,535 or less"),
    "Grafana without metrics": ("  enabled: false\n  grafana: true\n", "metrics.grafana", "[grafana]",
                                "set metrics.enabled: true, or remove metrics.grafana"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=[name.replace(" ", "-") for name in CASES])
def test_refused_with_file_line_field_rule_and_fix(case, tmp_path) -> None:
    line, field, rule, fix = case
    text = example_text("staging")
    assert "\nmetrics:" not in text
    text += "metrics:\n" + line
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    errors = [e for e in res.stderr.splitlines() if e.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith(f"error: {path}:{line_of(text, line.rstrip().splitlines()[-1])}: {field}: "), errors[0]
    assert fix in errors[0] and rule in errors[0], errors[0]
    assert "nothing was written" in res.stderr


# A metrics port on a port the cluster already listens on (spec/ports.py): (extra spec text, the line the error
# names, the field, what it says holds the port). staging has NVIDIA GPUs, a flash tier (MooseFS) and an NFS tier.
STAGING = "staging"
CLASHES = {
    "slurmctld": ("  node_exporter_port: 6817\n", "metrics.node_exporter_port", "slurmctld's (SlurmctldPort)"),
    "slurmd": ("  dcgm_exporter_port: 6818\n", "metrics.dcgm_exporter_port", "slurmd's (SlurmdPort)"),
    "slurmdbd": ("  prometheus_port: 6819\n", "metrics.prometheus_port", "slurmdbd's (DbdPort)"),
    "MariaDB": ("  prometheus_port: 3306\n", "metrics.prometheus_port", "MariaDB's, slurmdbd's database"),
    "the pull server": ("  prometheus_port: 8079\n", "metrics.prometheus_port",
                        "the pull bundle server's (gpucluster configure --pull)"),
    "NFS": ("  node_exporter_port: 2049\n", "metrics.node_exporter_port", "NFS's (NFS-Ganesha)"),
    "the MooseFS metalogger port": ("  node_exporter_port: 9419\n", "metrics.node_exporter_port",
                                    "storage.flash.moosefs.ports.metalogger's"),
    "the MooseFS client port": ("  dcgm_exporter_port: 9421\n", "metrics.dcgm_exporter_port",
                                "storage.flash.moosefs.ports.client's"),
    "the MooseFS chunk server's own port": ("  node_exporter_port: 9422\n", "metrics.node_exporter_port",
                                            "MooseFS's chunk server's (CSSERV_LISTEN_PORT's default)"),
    "the bandwidth check": ("  dcgm_exporter_port: 18515\n", "metrics.dcgm_exporter_port",
                            "the bandwidth check's ib_write_bw (HCA 0)"),
    "DCGM's host engine": ("  dcgm_exporter_port: 5555\n", "metrics.dcgm_exporter_port",
                           "DCGM's host engine (nv-hostengine)"),
    "node_exporter's port": ("  dcgm_exporter_port: 9100\n", "metrics.dcgm_exporter_port",
                             "metrics.node_exporter_port's (node_exporter)"),
    "a moved node_exporter's port": ("  node_exporter_port: 9500\n  prometheus_port: 9500\n",
                                     "metrics.prometheus_port", "metrics.node_exporter_port's (node_exporter)"),
    "dcgm-exporter's port": ("  prometheus_port: 9400\n", "metrics.prometheus_port",
                             "metrics.dcgm_exporter_port's (dcgm-exporter)"),
    "Grafana on Prometheus's port": ("  grafana: true\n  grafana_port: 9090\n", "metrics.grafana_port",
                                     "metrics.prometheus_port's (Prometheus)"),
    "Grafana on slurmctld's port": ("  grafana: true\n  grafana_port: 6817\n", "metrics.grafana_port",
                                    "slurmctld's (SlurmctldPort)"),
    "Grafana on MariaDB's port": ("  grafana: true\n  grafana_port: 3306\n", "metrics.grafana_port",
                                  "MariaDB's, slurmdbd's database"),
    "Grafana on node_exporter's port": ("  grafana: true\n  grafana_port: 9100\n", "metrics.grafana_port",
                                        "metrics.node_exporter_port's (node_exporter)"),
    "Grafana on a moved Prometheus's port": ("  grafana: true\n  prometheus_port: 9500\n  grafana_port: 9500\n",
                                             "metrics.grafana_port", "metrics.prometheus_port's (Prometheus)"),
}


def _check(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("case", CLASHES.values(), ids=[name.replace(" ", "-") for name in CLASHES])
def test_a_metrics_port_the_cluster_uses_is_refused(case, tmp_path) -> None:
    lines, field, holder = case
    text = example_text(STAGING) + "metrics:\n" + lines
    res = _check(tmp_path, text)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    errors = [e for e in res.stderr.splitlines() if e.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    line = line_of(text, lines.rstrip().splitlines()[-1])
    assert errors[0].startswith(f"error: {tmp_path / 'spec.yaml'}:{line}: {field}: "), errors[0]
    assert f"is {holder} already" in errors[0] and "give it a free port, e.g. " in errors[0], errors[0]
    assert errors[0].endswith("[ports]"), errors[0]
    assert "nothing was written" in res.stderr


@pytest.mark.parametrize("case", [
    "  amd_exporter_port: 6818\n",  # no AMD GPU in staging: nothing listens there
    "  prometheus_port: 6817\n  external_url: http://prometheus.example.org:9090\n",  # the site's own server
    "  node_exporter_port: 19100\n  dcgm_exporter_port: 19400\n  prometheus_port: 19090\n",
    "  external_url: https://[2001:db8::1]:9090/prom/\n",
    "  grafana: true\n",
    "  grafana: true\n  grafana_port: 9090\n  external_url: http://prometheus.example.org:9090\n",
    "  grafana_port: 6817\n",
], ids=["an-unused-exporter-port", "prometheus-elsewhere", "all-moved", "an-ipv6-url-with-a-path", "grafana",
        "grafana-on-the-port-of-a-prometheus-elsewhere", "a-grafana-port-without-grafana"])
def test_ports_nothing_else_holds_and_good_urls_are_accepted(case, tmp_path) -> None:
    res = _check(tmp_path, example_text(STAGING) + "metrics:\n" + case)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_amd_exporter_port_is_checked_where_amd_gpus_are(tmp_path) -> None:
    text = example_text("mi355x-800g-roce")
    assert "\nmetrics:" not in text
    text += "metrics:\n  amd_exporter_port: 6818\n"
    res = _check(tmp_path, text)
    assert res.returncode == 2 and "metrics.amd_exporter_port: port 6818 is slurmd's" in res.stderr, res.stderr


def test_the_fixed_ports_are_their_owners() -> None:
    """spec/ports.py copies the ports that modules above its floor own: each copy equals its owner."""
    from gpucluster.configure.pull import PORT
    from gpucluster.render.health.active import IB_PORT
    from gpucluster.render.slurm import DBD
    from gpucluster.spec import ports

    root = Path(__file__).resolve().parent.parent
    assert DBD["port"] == ports.SLURMDBD_PORT
    assert ports.PULL_PORT == PORT
    assert ports.IB_WRITE_BW_PORT == IB_PORT
    assert f"NFS_Port = {ports.NFS_PORT};" in (root / "templates/storage/ganesha.conf.j2").read_text()
    assert f"StoragePort={ports.MARIADB_PORT}" in (root / "templates/slurm/slurmdbd.conf.j2").read_text()
    # nv-hostengine's default port (dcgm-exporter's --remote-hostengine-info default is localhost:5555 too)
    assert ports.DCGM_HOSTENGINE_PORT == 5555


def test_the_defaults_are_accepted(tmp_path) -> None:
    text = example_text("staging") + ("metrics:\n  scrape_interval: 30\n  down_minutes: 5\n  unit_degraded_pct: 25\n"
                                      "  unit_degraded_min_nodes: 2\n  slurm_out_of_service_pct: 10\n"
                                      "  flap_count: 3\n  flap_minutes: 60\n  backfill_cycle_seconds: 20\n")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
