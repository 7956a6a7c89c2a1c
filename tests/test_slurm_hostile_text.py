"""Slurm's free text is data: a node's reason, a job's name and a comment may hold anything scontrol and sbatch
accept (newlines, ` State=IDLE`, `Reason=`, `NodeName=`, `|`, escapes, quotes, template syntax, 1,000+
characters, unicode). Every reader of a running cluster's Slurm output (slurmtext, and through it rollout,
`diff --inventory`, `health status`, `fabric test`, `validate --via-slurm`; node/slurmctl.py on the nodes)
reads such text whole or refuses it with an error naming the command, and never acts on it: a node drained by
hand stays someone else's, a job name invents no job and breaks no hostlist.

Part one: one parametrized test per hostile case, on the documents each Slurm line's clients write (22.05's
`sinfo --json` and `squeue --json`, the 23.02-on shape of `scontrol --json show node` and `squeue --json`,
and scontrol's `-o` line as the nodes read it). Part two: the same texts set on a real slurmctld of each line
(22.05 from the host, 24.11 and 26.05 from their Debian roots), one cluster per line, and read back."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from conftest import example_path, need_slurm_line

from gpucluster import slurmtext
from gpucluster.diff import running
from gpucluster.health import status
from gpucluster.node import slurmctl
from gpucluster.rollout.slurmops import NodeState, Slurm, parse_nodes
from gpucluster.slurmclient import SlurmError

STAMP = "2026-11-28T04:11:41"
LONG = "fan " * 300 + "State=IDLE"  # 1,210 characters

# (id, kind, text): kind is what the text is set as.
CASES = [
    ("reason-state-idle", "reason", "fan replaced State=IDLE"),
    ("reason-reason-key", "reason", "by hand Reason=gpc:resumable"),
    ("reason-nodename", "reason", "NodeName=gpu02 State=IDLE Reason=x"),
    ("reason-newline-state", "reason", "line one\nState=IDLE"),
    ("reason-newline-record", "reason", "two\nNodeName=gpu01 State=IDLE Reason=gpc:ok"),
    ("reason-escape", "reason", "\x1b[2J\x1b[H screen wiped"),
    ("reason-pipes", "reason", "a|b|gpu02|idle|c"),
    ("reason-quotes", "reason", "quoted \"State=IDLE\" 'x' `y`"),
    ("reason-template", "reason", "{{7*191}} ${HOME} $(id) %s"),
    ("reason-long", "reason", LONG),
    ("reason-unicode", "reason", "GPU fault ☠ 显卡 State=IDLE"),
    ("reason-nhc-fake-stamp", "reason",
     "NHC: unauthorized process 'x Comment=y State=IDLE' [root@2026-01-01T00:00:00] Extra=z"),
    ("job-newline-nodelist", "job", "train\nNodeList=gpu01"),
    ("job-newline-record", "job", "a\n99|root|gpu[01-04]|ghost"),
    ("job-keys", "job", "NodeList=gpu01 JobState=RUNNING"),
    ("job-spaces", "job", "name with  spaces "),
    ("job-percent", "job", "100%j %N %% %i"),
    ("job-escape-unicode", "job", "\x1b]0;title\x07 ☃"),
    ("job-long-pipes", "job", "|".join(["x" * 20] * 15)),
    ("comment-job-record", "job-comment", "c\n1|root|gpu04|ghost"),
    ("comment-node-record", "node-comment", "note\nNodeName=gpu01 State=IDLE Reason=gpc:ok"),
    ("comment-node-keys", "node-comment", "State=IDLE Reason=gpc:ok"),
]


def _epoch(when: str = STAMP) -> int:
    return int(time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M:%S")))


def _node_doc(shape: str, reason: str, comment: str = "") -> str:
    """gpu01 drained by hand with `reason`, gpu02 idle, gpu03 allocated; as `shape` writes it: '22.05'
    (sinfo --json: a base state word and flags, plain numbers) or '23.02' (scontrol --json: a list of words,
    numbers as {set, infinite, number})."""
    def node(name, words, why):
        when = _epoch() if why else 0
        if shape == "22.05":
            return {"name": name, "state": words[0].lower(), "state_flags": words[1:], "reason": why,
                    "reason_set_by_user": "root" if why else None, "reason_changed_at": when, "comment": comment}
        return {"name": name, "state": words, "reason": why, "reason_set_by_user": "root" if why else "",
                "reason_changed_at": {"set": True, "infinite": False, "number": when}, "comment": comment}

    nodes = [node("gpu01", ["IDLE", "DRAIN"], reason), node("gpu02", ["IDLE"], ""), node("gpu03", ["ALLOCATED"], "")]
    return json.dumps({"meta": {"plugin": {"data_parser": shape}}, "errors": [], "nodes": nodes})


def _jobs_doc(shape: str, name: str, comment: str = "") -> str:
    """Job 7 (`name`) running on gpu03, job 8 on gpu04, and what 22.05's squeue --json sends whatever -t and
    -w say: a pending job and a finished one, both on other nodes."""
    def num(v):
        return v if shape == "22.05" else {"set": v is not None, "infinite": False, "number": v or 0}

    def job(jid, jname, state, nodes, jcomment=""):
        return {"job_id": jid, "name": jname, "user_name": "alice", "nodes": nodes, "comment": jcomment,
                "job_state": state if shape == "22.05" else [state], "array_job_id": num(0),
                "array_task_id": num(None), "het_job_id": num(0), "het_job_offset": num(None)}

    jobs = [job(7, name, "RUNNING", "gpu03", comment), job(8, "plain", "RUNNING", "gpu04"),
            job(9, "queued", "PENDING", ""), job(6, "old", "COMPLETED", "gpu01")]
    return json.dumps({"meta": {}, "errors": [], "jobs": jobs})


def _o_line(reason: str, comment: str = "") -> str:
    """scontrol show node -o as 22.05 to 26.05 print it: a reason's first line, the stamp, its other lines
    after the stamp; a comment as it is (a newline in it ends the line)."""
    first, *more = reason.split("\n")
    line = (f"NodeName=gpu01 Arch=x86_64 OS=Linux 6.1 #1 SMP State=IDLE+DRAIN Partitions=gpu "
            f"Reason={first} [root@{STAMP}]" + "".join(f"        {m}" for m in more))
    return line + (f" Comment={comment}" if comment else "") + "\n"


def _runner(nodes: dict[str, str], jobs: str = "", old: bool = False):
    """A Slurm client stand-in: scontrol --json refused as 22.05 refuses it when `old`."""
    def run(cmd):
        cmd = list(cmd)
        if cmd[:2] == ["scontrol", "--json"]:
            if old:
                return subprocess.CompletedProcess(cmd, 1, "", "scontrol: unrecognized option '--json'\n")
            return subprocess.CompletedProcess(cmd, 0, nodes["23.02"], "")
        if cmd[:2] == ["sinfo", "--json"]:
            return subprocess.CompletedProcess(cmd, 0, nodes["22.05"], "")
        if cmd[:2] == ["squeue", "--json"]:
            return subprocess.CompletedProcess(cmd, 0, jobs, "")
        raise AssertionError(f"unexpected command {cmd}")
    return run


def _no_control(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


@pytest.mark.parametrize(("kind", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_text_is_read_whole_and_never_acted_on(kind: str, text: str) -> None:
    reason = text if kind == "reason" else "fan replaced, by hand"
    node_comment = text if kind == "node-comment" else ""
    nodes = {shape: _node_doc(shape, reason, node_comment) for shape in ("22.05", "23.02")}

    # the node table, in both shapes and through both commands: the reason whole, the node drained by hand
    for shape, doc in nodes.items():
        got = slurmtext.parse_nodes_json(doc)
        assert set(got) == {"gpu01", "gpu02", "gpu03"}, shape
        assert (got["gpu01"].state, got["gpu01"].reason, got["gpu01"].reason_user) == ("IDLE+DRAIN", reason, "root")
        assert got["gpu01"].reason_time == STAMP and got["gpu02"].state == "IDLE" and got["gpu02"].reason == ""
        assert parse_nodes(doc)["gpu01"] == NodeState("gpu01", frozenset({"IDLE", "DRAIN"}), reason)
    for old in (False, True):
        seen = Slurm(_runner(nodes, old=old)).nodes()
        assert seen["gpu01"].by_hand and seen["gpu01"].drained and seen["gpu01"].reason == reason
        assert not seen["gpu02"].out and seen["gpu03"].busy and set(seen) == {"gpu01", "gpu02", "gpu03"}

    # the node's own reading (scontrol show node -o): the state is Slurm's, the reason's first line is whole
    on_node = slurmctl.parse_nodes(_o_line(reason, node_comment))
    assert set(on_node) == {"gpu01"}
    assert on_node["gpu01"]["State"] == "IDLE+DRAIN" and on_node["gpu01"]["Partitions"] == "gpu"
    assert reason.split("\n")[0].startswith(on_node["gpu01"]["reason"]) and on_node["gpu01"]["reason"]
    assert not on_node["gpu01"]["reason"].startswith("gpc:")

    # health status: drained by an operator, the report one line per reason and free of control characters
    rows = status.merge(nodes["22.05"], "", {}, None, ["gpu01", "gpu02"])
    assert (rows[0].drained, rows[0].by, rows[0].reason) == (True, "operator", reason)
    assert not rows[1].drained and rows[1].by == ""
    report = status.format_status(rows, now=0)
    assert _no_control(report) and report.count("drained by hand: never resumed") == 1
    assert report.startswith("drained: 1 of 2 nodes\n")
    assert json.loads(status.as_json(rows))[0]["reason"] == reason

    # the queue: exactly the running jobs, the name whole, the hostlist Slurm's
    name = text if kind == "job" else "plain-name"
    comment = text if kind == "job-comment" else ""
    for shape in ("22.05", "23.02"):
        run = _runner(nodes, _jobs_doc(shape, name, comment))
        jobs, why = running.running_jobs(run)
        assert why is None and [j.id for j in jobs] == ["7", "8"], shape
        assert (jobs[0].name, jobs[0].nodes, jobs[0].nodelist, jobs[0].user) == (name, {"gpu03"}, "gpu03", "alice")
        assert jobs[0].as_json() == {"id": "7", "user": "alice", "name": name, "nodes": "gpu03"}
        assert running.hit(["gpu[01-02]"], jobs) == [] and running.hit(["gpu03"], jobs) == [jobs[0]]
        assert Slurm(run).running_jobs(["gpu03"]) == ["7"] and Slurm(run).running_jobs(["gpu01"]) == []


def _doc(**over) -> str:
    base = json.loads(_node_doc("23.02", "r"))
    base.update(over)
    return json.dumps(base)


BAD_NODES = [
    ("not-json", "NodeName=gpu01 State=IDLE", "not JSON"),
    ("truncated", _node_doc("23.02", "r")[:-20], "not JSON"),
    ("a-list", "[]", "a JSON list, not an object"),
    ("slurm-error", _doc(errors=[{"description": "Unable to contact slurm controller"}]), "Unable to contact"),
    ("no-nodes", json.dumps({"meta": {}, "errors": []}), "no 'nodes' list"),
    ("state-sentence", _doc(nodes=[{"name": "gpu01", "state": ["IDLE State=IDLE"]}]), "not a Slurm state word"),
    ("name-with-space", _doc(nodes=[{"name": "gpu01 State=IDLE", "state": ["IDLE"]}]), "not a node name"),
    ("twice", _doc(nodes=[{"name": "gpu01", "state": ["IDLE"]}] * 2), "listed twice"),
    ("reason-number", _doc(nodes=[{"name": "gpu01", "state": ["IDLE"], "reason": 3}]), "'reason' is int"),
]


@pytest.mark.parametrize(("text", "what"), [c[1:] for c in BAD_NODES], ids=[c[0] for c in BAD_NODES])
def test_a_node_table_that_does_not_fit_is_an_error_naming_the_command(text: str, what: str) -> None:
    with pytest.raises(slurmtext.SlurmOutputError, match=r"^scontrol --json show node: .*" + what):
        slurmtext.parse_nodes_json(text)
    with pytest.raises(SlurmError, match=what):  # the rollout stops with the command's error, no traceback
        Slurm(_runner({"23.02": text, "22.05": text})).nodes()


BAD_JOBS = [
    ("bad-hostlist", '{"jobs": [{"job_id": 7, "nodes": "gpu[01-", "job_state": "RUNNING"}]}', "not a hostlist"),
    ("name-in-nodes", '{"jobs": [{"job_id": 7, "nodes": "gpu01 x", "job_state": "RUNNING"}]}', "not a node name"),
    ("no-id", '{"jobs": [{"nodes": "gpu01", "job_state": "RUNNING"}]}', "no job_id"),
    ("id-text", '{"jobs": [{"job_id": "7\\n8", "nodes": "gpu01", "job_state": "RUNNING"}]}', "not a number"),
    ("old-text", "7|root|gpu01|x\n", "not JSON"),
]


@pytest.mark.parametrize(("text", "what"), [c[1:] for c in BAD_JOBS], ids=[c[0] for c in BAD_JOBS])
def test_a_queue_that_does_not_fit_is_said_by_diff_not_guessed(text: str, what: str) -> None:
    jobs, why = running.running_jobs(lambda cmd: subprocess.CompletedProcess(cmd, 0, text, ""))
    assert jobs is None and why.startswith("squeue --json -t ") and what in why
    with pytest.raises(SlurmError, match=what):
        Slurm(lambda cmd: subprocess.CompletedProcess(cmd, 0, text, "")).running_jobs(["gpu01"])


@pytest.mark.parametrize("line", ["gpu01 idle extra", "gpu01", "gpu01 State=IDLE", "gpu01\tidle", "gpu 01 idle"])
def test_sinfo_node_states_take_only_a_name_and_a_compact_state(line: str) -> None:
    assert slurmtext.parse_node_states("gpu02 drain*\ngpu03 mix-\n") == {"gpu02": "drain*", "gpu03": "mix-"}
    with pytest.raises(slurmtext.SlurmOutputError, match=r"^sinfo -h -N -o %N %t: line 2: .* is not 'NODE STATE'"):
        slurmtext.parse_node_states("gpu02 idle\n" + line + "\n")


# ---- part two: real slurmctld of each line ---------------------------------------------------------------

LINES = ("22.05", "24.11", "26.05")
REASONS = [c[2] for c in CASES if c[1] == "reason"]
# the first job names run (one per node of the staging spec), the others wait, held
JOB_NAMES = [c[2] for c in CASES if c[1] == "job"]


@pytest.fixture(scope="module", params=LINES)
def real(request, tmp_path_factory) -> Iterator:
    from gpucluster.cluster import load_cluster
    from gpucluster.emulate import SlurmCluster
    from gpucluster.render import render_all, write_outputs

    line = request.param
    need_slurm_line(line)
    tmp = tmp_path_factory.mktemp(f"hostile-{line}")
    spec = tmp / "staging.yaml"
    spec.write_text(example_path("staging").read_text().replace('version: "22.05"', f'version: "{line}"', 1))
    cluster = load_cluster(spec)
    write_outputs(render_all(cluster, cabling=False), tmp / "conf")
    nodes = list(cluster.spec.group("gpu").hosts)
    t0 = time.monotonic()
    with SlurmCluster(tmp / "conf", line=line, slurmd_nodes=nodes, start_timeout=120, reboot_delay=0.5) as sc:
        yield line, sc, cluster, nodes, tmp
    print(f"\nSlurm {line}: hostile text on real daemons took {time.monotonic() - t0:.1f} s")



@pytest.mark.slurm
@pytest.mark.emulate
def test_real_slurm_hands_back_hostile_text_whole(real) -> None:
    from gpucluster.rollout import state as st
    from gpucluster.rollout.engine import Rollout, new_state
    from gpucluster.rollout.waves import plan_waves, topology_units

    line, sc, cluster, nodes, tmp = real
    run = lambda cmd: sc.run(list(cmd))  # noqa: E731
    slurm = Slurm(run)
    hand, other = nodes[0], nodes[1]
    # every hostile reason, set by hand on one node, read back whole by each reader
    for reason in REASONS:
        sc.scontrol("update", f"nodename={hand}", "state=DRAIN", f"reason={reason}")
        seen = slurm.nodes()
        assert seen[hand].reason == reason and seen[hand].by_hand and seen[hand].drained, (line, reason)
        assert not seen[other].out, (line, seen[other])
        shown = sc.run(["sh", "-c", slurmtext.NODES_SH])
        assert shown.returncode == 0, shown.stderr
        row = status.merge(shown.stdout, "", {}, None, [hand])[0]
        assert (row.reason, row.by, row.drained, row.reason_user) == (reason, "operator", True, "root"), line
        assert _no_control(status.format_status([row], now=0))
        on_node = slurmctl.parse_nodes(sc.run(["scontrol", "show", "node", "-o", hand]).stdout)
        assert "DRAIN" in on_node[hand]["State"].split("+") and set(on_node) == {hand}, (line, on_node)
        assert reason.split("\n")[0].startswith(on_node[hand]["reason"]) and on_node[hand]["reason"]
        states = slurmtext.parse_node_states(sc.run([*slurmtext.NODE_STATES, "-n", ",".join(nodes)]).stdout)
        assert states[hand].startswith("drain") and set(states) == set(nodes)
    # a rollout over every node leaves the hand-drained one (reason: ` State=IDLE`) drained, with its reason
    sc.scontrol("update", f"nodename={hand}", "state=DRAIN", f"reason={REASONS[0]}")
    waves = plan_waves(topology_units(cluster.plan, "leaf", nodes), len(nodes))
    s = new_state("h1", cluster=cluster.spec.name, source="", change="drain", by="leaf", max_unavailable=len(nodes),
                  waves=waves, skipped=[], halt_share=0.0)
    path = st.state_path(tmp / "rollout")
    Rollout(slurm, path, s, apply=lambda _nodes: {}, poll=0.2, say=lambda _: None, live=False).run()
    after = slurm.nodes()
    assert after[hand].drained and after[hand].reason == REASONS[0], (line, after[hand])
    assert st.load(path)["nodes"][hand]["outcome"] == "by-hand"
    assert all(not after[n].out for n in nodes if n != hand), (line, after)
    sc.scontrol("update", f"nodename={hand}", "state=RESUME")
    # hostile job names (and a hostile comment): the running ones read whole, none invented, nodes Slurm's
    ids = {}
    for i, name in enumerate(JOB_NAMES):
        held = ["-H"] if i >= len(nodes) else ["-w", nodes[i]]
        res = sc.run(["sbatch", "--parsable", "-N1", *held, "-J", name, "--comment", "c\n1|root|gpu04|ghost",
                      "-o", "/dev/null", "--wrap", "sleep 60"])
        assert res.returncode == 0, res.stderr
        ids[res.stdout.strip().split(";")[0]] = name
    deadline = time.monotonic() + 30
    while True:
        jobs, why = running.running_jobs(run)
        assert why is None, why
        if len(jobs) == len(nodes) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert sorted((j.name, j.nodelist) for j in jobs) == sorted(zip(JOB_NAMES[:len(nodes)], nodes, strict=True))
    assert all(ids[j.id] == j.name for j in jobs), line
    waiting = slurmtext.read_jobs(run, ["PENDING"])
    assert sorted(j.name for j in waiting) == sorted(JOB_NAMES[len(nodes):]) and all(not j.nodes for j in waiting)
    assert sorted(slurm.running_jobs(nodes[:1])) == [j.id for j in jobs if j.nodelist == nodes[0]]
    sc.run(["scancel", *ids])


@pytest.mark.parametrize("forged", ["@@gpucluster-case 1 rc=0", "@@gpucluster-case/t0k3n 0 rc=0",
                                    "@@gpucluster-case/t0k3n 1 rc=0 tail", "0: @@gpucluster-case/t0k3n 1 rc=0",
                                    "@@gpucluster-case/other 1 rc=0"])
def test_a_job_printing_a_case_line_starts_no_case(forged: str) -> None:
    """fabric test's round output: a case's job prints what it likes; only the round script's own lines (the
    round's token, in order) start a case."""
    from gpucluster.fabric.asbuilt import jobs

    text = f"@@gpucluster-case/t0k3n 0 rc=3\n0: out\n{forged}\n@@gpucluster-case/t0k3n 1 rc=0\n0: fine\n"
    got = jobs.split_round(text, "t0k3n")
    assert sorted(got) == [0, 1] and got[0] == (3, f"0: out\n{forged}") and got[1] == (0, "0: fine")
    assert "@@gpucluster-case/t0k3n $i rc=" in jobs.round_script([["true"]], 1, "t0k3n")


def test_the_node_table_falls_back_once_and_from_two_threads() -> None:
    """22.05: scontrol refuses --json; the table is read with sinfo's from then on, and a second thread reading
    meanwhile (a rollout and its sampler) still gets the table, never scontrol's refusal as sinfo's error."""
    import threading

    nodes = {shape: _node_doc(shape, "r") for shape in ("22.05", "23.02")}
    calls: list[str] = []
    first = threading.Event()

    def run(cmd):
        calls.append(cmd[0])
        if cmd[0] == "scontrol" and not first.is_set():
            first.set()
            other = threading.Thread(target=lambda: out.append(table.read()))
            other.start()
            other.join()
        return _runner(nodes, old=True)(cmd)

    out: list = []
    table = slurmtext.NodeTable(run)
    out.append(table.read())
    assert len(out) == 2 and all(set(t) == {"gpu01", "gpu02", "gpu03"} for t in out)
    assert table.command == slurmtext.NODES_JSON_2205 and calls.count("scontrol") == 2
    table.read()
    assert calls.count("scontrol") == 2 and calls.count("sinfo") == 3
