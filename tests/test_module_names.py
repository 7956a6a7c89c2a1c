"""No two modules share a name unless they are the same kind of thing in parallel packages (docs/architecture.md).

A name says what a module does; two `files.py` or three `runner.py` make a reader open each to learn which is
which, and make a traceback's last line ambiguous. A pair that is truly parallel (the same job for two parallel
packages) is kept, and listed here with the reason. A new duplicate fails until it is renamed or listed; a listed
pair that is no longer a duplicate fails too, so the list stays true.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = (ROOT / "src" / "gpucluster", ROOT / "plugins")

# basename -> (the modules that share it, relative to src/gpucluster, and why they may)
KEPT = {
    "model.py": ({"spec/model.py", "cluster/model.py"},
                 "each is the data type its floor hands up: spec.model the spec as typed (floor 1, syntax), "
                 "cluster.model the Cluster derived from it (floor 3); imported by package, never bare"),
    "nvlink.py": ({"fabric/nvlink.py", "fabric/asbuilt/nvlink.py"},
                  "the same subject planned and built: NVLink domains as planned (fabric) and as built, compared "
                  "with the plan (fabric.asbuilt), as fabric/cabling is to fabric/asbuilt/match"),
    "gpucluster_apt.py": ({"plugins/action/gpucluster_apt.py", "plugins/modules/gpucluster_apt.py"},
                          "Ansible's own pairing for an action: the task name resolves to the action plugin, and a "
                          "module of the same name carries its documentation (as ansible.builtin.debug does)"),
}


def _not_a_module(path: Path) -> bool:
    """__init__.py names a package, not a module; validate/checks/ is a pytest suite run against nodes, whose
    file names (conftest.py, test_*.py) pytest itself fixes; templates/ holds no modules; a command module is named
    for its command by rule (commands/plan.py is `gpucluster plan`, tests/test_cli_imports.py), so it may share
    the name of the library module that does its work."""
    return path.name == "__init__.py" or ("checks" in path.parts and "validate" in path.parts) or \
        "templates" in path.parts or path.parts[:1] == ("commands",)


def modules_by_name() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for tree in TREES:
        for path in tree.rglob("*.py"):
            if not _not_a_module(path.relative_to(tree)):
                rel = path.relative_to(tree if tree.name == "gpucluster" else ROOT)
                found[path.name].add(str(rel))
    return found


def test_no_two_modules_share_a_name_unless_listed():
    shared = {name: paths for name, paths in modules_by_name().items() if len(paths) > 1}
    unlisted = {name: sorted(paths) for name, paths in shared.items() if KEPT.get(name, (None,))[0] != paths}
    assert not unlisted, (
        f"modules that share a name: {unlisted}. Rename one for what it does, or, if they are the same kind of "
        "thing in parallel packages, list the pair in KEPT with the reason")


def test_every_kept_pair_is_still_a_pair():
    found = modules_by_name()
    stale = {name: sorted(paths) for name, (paths, _) in KEPT.items() if found.get(name) != paths}
    assert not stale, f"KEPT lists pairs the tree no longer has: {stale}; drop or update them"
    assert all(len(why) > 40 for _, why in KEPT.values()), "each kept pair says why"


def test_no_two_test_modules_share_a_name():
    """pytest imports tests/ and tests/staged/ by basename (rootdir mode, no __init__.py): two test_x.py are a
    collection error in whichever run meets both, which CI does (seen: tests/test_pull.py beside
    tests/staged/test_pull.py stopped the unit phase)."""
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen[path.name].append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
