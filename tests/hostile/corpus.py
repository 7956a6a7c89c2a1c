"""The hostile-input corpus: broken and hostile specs and output folders, each named by kind.

Kinds: yaml-trap, alias-bomb, types, bounds, paths, file-kind (specs); output-dir (the -o folder);
signals (tests/test_hostile_outputs.py). Most specs are examples/staging.yaml with one change, so the
finding is caused by that change and its line is where the change sits; the rest are raw bytes or
special files. Each case names the rule(s) it must trip (one of them at least) and whether the message
can name a line (a FIFO has none). Generated here rather than kept as files: several are megabytes
(alias bombs, nesting, size limits) or are not files at all (FIFOs, sockets, devices).

tests/test_hostile_specs.py runs every spec case through `gpucluster render`; bench/hostile.py times them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGING = (ROOT / "examples" / "staging.yaml").read_text()

Build = Callable[[Path], tuple[str, int | None]]  # folder -> (spec argument, expected line or None)


@dataclass(frozen=True)
class SpecCase:
    kind: str
    name: str
    build: Build
    rules: frozenset[str]  # the run reports at least one of these
    located: bool = True  # the message names file:line
    stdin: Callable[[], bytes] | None = None  # the spec is "-", fed this on standard input
    says: str = ""  # a piece of the message

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def edit(old: str, new: str, at: str | None = None) -> Build:
    """staging.yaml with `old` (once, from the start of a line) replaced by `new`; the line is the first
    one the change touches (after what old and new share)."""
    assert STAGING.count(old) == 1, f"{old!r} occurs {STAGING.count(old)} times"
    same = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    line = STAGING[: STAGING.index(old)].count("\n") + 1 + old[:same].count("\n")
    text = STAGING.replace(old, new)
    if at is not None:  # the finding is about a key elsewhere (a list grown past its bound, say)
        line = text[: text.index("\n" + at) + 1].count("\n") + 1

    def build(folder: Path) -> tuple[str, int | None]:
        path = folder / "spec.yaml"
        path.write_text(text)
        return str(path), line

    return build


def edits(*pairs: tuple[str, str], line_of: str) -> Build:
    text = STAGING
    for old, new in pairs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    line = text[: text.index(line_of)].count("\n") + 1

    def build(folder: Path) -> tuple[str, int | None]:
        path = folder / "spec.yaml"
        path.write_text(text)
        return str(path), line

    return build


def raw(data: bytes | Callable[[], bytes], line: int | None = None) -> Build:
    def build(folder: Path) -> tuple[str, int | None]:
        path = folder / "spec.yaml"
        path.write_bytes(data() if callable(data) else data)
        return str(path), line

    return build


def special(make: Callable[[Path], str]) -> Build:
    def build(folder: Path) -> tuple[str, int | None]:
        return make(folder), None

    return build


def group(name: str, count: int | str, role: str = "storage", hostname: str | None = None) -> str:
    return (f"  - name: {name}\n    role: {role}\n    count: {count}\n    hostname: \"{hostname or name + '#####'}\"\n"
            "    cpu: {sockets: 1, cores_per_socket: 1, threads_per_core: 1}\n    memory_gb: 1\n")


def alias_bomb(width: int = 10, depth: int = 9) -> bytes:
    """'Billion laughs': each level lists the previous one `width` times: width**depth values from 1 kB."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth)]
    return ("\n".join(lines) + "\n").encode()


def _fifo(folder: Path) -> str:
    path = folder / "spec.yaml"
    os.mkfifo(path)
    return str(path)


def _socket(folder: Path) -> str:
    path = folder / "spec.yaml"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return str(path)


def _dir(folder: Path) -> str:
    path = folder / "spec.yaml"
    path.mkdir()
    return str(path)


def _symlink(target: str) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        path = folder / "spec.yaml"
        path.symlink_to(target)
        return str(path)

    return make


def _sparse(folder: Path) -> str:
    path = folder / "spec.yaml"
    with open(path, "wb") as fh:
        fh.truncate(2 << 30)  # 2 GB that takes no disk: the size check must refuse it unread
    return str(path)


RACK = "    nodes_per_rack: 2\n"
TOPO = "  topology: tree\n"
NFS_MOUNT = "          mount: /home/shared\n"
CATALOG = "catalog:\n  switches:\n    big: {name: big, ports: {400: 64}, fabrics: [roce]}\n"
SWITCH = "    big: {name: big, ports: {400: 64}, fabrics: [roce]}\n"


def catalog(old: str, new: str) -> Build:
    """A user catalog switch with one thing changed (the finding names the switch's line)."""
    return edit("fabric:\n", CATALOG.replace(old, new) + "fabric:\n", at="    big:")


def more_groups(groups) -> Build:
    """Extra node groups (the finding is about the whole list)."""
    return edit("fabric:\n", "".join(groups) + "fabric:\n", at="node_groups:")

SPEC_CASES: list[SpecCase] = [
    # ---- YAML traps: YAML 1.1 reads these as something other than what was meant -------------------
    SpecCase("yaml-trap", "bool-count", edit("    count: 4\n", "    count: yes\n"), frozenset({"yaml-bool"})),
    SpecCase("yaml-trap", "bool-true-count", edit("    count: 4\n", "    count: true\n"), frozenset({"yaml-bool"})),
    SpecCase("yaml-trap", "bool-memory", edit("    memory_gb: 1\n    gpu:", "    memory_gb: on\n    gpu:"),
             frozenset({"yaml-bool"})),
    SpecCase("yaml-trap", "norway-gres-detect", edit('    gres_detect: "off"', "    gres_detect: off"),
             frozenset({"yaml-bool"})),
    SpecCase("yaml-trap", "bool-name", edit("name: staging\n", "name: no\n"), frozenset({"yaml-bool"})),
    SpecCase("yaml-trap", "octal-count", edit("    count: 4\n", "    count: 010\n"), frozenset({"int_parsing"})),
    SpecCase("yaml-trap", "hex-memory", edit("    memory_gb: 1\n    gpu:", "    memory_gb: 0x10\n    gpu:"),
             frozenset({"int_parsing"})),
    # YAML reads 22.10 as the float 22.1; a release has two digits after the dot, so it is read back as
    # "22.10" (unquoted 24.11 works) and refused by the release table, not mistaken for 22.1
    SpecCase("yaml-trap", "version-as-float", edit('  version: "22.05"', "  version: 22.10"),
             frozenset({"slurm-version"})),
    SpecCase("yaml-trap", "ratio-as-base-60-int", edit("  tiers: 2\n", "  tiers: 2\n  oversubscription: {leaf: 61}\n"),
             frozenset({"string_type"})),
    SpecCase("yaml-trap", "date-as-name", edit("name: staging\n", "name: 2024-01-01\n"), frozenset({"string_type"})),
    SpecCase("yaml-trap", "null-count", edit("    count: 4\n", "    count: ~\n"), frozenset({"int_type"})),
    SpecCase("yaml-trap", "duplicate-key", edit("  topology: tree\n", "  topology: tree\n  topology: block\n"),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "merge-key", edit("  - name: nfs\n", "  - <<: {role: storage}\n    name: nfs\n"),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "python-tag", edit("name: staging\n", "name: !!python/object/apply:os.system ['true']\n"),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "binary-tag", edit("name: staging\n", "name: !!binary c3RhZ2luZw==\n"),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "set-tag", edit(RACK, RACK + "    features: !!set {a, b}\n"), frozenset({"yaml"})),
    SpecCase("yaml-trap", "complex-key", edit("  tiers: 2\n", "  tiers: 2\n  ? [leaf, spine]\n  : 1\n"),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "two-documents", raw(STAGING.encode() + b"---\nname: other\n", None), frozenset({"yaml"})),
    SpecCase("yaml-trap", "tab-indent", edit("    count: 4\n", "\tcount: 4\n"), frozenset({"yaml"})),
    SpecCase("yaml-trap", "escaped-escape-in-name", edit("name: staging\n", 'name: "stag\\ering"\n'),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "bidi-override-in-feature", edit("    nodes_per_rack: 2\n",
                                                           "    nodes_per_rack: 2\n    features: [\"ab\u202ecd\"]\n"),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "raw-bell-character", edit("  topology: tree\n", "  topology: tr\x07ee\n"),
             frozenset({"yaml"})),
    SpecCase("yaml-trap", "nul-byte", edit("  topology: tree\n", "  topology: tree\x00\n"), frozenset({"yaml"})),
    SpecCase("yaml-trap", "not-utf8", raw(STAGING.encode().replace(b"topology: tree", b"topology: tr\xffee"), 7),
             frozenset({"file"})),
    SpecCase("yaml-trap", "utf16", raw(STAGING.encode("utf-16"), 1), frozenset({"file"})),
    SpecCase("yaml-trap", "empty", raw(b"", 1), frozenset({"yaml"})),
    SpecCase("yaml-trap", "list-not-mapping", raw(b"- a\n- b\n", 1), frozenset({"yaml"})),
    # ---- alias bombs and other amplification -----------------------------------------------------------
    SpecCase("alias-bomb", "billion-laughs", raw(alias_bomb()), frozenset({"yaml"})),
    SpecCase("alias-bomb", "wide-anchor", raw(lambda: b"a: &a [" + b"x, " * 60_000 + b"x]\nb: [*a, *a]\n"),
             frozenset({"yaml"})),
    SpecCase("alias-bomb", "recursive-alias", raw(b"a: &x [*x]\n", 1), frozenset({"yaml"})),
    SpecCase("alias-bomb", "undefined-alias", raw(b"name: *nowhere\n", 1), frozenset({"yaml"})),
    SpecCase("alias-bomb", "deep-flow-nesting", raw(lambda: b"a: " + b"[" * 200_000 + b"]" * 200_000 + b"\n"),
             frozenset({"yaml"})),
    SpecCase("alias-bomb", "deep-block-nesting", raw(lambda: b"a: " + b"- " * 100_000 + b"x\n"),
             frozenset({"yaml"})),
    SpecCase("alias-bomb", "many-values", raw(lambda: b"a: [" + b"1, " * 150_000 + b"1]\n"), frozenset({"yaml"})),
    SpecCase("alias-bomb", "aliased-groups", edits(("  - name: ctl\n", "  - &g\n    name: ctl\n"),
                                                   ("fabric:\n", "  - *g\n" * 1500 + "fabric:\n"),
                                                   line_of="node_groups:"), frozenset({"too_long"})),
    # ---- types: strict numbers, booleans and text ----------------------------------------------------
    SpecCase("types", "quoted-count", edit("    count: 4\n", '    count: "4"\n'), frozenset({"int_parsing"})),
    SpecCase("types", "count-with-units", edit("    memory_gb: 1\n    gpu:", "    memory_gb: 512GB\n    gpu:"),
             frozenset({"int_parsing"})),
    SpecCase("types", "fractional-count", edit("    count: 4\n", "    count: 4.5\n"), frozenset({"int_from_float"})),
    SpecCase("types", "infinite-drive", edit("    nvme_tb: 0.001\n", "    nvme_tb: .inf\n"),
             frozenset({"finite_number"})),
    SpecCase("types", "nan-drive", edit("    nvme_tb: 0.001\n", "    nvme_tb: .nan\n"),
             frozenset({"finite_number"})),
    SpecCase("types", "overflowing-float", edit("    nvme_tb: 0.001\n", "    nvme_tb: 1.0e+999\n"),
             frozenset({"finite_number"})),
    SpecCase("types", "bool-drive-speed", edit("    replicas: 1\n", "    replicas: 1\n    nvme_gbps: yes\n"),
             frozenset({"yaml-bool"})),
    SpecCase("types", "quoted-boolean", edit("  accounting: true ", '  accounting: "yes" '),
             frozenset({"bool_type"})),
    SpecCase("types", "number-as-boolean", edit("  accounting: true ", "  accounting: 1 "), frozenset({"bool_type"})),
    SpecCase("types", "float-tiers", edit("  tiers: 2\n", "  tiers: 2.0\n"), frozenset({"int_from_float"})),
    SpecCase("types", "list-for-mapping", edit("  flash:\n    name: flash\n", "  flash: [1, 2]\n  flashx:\n"
                                               "    name: flash\n"), frozenset({"model_type"})),
    SpecCase("types", "scalar-for-list", edit("  nfs:\n", "  nfs: 7\n  nfsx:\n"), frozenset({"tuple_type"})),
    SpecCase("types", "text-for-feature-list", edit("    nodes_per_rack: 2\n",
                                                    "    nodes_per_rack: 2\n    features: ndr\n"),
             frozenset({"tuple_type"})),
    SpecCase("types", "text-port-count", catalog("64}", "many}"), frozenset({"int_parsing"})),
    SpecCase("types", "5000-digit-count", edit("    count: 4\n", "    count: " + "9" * 5000 + "\n"),
             frozenset({"int_parsing"})),
    # ---- bounds: each number no larger than what consumes it -----------------------------------------
    SpecCase("bounds", "max-nodes-1e30", edit('      max_time: "1:00:00"\n',
                                              '      max_time: "1:00:00"\n      max_nodes: ' + "1" + "0" * 30 + "\n"),
             frozenset({"less_than_equal"})),
    SpecCase("bounds", "first-index-1e20", edit('    hostname: "gpu##"\n',
                                                '    hostname: "gpu##"\n    first_index: 100000000000000000000\n'),
             frozenset({"less_than_equal"})),
    SpecCase("bounds", "hostname-over-63", edits(('    hostname: "gpu##"\n', '    hostname: "' + "g" * 46 + '##"\n'
                                                  "    first_index: 999999999999999990\n"),
                                                 line_of="    first_index: 9"), frozenset({"hostname"})),
    SpecCase("bounds", "switch-with-2e9-ports", catalog("64}", "2000000000}"), frozenset({"less_than_equal"})),
    SpecCase("bounds", "port-speed-1e6", catalog("400: 64", "1000000: 64"), frozenset({"less_than_equal"})),
    SpecCase("bounds", "count-1e6", edit("    count: 4\n", "    count: 1000000\n"), frozenset({"less_than_equal"})),
    SpecCase("bounds", "all-nodes-over-limit", more_groups(group(f"s{i}", 65536) for i in range(3)),
             frozenset({"cluster-size"})),
    SpecCase("bounds", "compute-over-slurm", more_groups(group(f"c{i}", 40000, "compute") for i in range(2)),
             frozenset({"slurm-limit"})),
    SpecCase("bounds", "cpus-over-16-bits", edit("    cpu: {sockets: 1, cores_per_socket: 1, threads_per_core: 1}\n"
                                                 "    memory_gb: 1\n    gpu:",
                                                 "    cpu: {sockets: 16, cores_per_socket: 512, threads_per_core: 8}\n"
                                                 "    memory_gb: 1\n    gpu:"), frozenset({"slurm-limit"})),
    SpecCase("bounds", "ratio-99999", edit("  tiers: 2\n", "  tiers: 2\n  oversubscription: {leaf: '99999:1'}\n"),
             frozenset({"value_error"})),
    SpecCase("bounds", "ratio-no-uplinks", edit("  tiers: 2\n", "  tiers: 2\n  oversubscription: {leaf: '1:0'}\n"),
             frozenset({"value_error"})),
    SpecCase("bounds", "2000-node-groups", more_groups(group(f"x{i}", 1) for i in range(2000)),
             frozenset({"too_long"})),
    SpecCase("bounds", "10k-character-name", edit("name: staging\n", "name: s" + "a" * 10_000 + "\n"),
             frozenset({"string_too_long"})),
    SpecCase("bounds", "max-time-overflow", edit('      max_time: "1:00:00"\n', '      max_time: "99999999999"\n'),
             frozenset({"string_pattern_mismatch"})),
    SpecCase("bounds", "300-catalog-switches", edit("fabric:\n", CATALOG + "".join(
        SWITCH.replace("big", f"b{i}") for i in range(300)) + "fabric:\n", at="  switches:"), frozenset({"too_long"})),
    SpecCase("bounds", "1000-features", edit("    nodes_per_rack: 2\n", "    nodes_per_rack: 2\n    features: ["
                                             + ", ".join(f"f{i}" for i in range(1000)) + "]\n"),
             frozenset({"too_long"})),
    # ---- paths: normalised, no '..' or '//', system directories reserved for mounts and exports --------
    SpecCase("paths", "mount-root", edit("    mount: /mnt/flash\n", "    mount: /\n"), frozenset({"mount-clash"})),
    SpecCase("paths", "mount-etc-munge", edit("    mount: /mnt/flash\n", "    mount: /etc/munge\n"),
             frozenset({"mount-clash"})),
    SpecCase("paths", "mount-tmp", edit("    mount: /mnt/flash\n", "    mount: /tmp\n"), frozenset({"mount-clash"})),
    SpecCase("paths", "mount-under-var", edit(NFS_MOUNT, "          mount: /var/lib/slurm/x\n"),
             frozenset({"mount-clash"})),
    SpecCase("paths", "mount-dotdot", edit("    mount: /mnt/flash\n", "    mount: /mnt/../etc\n"), frozenset({"path"})),
    SpecCase("paths", "mount-double-slash", edit("    mount: /mnt/flash\n", "    mount: //mnt/flash\n"),
             frozenset({"path"})),
    SpecCase("paths", "mount-dot-nesting", edit(NFS_MOUNT, "          mount: /mnt/./flash/x/\n"),
             frozenset({"mount-clash"})),
    SpecCase("paths", "export-root", edit("        - path: /export/home\n", "        - path: /\n"),
             frozenset({"reserved-path"})),
    SpecCase("paths", "export-etc", edit("        - path: /export/home\n", "        - path: /etc\n"),
             frozenset({"reserved-path"})),
    SpecCase("paths", "export-munge-state", edit("        - path: /export/home\n", "        - path: /var/lib/munge\n"),
             frozenset({"reserved-path"})),
    SpecCase("paths", "export-tmp-sticky", edit("        - path: /export/home\n", "        - path: /tmp/scratch\n"),
             frozenset({"reserved-path"})),
    SpecCase("paths", "export-relative", edit("        - path: /export/home\n", "        - path: export/home\n"),
             frozenset({"string_pattern_mismatch"})),
    SpecCase("paths", "prolog-dotdot", edit(TOPO, TOPO + "  prolog: /etc/slurm/../../bin/sh\n"), frozenset({"path"})),
    SpecCase("paths", "component-over-255", edit("    mount: /mnt/flash\n", "    mount: /mnt/" + "f" * 300 + "\n"),
             frozenset({"path"})),
    # ---- file kinds: only a regular file (or -), at most the size limit -----------------------------
    SpecCase("file-kind", "directory", special(_dir), frozenset({"file"}), located=False,
             says='is a directory, not a regular file'),
    SpecCase("file-kind", "fifo", special(_fifo), frozenset({"file"}), located=False,
             says='is a FIFO (named pipe), not a regular file'),
    SpecCase("file-kind", "dev-zero", special(lambda _f: "/dev/zero"), frozenset({"file"}), located=False,
             says='is a character device, not a regular file'),
    SpecCase("file-kind", "symlink-to-dev-zero", special(_symlink("/dev/zero")), frozenset({"file"}), located=False,
             says='is a character device, not a regular file'),
    SpecCase("file-kind", "socket", special(_socket), frozenset({"file"}), located=False,
             says='is a socket, not a regular file'),
    SpecCase("file-kind", "missing", special(lambda f: str(f / "nope.yaml")), frozenset({"file"}), located=False,
             says='No such file'),
    SpecCase("file-kind", "sparse-2gb", special(_sparse), frozenset({"file"}), located=False,
             says='the spec is 2,147,483,648 bytes'),
    SpecCase("file-kind", "over-1mb", raw(lambda: b"# " + b"x" * (1 << 20) + b"\n" + STAGING.encode()),
             frozenset({"file"}), located=False,
             says='the spec is 1,0'),
    SpecCase("file-kind", "stdin-dev-zero", special(lambda _f: "-"), frozenset({"file"}), located=False,
             says='the spec is more than 1,048,576 bytes',
             stdin=lambda: b"\0" * ((1 << 20) + 4096)),
    SpecCase("file-kind", "stdin-bool-count", special(lambda _f: "-"), frozenset({"yaml-bool"}),
             stdin=lambda: STAGING.replace("    count: 4\n", "    count: yes\n").encode()),
]

KINDS = sorted({c.kind for c in SPEC_CASES})


# ---- output-folder faults: the -o folder, not the spec ----------------------------------------------

@dataclass(frozen=True)
class OutputCase:
    name: str
    setup: Callable[[Path], str]  # folder holding ./out (an earlier render) -> the -o argument
    message: str  # a piece of the error

    @property
    def id(self) -> str:
        return f"output-dir/{self.name}"


def _squat(name: str, keep: bool) -> Callable[[Path], str]:
    """The user made a folder where the render writes a file (with a file of theirs inside, or empty)."""
    def setup(folder: Path) -> str:
        out = folder / "out"
        (out / name).unlink()
        (out / name).mkdir()
        if keep:
            (out / name / "mine.txt").write_text("the user's\n")
        return str(out)

    return setup


def _file(folder: Path) -> str:
    (folder / "file").write_text("not a folder\n")
    return str(folder / "file")


def _under_file(folder: Path) -> str:
    (folder / "file").write_text("not a folder\n")
    return str(folder / "file" / "out")


def _link(target: str) -> Callable[[Path], str]:
    def setup(folder: Path) -> str:
        (folder / "link").symlink_to(target)
        return str(folder / "link")

    return setup


def _link_to_file(folder: Path) -> str:
    _file(folder)
    return _link(str(folder / "file"))(folder)


def _crowded(folder: Path) -> str:
    out = folder / "out"
    (out / "many").mkdir()
    for i in range(10_001):
        (out / "many" / f"{i}.txt").write_bytes(b"")
    return str(out)


OUTPUT_CASES = [
    OutputCase("folder-squatting-on-slurm-conf", _squat("slurm.conf", keep=True), "is a folder where"),
    OutputCase("empty-folder-squatting-on-plan-json", _squat("plan.json", keep=False), "is a folder where"),
    OutputCase("output-is-a-file", _file, "is not a folder"),
    OutputCase("output-under-a-file", _under_file, "cannot create the output folder"),
    OutputCase("output-is-dev-null", lambda _f: "/dev/null", "system directory"),
    OutputCase("output-is-root", lambda _f: "/", "system directory"),
    OutputCase("symlink-to-root", _link("/"), "system directory"),
    OutputCase("symlink-to-a-file", _link_to_file, "is not a folder"),
    OutputCase("symlink-loop", lambda f: _link(str(f / "link"))(f), "is not a folder"),
    OutputCase("under-proc", lambda _f: "/proc/self/out", "system directory"),
    OutputCase("10001-files-of-the-user", _crowded, "more than 10,000 entries"),
]

# ---- signals: tests/test_hostile_outputs.py sends these to a render in a child process --------------
# (name, signals sent, when): "stream" = while cabling.csv streams, "swapped" = right after the swap,
# "load" = while the spec loads, "ignored" = SIGTERM sent while the process ignores it (nohup)
SIGNAL_CASES = [
    ("sigint-while-streaming", ("SIGINT",), "stream"),
    ("sigterm-while-streaming", ("SIGTERM",), "stream"),
    ("sighup-while-streaming", ("SIGHUP",), "stream"),
    ("sigterm-twice-while-streaming", ("SIGTERM", "SIGTERM"), "stream"),
    ("sigint-then-sigterm-while-streaming", ("SIGINT", "SIGTERM"), "stream"),
    ("sigterm-right-after-the-swap", ("SIGTERM",), "swapped"),
    ("sigint-right-after-the-swap", ("SIGINT",), "swapped"),
    ("sigint-while-loading", ("SIGINT",), "load"),
    ("sigterm-ignored-nohup", ("SIGTERM",), "ignored"),
]
