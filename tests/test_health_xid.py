"""GPU error classes from the kernel log (node/xid.py): the table against the catalogue it cites, the parser on the
kernel's own line formats (NVIDIA Xid, NVSwitch SXid, amdgpu RAS and resets), hostile text as data, the position
"since the last run" (a text file: inode + offset; /dev/kmsg: boot id + sequence number), the site's overrides, the
events that stay open until a reboot, and the gpu-xid check through the runner (tests/test_health_runner.py's node).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from test_health_runner import node  # noqa: F401 - the runner fixture, shared

from gpucluster.node import checks, xid

X79 = "[ 8734.123456] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
X13 = ("[ 912.000001] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
       "(GPC 7, TPC 0, SM 1): Out Of Range Address")

# ---------------------------------------------------------------- the table

# NVIDIA's immediate action (the catalogue's "Resolution Bucket") -> the ladder's rung (xid.py says why).
BUCKET = {"RESET_GPU": "reboot", "RESTART_BM": "reboot", "RESTART_APP": "record", "IGNORE": "record"}


@pytest.mark.parametrize("code", sorted(xid.XIDS))
def test_each_xid_row_follows_the_bucket_its_source_names(code: int) -> None:
    action, what, source = xid.XIDS[code]
    assert action in xid.LADDER and what and xid.CATALOG in source
    named = re.search(r": ([A-Z][A-Z_0-9]+)", source)
    bucket = named.group(1) if named else None
    assert bucket or len(source) > len(xid.CATALOG) + 40, f"XID {code}: no bucket, and no words for why"
    if bucket in BUCKET and action != "service":  # service: the catalogue routes the fault to an RMA (said in source)
        assert action == BUCKET[bucket], f"XID {code}: {bucket} is {BUCKET[bucket]}, the table says {action}"
    if action == "service":
        assert "CONTACT_SUPPORT" in source


@pytest.mark.parametrize("code", [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 74, 79, 92, 94, 95, 119, 120, 140, 154])
def test_the_common_xids_are_in_the_table(code: int) -> None:
    assert code in xid.XIDS


@pytest.mark.parametrize(("key", "action"), [
    (79, "reboot"), (48, "reboot"), (95, "reboot"), (119, "reboot"), (64, "service"), (13, "record"), (31, "record"),
    (43, "record"), (63, "record"), (94, "record"), (92, "record"), (4242, "record"), ("sxid-fatal", "reboot"),
    ("sxid-non-fatal", "record"), ("amdgpu-reset", "record"), ("amdgpu-bad-pages", "service"),
])
def test_table_lookup(key, action: str) -> None:
    assert xid.row(key)[0] == action


@pytest.mark.parametrize("key", sorted(xid.CLASSES))
def test_each_class_row_has_a_rung_and_a_source(key: str) -> None:
    action, what, source = xid.CLASSES[key]
    assert action in xid.LADDER and what and len(source) > 20


def test_overrides_replace_rows_and_say_so() -> None:
    assert xid.row(79, {"79": "record"})[0] == "record"
    assert xid.row(13, {"13": "drain"}) == ("drain", "Graphics Engine Exception",
                                             "health.xid_actions (the table: record)")
    assert xid.row(13, {"13": "explode"})[0] == "record"  # not a rung: the table's
    assert xid.row(43, {"79": "service"})[0] == "record"  # another XID's override


# ---------------------------------------------------------------- the parser

LINES = {
    "xid 79, dmesg": (X79, "xid79", "reboot", "0000:3b:00.0"),
    "xid 63, syslog": ("Nov 28 10:02:11 gpu07 kernel: NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New "
                       "row marked for remapping, reset gpu to activate.", "xid63", "record", "0000:10:1c.0"),
    "xid 13": (X13, "xid13", "record", "0000:cb:00.0"),
    "xid 48": ("NVRM: Xid (PCI:0000:9b:00): 48, pid=1234, name=python, An uncorrectable double bit error (DBE) has "
               "been detected on GPU in the framebuffer at partition 1, subpartition 0.", "xid48", "reboot",
               "0000:9b:00.0"),
    "xid 94": ("NVRM: Xid (PCI:0000:ca:00): 94, pid=2314, name=python3, Contained: CE User Channel (0x9). RST: No, "
               "D-RST: No", "xid94", "record", "0000:ca:00.0"),
    "xid 95": ("NVRM: Xid (PCI:0000:ca:00): 95, pid=2314, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No",
               "xid95", "reboot", "0000:ca:00.0"),
    "xid 119": ("NVRM: Xid (PCI:0000:45:00): 119, pid=12345, name=nvidia-smi, Timeout after 6s of waiting for RPC "
                "response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).", "xid119",
                "reboot", "0000:45:00.0"),
    "xid 154 node reboot": ("NVRM: Xid (PCI:0000:ca:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
                            "(Node Reboot Required)", "xid154-node-reboot", "reboot", "0000:ca:00.0"),
    "xid 154 none": ("NVRM: Xid (PCI:0000:ca:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) "
                     "to 0x0 (None)", "xid154-none", "record", "0000:ca:00.0"),
    "xid, old format without PCI:": ("NVRM: Xid (0000:01:00): 62, pid=1, name=x, 0000(0000) 00000000 00000000",
                                     "xid62", "reboot", "0000:01:00.0"),
    "sxid fatal": ("nvidia-nvswitch3: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 44 sourcetrack timeout error",
                   "sxid-fatal", "reboot", "0000:07:00.0"),
    "sxid non-fatal": ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Non-fatal, Link 32 LTSSM Fault Up",
                       "sxid-non-fatal", "record", "0000:05:00.0"),
    "amdgpu reset": ("[ 501.2] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!", "amdgpu-reset", "record",
                     "0000:c1:00.0"),
    "amdgpu reset failed": ("amdgpu 0000:c1:00.0: amdgpu: GPU reset(2) failed", "amdgpu-reset-failed", "reboot",
                            "0000:c1:00.0"),
    "amdgpu uncorrectable": ("amdgpu 0000:0b:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block",
                             "amdgpu-uncorrectable", "reboot", "0000:0b:00.0"),
    "amdgpu uncorrectable, new": ("amdgpu 0000:c1:00.0: amdgpu: {12} socket: 0, die: 1, 3 new uncorrectable "
                                  "hardware errors detected in umc block", "amdgpu-uncorrectable", "reboot",
                                  "0000:c1:00.0"),
    "amdgpu fatal": ("amdgpu 0000:c1:00.0: amdgpu: uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!",
                     "amdgpu-fatal", "reboot", "0000:c1:00.0"),
    "amdgpu bad pages": ("amdgpu 0000:c1:00.0: amdgpu: RAS records:2048 exceed threshold:512, GPU will not be "
                         "initialized. Replace this GPU or increase the threshold", "amdgpu-bad-pages", "service",
                         "0000:c1:00.0"),
}


@pytest.mark.parametrize("case", LINES.values(), ids=LINES.keys())
def test_kernel_lines_are_classified(case) -> None:
    line, cls, action, dev = case
    event = xid.classify(line)
    assert (event["class"], event["action"], event["device"]) == (cls, action, dev)


@pytest.mark.parametrize("line", [
    "amdgpu 0000:c3:00.0: amdgpu: no uncorrectable hardware errors detected in umc block",
    "amdgpu 0000:c3:00.0: amdgpu: 0 uncorrectable hardware errors detected in umc block",
    "amdgpu 0000:0b:00.0: amdgpu: 1048560 correctable hardware errors detected in umc block",
    "amdgpu 0000:c1:00.0: amdgpu: GPU reset(2) succeeded!",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05",
    "NVRM: GPU at PCI:0000:3b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "NVRM: Xid (PCI:0000:3b:00): 999999, six digits are no XID",
    "NVRM: Xid (PCI:zzzz:3b:00): 79, not an address",
])
def test_other_lines_are_no_gpu_error(line: str) -> None:
    assert xid.classify(line) is None


def test_the_message_says_the_xid_the_address_the_tables_words_and_the_rung() -> None:
    assert xid.describe(xid.classify(X79)) == "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot"


# ---------------------------------------------------------------- hostile text is data

HOSTILE = [
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name={__import__('os').system('reboot')}, %s%n {0.__class__} $(reboot)",
    "NVRM: Xid (PCI:0000:3b:00): 79, \x1b[31mred\x1b[0m `rm -rf /` ${IFS}; DROP TABLE nodes; " + "A" * 100_000,
]


@pytest.mark.parametrize("line", HOSTILE, ids=["format-and-code", "escapes-and-a-long-line"])
def test_hostile_text_in_a_line_never_reaches_the_message_or_the_state(line: str) -> None:
    event = xid.classify(line)
    said = xid.describe(event)
    assert said == "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot"
    kept = json.dumps(event)
    for bad in ("import", "reboot')", "%n", "__class__", "\x1b", "rm -rf", "DROP", "AAAA"):
        assert bad not in kept


def test_a_process_name_spelling_another_xid_does_not_change_the_first() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"
    assert xid.classify(line)["code"] == 13


# ---------------------------------------------------------------- since the last run: a text file


def test_a_file_is_read_from_where_the_last_run_stopped(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X13}\n")
    ok, message, data = xid.scan(str(log), {})
    assert ok and message.startswith("1 recorded since the last run: XID 13 on 0000:cb:00.0")
    assert data["position"]["offset"] == log.stat().st_size and data["ladder"] == "record"
    ok, message, data = xid.scan(str(log), data)
    assert ok and message == "no GPU error in the kernel log since the last run (0 lines read)"
    with log.open("a") as fh:
        fh.write(f"{X79}\n{X13[:30]}")  # the last line is still being written
    ok, message, data = xid.scan(str(log), data)
    assert not ok and message == "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot"
    assert data["position"]["offset"] == log.stat().st_size - 30  # the part line is read next time


def test_a_rotated_or_truncated_file_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X13}\n{X13}\n")
    _ok, _message, data = xid.scan(str(log), {})
    log.write_text(f"{X13}\n")  # truncated in place: shorter than the offset
    _ok, message, data = xid.scan(str(log), data)
    assert message.startswith("1 recorded")
    os.unlink(log)
    log.write_text(f"{X13}\n{X13}\n")  # a new file (a new inode) at the path
    assert xid.scan(str(log), {**data, "position": {**data["position"], "inode": -1}})[1].startswith("2 recorded")


def test_more_new_log_than_a_run_reads_is_skipped_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xid, "MAX_BYTES", 1000)
    log = tmp_path / "kern.log"
    log.write_text("x" * 5000 + f"\n{X79}\n")
    ok, message, _data = xid.scan(str(log), {})
    assert not ok and "bytes of the log skipped (more than 1000 new)" in message


def test_a_named_file_that_cannot_be_read_fails(tmp_path: Path) -> None:
    ok, message, _data = xid.scan(str(tmp_path / "missing.log"), {})
    assert not ok and message.startswith(f"cannot read {tmp_path / 'missing.log'}: ")


# ---------------------------------------------------------------- since the last run: /dev/kmsg


def _kmsg(root: Path, records: list[tuple[int, str]], boot: str = "boot-a") -> None:
    (root / "dev").mkdir(exist_ok=True)
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(f"{boot}\n")
    text = "".join(f"4,{seq},{seq * 1000},-;{msg}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n" for seq, msg in records)
    (root / "dev/kmsg").write_text(text)


def test_kmsg_is_read_after_the_last_sequence_number_of_this_boot(tmp_path: Path) -> None:
    _kmsg(tmp_path, [(100, X13), (101, "usb 1-1: reset")])
    ok, message, data = xid.scan("kmsg", {}, root=str(tmp_path))
    assert ok and message.startswith("1 recorded") and data["position"] == {"boot": "boot-a", "seq": 101}
    _kmsg(tmp_path, [(100, X13), (101, "usb 1-1: reset"), (102, X13)])
    ok, message, data = xid.scan("kmsg", data, root=str(tmp_path))
    assert message.startswith("1 recorded") and data["position"]["seq"] == 102
    ok, message, data = xid.scan("kmsg", data, root=str(tmp_path))
    assert ok and message == "no GPU error in the kernel log since the last run (0 lines read)"


def test_a_new_boot_reads_its_log_from_the_start_and_closes_the_open_events(tmp_path: Path) -> None:
    _kmsg(tmp_path, [(7, X79)])
    ok, _message, data = xid.scan("kmsg", {}, root=str(tmp_path))
    assert not ok
    ok, message, data = xid.scan("kmsg", data, root=str(tmp_path))  # nothing new: the reboot is still owed
    assert not ok and message == "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot"
    assert data["ladder"] == "reboot"
    _kmsg(tmp_path, [(3, X13)], boot="boot-b")  # rebooted: sequence numbers start again
    ok, message, data = xid.scan("kmsg", data, root=str(tmp_path))
    assert ok and message.startswith("1 recorded") and data["open"] == []


def test_no_kmsg_is_not_checked_and_passes(tmp_path: Path) -> None:
    ok, message, _data = xid.scan("kmsg", {}, root=str(tmp_path))
    assert ok and message.startswith("not checked: cannot read /dev/kmsg: ")


# ---------------------------------------------------------------- the ladder: drain once, reboot until a reboot


def test_a_drain_class_fails_on_the_run_that_read_it_only(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X13}\n")
    ok, message, data = xid.scan(str(log), {}, {"13": "drain"})
    assert not ok and message.endswith("(Graphics Engine Exception): drain") and data["ladder"] == "drain"
    ok, _message, data = xid.scan(str(log), data, {"13": "drain"})
    assert ok and data["open"] == []


def test_a_record_override_keeps_a_fallen_gpu_in_service(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X79}\n")
    ok, _message, data = xid.scan(str(log), {}, {"79": "record"})
    assert ok and data["ladder"] == "record" and data["recent"][0]["code"] == 79


def test_the_worst_event_is_said_first_and_sets_the_ladder(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X13}\n{X79}\n" + LINES["amdgpu bad pages"][0] + "\n")
    ok, message, data = xid.scan(str(log), {})
    assert not ok and message.startswith("amdgpu on 0000:c1:00.0 (amdgpu bad page records over the threshold): "
                                         "service; XID 79 on 0000:3b:00.0")
    assert data["ladder"] == "service"


# ---------------------------------------------------------------- the check and the runner


def test_the_check_reads_its_position_from_state_json(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X79}\n")
    check = {"name": "gpu-xid", "kind": "gpu-xid", "kernel_log": str(log), "state_dir": str(tmp_path)}
    ok, _message, data = checks.run_with_data(check)
    assert not ok
    (tmp_path / "state.json").write_text(json.dumps({"checks": {"gpu-xid": {"data": {**data, "open": []}}}}))
    assert checks.run_check(check) == (True, "no GPU error in the kernel log since the last run (0 lines read)")


def _xid_node(node, log: Path, **overrides) -> None:  # noqa: F811 - node is the shared fixture
    node.write_config(checks=[{"name": "gpu-xid", "kind": "gpu-xid", "kernel_log": str(log), "timeout": 5,
                               "xid_actions": overrides}], check_timeout=5, run_budget=10)


def test_the_runner_with_no_act_records_the_ladder_and_the_position(node) -> None:  # noqa: F811
    log = node.tmp / "kern.log"
    log.write_text(f"{X13}\n{X79}\n")
    _xid_node(node, log)
    res = node.run("--no-act")
    assert res.returncode == 0, res.stderr
    state = node.state
    gpu = state["checks"]["gpu-xid"]
    assert (gpu["ok"], gpu["message"]) == (False, "XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot")
    assert state["ladder"] == "reboot" and state["action"] == "reboot"
    assert state["reason"] == "gpc:gpu-xid: XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot"
    assert gpu["data"]["position"]["offset"] == log.stat().st_size
    assert [e["code"] for e in gpu["data"]["recent"]] == [13, 79]
    assert node.updates == [] and node.in_slurm["state"] == "IDLE"
    node.run("--no-act")  # nothing new, the reboot is still owed
    assert node.state["checks"]["gpu-xid"]["ok"] is False and node.state["ladder"] == "reboot"


def test_the_runner_reboots_on_a_reboot_class_and_keeps_record_classes_in_service(node) -> None:  # noqa: F811
    log = node.tmp / "kern.log"
    log.write_text(f"{X13}\n")
    _xid_node(node, log)
    node.run()
    assert node.in_slurm == {"state": "IDLE", "reason": ""}
    assert node.state["ladder"] == "record" and node.state["checks"]["gpu-xid"]["ok"] is True
    with log.open("a") as fh:
        fh.write(LINES["sxid fatal"][0] + "\n")
    node.run()
    reason = "gpc:gpu-xid: SXid 24007 on 0000:07:00.0 (NVSwitch fatal error): reboot"
    assert (node.state["action"], node.state["reason"]) == ("reboot", reason)
    calls = (node.tmp / "bin" / "scontrol.log").read_text().splitlines()
    assert f"reboot ASAP nextstate=RESUME reason={reason} {node.name}" in calls  # tests/test_health_reboot.py: the rest


def test_the_runner_applies_the_sites_overrides(node) -> None:  # noqa: F811
    log = node.tmp / "kern.log"
    log.write_text(f"{X79}\n")
    _xid_node(node, log, **{"79": "record"})
    node.run()
    assert node.in_slurm["state"] == "IDLE" and node.state["ladder"] == "record"


def test_the_docs_table_says_what_the_code_table_does() -> None:
    """docs/health.md's XID table names each row of xid.XIDS with the same rung."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "health.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| [^|]+ \| `(record|drain|reboot|service)` \|", text, re.M))
    want = {str(code): action for code, (action, _what, _source) in xid.XIDS.items() if code != 154}
    assert rows == want


def test_an_operator_closes_the_open_errors_after_a_reset_by_hand(node) -> None:  # noqa: F811
    log = node.tmp / "kern.log"
    log.write_text(f"{X79}\n")
    _xid_node(node, log)
    node.run("--no-act")
    res = node.run("--clear-xid")
    assert res.returncode == 0 and "cleared 1 open GPU errors: xid79 on 0000:3b:00.0" in res.stdout
    node.run("--no-act")
    assert node.state["checks"]["gpu-xid"]["ok"] is True  # and the log is not read again from its start
    assert node.run("--clear-xid").stdout.strip() == "gpucluster-health: no open GPU error to clear"


def test_a_containers_restart_is_a_new_boot_though_its_kernel_is_the_hosts(tmp_path) -> None:
    """A staged node is a container: its kernel's boot id is the host's, so only PID 1's start tells its boots apart
    (the emulated and staged reboots rely on it to close a reboot-class error)."""
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("host-boot\n")
    assert xid.boot_id(str(tmp_path)) == "host-boot"  # no /proc/1/stat: the kernel's alone
    (tmp_path / "proc/1").mkdir()
    stat = "1 (systemd (x) y) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 {start} 1000 10"
    (tmp_path / "proc/1/stat").write_text(stat.format(start=4711))
    first = xid.boot_id(str(tmp_path))
    assert first == "host-boot.4711"
    (tmp_path / "proc/1/stat").write_text(stat.format(start=99812))  # the container started again
    assert xid.boot_id(str(tmp_path)) != first
