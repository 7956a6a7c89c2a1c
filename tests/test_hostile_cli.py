"""Findings for machines and in one run: `check --json`, `plan --json` on failure, `--suppress RULE`
(warnings only), every finding of a spec whose syntax fails (the meaning checks run on the rest),
and locations down to the column.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import EXAMPLES, ROOT, example_path, example_text, line_of

from gpucluster.cli import main

KEYS = ["file", "line", "column", "field", "rule", "level", "message", "fix"]


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, which Python's json would otherwise accept."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


@pytest.fixture
def bad(tmp_path):
    """Syntax and meaning errors at once: a YAML boolean count, an octal memory size, a partition naming a
    missing group, a GPU count the SKU is not built with, and an export of /etc/munge."""
    text = example_text("staging")
    for old, new in [("    count: 4\n", "    count: yes\n"),
                     ("    memory_gb: 1\n    gpu:", "    memory_gb: 010\n    gpu:"),
                     ("      groups: [gpu]\n", "      groups: [gpu, gpux]\n"),
                     ("    gpus_per_node: 4\n", "    gpus_per_node: 3\n"),
                     ("        - path: /export/home\n", "        - path: /etc/munge\n")]:
        assert text.count(old) == 1
        text = text.replace(old, new)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path, text


EXPECTED = {("node_groups[1].count", "yaml-bool"), ("node_groups[1].memory_gb", "int_parsing"),
            ("slurm.partitions[0].groups[1]", "partition"), ("node_groups[1].gpus_per_node", "gpu-count"),
            ("storage.nfs[0].exports[0].path", "reserved-path")}


def test_every_finding_in_one_run(capsys, bad):
    """The syntax layer refuses count and memory_gb of group 'gpu'; the meaning checks still run on what
    it accepted: the partition typo, the GPU count (which does not read count), the export path."""
    path, _text = bad
    rc, _out, err = run(capsys, "check", str(path))
    assert rc == 2

    found = {(m[1], m[2]) for m in re.finditer(r"^error: \S+:\d+: (\S+): .+ \[([\w-]+)\]$", err, re.M)}
    assert found == EXPECTED, err


def test_check_json(capsys, bad):
    path, text = bad
    rc, out, err = run(capsys, "check", "--json", str(path))
    assert rc == 2 and err == ""
    doc = strict_json(out)
    assert doc["ok"] is False and doc["spec"] == str(path) and doc["errors"] == len(doc["findings"]) == 5
    for f in doc["findings"]:
        assert list(f) == KEYS
        assert f["file"] == str(path) and f["level"] == "error" and f["message"] and f["fix"]
        assert isinstance(f["line"], int) and isinstance(f["column"], int)
    assert {(f["field"], f["rule"]) for f in doc["findings"]} == EXPECTED
    count = next(f for f in doc["findings"] if f["field"] == "node_groups[1].count")
    assert (count["line"], count["column"]) == (line_of(text, "    count: yes"), 5)
    assert "write a number" in count["fix"]


def test_check_json_ok_carries_warnings(capsys):
    rc, out, _err = run(capsys, "check", "--json", str(example_path("meta-24k-roce")))
    doc = strict_json(out)
    assert rc == 0 and doc["ok"] is True and doc["errors"] == 0
    # in reading order: the 96 storage servers at one a rack (rack-default), then the rounded ratio
    assert [(f["field"], f["rule"], f["level"]) for f in doc["findings"]] == [
        ("node_groups[4].nodes_per_rack", "rack-default", "warning"),
        ("fabric.oversubscription.spine", "ratio-rounded", "warning")]
    assert doc["findings"][1]["line"] == line_of(example_text("meta-24k-roce"), "  oversubscription: {")


def test_check_json_on_an_unreadable_spec(capsys, tmp_path):
    rc, out, _err = run(capsys, "check", "--json", str(tmp_path))
    doc = strict_json(out)
    assert rc == 2 and [f["rule"] for f in doc["findings"]] == ["file"]


def test_plan_json_on_failure_prints_findings(capsys, bad):
    path, _text = bad
    rc, out, _err = run(capsys, "plan", "--json", str(path))
    doc = strict_json(out)
    assert rc == 2 and {(f["field"], f["rule"]) for f in doc["findings"]} == EXPECTED


@pytest.mark.parametrize("name", EXAMPLES)
def test_plan_json_is_strict_json(capsys, name):
    rc, out, _err = run(capsys, "plan", "--json", str(example_path(name)))
    assert rc == 0
    strict_json(out)


def test_suppress_hides_a_warning(capsys):
    rc, _out, err = run(capsys, "check", "--suppress", "ratio-rounded", str(example_path("meta-24k-roce")))
    assert rc == 0 and "ratio-rounded" not in err
    rc, out, _err = run(capsys, "check", "--json", "--suppress", "ratio-rounded", str(example_path("meta-24k-roce")))
    assert [f["rule"] for f in strict_json(out)["findings"]] == ["rack-default"]


def test_suppress_never_hides_an_error(capsys, bad):
    path, _text = bad
    rc, _out, err = run(capsys, "check", "--suppress", "gpu-count", str(path))
    assert rc == 2 and "[gpu-count]" in err
    text = example_text("staging").replace("    gpus_per_node: 4\n", "    gpus_per_node: 3\n")
    path.write_text(text)
    rc, _out, err = run(capsys, "check", "--suppress", "gpu-count", str(path))
    assert rc == 2 and "[gpu-count]" in err and "note: --suppress gpu-count does not apply to errors" in err


def test_suppress_takes_rule_names_only(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--suppress", "not a rule!", str(example_path("staging"))])
    assert exc.value.code == 2


def test_stdin(tmp_path):
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", "--json", "-"], cwd=ROOT,
                         input=example_text("staging").replace("    count: 4\n", "    count: on\n"),
                         capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src")}, timeout=120)
    doc = strict_json(res.stdout)
    assert res.returncode == 2 and [(f["file"], f["rule"]) for f in doc["findings"]] == [("<stdin>", "yaml-bool")]


def test_raw_control_character_line_and_column(capsys, tmp_path):
    path = tmp_path / "spec.yaml"
    text = example_text("staging").replace("  topology: tree\n", "  topology: tr\x1bee\n")
    path.write_text(text)
    rc, out, _err = run(capsys, "check", "--json", str(path))
    (f,) = strict_json(out)["findings"]
    assert rc == 2 and (f["line"], f["column"]) == (line_of(text, "  topology:"), len("  topology: tr") + 1)
    assert "U+001B" in f["message"]
