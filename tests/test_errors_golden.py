"""Golden outputs of the one error format: what a user sees for typical mistakes.

Each case is a spec under tests/golden/errors/ (staging.yaml with one mistake, named for it) and the
command that reads it; the golden file holds the exit status and everything printed on stderr. The
format they pin: `level: file:line: field: message; fix [rule]`, in line order, one finding per cause,
gpucluster's own words (never the schema library's), a flag's value blamed on the flag, and the summary
line `N problems; nothing was written` after every refused run. The six typical mistakes are
misspelt-required-key, memory-over-limit, switch-typo, partition-group-typo, gpu-count and yaml-syntax;
six-at-once puts them in one spec. After a deliberate change of wording:

    GPUCLUSTER_UPDATE_GOLDEN=1 pytest tests/test_errors_golden.py    (and review the diff)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpucluster.cli import main

HERE = Path(__file__).resolve().parent / "golden" / "errors"
UPDATE = os.environ.get("GPUCLUSTER_UPDATE_GOLDEN") == "1"
# The six typical mistakes, then two more (missing key, wrong type), then the format around them
CASES = {
    "misspelt-required-key": ["check"],
    "memory-over-limit": ["check"],
    "switch-typo": ["check"],
    "partition-group-typo": ["check"],
    "gpu-count": ["check"],
    "yaml-syntax": ["check"],
    "missing-required-key": ["check"],
    "wrong-type": ["check"],
    "six-at-once": ["check"],
    "six-at-once@plan": ["plan"],
    "six-at-once@render": ["render", "-o", "{out}"],
    "bad-slurm-version-flag": ["render", "-o", "{out}", "--slurm-version", "99.1"],
    "slurm-version-flag-too-old": ["render", "-o", "{out}", "--slurm-version", "23.02"],
    "nic-on-storage": ["check", "--fail-on", "warning"],
}
LIBRARY_WORDS = re.compile(r"Input should|should have|String should|Value error|valid dictionary|instance of|"
                           r"<top>|Traceback")


def run(case: str, tmp_path: Path, capsys, monkeypatch) -> str:
    spec = case.partition("@")[0] + ".yaml"
    command, *rest = CASES[case]
    argv = [command, spec] + [a.format(out=tmp_path / "out") for a in rest]
    monkeypatch.chdir(HERE)  # the findings name the spec as it was given: a path relative to here
    monkeypatch.setenv("NO_COLOR", "1")
    rc = main(argv)
    captured = capsys.readouterr()
    assert captured.out == "", "a refused run prints nothing on stdout"
    assert not (tmp_path / "out").exists(), "a refused run writes nothing"
    return f"$ gpucluster {' '.join(argv).replace(str(tmp_path), 'TMP')}\nexit {rc}\n{captured.err}"


@pytest.mark.parametrize("case", CASES)
def test_error_output_matches_its_golden_file(case, tmp_path, capsys, monkeypatch):
    got = run(case, tmp_path, capsys, monkeypatch)
    golden = HERE / f"{case}.txt"
    if UPDATE:
        golden.write_text(got)
    assert golden.exists(), f"no golden file for {case}: run with GPUCLUSTER_UPDATE_GOLDEN=1 and review it"
    assert got == golden.read_text()


@pytest.mark.parametrize("case", CASES)
def test_the_format_holds_in_each_golden_file(case):
    """What every golden file holds whatever its wording: exit 2, findings in line order and in the
    one format, no library wording, and the summary as the last line."""
    text = (HERE / f"{case}.txt").read_text()
    lines = text.splitlines()
    assert lines[1] == "exit 2"
    found = [re.match(r"^(error|warning): (?:(?P<file>[^:]+):(?P<line>\d+)|command line): (?:(?P<field>\S+): )?"
                      r".+; .+ \[[\w-]+\]$", line) for line in lines[2:-1]]
    assert all(found), "\n".join(line for line, m in zip(lines[2:-1], found, strict=True) if not m)
    located = [(m["file"], int(m["line"])) for m in found if m["line"]]
    assert located == sorted(located), "findings are in line order"
    assert re.fullmatch(r"\d+ problems?( and \d+ warnings?)?; nothing was written", lines[-1])
    assert not LIBRARY_WORDS.search(text)


def test_six_at_once_reports_each_mistake_once():
    """One finding per cause: the six mistakes give six findings, none of them twice."""
    text = (HERE / "six-at-once.txt").read_text()
    assert text.count("error: ") == 6 and text.rstrip().endswith("6 problems; nothing was written")


# ---- no library wording, for every kind of schema error -------------------------------------------

NOT_OURS = re.compile(r"Input should|should have|String should|Value error|valid dictionary|instance of|"
                      r"Field required|Extra inputs|Dictionary should|Tuple should|List should|Unable to parse")
KINDS = {  # (text in examples/staging.yaml, its replacement): one schema error kind each
    "text too long": ("name: staging\n", f"name: {'a' * 41}\n"),
    "list too long": ("    nodes_per_rack: 2\n", f"    nodes_per_rack: 2\n    features: [{', '.join(['f'] * 65)}]\n"),
    "list empty": ("      groups: [gpu]\n", "      groups: []\n"),
    "scalar for a section": ("    cpu: {sockets: 1, cores_per_socket: 1, threads_per_core: 1}\n"
                             "    memory_gb: 1\n    gpu:", "    cpu: 7\n    memory_gb: 1\n    gpu:"),
    "scalar for a list": ("    nodes_per_rack: 2\n", "    nodes_per_rack: 2\n    features: nvme\n"),
    "list for a mapping": ("  accounting: true ", "  parameters: [a]\n  accounting: true "),
    "list for text": ('    hostname: "gpu##"\n', "    hostname: [gpu]\n"),
    "not a boolean": ("  accounting: true ", "  accounting: maybe "),
    "not a choice": ("  type: roce\n", "  type: ethernet\n"),
    "not a choice as a key": ("{leaf: staging-bridge,", "{leef: staging-bridge,"),
    "pattern": ("name: staging\n", "name: Staging\n"),
    "below the range": ("    count: 4\n", "    count: 0\n"),
    "not above": ("    nvme_tb: 0.001\n", "    nvme_tb: 0\n"),
    "above the range": ("    gpus_per_node: 4\n", "    gpus_per_node: 99\n"),
    "not below": ("  interval: 30\n", "  interval: 30\n  min_free_pct: 100\n"),
    "a huge number": ("    count: 4\n", "    count: 99999999999999999999999\n"),
    "text for a number": ("    nvme_tb: 0.001\n", "    nvme_tb: fast\n"),
    "list for a section or null": ("  flash:\n    name: flash\n", "  flash: [1]\n  flashx:\n    name: flash\n"),
    "missing": ("    count: 4\n", ""),
    "unknown key": ("  topology: tree\n", "  topolgy: tree\n"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_schema_errors_speak_gpuclusters_words(kind, tmp_path):
    from conftest import example_text, findings_of, mutate

    text, _ = mutate(example_text("staging"), *KINDS[kind])
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    findings = findings_of(path)
    assert findings, kind
    for f in findings:
        assert f.message and f.fix and f.field and f.line, f.render()
        assert not NOT_OURS.search(f.message + f.fix), f.render()
