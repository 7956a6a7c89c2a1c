"""The output folder is replaced as a whole set (gpucluster.outputs), whatever happens to the render.

- output-dir faults (tests/hostile/corpus.py OUTPUT_CASES): exit 2, the folder named, no traceback,
  everything on disk byte-identical, no temporary folder left.
- signals (SIGNAL_CASES): a render in a child process gets SIGINT/SIGTERM/SIGHUP at a chosen point;
  afterwards the folder holds exactly the old set (or, after the swap, exactly the new one), no
  temporary folder is left, and the process ends as the signal says (130, or killed by it).
- kills at random points, over and over, in-process renders and the real command.
- the write_set API: the user's files kept, stale files removed, modes, nested names, late arrivals.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, example_path, example_text
from hostile.corpus import OUTPUT_CASES, SIGNAL_CASES

import gpucluster.outputs as outputs
from gpucluster.cli import main
from gpucluster.errors import UsageError
from gpucluster.outputs import MANIFEST, OutputFile, read_manifest, write_file, write_set


def snapshot(folder: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    if folder.is_symlink() or not folder.is_dir():
        return {".": folder.read_bytes() if folder.is_file() else None} if os.path.lexists(folder) else {}
    for path in sorted(folder.rglob("*")):
        out[str(path.relative_to(folder))] = None if path.is_dir() or path.is_symlink() else path.read_bytes()
    return out


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".gpucluster-" in p.name]


def quiet_main(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> dict[str, Path]:
    """Two small specs whose renders differ (old: staging, new: 6 GPU nodes), and their rendered sets."""
    d = tmp_path_factory.mktemp("specs")
    old, new = d / "old.yaml", d / "new.yaml"
    old.write_text(example_text("staging"))
    new.write_text(example_text("staging").replace("    count: 4\n", "    count: 6\n"))
    return {"old": old, "new": new}


@pytest.fixture(scope="module")
def sets(specs, tmp_path_factory) -> dict[str, dict[str, bytes | None]]:
    d = tmp_path_factory.mktemp("sets")
    out = {}
    for name, spec in specs.items():
        assert quiet_main(["render", str(spec), "-o", str(d / name)])[0] == 0
        out[name] = snapshot(d / name)
    assert out["old"] != out["new"]
    return out


# ---- output-folder faults ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", OUTPUT_CASES, ids=[c.name for c in OUTPUT_CASES])
def test_output_dir_fault(case, tmp_path, specs):
    out = tmp_path / "out"
    assert quiet_main(["render", str(specs["old"]), "-o", str(out)])[0] == 0
    target = case.setup(tmp_path)
    before = snapshot(tmp_path)
    rc, text = quiet_main(["render", str(specs["new"]), "-o", target])
    assert "Traceback" not in text
    assert rc == 2, text
    assert text.startswith("error: ") and case.message in text, text
    assert target.rstrip("/").split("/")[-1] in text, "the message names the folder"
    assert snapshot(tmp_path) == before, "something on disk changed"
    assert leftovers(tmp_path) == []


# ---- signals at chosen points ------------------------------------------------------------------------

def in_child(work) -> tuple[int, str]:
    """Run work() in a forked child (gpucluster already imported, so a run takes milliseconds): its exit
    code (negative: killed by that signal) and what it printed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            sys.stdout = sys.stderr = open(w, "w", buffering=1, closefd=False)  # noqa: SIM115
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            code = work()
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code if isinstance(code, int) else 98)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        text = fh.read().decode("utf-8", "replace")
    return wait_or_kill(pid, "the child"), text


def send(names: tuple[str, ...]) -> None:
    for name in names:
        os.kill(os.getpid(), getattr(signal, name))


@pytest.mark.parametrize("name, sent, when", SIGNAL_CASES, ids=[c[0] for c in SIGNAL_CASES])
def test_signal(name, sent, when, tmp_path, specs, sets):
    out = tmp_path / "out"
    assert quiet_main(["render", str(specs["old"]), "-o", str(out)])[0] == 0

    def work() -> int:
        import gpucluster.cluster as cluster_pkg
        import gpucluster.render.fileset as files

        if when == "stream":
            chain = files._chain

            def interrupted(first, rest):
                for i, chunk in enumerate(chain(first, rest)):
                    if i == 1:
                        send(sent)
                    yield chunk

            files._chain = interrupted
        elif when == "swapped":
            fsync_dir = outputs._fsync_dir

            def after_swap(path):
                fsync_dir(path)
                if Path(path) == out.parent:  # the first call on the parent follows the swap
                    send(sent)

            outputs._fsync_dir = after_swap
        elif when == "load":
            load = cluster_pkg.load_cluster

            def loading(path, **kwargs):
                send(sent)
                return load(path, **kwargs)

            cluster_pkg.load_cluster = loading
        elif when == "ignored":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            chain = files._chain

            def ignored(first, rest):
                for i, chunk in enumerate(chain(first, rest)):
                    if i == 1:
                        send(sent)
                    yield chunk

            files._chain = ignored
        return main(["render", str(specs["new"]), "-o", str(out)])

    code, text = in_child(work)
    assert "Traceback" not in text, text
    first = next((getattr(signal, s) for s in sent if s != "SIGINT"), signal.SIGINT)
    expect_new = when in ("swapped", "ignored")
    if when == "ignored":
        assert code == 0, text
    elif first == signal.SIGINT:
        assert code == 130, (code, text)
    else:
        assert code == -first, (code, text)
    assert snapshot(out) == sets["new" if expect_new else "old"], "the folder holds neither set whole"
    assert leftovers(tmp_path) == []


# ---- kills at random points, over and over -------------------------------------------------------------

def check_state(out: Path, sets: dict) -> str:
    got = snapshot(out)
    assert got in (sets["old"], sets["new"]), f"a mixed set: {sorted(got)}"
    assert leftovers(out.parent) == [], leftovers(out.parent)
    return "old" if got == sets["old"] else "new"


def wait_or_kill(pid: int, what: str, seconds: float = 30) -> int:
    """The child's exit code; a child still running long after its signal lost the signal: fail, not hang."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"{what}: the child was still running {seconds} s after its signal (the signal was lost)")


# The children of test_random_kills_in_process come from a fork server: a fresh interpreter that imports
# gpucluster once, then forks one child per request. A fork of pytest itself could inherit a lock held by
# another test's thread and hang in it (a "lost" signal that is the test's own fault); a fresh interpreter
# per child costs ~0.3 s of imports each. Protocol on the server's stdout, per child: "P<pid>\n", the child's
# "g" (started) and one "r" per finished render, then "X<exit code>\n" once the server has reaped it.
# A warm server (a fifth argument: a scratch folder) renders both specs once before it serves, so its children
# start with what a first render fills in (lazy imports, compiled templates, the templates' digest): their first
# render takes a warm render's time (~80 ms), where a cold child's takes 0.3-0.6 s.
_FORK_SERVER = """
import os, signal, sys
from gpucluster.cli import main
specs, out, stacks = sys.argv[1:3], sys.argv[3], sys.argv[4]
report = os.dup(1)
devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(devnull, 1)
os.dup2(devnull, 2)
for spec in specs if len(sys.argv) > 5 else ():
    assert main(["render", spec, "-o", sys.argv[5]]) == 0
os.write(report, b"ready\\n")
while os.read(0, 1):
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.read(go_r, 1)  # the server has announced this pid
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import faulthandler  # SIGUSR1: every thread's stack, so a lost signal says where the child was
        faulthandler.register(signal.SIGUSR1, file=open(stacks, "a"), all_threads=True)
        code = 97
        try:
            os.write(report, b"g")
            n = 0
            while True:
                try:
                    code = main(["render", specs[n % 2], "-o", out])
                except KeyboardInterrupt:  # landed outside main's own handler (argument parsing)
                    code = 130
                if code != 0:
                    break
                n += 1
                os.write(report, b"r")  # one render done
        except KeyboardInterrupt:  # landed in this loop's own bookkeeping, between two renders
            code = 130
        except BaseException:
            code = 96
        finally:
            os._exit(code)
    os.close(go_r)
    os.write(report, b"P%d\\n" % pid)
    os.write(go_w, b"1")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    os.write(report, b"X%d\\n" % os.waitstatus_to_exitcode(status))
"""


class _Reader:
    """Bytes from the fork server's stdout, with a deadline."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, bytearray()

    def _fill(self, deadline: float) -> bool:
        import select

        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.fd], [], [], left)[0]:
            return False
        data = os.read(self.fd, 4096)
        assert data, "the fork server exited"
        self.buf += data
        return True

    def take(self, deadline: float) -> bytes | None:
        while not self.buf:
            if not self._fill(deadline):
                return None
        out = bytes(self.buf[:1])
        del self.buf[:1]
        return out

    def line(self, deadline: float) -> str:
        while b"\n" not in self.buf:
            assert self._fill(deadline), "no line from the fork server in time"
        text, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return text.decode()


def test_random_kills_in_process(tmp_path, specs, sets):
    """200 kills, SIGINT and SIGTERM in turn, of a child that renders the two specs in turn as fast as it
    can, in one process: each kill lands at a random point of a load, a render or a write.

    A kill that lands in the child's first render comes from the cold server (the render fills the caches a
    fresh interpreter lacks, and the kill may land there); one that lands in a later render, after one or two
    finished renders, comes from the warm server, whose children skip only the cold first render's waiting
    (kills never landed in it), so its renders are the warm ones the kill lands in either way."""
    out = tmp_path / "out"
    assert quiet_main(["render", str(specs["old"]), "-o", str(out)])[0] == 0
    t0 = time.perf_counter()
    quiet_main(["render", str(specs["new"]), "-o", str(tmp_path / "timing")])
    one = time.perf_counter() - t0
    rng = random.Random(10)
    seen = {"old": 0, "new": 0}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    stacks = tmp_path / "stacks.txt"
    argv = [sys.executable, "-c", _FORK_SERVER, str(specs["new"]), str(specs["old"]), str(out), str(stacks)]
    servers = [subprocess.Popen(argv + extra, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
               for extra in ([], [str(tmp_path / "warm")])]
    readers = [_Reader(s.stdout.fileno()) for s in servers]
    try:
        for reader in readers:
            assert reader.line(time.monotonic() + 120) == "ready", "a fork server did not start"
        for i in range(200):
            sig = signal.SIGINT if i % 2 else signal.SIGTERM
            what = f"kill {i} ({signal.Signals(sig).name})"
            renders = rng.choice((0, 1, 2))
            server, reader = servers[renders > 0], readers[renders > 0]  # cold for a kill in the first render
            server.stdin.write(b"1")
            soon = time.monotonic() + 60
            head = reader.line(soon)
            assert head.startswith("P"), head
            pid = int(head[1:])
            assert reader.take(soon) == b"g", f"{what}: the child did not start"
            # Wait for 0, 1 or 2 finished renders, then up to one more render's time: the kill lands in the
            # first render (the old set stays) or a later one (the new set is in place), however loaded the
            # machine is, not after a delay measured once on a quiet machine.
            for _ in range(renders):
                assert reader.take(soon) == b"r", f"{what}: no render finished within 60 s"
            time.sleep(rng.uniform(0, one))
            os.kill(pid, sig)
            deadline, lost = time.monotonic() + 30, False
            while (got := reader.take(deadline)) != b"X":
                if got is None:  # still running 30 s after its signal: fail, not hang
                    os.kill(pid, signal.SIGUSR1)  # its threads' stacks first (faulthandler), for the message
                    time.sleep(1)
                    os.kill(pid, signal.SIGKILL)
                    deadline, lost = time.monotonic() + 30, True
            code = int(reader.line(deadline))
            assert not lost, (f"{what}: the child was still running 30 s after its signal (the signal was lost); "
                              f"its threads then:\n{stacks.read_text() if stacks.exists() else '(no stacks)'}")
            assert code in (130, -signal.SIGTERM, 1), f"{what}: exit {code}"
            seen[check_state(out, sets)] += 1
    finally:
        for server in servers:
            server.stdin.close()
            server.wait(timeout=60)
    print(f"\n200 kills ({one * 1000:.0f} ms a render): the folder held the old set {seen['old']} times, "
          f"the new set {seen['new']} times, never a mix")
    assert seen["old"] and seen["new"], "every kill landed on the same side: the test did not exercise the swap"


def test_random_kills_of_the_command(tmp_path, specs, sets):
    """The real command, killed at random points of its life (interpreter start and exit included)."""
    out = tmp_path / "out"
    assert quiet_main(["render", str(specs["old"]), "-o", str(out)])[0] == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "gpucluster.cli", "render"]
    t0 = time.perf_counter()
    subprocess.run(cmd + [str(specs["new"]), "-o", str(tmp_path / "timing")], env=env, check=True,
                   capture_output=True)
    whole = time.perf_counter() - t0
    rng = random.Random(11)
    for i in range(12):
        spec = specs["new" if i % 2 == 0 else "old"]
        proc = subprocess.Popen(cmd + [str(spec), "-o", str(out)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.3 * whole, 1.1 * whole))
        proc.send_signal(signal.SIGTERM if i % 2 else signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        assert b"Traceback" not in err or (proc.returncode != 0 and b"KeyboardInterrupt" in err), err
        check_state(out, sets)


# ---- the write_set API ---------------------------------------------------------------------------------

def test_user_files_kept_and_stale_files_removed(tmp_path):
    out = tmp_path / "out"
    write_set(out, {"a.conf": "1\n", "old.csv": "x\n", "group_vars/all.yml": "a: 1\n"})
    (out / "notes.txt").write_text("mine\n")
    (out / "group_vars" / "site.yml").write_text("b: 2\n")
    (out / "scratch").mkdir()
    (out / "link").symlink_to("notes.txt")
    done = write_set(out, {"a.conf": "2\n", "group_vars/all.yml": "a: 2\n"})
    assert done.removed == ("old.csv",)
    assert set(done.kept) == {"notes.txt", "group_vars/site.yml", "link"}
    assert snapshot(out) == {MANIFEST: (out / MANIFEST).read_bytes(), "a.conf": b"2\n", "group_vars": None,
                             "group_vars/all.yml": b"a: 2\n", "group_vars/site.yml": b"b: 2\n",
                             "link": None, "notes.txt": b"mine\n", "scratch": None}
    assert os.readlink(out / "link") == "notes.txt"
    assert set(read_manifest(out)) == {"a.conf", "group_vars/all.yml"}
    assert leftovers(tmp_path) == []


def test_a_stale_file_edited_since_is_the_users(tmp_path):
    out = tmp_path / "out"
    write_set(out, {"a": "1\n", "b": "1\n"})
    (out / "b").write_text("edited\n")
    done = write_set(out, {"a": "2\n"})
    assert done.removed == () and done.kept == ("b",)
    assert (out / "b").read_text() == "edited\n"


def test_a_folder_without_manifest_loses_only_the_replaced_names(tmp_path):
    """A folder an older gpucluster rendered into: nothing says which files were its own, so all stay."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "slurm.conf").write_text("old\n")
    (out / "cabling.csv").write_text("old\n")
    write_set(out, {"slurm.conf": "new\n"})
    assert (out / "slurm.conf").read_text() == "new\n" and (out / "cabling.csv").read_text() == "old\n"


def test_modes(tmp_path):
    out = tmp_path / "secrets"
    write_set(out, {"munge.key": b"k" * 32, "public.txt": OutputFile("p\n", 0o644)}, folder_mode=0o700,
              file_mode=0o600)
    assert os.stat(out).st_mode & 0o777 == 0o700
    assert os.stat(out / "munge.key").st_mode & 0o777 == 0o600
    assert os.stat(out / "public.txt").st_mode & 0o777 == 0o644
    os.chmod(out, 0o750)
    write_set(out, {"munge.key": b"k" * 32})
    assert os.stat(out).st_mode & 0o777 == 0o750, "an existing folder keeps its mode"


def test_a_symlinked_folder_stays_a_symlink(tmp_path):
    real = tmp_path / "real"
    write_set(real, {"a": "1\n"})
    (tmp_path / "link").symlink_to("real")
    write_set(tmp_path / "link", {"a": "2\n"})
    assert (tmp_path / "link").is_symlink() and (real / "a").read_text() == "2\n"


@pytest.mark.parametrize("name", ["", "/abs", "../up", "a/../b", "a//b", "./a", MANIFEST])
def test_bad_names_are_a_callers_bug(tmp_path, name):
    with pytest.raises(ValueError):
        write_set(tmp_path / "out", {name: "x"})
    assert not (tmp_path / "out").exists()


def test_a_file_and_a_folder_of_the_same_name(tmp_path):
    with pytest.raises(ValueError):
        write_set(tmp_path / "out", {"a": "x", "a/b": "y"})


def test_a_file_where_the_set_needs_a_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "group_vars").write_text("the user's\n")
    with pytest.raises(UsageError, match="is a file where"):
        write_set(out, {"group_vars/all.yml": "a: 1\n"})
    assert snapshot(out) == {"group_vars": b"the user's\n"}


def test_a_file_added_during_the_write_is_kept(tmp_path):
    """A user (or another tool) writes into the folder while the set is written: the file lands in the
    old folder, and is moved across before that folder is removed."""
    out = tmp_path / "out"
    write_set(out, {"a": "1\n"})

    def slow():
        (out / "late.txt").write_text("late\n")
        yield "2\n"

    write_set(out, {"a": slow})
    assert (out / "late.txt").read_text() == "late\n" and (out / "a").read_text() == "2\n"


def test_without_rename_exchange(tmp_path, monkeypatch):
    """NFS has no RENAME_EXCHANGE: two renames, the same result, nothing left beside the folder."""
    monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    write_set(out, {"a": "1\n"})
    (out / "mine").write_text("m\n")
    write_set(out, {"a": "2\n"})
    assert snapshot(out) == {MANIFEST: (out / MANIFEST).read_bytes(), "a": b"2\n", "mine": b"m\n"}
    assert leftovers(tmp_path) == []


def test_the_staging_folder_is_private_until_the_swap(tmp_path):
    out = tmp_path / "out"
    modes = []

    def peek():
        staging = next(p for p in tmp_path.iterdir() if ".gpucluster-" in p.name)
        modes.append(os.stat(staging).st_mode & 0o777)
        yield "x"

    write_set(out, {"a": peek})
    assert modes == [0o700]


def test_render_writes_into_the_output_folder_not_beside_it(tmp_path):
    """The render folder keeps what a render into a shared folder lost: a re-render drops a file the spec no longer
    produces (cabling.csv with --no-cabling) and keeps the user's."""
    out = tmp_path / "out"
    assert quiet_main(["render", str(example_path("staging")), "-o", str(out)])[0] == 0
    (out / "README.local").write_text("site notes\n")
    assert quiet_main(["render", str(example_path("staging")), "-o", str(out), "--no-cabling"])[0] == 0
    assert not (out / "cabling.csv").exists()
    assert (out / "README.local").read_text() == "site notes\n"


def test_write_file_replaces_one_file_among_others(tmp_path):
    """One output in a folder of the user's (an as-built file in the current folder): only that file changes."""
    (tmp_path / "notes.txt").write_text("mine\n")
    assert write_file(tmp_path / "topo.txt", "1\n") == 2
    assert write_file(tmp_path / "topo.txt", lambda: iter(["2", "\n"]), mode=0o600) == 2
    assert snapshot(tmp_path) == {"notes.txt": b"mine\n", "topo.txt": b"2\n"}
    assert os.stat(tmp_path / "topo.txt").st_mode & 0o777 == 0o600


def test_write_file_changes_nothing_on_failure(tmp_path):
    (tmp_path / "topo.txt").write_text("old\n")

    def broken():
        yield "half"
        raise OSError(28, "No space left on device")

    with pytest.raises(UsageError, match="nothing was changed"):
        write_file(tmp_path / "topo.txt", broken)
    assert snapshot(tmp_path) == {"topo.txt": b"old\n"}
    (tmp_path / "dir").mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        write_file(tmp_path / "dir", "x")
