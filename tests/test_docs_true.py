"""Docs are true: every file, folder, module and Python name that README.md and docs/*.md name exists.

Three kinds of reference are checked, each as the reader would follow it:
- a path from the project root (`src/...`, `tests/...`, `bench/...`, `roles/...`, ...; `gpucluster/...` is the
  package under src/); a `*` in it is a glob that must match something;
- a dotted name under `gpucluster.` (a module, or a module and the names inside it);
- a Markdown link to a file of the project, relative to the page.
Placeholders (`<stack>`, `NAME`, `{group}`) are not references and are left out.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOPS = ("src", "tests", "bench", "roles", "playbooks", "plugins", "scripts", "examples", "templates", "stacks",
        "docs", "gpucluster")
PATH_RE = re.compile(r"(?<![\w/.~$-])((?:{})/[A-Za-z0-9_.*/-]*[A-Za-z0-9_*/])".format("|".join(TOPS)))
DOTTED_RE = re.compile(r"(?<![\w./-])gpucluster(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?![\w=-])")
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PLACEHOLDER = re.compile(r"[<>{}]|\b[A-Z]{2,}\b|\.\.\.")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _paths(page: Path) -> list[str]:
    found = []
    for line in _text(page).splitlines():
        for m in PATH_RE.finditer(line):
            ref = m.group(1)
            after = line[m.end():m.end() + 2]
            if any(c in after for c in "<{") or PLACEHOLDER.search(ref) or len(Path(ref).stem) == 1:
                continue  # `stacks/Pulumi.<stack>.yaml`, `examples/x.yaml:6:` (a message's shape)
            found.append(ref)
    return sorted(set(found))


def _exists(ref: str) -> bool:
    rel = "src/" + ref if ref.startswith("gpucluster/") else ref
    if "*" in rel:
        return any(ROOT.glob(rel.rstrip("/")))
    return (ROOT / rel).exists()


def _labels() -> set[str]:
    """podman label keys of the staged nodes and images (`gpucluster.state`, `LABEL gpucluster.recipe=`): names
    in the docs, but not Python's. Read from the stage code, so a label the code drops fails here too."""
    found: set[str] = set()
    for src in (ROOT / "src" / "gpucluster" / "stage").glob("*.py"):
        found |= set(re.findall(r"gpucluster\.[a-z][a-z-]*(?==)", src.read_text()))
        found |= set(re.findall(r"[\"']gpucluster\.[a-z][a-z-]*[\"']", src.read_text()))
    return {label.strip("\"'") for label in found}


def _importable(dotted: str) -> bool:
    """The longest importable module prefix, then attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                # a module not imported by its package's __init__ is still a module of it
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{name}")
                except (ImportError, AttributeError):
                    return False
            else:
                obj = getattr(obj, name)
        return True
    return False


CASES = [(page, ref) for page in PAGES for ref in _paths(page)]


@pytest.mark.parametrize(("page", "ref"), CASES, ids=[f"{p.name}:{r}" for p, r in CASES])
def test_every_path_named_in_the_docs_exists(page: Path, ref: str) -> None:
    assert _exists(ref), f"{page.relative_to(ROOT)} names {ref}, which is not in the tree"


DOTTED = sorted({(page, m.group(0)) for page in PAGES for m in DOTTED_RE.finditer(_text(page))
                 if m.group(0) not in _labels()},
                key=lambda c: (c[0].name, c[1]))


@pytest.mark.parametrize(("page", "name"), DOTTED, ids=[f"{p.name}:{n}" for p, n in DOTTED])
def test_every_python_name_in_the_docs_exists(page: Path, name: str) -> None:
    assert _importable(name), f"{page.relative_to(ROOT)} names {name}, which cannot be imported"


LINKS = sorted({(page, m.group(1)) for page in PAGES for m in LINK_RE.finditer(_text(page))
                if "://" not in m.group(1) and not m.group(1).startswith("mailto:")},
               key=lambda c: (c[0].name, c[1]))


@pytest.mark.parametrize(("page", "target"), LINKS, ids=[f"{p.name}:{t}" for p, t in LINKS])
def test_every_link_to_a_project_file_resolves(page: Path, target: str) -> None:
    assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which is not there"


def test_the_checker_finds_references() -> None:
    """The three extractors see what the pages are known to name (so an empty pattern cannot pass)."""
    readme = ROOT / "README.md"
    assert "scripts/demo.sh" in _paths(readme)
    assert any(n == "docs/security.md" for p, n in LINKS if p == readme)
    assert not _exists("src/gpucluster/no_such_module.py")
    assert not _importable("gpucluster.no_such_module")
