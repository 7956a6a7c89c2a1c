"""`gpucluster expand SPEC`: every default filled in and marked, as YAML that `check` accepts again.

The round trip is the contract: the expanded spec loads to the same model as its source, `check`
accepts it, and expanding it again prints the same values (now all written). The marks are checked
against the model: a line ends in `# default` exactly when the source did not set that field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import EXAMPLES, example_path

from gpucluster.cli import main
from gpucluster.spec.expand import MARK
from gpucluster.spec.fieldtable import field_table, updated
from gpucluster.spec.loader import load_spec
from gpucluster.spec.model import ClusterSpec


def expand(capsys, path) -> str:
    assert main(["expand", str(path)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", EXAMPLES)
def test_expand_round_trips_through_check(name, capsys, tmp_path):
    text = expand(capsys, example_path(name))
    again = tmp_path / f"{name}.yaml"
    again.write_text(text)
    assert main(["check", str(again)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert load_spec(again).spec.model_dump() == load_spec(example_path(name)).spec.model_dump()
    # expanding the expansion prints the same lines, with nothing left to mark as a default
    twice = expand(capsys, again)
    assert [line.removesuffix(MARK) for line in text.splitlines()[1:]] == twice.splitlines()[1:]
    assert MARK not in twice


def test_defaults_are_marked_and_written_values_are_not(capsys):
    lines = expand(capsys, example_path("staging")).splitlines()
    # staging's gpu group sets nodes_per_rack: 2; its storage groups leave it at the default 1
    assert lines.count("    nodes_per_rack: 2") == 1
    assert lines.count("    nodes_per_rack: 1" + MARK) == 3
    assert "  version: '22.05'" in lines  # written, and quoted so YAML does not read a number
    assert "  tree_merge_leaves: 1" + MARK in lines
    assert "health:" in lines and "  interval: 30" in lines and "  check_timeout: 20" + MARK in lines
    # a section the spec left out is a default, and so is everything in it
    drivers = lines.index("drivers:" + MARK)
    assert all(line.endswith(MARK) for line in lines[drivers: lines.index("health:")])


def test_every_field_of_the_model_is_printed(capsys):
    from gpucluster.spec.model import NodeGroup

    text = expand(capsys, example_path("staging"))
    text = text[text.index("\nnode_groups:\n"): text.index("\nfabric:")]
    for field in NodeGroup.model_fields:
        # in each of staging's four groups: the first key on the item's '- ' line, the others under it
        assert len(re.findall(rf"^  [- ] {field}:", text, re.M)) == 4, field


def test_a_bad_spec_is_refused_like_check(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(example_path("staging").read_text().replace("    count: 4\n", "    count: four\n"))
    assert main(["expand", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "node_groups[1].count" in err and err.rstrip().endswith("1 problem; nothing was written")


# ---- docs/spec.md's table of fields, generated from the model ------------------------------------------

SPEC_MD = Path(__file__).resolve().parent.parent / "docs" / "spec.md"


def test_spec_md_field_table_is_the_models():
    doc = SPEC_MD.read_text()
    assert updated(doc) == doc, "docs/spec.md's field table differs from the model: run " \
                                "python -m gpucluster.spec.fieldtable docs/spec.md and review the diff"


def test_the_table_lists_every_required_field_and_default():
    table = field_table()
    assert "| `node_groups[].nodes_per_rack` | `1` |" in table  # a default once left undocumented
    assert "| `node_groups[].count` | **required** |" in table
    for name, info in ClusterSpec.model_fields.items():
        if name != "catalog":
            assert f"| `{name}` | {'**required**' if info.is_required() else ''}" in table, name


def test_expand_json_names_the_defaulted_fields(capsys):
    from gpucluster.cli import main

    assert main(["expand", "--json", "examples/staging.yaml"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["spec"]["name"] == "staging"
    assert "name" not in doc["defaulted"]  # written in the spec
    assert "slurm.prolog" in doc["defaulted"]
