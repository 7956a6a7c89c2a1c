"""The controller's Slurm metrics without a Slurm: the reason classifier, the exposition escaping, the parsers of
Slurm's output (shapes recorded from 22.05, 24.11 and 26.05), the plan's units, a failing command, the file written
whole, and the renderer of slurm-metrics.json held to the plan. The same program on a real slurmctld of every line:
tests/test_slurm_metrics_emulated.py.

`parse_exposition` is a strict reader of the text format, used here and by the emulated tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cluster_example, skip_or_fail

from gpucluster.node import slurmmetrics as sm

SCRIPT = Path(sm.__file__)

# ---- a strict reader of the text exposition format -----------------------------------------------------------------

_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _labels(text: str, where: str) -> tuple[dict[str, str], str]:
    """The `{...}` at the start of text (escapes undone), and the rest."""
    out: dict[str, str] = {}
    i = 1
    while text[i] != "}":
        m = _LABEL_NAME.match(text, i)
        assert m and text[m.end():m.end() + 2] == '="', f"{where}: bad label at {text[i:i + 20]!r}"
        i, value = m.end() + 2, []
        while text[i] != '"':
            if text[i] == "\\":
                esc = text[i + 1]
                assert esc in '\\"n', f"{where}: bad escape \\{esc}"
                value.append("\n" if esc == "n" else esc)
                i += 2
            else:
                value.append(text[i])
                i += 1
        assert m.group(0) not in out, f"{where}: label {m.group(0)} twice"
        out[m.group(0)] = "".join(value)
        i += 1
        if text[i] == ",":
            i += 1
    return out, text[i + 1:]


def parse_exposition(text: str) -> dict[tuple[str, frozenset], float]:
    """(metric, labels) -> value. Refuses what node_exporter's textfile collector or Prometheus would: a line that
    is not HELP, TYPE or a sample, a sample before its family's TYPE or apart from its family's other samples, a
    family declared twice, a series twice, a timestamp, a value that is not a number, no final newline."""
    assert text.endswith("\n"), "the file does not end with a newline"
    series: dict[tuple[str, frozenset], float] = {}
    typed, helped, done, current = set(), set(), set(), None
    for n, line in enumerate(text.splitlines(), 1):
        where = f"line {n}: {line[:80]!r}"
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, name, rest = line[2:6], *line[7:].split(" ", 1)
            assert _METRIC.fullmatch(name) and name not in done, where
            seen = helped if kind == "HELP" else typed
            assert name not in seen, f"{where}: {kind} twice"
            seen.add(name)
            assert kind == "HELP" or rest in ("gauge", "counter", "untyped"), where
            if current != name:
                done.update({current} - {None})
            current = name
            continue
        m = _METRIC.match(line)
        assert m and m.group(0) == current and current in typed, f"{where}: not a sample of the family declared last"
        rest = line[m.end():]
        labels, rest = _labels(rest, where) if rest.startswith("{") else ({}, rest)
        assert rest.startswith(" ") and " " not in rest[1:], f"{where}: not one value (a timestamp?)"
        key = (current, frozenset(labels.items()))
        assert key not in series, f"{where}: series twice"
        series[key] = float(rest[1:])
    return series


def value(series: dict, name: str, **labels) -> float | None:
    return series.get((name, frozenset(labels.items())))


def promtool_check(text: str) -> None:
    """`promtool check metrics`: parses and lints (names, units, HELP); skipped as not run without promtool."""
    if shutil.which("promtool") is None:
        skip_or_fail("not run: promtool not installed (the prometheus package; scripts/setup.sh --tests)")
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


# ---- the reason classifier ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("reason", "cls"), [
    ("gpc:mount-flash: /mnt/flash did not answer", "gpc:mount-flash"),
    ("gpc:service: XID 79 twice in 7 days", "gpc:service"),
    ("gpc:rollout 20261128-a1", "gpc:rollout"),
    ("gpc:grow g1 failed: hca-ports", "gpc:grow"),
    ("gpc:gpu-xid", "gpc:gpu-xid"),
    ("gpc:" + "a" * 40 + ": long", "gpc:" + "a" * 40),
    ("gpc:" + "a" * 41 + ": too long", "other"),
    ('gpc:x"} 1\nevil_metric 1', "other"),
    ("gpc:Mount_Flash: not ours", "other"),
    ("gpc:: empty", "other"),
    ("Not responding", "slurm:not-responding"),
    ("Kill task failed", "slurm:kill-task-failed"),
    ("Node unexpectedly rebooted", "slurm:unexpected-reboot"),
    ("reboot timed out", "slurm:reboot-timeout"),
    ("reboot requested", "slurm:reboot"),
    ("Reboot ASAP", "slurm:reboot"),
    ("ResumeTimeout reached", "slurm:power"),
    ("Prolog error", "slurm:prolog-epilog"),
    ("Epilog error", "slurm:prolog-epilog"),
    ("batch job complete failure", "slurm:job-failure"),
    ("Low RealMemory (reported:400 < 100.00% of configured:500)", "slurm:registration"),
    ("Low socket*core*thread count, Low CPUs", "slurm:registration"),
    ("gres/gpu count reported lower than configured (4 < 8)", "slurm:registration"),
    ("NO NETWORK ADDRESS FOUND", "slurm:no-address"),
    ('x"} 1\nevil_metric 1', "operator"),
    ("RMA 4711: replace the HCA", "operator"),
    ("not responding", "operator"),  # Slurm writes it capitalised: a person's words
    ("", "none"),
    ("   ", "none"),
])
def test_a_reason_is_a_class_never_the_text(reason: str, cls: str) -> None:
    assert sm.reason_class(reason) == cls
    assert cls in sm.REASON_CLASSES or re.fullmatch(r"gpc:[a-z0-9-]{1,40}", cls)


@pytest.mark.parametrize(("text", "code"), [
    ("Resources", "Resources"), ("Priority", "Priority"), ("Dependency", "Dependency"),
    ("ReqNodeNotAvail, UnavailableNodes:gpu[001-003]", "ReqNodeNotAvail"), ("JobHeldUser", "JobHeldUser"),
    ("(Resources)", "other"), ('x"} 1', "other"), ("A" * 41, "other"), ("", "other"),
    ("launch failed requeued held", "launch"),
])
def test_a_pending_reason_is_slurms_code_or_other(text: str, code: str) -> None:
    assert sm.pending_reason(text) == code


# ---- the exposition format ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "bounded"), [
    ('x"} 1\nevil_metric 1', 'x"} 1\nevil_metric 1'), ("x" * 100, "x" * sm.MAX_LABEL), ("\\" * 70, "\\" * sm.MAX_LABEL),
])
def test_a_label_value_is_bounded(raw: str, bounded: str) -> None:
    assert sm.label(raw) == bounded


@pytest.mark.parametrize("raw", ['a"b', "a\\b", "a\nb", 'x"} 1\nevil_metric 1', "\\" * 70])
def test_a_label_value_reads_back_as_written(raw: str) -> None:
    series = parse_exposition(sm.exposition(sm.family("gpucluster_slurm_test", "a test", [({"a": raw}, 1)])))
    assert series == {("gpucluster_slurm_test", frozenset({("a", raw[:sm.MAX_LABEL])})): 1.0}


def test_a_hostile_label_value_stays_one_series() -> None:
    text = sm.exposition(sm.family("gpucluster_slurm_test", "a test", [({"a": 'x"} 1\nevil_metric 1'}, 1),
                                                                       ({"a": "\\"}, 2)]))
    series = parse_exposition(text)
    assert series == {("gpucluster_slurm_test", frozenset({("a", 'x"} 1\nevil_metric 1')})): 1.0,
                      ("gpucluster_slurm_test", frozenset({("a", "\\")})): 2.0}
    assert not any(name == "evil_metric" for name, _ in series)


@pytest.mark.parametrize(("word", "out"), [("IDLE", "idle"), ("POWERED_DOWN", "powered_down"), ("Idle+x", "other"),
                                           ("", "other"), ("A" * 33, "other")])
def test_a_state_word_is_a_word_or_other(word: str, out: str) -> None:
    assert sm.word(word) == out


def test_the_reader_reads_a_good_file() -> None:
    assert parse_exposition("# HELP a x\n# TYPE a gauge\na 1\n") == {("a", frozenset()): 1.0}


@pytest.mark.parametrize("bad", [
    "# HELP a x\n# TYPE a gauge\na 1", "# HELP a x\n# TYPE a gauge\na 1 123\n", "a 1\n",
    '# HELP a x\n# TYPE a gauge\na{l="x} 1\n', "# HELP a x\n# TYPE a gauge\na 1\na 2\n",
    "# HELP a x\n# TYPE a gauge\n# HELP b y\n# TYPE b gauge\nb 1\na 1\n", "# HELP a x\n# TYPE a gauge\nb 1\n",
    '# HELP a x\n# TYPE a gauge\na{l="\\x"} 1\n', "# HELP a x\n# TYPE a gauge\na one\n",
], ids=["no-final-newline", "timestamp", "untyped", "open-quote", "twice", "family-split", "wrong-family",
        "bad-escape", "not-a-number"])
def test_the_reader_refuses_what_the_collector_would(bad: str) -> None:
    with pytest.raises((AssertionError, ValueError, IndexError)):
        parse_exposition(bad)


# ---- Slurm's output -------------------------------------------------------------------------------------------------

NODES_2205 = {"meta": {}, "errors": [], "nodes": [
    {"name": "gpu001", "state": "idle", "state_flags": [], "reason": ""},
    {"name": "gpu002", "state": "idle", "state_flags": ["DRAIN"], "reason": "gpc:mount-flash: gone"},
    {"name": "gpu003", "state": "mixed", "state_flags": ["DRAIN"], "reason": 'x"} 1\nevil_metric 1'},
    {"name": "gpu004", "state": "down", "state_flags": ["NOT_RESPONDING"], "reason": "Not responding"},
    {"name": "gpu005", "state": "idle", "state_flags": ["RESERVED"], "reason": ""},
    {"name": "gpu006", "state": "idle", "state_flags": ["CLOUD", "POWERED_DOWN"], "reason": ""},
    {"name": "gpu001", "state": "down", "state_flags": [], "reason": "listed twice: the first record counts"},
    {"name": "bad name", "state": "idle"}, {"name": "gpu009"}, "not a record",
]}
NODES_2411 = {"errors": [], "warnings": [], "nodes": [
    {"name": "gpu001", "state": ["IDLE"], "reason": ""},
    {"name": "gpu002", "state": ["IDLE", "DRAIN"], "reason": "gpc:mount-flash: gone"},
    {"name": "gpu003", "state": ["MIXED", "DRAIN"], "reason": 'x"} 1\nevil_metric 1'},
    {"name": "gpu004", "state": ["DOWN", "NOT_RESPONDING"], "reason": "Not responding"},
    {"name": "gpu005", "state": ["IDLE", "RESERVED"], "reason": ""},
    {"name": "gpu006", "state": ["IDLE", "CLOUD", "POWERED_DOWN"], "reason": ""},
    {"name": "gpu007", "state": [], "reason": ""}, {"name": "gpu008", "state": ["IDLE", 7]},
    {"name": "gpu\nx", "state": ["IDLE"]},
]}


@pytest.mark.parametrize("doc", [NODES_2205, NODES_2411], ids=["22.05 sinfo --json", "24.11 scontrol --json"])
def test_the_node_table_reads_in_both_shapes(doc: dict) -> None:
    nodes, skipped = sm.parse_nodes(json.dumps(doc))
    assert sorted(nodes) == [f"gpu00{i}" for i in range(1, 7)] and skipped == 3
    assert nodes["gpu001"] == ("IDLE", frozenset(), "")
    assert nodes["gpu003"] == ("MIXED", frozenset({"DRAIN"}), 'x"} 1\nevil_metric 1')
    assert [sm.node_state(*nodes[n][:2]) for n in sorted(nodes)] == ["idle", "drained", "draining", "down", "idle",
                                                                      "idle"]
    assert [n for n in sorted(nodes) if sm.is_free(nodes[n])] == ["gpu001", "gpu006"]
    assert [n for n in sorted(nodes) if sm.out_of_service(*nodes[n][:2])] == ["gpu002", "gpu003", "gpu004"]


@pytest.mark.parametrize("text", ["not json", "[]", '{"nodes": {}}', '{"errors": [{"error": "x"}], "nodes": []}'])
def test_a_node_table_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        sm.parse_nodes(text)


def test_the_queue_reads_states_and_pending_codes() -> None:
    text = ("PENDING|Resources\nPENDING|ReqNodeNotAvail, UnavailableNodes:gpu[001-002]\nRUNNING|None\n"
            "PENDING|Priority\nCOMPLETING|None\nPENDING|(weird)\nnot a line\n\nPENDING|x\nbad|line\n")
    states, reasons, skipped = sm.parse_jobs(text)
    assert states == {"pending": 5, "running": 1, "completing": 1}
    assert reasons == {"Resources": 1, "ReqNodeNotAvail": 1, "Priority": 1, "other": 1, "x": 1}
    assert skipped == 2


SDIAG = """*******************************************************
sdiag output at Sat Nov 28 17:02:37 2026 (1795885357)
Main schedule statistics (microseconds):
\tLast cycle:   843
\tMax cycle:    1843
\tTotal cycles: 3
\tMean cycle:   943
\tMean depth cycle:  2
\tLast queue length: 5

Main scheduler exit:
\tEnd of job queue: 1

Backfilling stats
\tTotal backfilled jobs (since last slurm start): 0
\tTotal cycles: 4
\tLast cycle when: Sat Nov 28 17:02:40 2026 (1795885360)
\tLast cycle: 120
\tMax cycle:  2000000
\tMean cycle: 500
\tLast depth cycle: 3
\tLast depth cycle (try sched): 3
\tDepth Mean: 2
\tLast queue length: 3

Backfill exit
\tLast cycle: 99999
Remote Procedure Call statistics by message type
\tREQUEST_PING ( 1008) count:1 ave_time:246 total_time:246
"""


def test_sdiag_gives_both_schedulers_in_seconds() -> None:
    got = sm.parse_sdiag(SDIAG)
    assert got == {("cycle_last_seconds", "main"): 843e-6, ("cycle_max_seconds", "main"): 1843e-6,
                   ("cycles", "main"): 3, ("cycle_mean_seconds", "main"): 943e-6, ("depth_mean", "main"): 2,
                   ("queue_length", "main"): 5, ("cycles", "backfill"): 4, ("cycle_last_seconds", "backfill"): 120e-6,
                   ("cycle_max_seconds", "backfill"): 2.0, ("cycle_mean_seconds", "backfill"): 500e-6,
                   ("depth_last", "backfill"): 3, ("depth_mean", "backfill"): 2, ("queue_length", "backfill"): 3}


# ---- the plan's units -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("hostlist", "names"), [
    ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]), ("h100-[00009-00011]", ["h100-00009", "h100-00010",
                                                                              "h100-00011"]),
    ("a[1,3-4]b", ["a1b", "a3b", "a4b"]), ("x1,x2", ["x1", "x2"]), ("gpu[08-10],cpu1", ["gpu08", "gpu09", "gpu10",
                                                                                       "cpu1"]),
    ("gpu5", ["gpu5"]), ("", []),
])
def test_a_hostlist_expands(hostlist: str, names: list[str]) -> None:
    assert sm.expand(hostlist) == names


@pytest.mark.parametrize("hostlist", ["gpu[1-", "gpu[3-1]", "gpu[a-b]", "a[1-2]b[1-2]", "gpu]1[", "gpu[0-99999999]",
                                      'gpu"x', "gpu[[1-2]]"])
def test_a_bad_hostlist_is_refused(hostlist: str) -> None:
    with pytest.raises(ValueError):
        sm.expand(hostlist)


@pytest.mark.parametrize(("spans", "block"), [
    ([], 0), ([(True, 4)], 4), ([(True, 4), (True, 4), (False, 4), (True, 4)], 8),
    ([(False, 4), (True, 4), (True, 2)], 6), ([(True, 4), (False, 4), (True, 4), (True, 4), (True, 1)], 9),
])
def test_the_largest_free_block_is_consecutive_whole_units(spans, block: int) -> None:
    assert sm.largest_block(spans) == block


PLAN = {"cluster": "t", "units": [
    {"unit": "su0001", "group": "gpu", "pod": "pod001", "hosts": "gpu[001-004]"},
    {"unit": "su0002", "group": "gpu", "pod": "pod001", "hosts": "gpu[005-008]"},
    {"unit": "su0003", "group": "gpu", "pod": "pod002", "hosts": "gpu[009-010]"},
    {"unit": "su0004", "group": "cpu", "pod": "pod002", "hosts": "cpu[1-2]"}],
    "nvlink_domains": [{"nvlink_domain": "nvl0001", "group": "gpu", "hosts": "gpu[001-004]"},
                       {"nvlink_domain": "nvl0002", "group": "gpu", "hosts": "gpu[005-008]"}]}


def _table(busy: set[str]) -> dict:
    names = [f"gpu{i:03d}" for i in range(1, 11)] + ["cpu1", "cpu2"]
    return {"errors": [], "nodes": [{"name": n, "state": ["ALLOCATED" if n in busy else "IDLE"], "reason": ""}
                                    for n in names]}


def fake_run(outputs: dict):
    """A runner of canned outputs: argv -> text, or an exception's message when the value is one."""
    def run(argv, timeout):
        got = outputs.get(tuple(argv))
        if got is None or isinstance(got, Exception):
            return None, f"{' '.join(argv)}: {got or 'exit 1: Unable to contact slurm controller'}"
        return got, ""
    return run


def _collect(tmp_path: Path, outputs: dict, plan: dict | None = PLAN) -> tuple[dict, list[str], str]:
    path = tmp_path / "slurm-metrics.json"
    if plan is not None:
        path.write_text(json.dumps(plan))
    text, whys = sm.collect(fake_run(outputs), str(path), 5, 1795885357.25)
    return parse_exposition(text), whys, text


def _all_up(busy=frozenset()) -> dict:
    return {sm.NODES_JSON: json.dumps(_table(set(busy))), sm.JOBS: "RUNNING|None\nPENDING|Resources\n",
            sm.SDIAG: SDIAG}


def test_units_free_and_the_largest_block_follow_the_plan(tmp_path: Path) -> None:
    s, whys, _ = _collect(tmp_path, _all_up())
    assert whys == []
    assert value(s, "gpucluster_slurm_units_free", node_group="gpu") == 3
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="gpu") == 10
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="cpu") == 2
    assert value(s, "gpucluster_slurm_nvlink_domains_free", node_group="gpu") == 2
    # a job on su0002's hosts: one unit and one domain less, the block cut in two (4 and 2: the larger is 4)
    s, _, _ = _collect(tmp_path, _all_up({"gpu005", "gpu006", "gpu007", "gpu008"}))
    assert value(s, "gpucluster_slurm_unit_free_nodes", node_group="gpu", pod="pod001", unit="su0002") == 0
    assert value(s, "gpucluster_slurm_unit_free_nodes", node_group="gpu", pod="pod001", unit="su0001") == 4
    assert value(s, "gpucluster_slurm_units_free", node_group="gpu") == 2
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="gpu") == 4
    assert value(s, "gpucluster_slurm_nvlink_domain_free_nodes", node_group="gpu", nvlink_domain="nvl0002") == 0
    assert value(s, "gpucluster_slurm_nvlink_domains_free", node_group="gpu") == 1
    # one busy node in su0001 too: no unit of the group wholly free but su0003
    s, _, _ = _collect(tmp_path, _all_up({"gpu001", "gpu005"}))
    assert value(s, "gpucluster_slurm_units_free", node_group="gpu") == 1
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="gpu") == 2


def test_a_unit_host_slurm_does_not_know_is_not_free(tmp_path: Path) -> None:
    table = _table(set())
    table["nodes"] = [n for n in table["nodes"] if n["name"] != "gpu010"]
    s, _, _ = _collect(tmp_path, {**_all_up(), sm.NODES_JSON: json.dumps(table)})
    assert value(s, "gpucluster_slurm_unit_free_nodes", node_group="gpu", pod="pod002", unit="su0003") == 1
    assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group="gpu") == 8


@pytest.mark.parametrize("failing", ["nodes", "jobs", "sdiag"])
def test_a_failing_command_is_up_0_and_its_metrics_are_left_out(tmp_path: Path, failing: str) -> None:
    outputs = _all_up()
    argv = {"nodes": sm.NODES_JSON, "jobs": sm.JOBS, "sdiag": sm.SDIAG}[failing]
    outputs[argv] = None
    s, whys, _ = _collect(tmp_path, outputs)
    assert {src: value(s, "gpucluster_slurm_up", source=src) for src in sm.SOURCES} == \
        {src: float(src != failing) for src in sm.SOURCES}
    assert len(whys) == 1 and "Unable to contact" in whys[0]
    assert value(s, "gpucluster_slurm_last_run_timestamp_seconds") == 1795885357.25
    names = {name for name, _ in s}
    gone = {"nodes": {"gpucluster_slurm_nodes", "gpucluster_slurm_units_free", "gpucluster_slurm_unit_free_nodes"},
            "jobs": {"gpucluster_slurm_jobs", "gpucluster_slurm_jobs_pending"},
            "sdiag": {"gpucluster_slurm_sched_cycle_last_seconds"}}
    assert not names & gone[failing]
    assert all(names & g for k, g in gone.items() if k != failing)


def test_output_that_does_not_read_is_up_0(tmp_path: Path) -> None:
    s, whys, _ = _collect(tmp_path, {**_all_up(), sm.NODES_JSON: "<html>proxy error</html>"})
    assert value(s, "gpucluster_slurm_up", source="nodes") == 0 and "does not read" in whys[0]


def test_2205_reads_sinfo_where_scontrol_has_no_json(tmp_path: Path) -> None:
    outputs = {**_all_up(), sm.NODES_JSON: Exception("exit 1: scontrol: unrecognized option '--json'"),
               sm.NODES_JSON_2205: json.dumps(NODES_2205)}
    s, whys, _ = _collect(tmp_path, outputs)
    assert whys == [] and value(s, "gpucluster_slurm_nodes", state="draining") == 1
    assert value(s, "gpucluster_slurm_nodes_out_of_service", reason_class="operator") == 1
    assert value(s, "gpucluster_slurm_nodes_out_of_service", reason_class="slurm:not-responding") == 1
    assert value(s, "gpucluster_slurm_nodes_out_of_service", reason_class="gpc:mount-flash") == 1
    assert value(s, "gpucluster_slurm_records_skipped", source="nodes") == 3
    # scontrol failing for another reason (slurmctld down) is not retried with sinfo: one timeout, not two
    outputs[sm.NODES_JSON] = Exception("exit 1: Unable to contact slurm controller (connect failure)")
    s, whys, _ = _collect(tmp_path, outputs)
    assert value(s, "gpucluster_slurm_up", source="nodes") == 0


@pytest.mark.parametrize("plan", [None, {"units": "x"}, {"units": [{"unit": "su1", "hosts": "gpu[1-"}]},
                                  {"units": [{"unit": 3, "hosts": "gpu1"}]}, []],
                         ids=["missing", "not-a-list", "bad-hostlist", "not-a-string", "not-an-object"])
def test_a_plan_that_does_not_read_is_up_0_and_no_unit_metrics(tmp_path: Path, plan) -> None:
    s, whys, _ = _collect(tmp_path, _all_up(), plan)
    assert value(s, "gpucluster_slurm_up", source="plan") == 0 and value(s, "gpucluster_slurm_up", source="nodes") == 1
    assert len(whys) == 1
    assert not {name for name, _ in s} & {"gpucluster_slurm_units_free", "gpucluster_slurm_unit_free_nodes"}
    assert value(s, "gpucluster_slurm_nodes", state="idle") == 12


def test_the_whole_file_passes_promtool(tmp_path: Path) -> None:
    outputs = {**_all_up(), sm.NODES_JSON: json.dumps(NODES_2411)}
    _s, _whys, text = _collect(tmp_path, outputs)
    assert "evil_metric" not in {line.split("{")[0].split(" ")[0] for line in text.splitlines()}
    promtool_check(text)


def test_the_program_stands_alone_and_writes_the_file_whole(tmp_path: Path) -> None:
    """Run as the timer runs it: python3 without gpucluster (isolated mode), Slurm's commands from PATH (here
    stand-ins: slurmctld unreachable, so every source but the plan is up 0), the file renamed into place."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sinfo", "squeue", "sdiag"):
        (bin_dir / name).write_text("#!/bin/sh\necho 'Unable to contact slurm controller (connect failure)' >&2\n"
                                    "exit 1\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    out = tmp_path / "textfile" / "gpucluster_slurm.prom"
    out.parent.mkdir()
    out.write_text("stale\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    plan = str(tmp_path / "plan.json")
    res = subprocess.run([sys.executable, "-I", str(SCRIPT), "--output", str(out), "--plan", plan, "--timeout", "5"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("Unable to contact") == 3
    s = parse_exposition(out.read_text())
    assert [value(s, "gpucluster_slurm_up", source=src) for src in sm.SOURCES] == [0, 0, 0, 1]
    assert sorted(p.name for p in out.parent.iterdir()) == ["gpucluster_slurm.prom"]  # no temporary file left
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    # a folder it cannot write: exit 1 with the reason, the old file untouched
    res = subprocess.run([sys.executable, "-I", str(SCRIPT), "--output", str(tmp_path / "none" / "x.prom"),
                          "--plan", plan], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 1 and "none/x.prom" in res.stderr


def test_a_command_that_hangs_is_cut_at_its_timeout(tmp_path: Path) -> None:
    script = tmp_path / "sdiag"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{old}"
    try:
        text, why = sm.run_command(["sdiag"], 0.5)
    finally:
        os.environ["PATH"] = old
    assert text is None and "no answer within 0.5 s" in why
    assert sm.run_command(["no-such-command-here"], 1)[0] is None


# ---- the renderer ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("example", ["staging", "meta-24k-ib", "gb200-superpod", "colossus-200k"])
def test_slurm_metrics_json_holds_every_unit_and_domain_of_the_plan(example: str) -> None:
    """Each span's hosts, expanded by the exporter's own reader, are exactly the plan's members of that unit or
    domain, in plan order, labelled as the scrape targets are."""
    from gpucluster.render.metrics import label_runs
    from gpucluster.render.slurmunits import FILE, render_slurm_units

    cluster = cluster_example(example)
    plan = cluster.plan
    doc = json.loads(render_slurm_units(cluster)[FILE])
    assert doc["cluster"] == cluster.name
    assert [u["unit"] for u in doc["units"]] == [u.name for u in plan.units]
    for u, planned in zip(doc["units"], plan.units, strict=True):
        group = cluster.spec.group(planned.group)
        assert u["group"] == planned.group
        assert sm.expand(u["hosts"]) == [group.host(i) for i in range(planned.first, planned.first + planned.count)]
    assert [d["nvlink_domain"] for d in doc["nvlink_domains"]] == [d.name for d in plan.domains]
    for d, planned in zip(doc["nvlink_domains"], plan.domains, strict=True):
        assert set(sm.expand(d["hosts"])) == {h for h, dom in plan.domain_of_host.items() if dom is planned}
    # the pods and units are named as the targets' labels name them
    targets = {(labels.get("unit"), labels.get("pod", "")) for g in cluster.spec.fabric_groups
               for _f, _c, labels in label_runs(cluster, g)}
    assert {(u["unit"], u["pod"]) for u in doc["units"]} == targets


def test_no_slurm_metrics_json_without_metrics() -> None:
    from gpucluster.render.slurmunits import render_slurm_units

    cluster = cluster_example("staging")
    spec = cluster.spec.model_copy(update={"metrics": cluster.spec.metrics.model_copy(update={"enabled": False})})
    off = type(cluster)(cluster.loaded.model_copy(update={"spec": spec}), cluster.plan)
    assert render_slurm_units(off) == {}


def test_render_writes_it_and_diff_copies_it_to_the_controller_only() -> None:
    from gpucluster.diff.changes import _file_changes
    from gpucluster.render import render_all

    cluster = cluster_example("staging")
    assert "slurm-metrics.json" in render_all(cluster, cabling=False)
    (change,) = _file_changes("slurm-metrics.json", "a", "b", cluster, cluster, "22.05", ())
    assert change.cls == "none" and change.groups == ("slurm_controller",)


def test_all_idle_on_the_rendered_units_every_unit_is_free(tmp_path: Path) -> None:
    """The renderer's file read by the exporter: with every node of the plan idle, each group's units are all free
    and its largest block is every node of its units."""
    from gpucluster.render.slurmunits import FILE, render_slurm_units

    cluster = cluster_example("meta-24k-ib")
    (tmp_path / FILE).write_text(render_slurm_units(cluster)[FILE])
    hosts = list(cluster.plan.unit_of_host)
    table = {"errors": [], "nodes": [{"name": h, "state": ["IDLE"], "reason": ""} for h in hosts]}
    text, whys = sm.collect(fake_run({sm.NODES_JSON: json.dumps(table), sm.JOBS: "", sm.SDIAG: ""}),
                            str(tmp_path / FILE), 5, 1.0)
    s = parse_exposition(text)
    assert whys == []
    for g in cluster.spec.fabric_groups:
        units = [u for u in cluster.plan.units if u.group == g.name]
        assert value(s, "gpucluster_slurm_units_free", node_group=g.name) == len(units)
        assert value(s, "gpucluster_slurm_units_free_block_nodes", node_group=g.name) == sum(u.count for u in units)
