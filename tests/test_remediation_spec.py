"""Bad remediation settings are refused by `gpucluster check`: exit 2, one error per field naming the file, the
line, the field, the rule and a fix, no traceback. The breaker's shares are above 0 and at most 100 %, its floor
and the hysteresis at least 1, an XID override names a known rung of the ladder and an XID number in range."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import example_text, line_of

# staging.yaml's health: section ends with its breaker (min_nodes: 8); each case replaces that block.
ANCHOR = "  breaker:\n    min_nodes: 8\n"
CASES = {
    "a drain share of 0": ("  breaker:\n    min_nodes: 8\n    drains_pct: 0\n", "    drains_pct: 0",
                           "health.breaker.drains_pct", "more than 0"),
    "an out-of-service share over 100 %": ("  breaker:\n    min_nodes: 8\n    out_of_service_pct: 101\n",
                                           "    out_of_service_pct: 101", "health.breaker.out_of_service_pct",
                                           "100.0 or less"),
    "a floor of 0 nodes": ("  breaker:\n    min_nodes: 0\n", "    min_nodes: 0", "health.breaker.min_nodes",
                           "1 or more"),
    "a window of a minute": ("  breaker:\n    min_nodes: 8\n    window_minutes: 1\n", "    window_minutes: 1",
                             "health.breaker.window_minutes", "5 or more"),
    "hysteresis of 0 runs": ("  breaker:\n    min_nodes: 8\n", "  fail_after: 0", "health.fail_after", "1 or more"),
    "an unknown XID rung": ("  breaker:\n    min_nodes: 8\n  xid_actions:\n    79: reimage\n", "    79: reimage",
                            "health.xid_actions[79]", "use one of 'record', 'drain', 'reboot' or 'service'"),
    "an XID number out of range": ("  breaker:\n    min_nodes: 8\n  xid_actions:\n    5000: drain\n",
                                   "    5000: drain", "health.xid_actions[5000]", "1,000 or less"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_refused_with_file_line_field_and_fix(case, tmp_path) -> None:
    new, anchor, field, fix = case
    text = example_text("staging")
    assert text.count(ANCHOR) == 1
    text = text.replace(ANCHOR, new)
    if anchor == "  fail_after: 0":  # staging.yaml sets it (2)
        assert text.count("  fail_after: 2\n") == 1
        text = text.replace("  fail_after: 2\n", "  fail_after: 0\n")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith(f"error: {path}:{line_of(text, anchor)}: {field}: "), errors[0]
    assert fix in errors[0], errors[0]
    assert "nothing was written" in res.stderr
