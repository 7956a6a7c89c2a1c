"""Bad metrics settings are refused by `gpucluster check`: exit 2, one error per field naming the file, the line, the
field, the rule and a fix, no traceback, nothing written. A scrape interval of 5 s to 2 minutes (a longer one leaves
gaps in Prometheus's 5-minute lookback), a unit share above 0 and at most 100 %, at least 1 node and 1 minute; the
same share bounds for Slurm's nodes out of service, a flap of at least 2 exits in 10 minutes to a day, a backfill
cycle above 0 and at most Slurm's own bf_max_time limit (3600 s)."""

from __future__ import annotations

import subprocess
import sys

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
    assert errors[0].startswith(f"error: {path}:{line_of(text, line.rstrip())}: {field}: "), errors[0]
    assert fix in errors[0] and rule in errors[0], errors[0]
    assert "nothing was written" in res.stderr


def test_the_defaults_are_accepted(tmp_path) -> None:
    text = example_text("staging") + ("metrics:\n  scrape_interval: 30\n  down_minutes: 5\n  unit_degraded_pct: 25\n"
                                      "  unit_degraded_min_nodes: 2\n  slurm_out_of_service_pct: 10\n"
                                      "  flap_count: 3\n  flap_minutes: 60\n  backfill_cycle_seconds: 20\n")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
