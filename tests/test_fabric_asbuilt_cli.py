"""`gpucluster fabric ...` end to end: exit codes (0 matches, 1 differs, 2 bad input with file:line and a
fix), the --json contracts, help text with examples, and nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "asbuilt"
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.asbuilt.fabricgen import build, write_lldp_dir  # noqa: E402

META_IB = str(ROOT / "examples" / "meta-24k-ib.yaml")
META_ROCE = str(ROOT / "examples" / "meta-24k-roce.yaml")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    from gpucluster.cluster import load_cluster

    plan = load_cluster(META_IB).plan
    built = build(plan)
    folder = tmp_path_factory.mktemp("dumps")
    clean = folder / "clean.txt"
    clean.write_text(built.ibnetdiscover())
    faulty = built.copy()
    host = plan.spec.group("h100").hosts[4]
    faulty.swap_far_ends(("H", host, "mlx5_3"), ("H", host, "mlx5_5"))
    bad = folder / "railswap.txt"
    bad.write_text(faulty.ibnetdiscover())
    return clean, bad, host


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_discover_text_and_json(capsys):
    code, out, _ = run(capsys, "fabric", "discover", "--ibnetdiscover", str(FIXTURES / "hdr-two-tier.ibnet"))
    assert code == 0 and "4 switches (3 leaf, 1 spine)" in out and "unidentified-endpoint" in out
    code, out, _ = run(capsys, "fabric", "discover", "--ibnetdiscover", str(FIXTURES / "hdr-two-tier.ibnet"), "--json")
    doc = json.loads(out)
    assert code == 0
    assert {"switches", "tiers", "hosts", "host_ports", "unidentified", "bundles", "degraded_bundles",
            "findings"} <= set(doc)


def test_verify_exit_codes(capsys, dump):
    clean, bad, host = dump
    code, out, _ = run(capsys, "fabric", "verify", META_IB, "--ibnetdiscover", str(clean))
    assert code == 0 and "the fabric matches the plan" in out
    code, out, _ = run(capsys, "fabric", "verify", META_IB, "--ibnetdiscover", str(bad))
    assert code == 1 and "wrong-rail" in out and f"swap the cables at {host} mlx5_3 and {host} mlx5_5" in out
    code, out, _ = run(capsys, "fabric", "verify", META_IB, "--ibnetdiscover", str(bad), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False
    assert [f["kind"] for f in doc["findings"]] == ["wrong-rail"]
    assert doc["findings"][0]["detail"]["swap"] == [f"{host} mlx5_3", f"{host} mlx5_5"]


def test_verify_lldp(capsys, tmp_path):
    from gpucluster.cluster import load_cluster

    plan = load_cluster(META_ROCE).plan
    write_lldp_dir(build(plan), tmp_path / "lldp")
    code, out, _ = run(capsys, "fabric", "verify", META_ROCE, "--lldp", str(tmp_path / "lldp"))
    assert code == 0 and "inferred by position" in out


@pytest.mark.parametrize("argv, where", [
    (["fabric", "discover", "--ibnetdiscover", "{tmp}/nope.txt"], "{tmp}/nope.txt: cannot read"),
    (["fabric", "discover", "--ibnetdiscover", "{tmp}/garbage.txt"], "{tmp}/garbage.txt:1: no node block"),
    (["fabric", "verify", META_IB, "--ibnetdiscover", str(FIXTURES / "hdr-two-tier.ibnet"),
      "--sites", "{tmp}/bad.csv"], "{tmp}/bad.csv:1: header: the header is name,site"),
    (["fabric", "verify", META_IB, "--ibnetdiscover", str(FIXTURES / "hdr-two-tier.ibnet"),
      "--sites", "{tmp}/typo.csv"], "{tmp}/typo.csv:3: hostname: 'gti9999' is not a host of the spec"),
    (["fabric", "verify", META_IB, "--ibnetdiscover", str(FIXTURES / "hdr-two-tier.ibnet"),
      "--switch-pattern", "("], "--switch-pattern '(': not a regular expression"),
    (["fabric", "verify", META_ROCE, "--ibnetdiscover", str(FIXTURES / "hdr-two-tier.ibnet")], "use --lldp"),
    (["fabric", "verify", META_ROCE, "--lldp", "{tmp}/garbage.txt"], "{tmp}/garbage.txt:1:1: not JSON"),
    (["fabric", "topofile", META_ROCE, "-o", "{tmp}/x.topo"], "for InfiniBand"),
    (["fabric", "switch-config", META_IB, "-o", "{tmp}/sw"], "RoCE lossless QoS"),
    (["fabric", "test-plan", META_IB, "--efficiency", "3"], "--efficiency 3.0"),
])
def test_bad_input_exits_2_with_location_and_no_traceback(capsys, tmp_path, argv, where):
    (tmp_path / "garbage.txt").write_text("hello\n")
    (tmp_path / "bad.csv").write_text("name,site\n")
    (tmp_path / "typo.csv").write_text("hostname,address\ngti0001,node-a1\ngti9999,node-a2\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, _out, err = run(capsys, *argv)
    assert code == 2
    assert where.replace("{tmp}", str(tmp_path)) in err
    assert "Traceback" not in err
    assert not (tmp_path / "x.topo").exists() and not (tmp_path / "sw").exists()


def test_topofile_and_switch_config_write_files(capsys, tmp_path):
    code, _out, _ = run(capsys, "fabric", "topofile", META_IB, "-o", str(tmp_path / "fabric.topo"))
    assert code == 0 and (tmp_path / "fabric.topo").read_text().startswith("# IBDM topology of meta-24k-ib")
    assert [p.name for p in tmp_path.iterdir()] == ["fabric.topo"]  # no temporary left behind
    code, _out, _ = run(capsys, "fabric", "switch-config", META_ROCE, "-o", str(tmp_path / "sw"))
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == [
        ".gpucluster-manifest.json", "core-eos-qos.cfg", "leaf-sonic-qos.json", "spine-eos-qos.cfg"]


def test_test_plan_json(capsys):
    code, out, _ = run(capsys, "fabric", "test-plan", str(ROOT / "examples" / "staging.yaml"), "--transport",
                       "iperf3", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["stand_in"] is True and doc["unit"] == "Gb/s"
    assert {c["tier"] for c in doc["cases"]} == set(doc["tiers"])


@pytest.mark.parametrize("sub", ["discover", "verify", "topofile", "switch-config", "test-plan"])
def test_every_argument_has_help_and_the_epilog_has_examples(sub):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-m", "gpucluster.cli", "fabric", sub, "--help"], capture_output=True,
                         text=True, env=env, check=True).stdout
    assert f"gpucluster fabric {sub}" in out.split("examples:")[1]
    from gpucluster.cli import build_parser

    fabric = build_parser()._subparsers._group_actions[0].choices["fabric"]
    parser = fabric._subparsers._group_actions[0].choices[sub]
    for action in parser._actions:
        assert action.help, f"{sub}: {action.dest} has no help"
