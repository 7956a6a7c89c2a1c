"""The one table of slurm.conf keys (gpucluster.slurmkeys) against everything that names keys: the template,
the rendered files of every example, the spec's owned-key rule, the roles' restart filter, the release list."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import cluster_example, example_path, load_file

from gpucluster import slurmkeys, slurmtext
from gpucluster.render import render_all, templates_dir
from gpucluster.render.health.slurmconf import slurm_conf_lines
from gpucluster.spec import rules as checks
from gpucluster.spec.slurm_versions import RELEASES

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.yaml"))


def _filters():
    return load_file(ROOT / "plugins/filter/gpucluster_roles.py", "gpucluster_roles")


def test_the_table_covers_every_release():
    assert slurmkeys.RELEASES == RELEASES


def test_every_entry_is_well_formed():
    names = [k.name.lower() for k in slurmkeys.KEYS]
    assert len(names) == len(set(names)), "a key is listed twice"
    for k in slurmkeys.KEYS:
        assert k.syntax in slurmkeys.SYNTAXES, k
        assert k.changes and k.changes[0][0] == RELEASES[0], k
        assert all(cls in slurmkeys.CLASSES and since in RELEASES for since, cls in k.changes), k
        assert k.of is None or (slurmkeys.key(k.of) and k.owner == slurmkeys.key(k.of).owner), k
        assert k.source, k


def test_the_template_writes_exactly_the_tables_template_keys():
    text = (Path(templates_dir()) / "slurm" / "slurm.conf.j2").read_text()
    written = set(re.findall(r"^([A-Z][A-Za-z]+)=", text, flags=re.M))
    assert "fixed_settings" in text
    assert not written & {k for k, _ in slurmkeys.fixed_settings()}, "a fixed setting is written twice"
    assert written | {k for k, _ in slurmkeys.fixed_settings()} == slurmkeys.template_keys()


def test_the_health_lines_are_the_tables_health_keys():
    cluster = cluster_example("staging")
    keys = {line.split("=", 1)[0] for line in slurm_conf_lines(cluster)}
    assert keys and keys <= {k.name for k in slurmkeys.KEYS if k.written == "health"}


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_key_a_rendered_slurm_conf_holds_is_in_the_table(name):
    cluster = cluster_example(name)
    text = render_all(cluster, cabling=False)["slurm.conf"]
    site = {k.lower() for k in cluster.spec.slurm.parameters}
    unknown = [k for k in slurmtext.all_settings(text) if slurmkeys.key(k) is None and k not in site]
    assert not unknown


def test_the_owned_keys_are_the_tables():
    assert slurmkeys.owned() == checks.OWNED_KEYS
    assert {"ControlMachine", "ControlAddr", "BackupController", "BackupAddr", "SlurmctldAddr"} <= set(
        checks.OWNED_KEYS)


@pytest.mark.parametrize(("key", "version", "want"), [
    ("SlurmctldPort", "22.05", slurmkeys.RESTART), ("SlurmctldPort", "26.05", slurmkeys.RESTART),
    ("StateSaveLocation", "23.02", slurmkeys.RESTART_SLURMCTLD), ("StateSaveLocation", "23.11", slurmkeys.RECONFIGURE),
    ("SchedulerParameters", "22.05", slurmkeys.RECONFIGURE), ("NodeName", "22.05", slurmkeys.RESTART),
    ("NodeName", "24.11", slurmkeys.RECONFIGURE), ("NotInTheTable", "22.05", slurmkeys.RECONFIGURE),
])
def test_change_class_per_release(key, version, want):
    assert slurmkeys.change_class(key, version) == want


CONF = "ClusterName=c\nSlurmctldHost=a\nSlurmctldPort=6817\nStateSaveLocation=/s\nNodeName=n1 CPUs=8\n"


@pytest.mark.parametrize(("change", "version", "want"), [
    (("SlurmctldHost=a", "SlurmctldHost=b"), None, ["slurmctldhost changed"]),
    (("SlurmctldHost=a", "SlurmctldHost=b"), "22.05", ["slurmctldhost changed"]),
    (("SlurmctldHost=a", "SlurmctldHost=b"), "24.11", []),
    (("SlurmctldHost=a", "SlurmctldHost=a\nSlurmctldHost=b"), "22.05", ["slurmctldhost changed"]),
    (("StateSaveLocation=/s", "StateSaveLocation=/t"), "23.11", []),
    (("CPUs=8", "CPUs=16"), "23.02", ["node definitions (NodeName lines) changed"]),
    (("CPUs=8", "CPUs=16"), "23.11", []),
    (("SlurmctldPort=6817", "SlurmctldPort=7817"), "26.05", ["slurmctldport changed"]),
])
def test_the_roles_restart_filter_reads_the_table(change, version, want):
    assert _filters().slurm_conf_restart_reasons(CONF, CONF.replace(*change), version) == want


def test_there_is_one_slurm_conf_parser():
    text = (ROOT / "plugins/filter/gpucluster_roles.py").read_text()
    assert "def slurm_conf_settings" not in text and "RESTART_KEYS" not in text
    assert "OWNED_KEYS = {" not in (ROOT / "src/gpucluster/spec/rules.py").read_text()


def test_compile_to_never_leaves_a_moment_without_the_compiled_folder(tmp_path, monkeypatch):
    """Every rename while compile_to replaces an existing compiled/ leaves compiled/ in place (outputs.write_set
    swaps with one rename-exchange; a hand-rolled rename-aside-then-in has a moment with none)."""
    from gpucluster.compiled import COMPILED, compile_to

    cluster = cluster_example("staging")
    target = compile_to(cluster, tmp_path / "state")
    assert target == tmp_path / "state" / COMPILED
    gaps = []
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def watched(src, dst, *a, _real=real, **kw):
            _real(src, dst, *a, **kw)
            if not target.is_dir():
                gaps.append((src, dst))
        monkeypatch.setattr(os, name, watched)
    compile_to(cluster, tmp_path / "state")
    monkeypatch.undo()
    assert not gaps
    assert (target / "facts.json").is_file() and (target / "rendered" / "slurm.conf").is_file()
    assert (target / "stamp.json").stat().st_mode & 0o777 == 0o600
    assert example_path("staging").is_file()


def test_check_refuses_a_smuggled_setting_located(tmp_path, capsys):
    """A smuggled setting, `SlurmctldDebug: "info HealthCheckInterval=7"`, is exit 2 with file:line, field, rule
    and fix."""
    from gpucluster.cli import main

    text = example_path("staging").read_text().replace(
        "  partitions:\n", '  parameters:\n    SlurmctldDebug: "info HealthCheckInterval=7"\n  partitions:\n', 1)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    line = text.splitlines().index('    SlurmctldDebug: "info HealthCheckInterval=7"') + 1
    try:
        rc = main(["check", str(spec)])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{spec}:{line}: slurm.parameters.SlurmctldDebug: " in err
    assert "[slurm-value]" in err and "write SlurmctldDebug without spaces" in err
    assert "Traceback" not in err


def test_the_operations_doc_lists_the_tables_classes():
    """docs/operations.md's per-release key table is the table's (no key changes class elsewhere than 23.11)."""
    for k in slurmkeys.KEYS:
        assert all(since in ("22.05", "23.11") for since, _ in k.changes), k
    doc = (ROOT / "docs" / "operations.md").read_text()
    rows = {m[0]: (m[1], m[2]) for m in re.findall(r"^\| (\w+) \| ([\w-]+) \| ([\w-]+) \|", doc, flags=re.M)}
    want = {k.name: (slurmkeys.change_class(k.name, "22.05"), slurmkeys.change_class(k.name, "23.11"))
            for k in slurmkeys.KEYS}
    want = {name: classes for name, classes in want.items() if classes != ("reconfigure", "reconfigure")}
    assert {name: rows.get(name) for name in want} == want
    assert not {name for name in rows if slurmkeys.key(name) and name not in want}
