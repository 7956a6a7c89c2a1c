"""Checks that hold for every host are one task per run, not one per host: on a push each per-host
task costs the controller one Ansible worker per host, so a cluster-wide assert run per host grows with the
fleet for nothing. Read from the roles' task files as Ansible parses them (YAML)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_WIDE = "Preflight | the inventory names the cluster spec"
FILES = sorted(p for p in (ROOT / "roles").glob("*/tasks/preflight.yml") if CLUSTER_WIDE in p.read_text())


def test_the_cluster_wide_assert_is_in_the_roles_it_guards():
    assert len(FILES) >= 5, FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parts[-3])
def test_a_cluster_wide_assert_runs_once(path):
    tasks = [t for t in yaml.safe_load(path.read_text()) if t.get("name") == CLUSTER_WIDE]
    assert len(tasks) == 1 and tasks[0].get("run_once") is True, f"{path}: {CLUSTER_WIDE!r} needs run_once: true"
