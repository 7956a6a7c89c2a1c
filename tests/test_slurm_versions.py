"""Rendering for every Slurm release 22.05 .. 26.05: the version table, the rules it drives (a setting the
release lacks is a located error naming the release that added or removed it; a deprecated one is a
warning with its replacement), topology.yaml from 25.05, valid BlockSizes, and the --slurm-version
override. Expected values come from the table and the plan; the real slurmctld of each line checks the
same table in test_slurm_versions_real.py.
"""

from __future__ import annotations

import re
from itertools import pairwise

import hostlist
import pytest
import yaml
from conftest import (
    EXAMPLES,
    compiled,
    example_data,
    example_path,
    example_text,
    findings_of,
    generic_spec,
    line_of,
    mutate,
    spec_from_data,
)

from gpucluster.cli import main
from gpucluster.cluster import Cluster, check_meaning, load_cluster
from gpucluster.errors import SpecError
from gpucluster.render import render_all
from gpucluster.render.topology import block_sizes, block_sizes_problem, blocks, named_topologies, slurm_switches
from gpucluster.spec.model import LoadedSpec
from gpucluster.spec.rules import OWNED_KEYS
from gpucluster.spec.slurm_versions import (
    CHANGES,
    PARAMETERS,
    RELEASES,
    Change,
    feature,
    has,
    previous,
    version_tuple,
)

RULE = "slurm-version"


def texts(cluster) -> dict[str, str]:
    return {k: v if isinstance(v, str) else "".join(v()) for k, v in render_all(cluster, cabling=False).items()}


def at(data: dict, version: str) -> LoadedSpec:
    data["slurm"]["version"] = version
    return LoadedSpec(spec=spec_from_data(data), source="spec.yaml", lines={})


def version_findings(data: dict, version: str) -> list:
    return [f for f in check_meaning(at(data, version)) if f.rule == RULE]


# ---- the table ---------------------------------------------------------------------------------

def test_releases_are_two_a_year_from_22_05_to_26_05():
    assert RELEASES[0] == "22.05" and RELEASES[-1] == "26.05"
    for a, b in pairwise(RELEASES):
        year = version_tuple(a)[0]
        assert version_tuple(b) in {(year, 11), (year + 1, 2), (year + 1, 5)}


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.setting)
def test_every_entry_is_sourced_and_ordered(change: Change):
    assert change.source, "every entry says where it was read or measured"
    spans = [v for v in (change.added, change.deprecated, change.removed) if v]
    assert spans and all(v in RELEASES for v in spans)
    assert spans == sorted(spans, key=version_tuple)
    assert (change.key is None) != (change.feature is None) or change.feature


def test_no_parameter_entry_is_a_key_gpucluster_owns():
    """The spec refuses owned keys outright; a version entry for one would never be reached."""
    owned = {k.lower() for k in OWNED_KEYS}
    assert not [c.setting for c in PARAMETERS if c.key.lower() in owned]


def test_the_issue_milestones_are_in_the_table():
    assert [feature(f).added for f in ("topology-block", "block-sizes", "topology-yaml", "dynamic-topology",
                                       "topology-ring", "topology-torus3d", "block-sizes-fatal-yaml")] == \
        ["23.11", "24.05", "25.05", "25.11", "26.05", "26.05", "26.05"]


# ---- the release itself ------------------------------------------------------------------------

@pytest.mark.parametrize("version", RELEASES)
def test_every_release_is_accepted(version):
    assert not version_findings(example_data("staging"), version)


@pytest.mark.parametrize("version", ["21.08", "23.05", "26.11", "22.5"])
def test_other_versions_are_refused_with_the_list(write_spec, version):
    text = example_text("staging").replace('version: "22.05"', f'version: "{version}"')
    path = write_spec(text)
    found = [f for f in findings_of(path) if f.field == "slurm.version"]
    assert len(found) == 1
    f = found[0]
    assert f.rule == RULE and f.line == line_of(text, "  version:")
    assert all(r in f.fix for r in RELEASES)


# ---- version-gated slurm.parameters keys: refused below, accepted from ---------------------------

def with_param(change: Change) -> dict:
    data = example_data("staging")
    data["slurm"]["parameters"] = {change.key: change.test_value}
    return data


ADDED = [c for c in PARAMETERS if c.added and previous(c.added)]
REMOVED = [c for c in PARAMETERS if c.removed]
DEPRECATED = [c for c in PARAMETERS if c.deprecated]


@pytest.mark.parametrize("change", ADDED, ids=lambda c: f"{c.setting}@{c.added}")
def test_parameter_refused_below_the_release_that_added_it(change):
    found = version_findings(with_param(change), previous(change.added))
    assert [f.path for f in found] == [("slurm", "parameters", change.key)]
    assert found[0].level == "error" and f"added in {change.added}" in found[0].message


@pytest.mark.parametrize("change", ADDED, ids=lambda c: f"{c.setting}@{c.added}")
def test_parameter_accepted_from_the_release_that_added_it(change):
    assert not [f for f in version_findings(with_param(change), change.added) if f.level == "error"]


@pytest.mark.parametrize("change", REMOVED, ids=lambda c: f"{c.setting}@{c.removed}")
def test_parameter_refused_from_the_release_that_removed_it(change):
    found = version_findings(with_param(change), change.removed)
    assert [f.path for f in found] == [("slurm", "parameters", change.key)]
    assert found[0].level == "error" and change.removed in found[0].message and "removed" in found[0].message


@pytest.mark.parametrize("change", REMOVED, ids=lambda c: f"{c.setting}@{c.removed}")
def test_parameter_accepted_before_the_release_that_removed_it(change):
    before = previous(change.removed)
    if not change.supported(before):
        pytest.fail(f"{change.setting} never exists")
    assert not [f for f in version_findings(with_param(change), before) if f.level == "error"]


@pytest.mark.parametrize("change", DEPRECATED, ids=lambda c: f"{c.setting}@{c.deprecated}")
def test_deprecated_parameter_warns_with_its_replacement(change):
    found = version_findings(with_param(change), change.deprecated)
    assert [(f.path, f.level) for f in found] == [(("slurm", "parameters", change.key), "warning")]
    assert change.deprecated in found[0].message and found[0].fix == change.replacement
    if previous(change.deprecated) and change.supported(previous(change.deprecated)):
        assert not version_findings(with_param(change), previous(change.deprecated))


def test_a_parameter_finding_is_located_and_rendered_with_its_line(write_spec):
    text, line = mutate(example_text("staging"), "  profile: staging ",
                        "  parameters:\n    MetricsType: metrics/openmetrics\n  profile: staging ")
    found = [f for f in findings_of(write_spec(text)) if f.rule == RULE]
    assert len(found) == 1 and found[0].line == line + 1
    assert "MetricsType needs Slurm 25.11 or later (added in 25.11); slurm.version is 22.05" in found[0].render()


def test_flag_entries_match_one_flag_of_a_list():
    c = next(c for c in PARAMETERS if c.setting == "SchedulerParameters=bf_allow_magnetic_slot")
    assert c.matches("schedulerparameters", "bf_continue,bf_allow_magnetic_slot,max_rpc_cnt=10")
    assert not c.matches("SchedulerParameters", "bf_continue")
    d = next(c for c in PARAMETERS if c.setting == "SelectType=select/cons_res")
    assert d.matches("SelectType", "select/cons_res") and not d.matches("SelectType", "select/cons_tres")


# ---- version-gated features the spec's own fields choose -----------------------------------------

def spec_feature(name: str, data: dict) -> dict:
    if name == "topology-block":
        data["slurm"]["topology"] = "block"
    elif name == "topology-yaml":
        data["slurm"]["partitions"][0]["topology"] = "block"
    elif name == "gres-autodetect-nvidia":
        data["node_groups"][1]["gres_detect"] = "nvidia"
    else:
        data["health"] = {"node_state": feature(name).value}
    return data


SPEC_FEATURES = {"topology-block": ("slurm", "topology"), "topology-yaml": ("slurm", "partitions", 0, "topology"),
                 "gres-autodetect-nvidia": ("node_groups", 1, "gres_detect"),
                 "hc-nondrained-idle": ("health", "node_state"),
                 "hc-start-only": ("health", "node_state"),
                 "hc-reboot-only": ("health", "node_state")}


@pytest.mark.parametrize("name", SPEC_FEATURES)
def test_spec_feature_refused_below_and_accepted_from_its_release(name):
    added = feature(name).added
    below = version_findings(spec_feature(name, example_data("staging")), previous(added))
    assert below and {f.path for f in below} == {SPEC_FEATURES[name]}
    assert all(f.level == "error" and f"added in {added}" in f.message for f in below)
    assert not version_findings(spec_feature(name, example_data("staging")), added)


def test_only_health_check_states_stand_alone():
    data = example_data("staging")
    data["health"] = {"node_state": "IDLE,START_ONLY"}
    found = version_findings(data, "26.05")
    assert [(f.path, f.level) for f in found] == [(("health", "node_state"), "error")]
    assert "START_ONLY alone" in found[0].fix


def test_partition_topology_equal_to_the_cluster_one_needs_no_yaml():
    data = example_data("staging")
    data["slurm"]["partitions"][0]["topology"] = "tree"
    assert not version_findings(data, "22.05")


# ---- what each release renders -----------------------------------------------------------------

def on_tree(name: str, version: str) -> Cluster:
    """The example at a release, on topology/tree: as on disk, or switched in memory where the example says block
    (GB200/GB300: blocks need 23.11, and these tests follow the tree across every line)."""
    data = example_data(name)
    if data["slurm"].get("topology", "tree") == "tree":
        return load_cluster(example_path(name), slurm_version=version)
    data["slurm"].update(version=version, topology="tree")
    return compiled(spec_from_data(data), f"{name}.yaml (topology: tree)")


def render_at(name: str, version: str) -> dict[str, str]:
    return texts(on_tree(name, version))


# oci.conf is slurmstepd's, not slurmctld's, and takes keys from 23.02 on that 22.05 refuses (render/containers.py);
# tests/test_containers.py checks each release's keys against the real binaries of 22.05, 24.11 and 26.05.
NOT_SLURMCTLDS = ("oci.conf",)


def header_free(files: dict[str, str]) -> dict[str, str]:
    return {k: re.sub(r"(?m)^# .*Slurm \d\d\.\d\d.*\n", "", v) for k, v in files.items() if k not in NOT_SLURMCTLDS}


@pytest.mark.parametrize("name", EXAMPLES)
def test_renders_change_only_where_the_table_says(name):
    """Within 22.05..24.11 and within 25.05..26.05 an example's files differ only in the comment naming
    the release (so the real slurmctld of 24.11 and 26.05 stands for the releases next to it); across
    25.05 topology.conf becomes topology.yaml."""
    groups = [r for r in RELEASES if not has(r, "topology-yaml")], [r for r in RELEASES if has(r, "topology-yaml")]
    for group in groups:
        first = header_free(render_at(name, group[0]))
        for version in group[1:]:
            assert header_free(render_at(name, version)) == first, version
    assert "topology.conf" in render_at(name, "24.11") and "topology.yaml" not in render_at(name, "24.11")
    assert "topology.yaml" in render_at(name, "25.05") and "topology.conf" not in render_at(name, "25.05")


def slurm_records(text: str, kind: str) -> list[dict[str, str]]:
    return [dict(tok.split("=", 1) for tok in line.split()) for line in text.splitlines()
            if line.startswith(f"{kind}=")]


@pytest.mark.parametrize("name", EXAMPLES)
def test_topology_yaml_is_the_planned_tree(name):
    cluster = on_tree(name, "26.05")
    out = texts(cluster)
    doc = yaml.safe_load(out["topology.yaml"])
    assert [t["topology"] for t in doc] == ["tree"] and doc[0]["cluster_default"] is True
    switches = doc[0]["tree"]["switches"]
    planned = slurm_switches(cluster.plan)
    assert [s["switch"] for s in switches] == [s.name for s in planned]
    for got, sw in zip(switches, planned, strict=True):
        if sw.nodes:
            assert hostlist.expand_hostlist(got["nodes"]) == hostlist.expand_hostlist(",".join(sw.nodes))
        else:
            assert set(hostlist.expand_hostlist(got["children"])) == set(sw.switches)
    conf = out["slurm.conf"]
    assert "TopologyPlugin" not in conf  # slurm.conf(5): ignored when topology.yaml exists
    assert {p["PartitionName"]: p["Topology"] for p in slurm_records(conf, "PartitionName")} == \
        {p.name: "tree" for p in cluster.spec.slurm.partitions}


def colossus_by_gpu(h200: str = "block") -> dict:
    """Colossus 200k with an H100 and an H200 partition, the H200 one on its own placement model."""
    data = example_data("colossus-200k")
    data["slurm"]["partitions"] = [{"name": "h100", "groups": ["h100"], "default": True},
                                   {"name": "h200", "groups": ["h200"], "topology": h200}]
    return data


def test_partitions_on_different_designs_get_their_own_named_topologies():
    data = colossus_by_gpu()
    data["slurm"]["version"] = "25.05"
    cluster = compiled(spec_from_data(data))
    out = texts(cluster)
    doc = yaml.safe_load(out["topology.yaml"])
    assert [(t["topology"], t["cluster_default"]) for t in doc] == [("tree", True), ("block", False)]
    planned = blocks(cluster.plan, "25.05")
    assert doc[1]["block"]["block_sizes"] == list(planned.sizes)
    assert [b["block"] for b in doc[1]["block"]["blocks"]] == [u.name for u in planned.units]
    parts = {p["PartitionName"]: p["Topology"] for p in slurm_records(out["slurm.conf"], "PartitionName")}
    assert parts == {"h100": "tree", "h200": "block"}


def test_a_partition_topology_before_25_05_is_refused():
    data = colossus_by_gpu()
    found = version_findings(data, "24.11")
    assert [f.path for f in found] == [("slurm", "partitions", 1, "topology")]
    assert "added in 25.05" in found[0].message


def test_flat_cluster_with_a_block_partition_has_a_flat_default():
    data = colossus_by_gpu()
    data["slurm"]["topology"] = "none"
    data["slurm"]["version"] = "26.05"
    topologies = named_topologies(spec_from_data(data), compiled(spec_from_data(data)).plan, "26.05")
    assert [(t.name, t.default) for t in topologies] == [("flat", True), ("block", False)]
    doc = yaml.safe_load(texts(compiled(spec_from_data(data)))["topology.yaml"])
    assert doc[0] == {"topology": "flat", "cluster_default": True, "flat": True}


def test_no_topology_renders_no_topology_file_on_any_release():
    data = example_data("staging")
    data["slurm"]["topology"] = "none"
    for version in ("22.05", "26.05"):
        data["slurm"]["version"] = version
        out = texts(compiled(spec_from_data(data)))
        assert "topology.conf" not in out and "topology.yaml" not in out
        assert "Topology=" not in out["slurm.conf"] and "TopologyPlugin" not in out["slurm.conf"]


# ---- BlockSizes Slurm accepts --------------------------------------------------------------------

@pytest.mark.parametrize(("sizes", "nodes", "version", "why"), [
    ((4, 8, 16), [4, 4, 4, 4], "24.11", None),
    ((30, 120), [32, 32, 32, 32], "24.11", None),  # topology.conf(5)'s own example
    ((4, 12), [4, 4, 4], "26.05", "power of two"),  # 24.11 and 26.05: 'Invalid BlockSizes value: 12'
    ((8,), [4, 4], "24.11", "smaller than the base"),  # 24.11: 'children count lower than bblock_node_cnt'
    ((8,), [4, 4], "25.05", None),  # allowed from 25.05
    ((8, 4), [8, 8], "26.05", "must grow"),
    ((1, 2 ** 16), [1] * 4, "26.05", "2^15"),
])
def test_block_sizes_problem_follows_slurms_rules(sizes, nodes, version, why):
    problem = block_sizes_problem(sizes, nodes, version)
    assert (problem is None) if why is None else (why in problem)


@pytest.mark.parametrize("version", [r for r in RELEASES if has(r, "block-sizes")])
@pytest.mark.parametrize("name", EXAMPLES)
def test_rendered_block_sizes_are_valid_for_every_example(name, version):
    data = example_data(name)
    data["slurm"].update(topology="block", version=version)
    cluster = compiled(spec_from_data(data))
    found = blocks(cluster.plan, version)  # raises when its own sizes would be refused
    assert block_sizes_problem(found.sizes, [u.count for u in found.units], version) is None
    text = texts(cluster)["topology.yaml" if has(version, "topology-yaml") else "topology.conf"]
    assert ",".join(map(str, found.sizes)) in text.replace(", ", ",")


def test_a_partial_last_unit_sets_the_base_only_before_25_05():
    """Blocks smaller than the base size are allowed from 25.05, so the base stays a whole unit there."""
    plan = compiled(spec_from_data(generic_spec([100], radix=32, unit=16))).plan
    counts = sorted({u.count for u in plan.units})
    assert counts == [4, 16]
    assert block_sizes(plan, "24.11")[0] == 4
    assert block_sizes(plan, "25.05")[0] == 16


# ---- the --slurm-version override ----------------------------------------------------------------

def test_load_cluster_override_replaces_the_spec_version():
    cluster = load_cluster(example_path("staging"), slurm_version="26.05")
    assert cluster.spec.slurm.version == "26.05"
    assert load_cluster(example_path("staging")).spec.slurm.version == "22.05"


def test_override_findings_are_located_at_the_spec_slurm_version():
    with pytest.raises(SpecError) as err:
        load_cluster(example_path("staging"), slurm_version="21.08")
    f = next(f for f in err.value.findings if f.field == "slurm.version")
    assert f.line == line_of(example_text("staging"), "  version:") and f.file.endswith("staging.yaml")


def test_override_runs_every_version_rule():
    """The override is applied before the rules: a 22.05 spec with topology: block renders for 24.11."""
    data = example_data("staging")
    data["slurm"]["topology"] = "block"
    with pytest.raises(SpecError):
        compiled(spec_from_data(data))
    assert not version_findings(data, "24.11")


def test_cli_render_slurm_version(capsys, tmp_path):
    assert main(["render", str(example_path("staging")), "-o", str(tmp_path / "a"), "--no-cabling"]) == 0
    assert main(["render", str(example_path("staging")), "-o", str(tmp_path / "b"), "--no-cabling",
                 "--slurm-version", "26.05"]) == 0
    assert "(Slurm 26.05)" in capsys.readouterr().out
    assert (tmp_path / "a" / "topology.conf").exists() and (tmp_path / "b" / "topology.yaml").exists()
    a, b = (tmp_path / "a" / "slurm.conf").read_text(), (tmp_path / "b" / "slurm.conf").read_text()
    assert a != b and a.replace("Slurm 22.05", "Slurm 26.05").replace("TopologyPlugin=topology/tree\n", "") \
        .replace(" State=UP", " Topology=tree State=UP", 1) == b


def test_cli_render_refuses_an_unknown_slurm_version_and_writes_nothing(capsys, tmp_path):
    rc = main(["render", str(example_path("staging")), "-o", str(tmp_path / "out"), "--slurm-version", "27.05"])
    err = capsys.readouterr().err
    # the flag's value is wrong, not the spec's slurm.version line: blamed on the flag
    assert rc == 2 and "command line: --slurm-version: Slurm 27.05 is not a release" in err
    assert "staging.yaml" not in err and err.rstrip().endswith("1 problem; nothing was written")
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# ---- a coarser logical tree where the fabric below it is non-blocking ------------------------------

def test_merged_leaves_keep_every_node_once_within_pods():
    data = example_data("meta-24k-roce")
    data["slurm"]["tree_merge_leaves"] = 4
    cluster = compiled(spec_from_data(data))
    plan = cluster.plan
    switches = slurm_switches(plan)
    leaves = [s for s in switches if s.level == 0]
    assert len(leaves) == len(plan.units) // 4 and len(switches) == len(leaves) + plan.pods + 1
    seen = [n for s in leaves for n in hostlist.expand_hostlist(",".join(s.nodes))]
    assert sorted(seen) == sorted(h for g in cluster.spec.groups_with_role("compute") for h in g.hosts)
    pod_of = {u.name: u.pod for u in plan.units}
    unit_of_host = {h: u.name for h, u in plan.unit_of_host.items()}
    for s in leaves:
        assert len({pod_of[unit_of_host[h]] for h in hostlist.expand_hostlist(",".join(s.nodes))}) == 1


def test_merging_leaves_behind_oversubscribed_uplinks_is_refused():
    data = example_data("meta-24k-roce")
    data["slurm"]["tree_merge_leaves"] = 4
    data["fabric"]["oversubscription"]["leaf"] = "3:1"
    found = [f for f in check_meaning(LoadedSpec(spec=spec_from_data(data), source="x", lines={}))
             if f.field == "slurm.tree_merge_leaves"]
    assert [f.level for f in found] == ["error"] and "3:1" in found[0].message


def test_merging_leaves_without_a_tree_is_refused():
    data = example_data("meta-24k-roce")
    data["slurm"].update(tree_merge_leaves=4, topology="block", version="24.11")
    found = [f for f in check_meaning(LoadedSpec(spec=spec_from_data(data), source="x", lines={}))
             if f.field == "slurm.tree_merge_leaves"]
    assert [f.level for f in found] == ["error"]


def test_the_docs_list_every_entry_of_the_table():
    """docs/slurm-versions.md names every setting of the table, so the two cannot drift apart."""
    from conftest import ROOT

    doc = (ROOT / "docs" / "slurm-versions.md").read_text()
    assert not [c.setting for c in CHANGES if f"`{c.setting}`" not in doc]
    assert all(r in doc for r in RELEASES)
