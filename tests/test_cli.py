"""`gpucluster check|plan|render`: exit codes, located findings on stderr (never a traceback), the
`plan --json` contract, and what render writes (everything, or nothing on a bad spec).

Most cases call `gpucluster.cli.main` in-process; a few run the installed entry point to prove the
real command behaves the same.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, example_path, example_text, loaded_example, mutate

from gpucluster.cli import main
from gpucluster.outputs import MANIFEST
from gpucluster.render.topology import slurm_switches

FINDING = re.compile(r"^(error|warning): (?P<file>[^:]+):(?P<line>\d+): (?P<field>\S+): .+; .+ \[(?P<rule>[\w-]+)\]$")
CONTRACT = ("nodes", "gpus", "gpus_by_type", "switches", "links", "oversubscription", "bisection_tbps", "tiers",
            "racks")
RENDERED = ("slurm.conf", "topology.conf", "gres.conf", "cgroup.conf", "nccl.conf", "cabling.csv", "bom.csv")
ENTRY = Path(sys.executable).parent / "gpucluster"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def finding_lines(err: str) -> list[re.Match]:
    lines = [line for line in err.splitlines()
             if line.startswith(("error: ", "warning: ")) and "problem(s)" not in line]
    matches = [FINDING.match(line) for line in lines]
    assert all(matches), f"a finding not in file:line: field: message; fix [rule] form:\n{err}"
    return matches


@pytest.fixture
def bad_spec(tmp_path) -> tuple[Path, int]:
    text, line = mutate(example_text("staging"), "    gpus_per_node: 4\n", "    gpus_per_node: 3\n")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path, line


# ---- exit codes and stderr ---------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_check_ok(capsys, name):
    rc, out, err = run(capsys, "check", str(example_path(name)))
    assert rc == 0
    assert f"{example_path(name)}: ok" in out
    finding_lines(err)  # warnings, if any, are located too


def test_check_prints_warnings_but_succeeds(capsys):
    rc, _out, err = run(capsys, "check", str(example_path("meta-24k-roce")))
    found = finding_lines(err)
    assert rc == 0
    # in reading order: the storage group (line 44) left at one server a rack, then the rounded ratio (line 62)
    assert [(m[1], m["field"], m["rule"]) for m in found] == [
        ("warning", "node_groups[4].nodes_per_rack", "rack-default"),
        ("warning", "fabric.oversubscription.spine", "ratio-rounded")]


@pytest.mark.parametrize("command", ["check", "plan", "render"])
def test_bad_spec_exits_2_with_located_findings(capsys, tmp_path, bad_spec, command):
    path, line = bad_spec
    argv = [command, str(path)] + (["-o", str(tmp_path / "out")] if command == "render" else [])
    rc, _out, err = run(capsys, *argv)
    assert rc == 2
    found = finding_lines(err)
    assert [(m["file"], int(m["line"]), m["field"], m["rule"]) for m in found] == [
        (str(path), line, "node_groups[1].gpus_per_node", "gpu-count")]
    assert not (tmp_path / "out").exists(), "render wrote something for a bad spec"


def test_many_findings_each_on_its_own_line(capsys, tmp_path):
    text = example_text("staging").replace("    gpus_per_node: 4\n", "    gpus_per_node: 3\n").replace(
        '    hostname: "nfs##"\n', '    hostname: "gpu##"\n')
    path = tmp_path / "two.yaml"
    path.write_text(text)
    rc, _out, err = run(capsys, "check", str(path))
    assert rc == 2
    assert {m["rule"] for m in finding_lines(err)} == {"gpu-count", "hostname-collision"}


@pytest.mark.parametrize("what", ["missing", "directory", "binary", "empty"])
def test_unreadable_or_unusable_file_exits_2(capsys, tmp_path, what):
    path = tmp_path / "spec.yaml"
    if what == "directory":
        path.mkdir()
    elif what == "binary":
        path.write_bytes(b"\x00\xff\xfe\x80")
    elif what == "empty":
        path.write_text("")
    for command in ("check", "plan"):
        rc, _out, err = run(capsys, command, str(path))
        assert rc == 2
        assert err.startswith(f"error: {path}")
        assert "[file]" in err or "[yaml]" in err


def test_render_to_a_path_under_a_regular_file_exits_2(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rc, _out, err = run(capsys, "render", str(example_path("staging")), "-o", str(blocker / "out"))
    assert rc == 2
    assert err.startswith("error: ") and "-o" in err
    assert blocker.read_text() == "not a folder"


def test_render_onto_a_regular_file_exits_2(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, _out, _err = run(capsys, "render", str(example_path("staging")), "-o", str(blocker))
    assert rc == 2


@pytest.mark.parametrize("argv", [[], ["plan"], ["render", "x.yaml"], ["frobnicate"]])
def test_usage_errors_exit_2(capsys, argv):
    rc, _out, err = run(capsys, *argv)
    assert rc == 2 and "usage:" in err


# ---- plan --json -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_plan_json_contract(capsys, name):
    rc, out, _err = run(capsys, "plan", "--json", str(example_path(name)))
    assert rc == 0
    data = json.loads(out)
    assert set(CONTRACT) <= set(data)
    loaded, plan = loaded_example(name)
    spec = loaded.spec
    assert data["nodes"] == sum(g.count for g in spec.node_groups)
    assert data["gpus"] == sum(g.count * g.gpus_per_node for g in spec.node_groups if g.gpu)
    assert data["gpus_by_type"] == {k: v for k, v in plan.gpus_by_type.items()}
    assert sum(data["gpus_by_type"].values()) == data["gpus"]
    assert data["tiers"] == len(data["switches"]) in (2, 3)
    assert list(data["switches"]) == ["leaf", "spine", "core"][: data["tiers"]]
    assert data["switches"] == {t.tier: t.count for t in plan.tier_plans}
    assert all(isinstance(v, int) and v > 0 for v in data["switches"].values())
    expected_links = ["node-leaf", "leaf-spine", "spine-core"][: data["tiers"]]
    assert list(data["links"]) == expected_links
    assert data["links"]["node-leaf"] == sum(g.count * g.nics_per_node for g in spec.fabric_groups)
    # oversubscription: tier -> "N:1" for every tier with uplinks (the top tier has none)
    assert list(data["oversubscription"]) == ["leaf", "spine"][: data["tiers"] - 1]
    for ratio in data["oversubscription"].values():
        assert re.fullmatch(r"\d+(\.\d+)?:1", ratio)
    assert isinstance(data["bisection_tbps"], (int, float)) and data["bisection_tbps"] > 0
    assert data["racks"] == sum(-(-g.count // g.nodes_per_rack) for g in spec.node_groups)


def test_plan_json_bisection_of_a_non_blocking_fabric(capsys):
    """RSC phase 1: 6,080 endpoints x 200 Gb/s, no oversubscription: half of it crosses the cut."""
    data = json.loads(run(capsys, "plan", "--json", str(example_path("meta-rsc-phase1")))[1])
    assert set(data["oversubscription"].values()) == {"1:1"}
    assert data["bisection_tbps"] == pytest.approx(6_080 * 200 / 2 / 1000)


def test_plan_human_output(capsys):
    rc, out, _err = run(capsys, "plan", str(example_path("colossus-200k")))
    assert rc == 0
    out = " ".join(out.split())  # rich wraps at the terminal width
    assert "200,000 GPUs" in out and "150,000 h100-sxm5-80g" in out and "50,000 h200-sxm-141g" in out


# ---- render ------------------------------------------------------------------------------------

def test_render_writes_every_file(capsys, tmp_path):
    out_dir = tmp_path / "out"
    rc, out, _err = run(capsys, "render", str(example_path("frontier-mi250x-roce")), "-o", str(out_dir))
    assert rc == 0
    written = {p.name for p in out_dir.iterdir()} - {MANIFEST}  # the set's manifest (gpucluster.outputs)
    assert set(RENDERED) <= written
    assert not [n for n in written if n.startswith(".")], "a temporary file was left behind"
    # the sizes printed are the sizes on disk
    for m in re.finditer(r"^  \S+/(\S+)  ([\d,]+) bytes$", out, re.M):
        assert (out_dir / m[1]).stat().st_size == int(m[2].replace(",", ""))
    assert len(re.findall(r" bytes$", out, re.M)) == len(written)
    # plan.json is plan --json
    plan_out = run(capsys, "plan", "--json", str(example_path("frontier-mi250x-roce")))[1]
    assert json.loads((out_dir / "plan.json").read_text()) == json.loads(plan_out)


def test_render_no_cabling(capsys, tmp_path):
    rc, _out, _err = run(capsys, "render", str(example_path("staging")), "-o", str(tmp_path), "--no-cabling")
    assert rc == 0
    assert not (tmp_path / "cabling.csv").exists() and (tmp_path / "slurm.conf").exists()


def test_render_again_replaces_files(capsys, tmp_path):
    run(capsys, "render", str(example_path("staging")), "-o", str(tmp_path))
    (tmp_path / "slurm.conf").write_text("stale\n")
    assert run(capsys, "render", str(example_path("staging")), "-o", str(tmp_path))[0] == 0
    assert (tmp_path / "slurm.conf").read_text().startswith("# slurm.conf for staging")


def test_bad_spec_leaves_an_existing_output_untouched(capsys, tmp_path, bad_spec):
    run(capsys, "render", str(example_path("staging")), "-o", str(tmp_path / "out"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    rc, _out, err = run(capsys, "render", str(bad_spec[0]), "-o", str(tmp_path / "out"))
    assert rc == 2 and "nothing was written" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


# ---- the installed command ---------------------------------------------------------------------

def entry(*argv: str) -> subprocess.CompletedProcess:
    if not ENTRY.exists():
        pytest.skip(f"{ENTRY} not installed (pip install -e .)")
    return subprocess.run([str(ENTRY), *argv], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_entry_point_ok_and_json():
    res = entry("plan", "--json", "examples/staging.yaml")
    assert res.returncode == 0, res.stderr
    assert set(CONTRACT) <= set(json.loads(res.stdout))


def test_entry_point_bad_spec(bad_spec):
    path, line = bad_spec
    res = entry("check", str(path))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"{path}:{line}: node_groups[1].gpus_per_node: " in res.stderr


def test_entry_point_unwritable_output(tmp_path):
    (tmp_path / "f").write_text("x")
    res = entry("render", "examples/staging.yaml", "-o", str(tmp_path / "f" / "out"))
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.startswith("error: ")


# ---- inventory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["staging", "meta-24k-ib", "frontier-mi250x-roce"])
def test_inventory_agrees_with_the_plan(capsys, tmp_path, name):
    """Host variables (leaf, pod, rack: membership only) are the plan's, and the leaf/pod are topology.conf's switches.
    The inventory is read as Ansible reads it (host ranges, children, group_vars/): gpucluster's reader."""
    from gpucluster.inventory.reader import load_inventory

    rc, _out, _err = run(capsys, "inventory", str(example_path(name)), "-o", str(tmp_path))
    assert rc == 0 and (tmp_path / "hosts.yml").is_file()
    inv = load_inventory(tmp_path)
    loaded, plan = loaded_example(name)
    spec = loaded.spec
    members = {k: set(v) for k, v in inv.groups.items()}
    assert members["slurm_compute"] == {h for g in spec.groups_with_role("compute") for h in g.hosts}
    assert members["slurm_controller"] == {h for g in spec.groups_with_role("controller") for h in g.hosts}
    fabric = "fabric_ib" if spec.fabric.type == "infiniband" else "fabric_roce"
    assert members[fabric] == {h for g in spec.fabric_groups for h in g.hosts}
    parent = {c: s.name for s in slurm_switches(plan) for c in s.switches}
    racks: dict[str, list[str]] = {}
    for g in spec.node_groups:
        hosts = {h: inv.hosts[h].vars for h in inv.groups[f"nodegroup_{g.name.replace('-', '_')}"]}
        assert list(hosts) == g.hosts
        for h, hv in hosts.items():
            racks.setdefault(hv["gpucluster_rack"], []).append(h)
            assert hv["gpucluster_node_group"] == g.name
            if g in spec.fabric_groups:
                unit = plan.unit_of_host[h]
                assert hv["gpucluster_leaf"] == unit.name
                assert "gpucluster_hcas" not in hv and "gpucluster_rails" not in hv  # facts.json's (node_groups)
                if plan.tiers == 3:
                    assert hv["gpucluster_pod"] == parent[unit.name]
    assert len(racks) == plan.rack_count
    group_of = {h: g for g in spec.node_groups for h in g.hosts}
    for hosts in racks.values():
        assert len({group_of[h].name for h in hosts}) == 1, "a rack shared by two groups"
        assert len(hosts) <= group_of[hosts[0]].nodes_per_rack


def test_every_command_the_readme_documents_is_a_subcommand():
    """The README's command table is what users type: each `gpucluster NAME` there must parse (a plugin
    left out of cli.PLUGINS would otherwise surface only when the staged demo reaches that step)."""
    documented = set(re.findall(r"^\| `gpucluster (\w+)", (ROOT / "README.md").read_text(), re.MULTILINE))
    assert {"check", "plan", "render", "stage", "configure", "validate", "demo"} <= documented
    for name in sorted(documented):
        res = subprocess.run([str(ENTRY), name, "--help"], capture_output=True, text=True, check=False)
        assert res.returncode == 0, f"`gpucluster {name} --help` exited {res.returncode}: {res.stderr.strip()}"
