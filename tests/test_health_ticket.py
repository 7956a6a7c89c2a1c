"""`gpucluster health ticket`: a repair ticket names the node's rack, U, slot and cables exactly as the plan has them
(checked against the plan's own rack plan and cabling map, not copied constants), carries Slurm's state and the
node's failing checks, keeps hostile text inert in Markdown, refuses a webhook URL that is not http(s), and POSTs
to a receiver on loopback (the only address these tests reach)."""

from __future__ import annotations

import calendar
import json
import os
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import cluster_example, example_path
from markdown_it import MarkdownIt

from gpucluster.cli import main
from gpucluster.fabric.cabling import CABLING_HEADER, cabling_rows
from gpucluster.health import remote, status, ticket
from gpucluster.report.racks import build_racks

HOSTILE = "gpc:op: <script>alert(1)</script>\n# Pwned\n[click](http://evil.example) ``` `x` | **bold** ![i](x.png)"


def plan_rows(cluster, node: str) -> list[dict]:
    """The node's rows of the plan's whole cabling map (what `render` writes as cabling.csv)."""
    keys = CABLING_HEADER.strip().split(",")
    rows = [dict(zip(keys, line.split(","), strict=True)) for chunk in cabling_rows(cluster.plan)
            for line in chunk.splitlines()]
    return [r for r in rows if node in (r["a_device"], r["b_device"])]


def plan_place(cluster, node: str) -> tuple[str, int, tuple[int, int], int]:
    """(rack, slot, (lowest U, highest U), rack height) from the plan's rack plan: the rack whose hosts hold the
    node; slots from the bottom, as the elevation draws them."""
    group = cluster.group_of_host[node]
    i = group.hosts.index(node)
    racks = build_racks(cluster.plan).racks
    rack = next(r for r in racks if r.group == group.name and r.index <= i < r.index + r.nodes)
    return rack.name, i - rack.index + 1, rack.node_u(i - rack.index), rack.height


STAGING = cluster_example("staging")


def _sample(name: str) -> list[tuple[str, str]]:
    """A GPU node of each GPU group of a large example: the first, one in the middle, the last."""
    c = cluster_example(name)
    out = []
    for g in c.spec.node_groups:
        if g.gpu:
            out += [(name, g.hosts[k]) for k in dict.fromkeys((0, g.count // 2 + 1, g.count - 1))]
    return out


NODES = [("staging", h) for h in STAGING.contract_groups["slurm_compute"]] + \
    _sample("meta-24k-ib") + _sample("gb200-superpod")


@pytest.mark.parametrize(("example", "node"), NODES, ids=[f"{e}-{n}" for e, n in NODES])
def test_the_ticket_places_the_node_and_its_cables_as_the_plan_does(example, node) -> None:
    cluster = cluster_example(example)
    plan = ticket.node_plan(cluster, node, {"gpucluster_serial": "SN-1"})
    doc = ticket.build(plan, {})
    rack, slot, (lowest, highest), height = plan_place(cluster, node)
    w = doc["where"]
    assert (w["rack"], w["slot"], w["u_lowest"], w["u_highest"], w["rack_height_u"]) == (rack, slot, lowest, highest,
                                                                                         height)
    assert w["u"] == (f"U {lowest}-{highest}" if highest > lowest else f"U {lowest}")
    assert doc["where"]["rack"] == cluster.host_vars(cluster.group_of_host[node],
                                                     cluster.group_of_host[node].hosts.index(node))["gpucluster_rack"]
    rows = plan_rows(cluster, node)
    assert rows and doc["cables"] == rows  # both ends of every cable, in the map's order
    assert doc["where"]["serial"] == "SN-1" and doc["where"]["group"] == cluster.group_of_host[node].name
    page = ticket.markdown(doc)
    assert f"**rack** `{rack}`, **{w['u']}** (a {height}U rack), **slot** {slot} of" in page
    for r in rows:
        assert f"`{r['a_device']}` port `{r['a_port']}` to `{r['b_device']}` port `{r['b_port']}`" in page


def test_a_node_the_plan_does_not_have_is_refused_with_a_suggestion() -> None:
    from gpucluster.errors import UsageError

    with pytest.raises(UsageError, match=r"not a node of the cluster staging.*did you mean 'gpu01'"):
        ticket.node_plan(STAGING, "gpu1")


def state_file(reason: str = "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot") -> dict:
    event = {"kind": "xid", "code": 79, "device": "0000:3b:00.0", "class": "xid79", "action": "reboot",
             "what": "GPU has fallen off the bus"}
    return {"node": "gpu01", "started": 1764336000.5, "action": "drain", "why": "gpu-xid failed", "ladder": "reboot",
            "checks": {"gpu-xid": {"ok": False, "message": reason, "since": 1764335700,
                                   "data": {"open": [event], "recent": [event], "position": {"boot": "x"}}},
                       "munge": {"ok": True, "message": "munge ok", "since": 1764300000}}}


def test_the_ticket_carries_slurms_verdict_and_the_failing_checks() -> None:
    slurm = {"state": "IDLE+DRAIN", "reason": "gpc:gpu-xid: XID 79", "reason_user": "root",
             "reason_time": "2026-11-28T13:22:07"}
    doc = ticket.build(ticket.node_plan(STAGING, "gpu01"), {"slurm": slurm, "health": state_file(), "made": 1})
    assert doc["slurm"] == {**slurm, "error": None}
    h = doc["health"]
    assert h["ladder"] == "reboot" and h["last_run"] == "2025-11-28T13:20:00Z"
    assert h["failing"] == [{"check": "gpu-xid", "message": state_file()["checks"]["gpu-xid"]["message"],
                             "since": "2025-11-28T13:15:00Z", "not_run": False}]
    assert h["passing"] == ["munge"] and h["xid_open"][0]["code"] == 79 and "position" not in json.dumps(h)
    page = ticket.markdown(doc)
    assert "`XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot`" in page
    assert "**GPU error ladder**: `reboot`" in page


@pytest.mark.parametrize("where", ["reason", "message", "node"])
def test_hostile_text_comes_out_inert_in_markdown(where) -> None:
    plan = ticket.node_plan(STAGING, "gpu02")
    if where == "node":
        plan = {**plan, "node": HOSTILE}
    slurm = {"state": "DRAIN", "reason": HOSTILE if where == "reason" else "gpc:x"}
    health = state_file(HOSTILE if where == "message" else "fine")
    page = ticket.markdown(ticket.build(plan, {"slurm": slurm, "health": health}))
    tokens = MarkdownIt("commonmark").parse(page)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert len(headings) == 4 and headings[1:] == ["Where", "What failed", "Cables to check"]  # no "# Pwned"
    html = MarkdownIt("commonmark").render(page)
    assert "<script>" not in html and "<a " not in html and "<img" not in html and "<strong>bold" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\n# Pwned" in html  # whole, as text, in one code span


def test_a_code_span_holds_any_run_of_backticks() -> None:
    for text in ["`", "``", "a ``` b", "` x `", " ", "x`"]:
        inline = MarkdownIt("commonmark").parseInline(ticket.code(text))[0].children
        assert [t.type for t in inline] == ["code_inline"] and inline[0].content == text, text


# ---- the command: an inventory on disk, Slurm and the node stood in for, a webhook on loopback ------------------

class FakeClient:
    """slurmclient.Client: the controller answers the node table, the node its state file."""

    calls: ClassVar[list] = []

    def __init__(self, host, timeout=0):
        self.where = getattr(host, "name", "?")

    def check(self, argv):
        FakeClient.calls.append(("check", self.where, list(argv)))
        assert list(argv) == status.SHOW_NODES
        node = {"name": "gpu01", "state": "idle", "state_flags": ["DRAIN"], "reason": "gpc:gpu-xid: XID 79",
                "reason_set_by_user": "root", "reason_changed_at": 0}
        return subprocess.CompletedProcess(argv, 0, json.dumps({"meta": {}, "errors": [], "nodes": [node]}), "")

    def __call__(self, argv):
        FakeClient.calls.append(("call", self.where, list(argv)))
        return subprocess.CompletedProcess(argv, 0, json.dumps(state_file()), "")


@pytest.fixture
def inventory(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "inv"
    folder.mkdir()
    spec = example_path("staging").resolve()
    (folder / "hosts.yml").write_text(
        "all:\n"
        f"  vars: {{gpucluster_cluster: staging, gpucluster_spec: '{spec}'}}\n"
        "  children:\n"
        "    slurm_controller: {hosts: {ctl01: {}}}\n"
        "    slurm_compute: {hosts: {gpu01: {gpucluster_serial: 'SN-0001'}, gpu02: {}}}\n")
    monkeypatch.setattr(remote, "Client", FakeClient)
    FakeClient.calls = []
    return folder


def test_the_command_writes_the_ticket_atomically_0644(inventory, tmp_path, capsys) -> None:
    out = tmp_path / "gpu01.json"
    old = os.umask(0o077)  # 0644 whatever the umask: the ticket is for people to read
    try:
        assert main(["health", "ticket", str(inventory), "gpu01", "--format", "json", "-o", str(out)]) == 0
    finally:
        os.umask(old)
    doc = json.loads(out.read_text())
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert doc["where"]["serial"] == "SN-0001" and doc["slurm"]["state"] == "IDLE+DRAIN"
    assert doc["cables"] == plan_rows(STAGING, "gpu01") and doc["health"]["ladder"] == "reboot"
    assert ("check", "ctl01", status.SHOW_NODES) in FakeClient.calls
    assert ("call", "gpu01", ["cat", "/var/lib/gpucluster/health/state.json"]) in FakeClient.calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu01.json", "inv"]  # no temporary file left


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://tickets.example.org/x", "tickets.example.org/hook",
                                 "http://", "javascript:alert(1)"])
def test_a_webhook_that_is_not_http_is_refused_with_exit_2(inventory, tmp_path, capsys, url) -> None:
    out = tmp_path / "t.md"
    assert main(["health", "ticket", str(inventory), "gpu01", "-o", str(out), "--webhook", url]) == 2
    err = capsys.readouterr().err
    assert "--webhook" in err and "http:// or https://" in err and "e.g. --webhook https://" in err
    assert "Traceback" not in err and not out.exists() and FakeClient.calls == []  # refused before any work


def test_the_refusal_has_no_traceback_from_the_shell(tmp_path) -> None:
    import sys

    run = subprocess.run([sys.executable, "-m", "gpucluster.cli", "health", "ticket", str(tmp_path), "gpu01",
                          "--webhook", "file:///etc/passwd"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--webhook" in run.stderr and "Traceback" not in run.stderr


class Receiver(BaseHTTPRequestHandler):
    got: ClassVar[list] = []
    answer = 200

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.got.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(Receiver.answer)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    Receiver.got = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/gpucluster"
    server.shutdown()
    server.server_close()


def test_the_webhook_gets_the_json_ticket(inventory, tmp_path, receiver, capsys) -> None:
    Receiver.answer = 200
    out = tmp_path / "gpu01.md"
    assert main(["health", "ticket", str(inventory), "gpu01", "-o", str(out), "--webhook", receiver, "--json"]) == 0
    [(path, kind, doc)] = Receiver.got
    assert path == "/hooks/gpucluster" and kind == "application/json"
    assert doc == json.loads(capsys.readouterr().out)["ticket"]
    assert doc["node"] == "gpu01" and doc["where"]["rack"] == plan_place(STAGING, "gpu01")[0]
    assert out.read_text() == ticket.markdown(doc)


def test_a_failing_post_exits_1_after_the_file_is_written(inventory, tmp_path, receiver, capsys) -> None:
    Receiver.answer = 500
    out = tmp_path / "gpu01.md"
    assert main(["health", "ticket", str(inventory), "gpu01", "-o", str(out), "--webhook", receiver]) == 1
    assert "# Repair ticket: `gpu01`" in out.read_text() and len(Receiver.got) == 1
    assert "--webhook" in capsys.readouterr().err


# ---- docs/health.md's example is this rendering -----------------------------------------------------------------

def _t(s: str) -> int:
    return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%S"))


_EVENT = {"kind": "xid", "code": 79, "device": "0000:3b:00.0", "class": "xid79", "action": "reboot",
          "what": "GPU has fallen off the bus"}
EXAMPLE_EVIDENCE = {
    "made": _t("2026-11-28T13:40:12"),
    "slurm": {"state": "IDLE+DRAIN", "reason": "gpc:gpu-xid: XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): "
              "reboot", "reason_user": "root", "reason_time": "2026-11-28T13:22:07"},
    "health": {"started": _t("2026-11-28T13:37:05"), "action": "none", "why": "still drained for gpu-xid",
               "ladder": "reboot",
               "checks": {"gpu-xid": {"ok": False, "since": _t("2026-11-28T13:22:05"),
                                      "message": "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot",
                                      "data": {"open": [_EVENT], "recent": [_EVENT]}},
                          "gpu-count": {"ok": False, "message": "3 of 4 GPUs (nvidia-smi)",
                                        "since": _t("2026-11-28T13:22:05")},
                          **{n: {"ok": True} for n in ("munge", "gpu-ecc", "hca-ports", "link-flap", "mount-flash",
                                                       "disk-tmp", "disk-spool")}}},
}


def test_the_docs_example_is_the_staging_ticket_rendered() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "health.md").read_text()
    shown = text.split("~~~~markdown\n", 1)[1].split("~~~~\n", 1)[0]
    doc = ticket.build(ticket.node_plan(STAGING, "gpu03", {"gpucluster_serial": "S4RN1234567"}), EXAMPLE_EVIDENCE)
    assert shown == ticket.markdown(doc)
