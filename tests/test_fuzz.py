"""Fuzzing the loader and the CLI: no input may raise anything but SpecError, every finding says
where and how to fix it, and the command never prints a traceback. Plus the corpus of realistic
broken specs in tests/broken/, each naming the rule it must trip (`# expect: <rule>`).

Inputs: the examples mutated as data (keys deleted or renamed, values of the wrong type, random
scalars), the examples mutated as text (lines dropped, duplicated, characters spliced in), and random
text and bytes. A spec that survives the checks must also plan and render.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import BROKEN_DIR, ROOT, example_data, example_text
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.cli import main
from gpucluster.cluster import load_cluster
from gpucluster.errors import SpecError
from gpucluster.fabric.summary import plan_summary
from gpucluster.render import render_all

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BASES = ["staging", "meta-rsc-phase1", "frontier-mi250x-roce", "meta-24k-ib"]


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    """One file rewritten per example (hypothesis runs many examples in one test call)."""
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"

    def write(content: str | bytes) -> Path:
        if isinstance(content, str):
            content = content.encode("utf-8", "surrogatepass")
        path.write_bytes(content)
        return path

    return write


def load_or_findings(path: Path):
    """Load, then plan, summarise and render what loads. Only SpecError may escape, as findings."""
    try:
        cluster = load_cluster(path)
    except SpecError as exc:
        assert exc.findings, "a SpecError without findings"
        for f in exc.findings:
            assert f.file == str(path), f.render()
            assert f.rule and f.message and f.fix, f"finding without rule/message/fix: {f.render()}"
            assert f.level == "error"
        return exc.findings
    plan_summary(cluster.plan)
    out = render_all(cluster, cabling=False)
    for value in out.values():
        assert isinstance(value, str)
    assert_parseable(out)
    return []


SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:=^/+-]*$")  # nothing a shell or slurm.conf's tokenizer would split


ROCE_LINE = re.compile(r'^ROCE_[A-Z_]+=([A-Za-z0-9_.,:-]*|"[A-Za-z0-9_.:-]+( [A-Za-z0-9_.:-]+)*")$')
SYSTEMD_LINE = re.compile(r"^(\[[A-Z][A-Za-z]*\]|[A-Z][A-Za-z]*=[A-Za-z0-9@_.:=-]+( [A-Za-z0-9@_.:=-]+)*)$")
GANESHA_LINE = re.compile(r"^\t*([A-Z][A-Za-z0-9_]* \{|\}|[A-Z][A-Za-z0-9_]* = [^;{}#\n]+;)$")
# oci.conf: Slurm's Key="value", one command line without a quote or '#' inside; the SPANK stack's include and
# required lines; enroot.conf's KEY value, a path whose one substitution is the user's id.
OCI_LINE = re.compile(r'^[A-Z][A-Za-z]*="[^"#\n]+"$')
SPANK_LINE = re.compile(r"^(include|required) /[A-Za-z0-9_./*-]+$")
ENROOT_LINE = re.compile(r"^ENROOT_[A-Z_]+ /[A-Za-z0-9_./-]+(user-\$\(id -u\))?$")


def assert_parseable(out: dict[str, str]) -> None:
    """Whatever the spec said, the configs stay Key=Value tokens and the env scripts stay inert."""
    for name, text in out.items():
        if name.startswith("ganesha") and name.endswith(".conf"):  # NFS-Ganesha's block syntax
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    assert GANESHA_LINE.match(line), f"{name}: {line!r}"
        elif name.startswith("roce-qos"):  # shell assignments, read by the rdma role's script
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    assert ROCE_LINE.match(line), f"{name}: unsafe line {line!r}"
        elif name in ("oci.conf", "plugstack.conf", "enroot.conf") or name.startswith("pyxis."):
            pattern = {"oci.conf": OCI_LINE, "enroot.conf": ENROOT_LINE}.get(name, SPANK_LINE)
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    assert pattern.match(line), f"{name}: {line!r}"
        elif name.endswith(".conf") and name.startswith(("slurmd-", "prometheus-dcgm-exporter")):  # systemd drop-ins
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    assert SYSTEMD_LINE.match(line), f"{name}: {line!r}"
        elif name.endswith(".conf"):
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    assert all("=" in tok for tok in line.split()), f"{name}: {line!r}"
        elif name.endswith(".sh"):
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    key, _, value = line.removeprefix("export ").partition("=")
                    assert line.startswith("export ") and key.isidentifier(), f"{name}: {line!r}"
                    assert SAFE_VALUE.match(value), f"{name}: unsafe value in {line!r}"


def cli_check(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", str(path)])
    text = out.getvalue() + err.getvalue()
    assert "Traceback" not in text
    assert rc in (0, 2), rc
    if rc == 2:
        assert re.search(r"^error: .+ \[[\w-]+\]$", err.getvalue(), re.M), err.getvalue()
    return rc, text


# ---- data mutations ----------------------------------------------------------------------------

def all_paths(data, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out += all_paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += all_paths(v, prefix + (i,))
    return out


def get(data, path):
    for p in path:
        data = data[p]
    return data


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70000), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["1:1", "7:1", "0:1", "1:0", "a:b", "gpu##", "h100-sxm5-80g", "#", "", "/", "/etc", "22.05",
                     "99.99", "auto", "compute", "roce", "infiniband", "rail-optimized", "00", "1e400", "~"]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=6), scalars, max_size=3))


OPTIONAL_KEYS = ["features", "hcas", "first_index", "gres_detect", "nodes_per_leaf", "rails", "link_speed_gbps",
                 "qps_per_connection", "management_interface", "rail_groups", "nodes_per_pod", "client_groups",
                 "max_nodes", "priority_tier", "oversubscription", "tiers", "gid_index", "hca_prefix"]


@st.composite
def mutated_specs(draw) -> dict:
    data = example_data(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        paths = all_paths(data)
        path = paths[draw(st.integers(0, len(paths) - 1))]
        if not path:
            continue
        parent, key = get(data, path[:-1]), path[-1]
        op = draw(st.sampled_from(["delete", "replace", "rename", "wrap", "duplicate", "add"]))
        if op == "add":  # an optional key the examples leave out, with any value
            target = get(data, path) if isinstance(get(data, path), dict) else parent
            if isinstance(target, dict):
                target[draw(st.sampled_from(OPTIONAL_KEYS))] = draw(values)
        elif op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(values)
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = parent.pop(key)
        elif op == "wrap":
            parent[key] = [parent[key]] if draw(st.booleans()) else {"value": parent[key]}
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
    return data


@settings(FUZZ, max_examples=150)
@given(mutated_specs())
def test_mutated_data_only_raises_spec_error(spec_file, data):
    try:
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        return
    load_or_findings(spec_file(text))


# Text fields that land in rendered files, each set to any short text: one field at a time, so the rest of
# the spec stays valid and the render is reached.
TEXT_FIELDS = [
    (("node_groups", 1), "features", True), (("node_groups", 1), "hcas", True), (("node_groups", 1), "hostname", False),
    (("node_groups", 1), "name", False), (("fabric",), "management_interface", False), ((), "name", False),
    (("slurm", "partitions", 0), "name", False), (("slurm", "partitions", 0), "max_time", False),
    (("storage", "nfs", 0, "exports", 0), "options", False), (("storage", "flash"), "mount", False),
]
words = st.text(alphabet=st.sampled_from("ab01_-.:,=# $`;'\"|&()\n\t/\\^[]{}*"), min_size=1, max_size=10)


@settings(FUZZ, max_examples=100)
@given(st.sampled_from(TEXT_FIELDS), words)
def test_any_text_in_a_rendered_field_renders_parseably(spec_file, field, word):
    path, key, is_list = field
    data = example_data("staging")
    get(data, path)[key] = [word] if is_list else word
    load_or_findings(spec_file(yaml.safe_dump(data, sort_keys=False)))


# ---- text mutations ----------------------------------------------------------------------------

@st.composite
def mutated_texts(draw) -> str:
    lines = example_text(draw(st.sampled_from(BASES))).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "splice", "indent", "truncate"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "splice":
            j = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:j] + draw(st.text(alphabet=":-[]{}#&*!|>'\"%@`, \t\nab01", max_size=4)) + lines[i][j:]
        elif op == "indent":
            lines[i] = " " * draw(st.integers(1, 3)) + lines[i]
        else:
            lines = lines[:i]
        if not lines:
            break
    return "".join(lines)


@settings(FUZZ, max_examples=150)
@given(mutated_texts())
def test_mutated_text_only_raises_spec_error(spec_file, text):
    load_or_findings(spec_file(text))


@settings(FUZZ, max_examples=100)
@given(st.text(max_size=200))
def test_random_text_only_raises_spec_error(spec_file, text):
    load_or_findings(spec_file(text))


@settings(FUZZ, max_examples=60)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_spec_error(spec_file, raw):
    load_or_findings(spec_file(raw))


@settings(FUZZ, max_examples=60)
@given(st.one_of(mutated_texts(), st.text(max_size=100)))
def test_cli_check_never_prints_a_traceback(spec_file, text):
    cli_check(spec_file(text))


# ---- a handful through the real command ---------------------------------------------------------

NASTY = {
    "binary": b"\x00\x01\xff\xfe" * 10,
    "deep-nesting": b"a: " + b"[" * 1100 + b"]" * 1100 + b"\n",
    "python-tag": b"name: !!python/object/apply:os.system ['true']\n",
    "alias-bomb": ("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9))).encode(),
    "truncated-example": example_text("meta-24k-roce").encode()[:1500],
    "tab-indent": example_text("staging").replace("  ", "\t", 3).encode(),
}


@pytest.mark.parametrize("name", NASTY)
def test_entry_point_on_nasty_input(tmp_path, name):
    path = tmp_path / "spec.yaml"
    path.write_bytes(NASTY[name])
    exe = Path(sys.executable).parent / "gpucluster"
    res = subprocess.run([str(exe), "check", str(path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert res.stderr.startswith(f"error: {path}")


# ---- the broken-spec corpus --------------------------------------------------------------------

BROKEN = sorted(BROKEN_DIR.glob("*.yaml"))


def expected_rules(path: Path) -> set[str]:
    return set(re.findall(r"^# expect: ([\w-]+)\s*$", path.read_text(), re.M))


def test_corpus_is_there():
    assert len(BROKEN) >= 15
    for path in BROKEN:
        assert expected_rules(path), f"{path.name} has no '# expect: <rule>' line"


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_spec_trips_its_rule(path, capsys):
    findings = load_or_findings(path)
    assert findings, f"{path.name} loaded cleanly"
    assert {f.rule for f in findings} == expected_rules(path)
    assert all(f.line for f in findings), [f.render() for f in findings]
    rc = main(["check", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    for rule in expected_rules(path):
        assert f"[{rule}]" in err
