"""Settings that change nothing where they are written draw a warning (spec/effects.py), and the CLI's
warning controls: render prints them, --suppress by rule or by field path, --fail-on warning for CI.

Each case starts from examples/staging.yaml (which draws no warning) and writes one ineffective
setting; the warning must name that setting's line and its own rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import example_text, mutate

from gpucluster.cli import main
from gpucluster.cluster import check_file
from gpucluster.errors import Finding, suppressed


@dataclass(frozen=True)
class Case:
    old: str
    new: str
    field: str
    rule: str


NFS = '    hostname: "nfs##"\n'
CTL = '    hostname: "ctl##"\n'
CASES = {
    "NICs on a storage group": Case(NFS, NFS + "    nic: veth-staging\n    nics_per_node: 1\n",
                                    "node_groups[3].nics_per_node", "nic-on-storage"),
    "a NIC on the controller": Case(CTL, CTL + "    nic: veth-staging\n    nics_per_node: 1\n",
                                    "node_groups[0].nics_per_node", "nic-on-service"),
    "features of a storage group": Case(NFS, NFS + "    features: [nvme]\n", "node_groups[3].features",
                                        "features-off-slurm"),
    "gres_detect without GPUs": Case(NFS, NFS + "    gres_detect: nvml\n", "node_groups[3].gres_detect",
                                     "gres-without-gpus"),
    "InfiniBand settings on RoCE": Case("  management_interface: eth0\n",
                                        "  management_interface: eth0\n  infiniband: {sharp: true}\n",
                                        "fabric.infiniband", "infiniband-on-roce"),
    "a purge without accounting": Case("  accounting: true ",
                                       "  accounting: false\n  accounting_purge_after: 12months\n  #",
                                       "slurm.accounting_purge_after", "purge-without-accounting"),
    "health settings with health off": Case("  interval: 30\n", "  interval: 30\n  enabled: false\n",
                                            "health.interval", "health-disabled"),
    "active-check settings without checks": Case("  interval: 30\n", "  interval: 30\n  active: {every_hours: 6}\n",
                                                 "health.active.every_hours", "active-unused"),
    "a large group at one server a rack": Case("    count: 4\n", "    count: 32\n", "node_groups[1].nodes_per_rack",
                                               "rack-default"),
}
RACKLESS = "    nodes_per_rack: 2\n"  # the rack-default case removes it, so the group is at the default


def spec_with(tmp_path, case: Case):
    text, _ = mutate(example_text("staging"), case.old, case.new)
    if case.rule == "rack-default":
        text, _ = mutate(text, RACKLESS, "")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path, text


def test_staging_draws_no_warning():
    assert check_file("examples/staging.yaml")[1] == []


@pytest.mark.parametrize("name", CASES)
def test_a_setting_without_effect_warns_at_its_line(name, tmp_path):
    case = CASES[name]
    path, text = spec_with(tmp_path, case)
    findings = check_file(path)[1]
    assert [(f.level, f.field, f.rule) for f in findings] == [("warning", case.field, case.rule)]
    (f,) = findings
    key = case.field.rpartition(".")[2].partition("[")[0]
    line = text.splitlines()[f.line - 1]
    # the setting's own line; a default left unset (rack-default) is its group's first line
    assert key in line or (case.rule == "rack-default" and line == "  - name: gpu"), line
    assert f.fix


def test_a_default_written_out_draws_no_warning(tmp_path):
    """Writing a default where it has no effect is harmless (and what `expand` prints): no warning."""
    path, _ = spec_with(tmp_path, Case(NFS, NFS + "    nic: null\n    nics_per_node: 0\n    gres_detect: auto\n"
                                       "    features: []\n", "", ""))
    assert check_file(path)[1] == []


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


NIC_ON_STORAGE = CASES["NICs on a storage group"]
FEATURES = CASES["features of a storage group"]


def two_warnings(tmp_path):
    text, _ = mutate(example_text("staging"), NFS, NFS + "    nic: veth-staging\n    nics_per_node: 1\n"
                     "    features: [nvme]\n")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


def test_render_prints_warnings_and_writes(capsys, tmp_path):
    rc, _out, err = run(capsys, "render", two_warnings(tmp_path), "-o", str(tmp_path / "out"), "--no-cabling")
    assert rc == 0 and (tmp_path / "out" / "slurm.conf").exists()
    assert "[nic-on-storage]" in err and "[features-off-slurm]" in err


@pytest.mark.parametrize("command", ["check", "plan", "render"])
def test_fail_on_warning_refuses_the_run(capsys, tmp_path, command):
    out_dir = tmp_path / "out"
    extra = ["-o", str(out_dir), "--no-cabling"] if command == "render" else []
    rc, _out, err = run(capsys, command, two_warnings(tmp_path), *extra, "--fail-on", "warning")
    assert rc == 2 and not out_dir.exists()
    assert err.rstrip().endswith("2 problems; nothing was written")
    assert run(capsys, command, two_warnings(tmp_path), *extra, "--fail-on", "error")[0] == 0


@pytest.mark.parametrize("command", ["check", "plan", "render"])
@pytest.mark.parametrize("by", ["rule", "field"])
def test_suppress_by_rule_or_field_path(capsys, tmp_path, command, by):
    out_dir = tmp_path / "out"
    extra = ["-o", str(out_dir), "--no-cabling"] if command == "render" else []
    name = "nic-on-storage" if by == "rule" else "node_groups[3].nics_per_node"
    rc, out, err = run(capsys, command, two_warnings(tmp_path), *extra, "--suppress", name)
    shown = out + err  # plan lists its warnings with the plan, on stdout
    assert rc == 0 and "[nic-on-storage]" not in shown and "[features-off-slurm]" in shown
    # with both hidden, --fail-on warning passes
    other = "features-off-slurm" if by == "rule" else "node_groups[3].features"
    assert run(capsys, command, two_warnings(tmp_path), *extra, "--suppress", name, "--suppress", other,
               "--fail-on", "warning")[0] == 0


def warning(field: tuple, rule: str = "r") -> Finding:
    return Finding(field, "m", "f", rule, "warning", "s.yaml", 1)


@pytest.mark.parametrize(("pattern", "field", "hidden"), [
    ("node_groups[2].nic", ("node_groups", 2, "nic"), True),
    ("node_groups[2]", ("node_groups", 2, "nic"), True),
    ("node_groups[*].nic", ("node_groups", 7, "nic"), True),
    ("node_groups[2].nic", ("node_groups", 2, "nics_per_node"), False),  # components, not text prefixes
    ("node_groups[2]", ("node_groups", 20, "nic"), False),
    ("fabric.roce", ("fabric", "roce", "dscp"), True),
    ("fabric.roce", ("fabric", "roce_x"), False),
    ("fabric", ("fabric", "roce"), False),  # one word is a rule's name, never a field
])
def test_field_patterns_match_on_component_boundaries(pattern, field, hidden):
    kept, _ = suppressed([warning(field)], [pattern])
    assert (kept == []) is hidden


def test_errors_are_never_suppressed():
    error = Finding(("a", "b"), "m", "f", "r", "error", "s.yaml", 1)
    kept, refused = suppressed([error, warning(("b",))], ["r", "a.b"])
    assert kept == [error] and refused == ["a.b", "r"]


def test_check_json_ok_follows_fail_on(capsys, tmp_path):
    import json

    spec = two_warnings(tmp_path)
    rc, out, _err = run(capsys, "check", spec, "--json")
    assert rc == 0 and json.loads(out)["ok"] is True and json.loads(out)["warnings"] == 2
    rc, out, _err = run(capsys, "check", spec, "--json", "--fail-on", "warning")
    doc = json.loads(out)
    assert rc == 2 and doc["ok"] is False and [f["line"] for f in doc["findings"]] == sorted(
        f["line"] for f in doc["findings"])
