"""The spec's two layers of checking: syntax (pydantic) and meaning (spec/rules.py).

Every finding must name the file, the line, the field path, the rule it breaks and a fix. Each case
starts from an example that loads cleanly and changes one thing, so the finding is caused by that
change; its line is where the change sits in the file (found by searching, not typed in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from conftest import EXAMPLES, example_path, example_text, findings_of, line_of, mutate

from gpucluster.catalog import GPUS, SWITCHES
from gpucluster.cluster import check_meaning, load_cluster
from gpucluster.errors import Finding
from gpucluster.fabric.plan import _max_down
from gpucluster.spec.loader import load_spec as load_unchecked
from gpucluster.spec.model import Slurm

RENDERED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): (?P<field>\S+): (?P<msg>.+); (?P<fix>.+) \[(?P<rule>[\w-]+)\]$")


def one(findings: list[Finding], field: str, rule: str) -> Finding:
    hits = [f for f in findings if f.field == field and f.rule == rule]
    assert len(hits) == 1, f"expected one {rule} finding at {field}, got:\n" + "\n".join(f.render() for f in findings)
    return hits[0]


def assert_located(f: Finding, path, line: int) -> None:
    """The finding names file, line, field, rule and a fix, and renders as `file:line: field: msg; fix [rule]`."""
    assert f.file == str(path)
    assert f.line == line, f.render()
    assert f.fix, f"no fix in {f.render()}"
    m = RENDERED.match(f.render())
    assert m, f.render()
    assert (m["file"], int(m["line"]), m["field"], m["rule"]) == (str(path), line, f.field, f.rule)


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_load_without_errors(name):
    loaded = load_unchecked(example_path(name))
    assert [f for f in check_meaning(loaded) if f.level == "error"] == []


# ---- one case per rule -------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    example: str
    old: str
    new: str
    field: str
    rule: str
    fix: str = ""  # a piece the fix must contain
    anchor: str | None = None  # the finding's line holds this text (default: where `new` starts)
    message: str = ""  # a piece the message must contain


CASES = {
    "unknown key, did you mean": Case(
        "staging", "  topology: tree\n", "  topolgy: tree\n", "slurm.topolgy", "unknown-key",
        fix="did you mean 'topology'?"),
    "unknown key in a node group": Case(
        "staging", "    nodes_per_rack: 2\n", "    nodes_per_rak: 2\n", "node_groups[1].nodes_per_rak", "unknown-key",
        fix="did you mean 'nodes_per_rack'?"),
    "unknown key, nothing close": Case(
        "staging", "  accounting: true ", "  zzzzzz: true ", "slurm.zzzzzz", "unknown-key",
        # the slurm section's keys, from the model (the section gains keys; the message lists them all)
        fix="allowed keys here: " + ", ".join(sorted(Slurm.model_fields))),
    "unknown key in a user catalog entry": Case(
        "meta-rsc-phase1", "      ports: {200: 800}\n", "      portz: {200: 800}\n", "catalog.switches.cs8500.portz",
        "unknown-key", fix="did you mean 'ports'?"),
    "missing key": Case(
        "staging", "    count: 4\n", "", "node_groups[1].count", "required", fix="add 'count'",
        anchor="  - name: gpu"),
    "wrong type (text for an integer)": Case(
        "staging", "    count: 4\n", "    count: four\n", "node_groups[1].count", "int_parsing",
        fix="change the value's type"),
    "wrong type (scalar for a mapping)": Case(
        "staging", "  flash:\n    name: flash\n", "  flash: 7\n  flashx:\n    name: flash\n", "storage.flash",
        "model_type", anchor="  flash: 7"),
    "value out of range": Case(
        "staging", "    gpus_per_node: 4\n", "    gpus_per_node: 99\n", "node_groups[1].gpus_per_node",
        "less_than_equal", fix="range"),
    "literal not allowed": Case(
        "staging", "  type: roce\n", "  type: ethernet\n", "fabric.type", "literal_error",
        fix="'infiniband'"),
    "radix exceeded for 2 tiers": Case(
        "meta-rsc-phase1", "    count: 760\n", "    count: 7600\n", "fabric.tiers", "radix",
        anchor="  tiers: 2", message="radix exceeded for 2 tiers"),
    "radix exceeded for 3 tiers": Case(
        # rail-optimised at radix 64 holds 64^3/4 = 65,536 endpoints = 8,192 nodes of 8 rails
        "meta-24k-ib", "    count: 3072\n", "    count: 8193\n", "fabric.switches.core", "radix",
        anchor="  switches: {", message="radix exceeded for 3 tiers"),
    "NICs per node != rails": Case(
        "meta-24k-roce", "    nics_per_node: 8\n", "    nics_per_node: 4\n", "node_groups[2].nics_per_node", "rails",
        fix="give the group 8 NICs", message="4 NICs per node but the fabric has 8 rails"),
    "HCA names != NICs": Case(
        "frontier-mi250x-roce", "    hcas: [mlx5_0, mlx5_1, mlx5_2, mlx5_3]\n", "    hcas: [mlx5_0, mlx5_1]\n",
        "node_groups[1].hcas", "rails"),
    "GPU count not allowed for the SKU": Case(
        "staging", "    gpus_per_node: 4\n", "    gpus_per_node: 3\n", "node_groups[1].gpus_per_node", "gpu-count",
        fix=f"use one of {list(GPUS['h100-sxm5-80g'].allowed_per_node)}"),
    "MI250X count not allowed": Case(
        "frontier-mi250x-roce", "    gpus_per_node: 8\n", "    gpus_per_node: 5\n", "node_groups[1].gpus_per_node",
        "gpu-count", fix=f"use one of {list(GPUS['mi250x'].allowed_per_node)}"),
    "unknown GPU, did you mean": Case(
        "staging", "    gpu: h100-sxm5-80g\n", "    gpu: h100-sxm5-80\n", "node_groups[1].gpu", "catalog",
        fix="did you mean 'h100-sxm5-80g'?"),
    "unknown switch, did you mean the user catalog's": Case(
        "meta-rsc-phase1", "spine: cs8500}", "spine: cs8050}", "fabric.switches.spine", "catalog",
        fix="did you mean 'cs8500'?", anchor="  switches: {"),
    "colliding hostnames": Case(
        "staging", '    hostname: "nfs##"\n', '    hostname: "gpu##"\n', "node_groups[3].hostname",
        "hostname-collision", message="gpu01 is also generated by group 'gpu'"),
    "colliding hostnames through first_index": Case(
        "staging", '    hostname: "nfs##"\n', '    hostname: "gpu##"\n    first_index: 4\n', "node_groups[3].hostname",
        "hostname-collision", message="gpu04"),
    "text after the index (slurmctld refuses gpu[01-04]-ib)": Case(
        "staging", '    hostname: "gpu##"\n', '    hostname: "gpu##-ib"\n', "node_groups[1].hostname", "hostname",
        fix="end the hostname with the '#' run", message="gpu[01-04]-ib"),
    "a feature with a space (would split slurm.conf's NodeName line)": Case(
        "staging", "    nodes_per_rack: 2\n", "    nodes_per_rack: 2\n    features: [ndr ib]\n",
        "node_groups[1].features[0]", "string_pattern_mismatch", anchor="    features:"),
    "an HCA name with shell text (lands in the sourced nccl-env.sh)": Case(
        "frontier-mi250x-roce", "    hcas: [mlx5_0, mlx5_1, mlx5_2, mlx5_3]\n",
        "    hcas: [mlx5_0, mlx5_1, mlx5_2, '$(reboot)']\n", "node_groups[1].hcas[3]", "string_pattern_mismatch"),
    "a partition named default (slurmctld: 'No PartitionName information')": Case(
        "staging", "    - name: gpu\n", "    - name: default\n", "slurm.partitions[0].name", "partition",
        fix="another name"),
    "compute group in no partition": Case(
        "colossus-200k", "      groups: [h100, h200]\n", "      groups: [h100]\n", "node_groups[2].name", "partition",
        anchor="  - name: h200", message="'h200' is in no partition"),
    "partition names a missing group": Case(
        "colossus-200k", "      groups: [h100, h200]\n", "      groups: [h100, h200, h300]\n",
        "slurm.partitions[0].groups[2]", "partition", fix="did you mean 'h200'?"),
    "block topology on Slurm < 23.11": Case(
        "staging", "  topology: tree\n", "  topology: block\n", "slurm.topology", "slurm-version",
        fix="23.11"),
    "Slurm version outside the supported range": Case(
        "staging", '  version: "22.05"', '  version: "19.05"', "slurm.version", "slurm-version"),
    "oversubscribing the top tier of a 2-tier plan": Case(
        "staging", "  tiers: 2\n", "  tiers: 2\n  oversubscription: {spine: '2:1'}\n",
        "fabric.oversubscription.spine", "ratio-tier", anchor="  oversubscription:"),
    "oversubscribing the core": Case(
        "meta-24k-roce", '{leaf: "1:1", spine: "7:1"}', '{leaf: "1:1", spine: "7:1", core: "2:1"}',
        "fabric.oversubscription.core", "ratio-tier"),
    "a ratio below 1:1": Case(
        "staging", "  tiers: 2\n", "  tiers: 2\n  oversubscription: {leaf: '1:2'}\n",
        "fabric.oversubscription", "value_error", message="more uplinks than downlinks",
        anchor="  oversubscription:"),
    "a ratio needing more ports than the leaf has": Case(
        # 40 nodes x 1 NIC at 1:1 need 40 down + 40 up; the 64-port bridge takes at most 32 down at 1:1
        "staging", "  nodes_per_leaf: 2 ", "  nodes_per_leaf: 40 ", "fabric.nodes_per_leaf", "radix",
        fix=f"lower nodes_per_leaf to at most {_max_down(64, 1.0)}", message="40 down + 40 up"),
    "clashing storage mounts": Case(
        "staging", "          mount: /home/shared\n", "          mount: /mnt/flash/home\n",
        "storage.nfs[0].exports[0].mount", "mount-clash", message="clashes with /mnt/flash"),
    "mount over a system directory": Case(
        "staging", "    mount: /mnt/flash\n", "    mount: /etc/\n", "storage.flash.mount", "mount-clash"),
    "duplicate YAML key": Case(
        "staging", "  accounting: true ", "  accounting: true\n  accounting: false ", "slurm.accounting", "yaml",
        anchor="  accounting: false", message="appears twice"),
    "storage served from a compute group": Case(
        "staging", "      server_group: nfs\n", "      server_group: gpu\n", "storage.nfs[0].server_group", "storage"),
    "rail groups that do not divide the rails": Case(
        "meta-24k-ib", "  scalable_unit_nodes: 32\n", "  scalable_unit_nodes: 32\n  rail_groups: 3\n",
        "fabric.rail_groups", "rail-groups", anchor="  rail_groups: 3"),
    "no controller": Case(
        "staging", "    role: controller\n", "    role: login\n", "node_groups", "roles", anchor="node_groups:"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rule_fires_with_location_and_fix(case: Case, write_spec):
    text, line = mutate(example_text(case.example), case.old, case.new)
    path = write_spec(text)
    if case.anchor:
        line = line_of(text, case.anchor)
    f = one(findings_of(path), case.field, case.rule)
    assert f.level == "error"
    assert_located(f, path, line)
    assert case.fix in f.fix
    assert case.message in f.message


def test_every_rule_case_loads_once_reverted(write_spec):
    """Sanity for the table: every example used above loads as shipped, so each finding is the change's."""
    for name in {c.example for c in CASES.values()}:
        assert findings_of(example_path(name)) == []


def test_ratio_decides_whether_the_leaf_fits(write_spec):
    """Same 40-node leaf: 1:1 needs 80 ports of the 64-port bridge (radix), 2:1 needs 60 and plans."""
    base = example_text("staging").replace("  nodes_per_leaf: 2 ", "  nodes_per_leaf: 40 ").replace(
        "    count: 4\n", "    count: 80\n")
    ok = write_spec(base.replace("  tiers: 2\n", "  tiers: 2\n  oversubscription: {leaf: '2:1'}\n"), "ok.yaml")
    bad = write_spec(base, "bad.yaml")
    assert [f.rule for f in findings_of(bad)] == ["radix"]
    leaf = load_cluster(ok).plan.tier("leaf")
    assert (leaf.down, leaf.up) == (40, 20)


def test_block_topology_accepted_from_23_11(write_spec):
    text = example_text("staging").replace("  topology: tree\n", "  topology: block\n").replace(
        '  version: "22.05"', '  version: "23.11"')
    assert findings_of(write_spec(text)) == []


def test_three_tier_capacity_boundary_is_not_an_error(write_spec):
    """8,192 nodes x 8 rails = 64^3/4 endpoints: exactly what 3 tiers of 64-port switches hold."""
    text, _ = mutate(example_text("meta-24k-ib"), "    count: 3072\n", "    count: 8192\n")
    assert findings_of(write_spec(text)) == []


# ---- YAML details ------------------------------------------------------------------------------

def test_unquoted_ratio_is_text_not_base_60(write_spec):
    """YAML 1.1 reads 1:1 as 61 and 7:1 as 421; the loader keeps them (and times like 1:00:00) as text."""
    text = example_text("meta-24k-roce").replace('{leaf: "1:1", spine: "7:1"}', "{leaf: 1:1, spine: 7:1}")
    text = text.replace('max_time: "14-00:00:00"', "max_time: 1:00:00")
    spec = load_cluster(write_spec(text)).spec
    assert spec.fabric.oversubscription == {"leaf": "1:1", "spine": "7:1"}
    assert spec.slurm.partitions[0].max_time == "1:00:00"
    assert spec.fabric.ratio("spine") == 7.0


def test_integer_ratio_is_a_type_error(write_spec):
    text, line = mutate(example_text("staging"), "  tiers: 2\n", "  tiers: 2\n  oversubscription: {leaf: 61}\n")
    path = write_spec(text)
    f = one(findings_of(path), "fabric.oversubscription.leaf", "string_type")
    assert_located(f, path, line + 1)


def test_duplicate_key_reported_at_its_second_occurrence(write_spec):
    text = example_text("staging").replace("  design: fat-tree\n", "  design: fat-tree\n  design: rail-optimized\n")
    path = write_spec(text)
    f = one(findings_of(path), "fabric.design", "yaml")
    assert f.line == line_of(text, "  design: rail-optimized")


def test_yaml_syntax_error_names_its_line(write_spec):
    text, line = mutate(example_text("staging"), "    count: 4\n", "    count: [4\n")
    fs = findings_of(write_spec(text))
    assert [f.rule for f in fs] == ["yaml"]
    assert fs[0].line is not None and fs[0].line >= line
    assert fs[0].fix


# ---- many problems at once ---------------------------------------------------------------------

def test_syntax_problems_reported_together(write_spec):
    text = example_text("staging")
    text = text.replace("  topology: tree\n", "  topolgy: tree\n")
    text = text.replace("    count: 4\n", "    count: four\n")
    text = text.replace("  type: roce\n", "  type: ethernet\n")
    fs = findings_of(write_spec(text))
    assert {(f.field, f.rule) for f in fs} >= {
        ("slurm.topolgy", "unknown-key"), ("node_groups[1].count", "int_parsing"), ("fabric.type", "literal_error")}
    assert len({f.line for f in fs}) == len(fs)


def test_meaning_problems_reported_together(write_spec):
    text = example_text("staging")
    text = text.replace("    gpus_per_node: 4\n", "    gpus_per_node: 3\n")
    text = text.replace('    hostname: "nfs##"\n', '    hostname: "gpu##"\n')
    text = text.replace("  topology: tree\n", "  topology: block\n")
    text = text.replace("          mount: /home/shared\n", "          mount: /mnt/flash/home\n")
    path = write_spec(text)
    fs = findings_of(path)
    assert {f.rule for f in fs} >= {"gpu-count", "hostname-collision", "slurm-version", "mount-clash"}
    for f in fs:
        assert f.file == str(path) and f.line and f.fix and f.rule


def test_warnings_do_not_stop_loading():
    """Meta's 7:1 aggregation cannot split 384 downlinks exactly: a located warning, not an error."""
    loaded = load_unchecked(example_path("meta-24k-roce"))
    fs = check_meaning(loaded)
    w = one(fs, "fabric.oversubscription.spine", "ratio-rounded")
    assert w.level == "warning"
    assert w.line == line_of(example_text("meta-24k-roce"), "  oversubscription: {")
    assert all(f.level == "warning" for f in fs)


# ---- user catalog ------------------------------------------------------------------------------

def test_user_catalog_switch_is_used_by_the_planner():
    """meta-rsc adds an 800-port HDR director that the built-in catalog lacks; the spine tier uses it."""
    assert "cs8500" not in SWITCHES
    cluster = load_cluster(example_path("meta-rsc-phase1"))
    spec = cluster.spec
    assert spec.parts.switches["cs8500"].ports == {200: 800}
    spine = cluster.plan.tier("spine")
    assert (spine.model, spine.radix) == ("cs8500", 800)


def test_user_catalog_overrides_a_builtin(write_spec):
    """A spec can redefine a built-in part: with 2 allowed, 2 x H100 stops being an error."""
    text = example_text("staging").replace("    gpus_per_node: 4\n", "    gpus_per_node: 2\n")
    assert [f.rule for f in findings_of(write_spec(text, "before.yaml"))] == ["gpu-count"]
    override = (
        "catalog:\n  gpus:\n    h100-sxm5-80g:\n      vendor: nvidia\n      name: H100 (2-GPU board)\n"
        "      memory_gb: 80\n      slurm_type: h100\n      allowed_per_node: [2, 4, 8]\n")
    assert findings_of(write_spec(override + text, "after.yaml")) == []
    assert GPUS["h100-sxm5-80g"].allowed_per_node == (4, 8)  # the built-in is untouched


def test_user_catalog_entry_is_validated_and_located(write_spec):
    text, line = mutate(example_text("meta-rsc-phase1"), "      ports: {200: 800}\n", "      ports: {200: many}\n")
    path = write_spec(text)
    f = one(findings_of(path), "catalog.switches.cs8500.ports[200]", "int_parsing")
    assert_located(f, path, line)


def test_user_catalog_switch_of_the_wrong_fabric(write_spec):
    text, _ = mutate(example_text("meta-rsc-phase1"), "      fabrics: [infiniband]\n", "      fabrics: [roce]\n")
    path = write_spec(text)
    f = one(findings_of(path), "fabric.switches.spine", "fabric-type")
    assert_located(f, path, line_of(text, "  switches: {"))


# ---- files that are not specs ------------------------------------------------------------------

ALIAS_BOMB = ("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9))).encode()


@pytest.mark.parametrize("content, rule", [
    (b"", "yaml"),
    (b"- just\n- a list\n", "yaml"),
    (b"\xff\xfe not utf-8", "file"),
    (b"name: [unclosed\n", "yaml"),
    (b"a: &x [*x]\n", "yaml"),
    (b"<<: {name: x}\n", "yaml"),
    # "billion laughs": 1 kB of aliases of aliases expanding to 10^9 values must not hang the loader
    (ALIAS_BOMB, "yaml"),
], ids=["empty", "list", "binary", "unclosed", "alias", "merge-key", "alias-bomb"])
def test_non_specs_are_findings(content, rule, write_spec):
    fs = findings_of(write_spec(content))
    assert fs and fs[0].rule == rule and fs[0].fix


def test_missing_file_is_a_finding(tmp_path):
    fs = findings_of(tmp_path / "nope.yaml")
    assert [f.rule for f in fs] == ["file"]
    assert str(tmp_path / "nope.yaml") in fs[0].render()


def test_compute_group_off_the_fabric_is_warned(write_spec):
    """slurmctld warns 'switches lack access to 2 nodes' for compute nodes under no switch; check says so first."""
    extra = ('  - name: cpu\n    role: compute\n    count: 2\n    hostname: "cpu##"\n'
             "    cpu: {sockets: 1, cores_per_socket: 1, threads_per_core: 1}\n    memory_gb: 1\nfabric:\n")
    text, _ = mutate(example_text("staging"), "fabric:\n", extra)
    text, _ = mutate(text, "      groups: [gpu]\n", "      groups: [gpu, cpu]\n")
    path = write_spec(text)
    load_cluster(path)  # a warning, not an error
    fs = check_meaning(load_unchecked(path))
    w = one(fs, "node_groups[4].nics_per_node", "topology")
    assert w.level == "warning" and w.line == line_of(text, "  - name: cpu") and w.fix


# ---- slurm.parameters ----------------------------------------------------------------------------

def test_owned_slurm_key_is_refused_naming_the_field_that_sets_it(write_spec):
    """slurm.parameters may add or override computed defaults, never a key gpucluster writes from the
    spec: TopologyPlugin comes from slurm.topology (case does not matter to Slurm, nor here)."""
    text, _ = mutate(example_text("staging"), "  topology: tree\n",
                     "  topology: tree\n  parameters:\n    topologyplugin: topology/flat\n    MaxArraySize: 10001\n")
    path = write_spec(text)
    f = one(findings_of(path), "slurm.parameters.topologyplugin", "owned-key")
    assert "slurm.topology" in f.message and "slurm.topology" in f.fix
    assert f.line == line_of(text, "    topologyplugin:") and f.file == str(path)


def test_slurm_parameters_take_plain_values_only(write_spec):
    """A value is one line of text or a whole number: a YAML boolean or a newline is a syntax finding."""
    text, _ = mutate(example_text("staging"), "  topology: tree\n",
                     "  topology: tree\n  parameters:\n    SlurmctldDebug: yes\n    MaxArraySize: \"1\\n2\"\n")
    rules = {f.field: f.rule for f in findings_of(write_spec(text))}
    assert set(rules) == {"slurm.parameters.SlurmctldDebug", "slurm.parameters.MaxArraySize"}
