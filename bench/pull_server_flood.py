"""The bundle server under a flood of idle connections, before and after its hardening, in one run.

    .venv/bin/python bench/pull_server_flood.py                       # writes bench/pull-server-flood.json
    .venv/bin/python bench/pull_server_flood.py --connections 500 --json /tmp/x.json

For each version of the node program gpucluster-pull (src/gpucluster/node/pullrunner.py; "before": the newest
commit whose server is still http.server's ThreadingHTTPServer, read with `git show REV:PATH` from the path it had then
into a temporary file; "after": the working tree), it starts the server in its own process on 127.0.0.1 (never
another address) with the file limit systemd gives it (before: the default soft limit of 1024; after: the unit's
LimitNOFILE, max connections + 1024), then measures what a legitimate node does: GET the pointer and PUT its
result, first on an idle server, then while this process holds --connections idle connections to it. Every
step is bounded in count and time; the run stops by itself (--deadline). Prints a table and writes the figures;
asserts nothing (bench/ convention).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "src/gpucluster/node/pullrunner.py"
# Where the program lived in older commits (the "before" server is one of them).
OLD_PATHS = ("src/gpucluster/node/pull.py", "roles/pull_runner/files/gpucluster-pull")
SERVER = """
import importlib.machinery, importlib.util, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(int(sys.argv[4]), hard), hard))
loader = importlib.machinery.SourceFileLoader("pull_server", sys.argv[1])
spec = importlib.util.spec_from_loader(loader.name, loader)
module = importlib.util.module_from_spec(spec)
loader.exec_module(module)
server = module.make_server(0, sys.argv[2], sys.argv[3], "127.0.0.1")
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def before_revision() -> str:
    """The newest commit whose gpucluster-pull serves with ThreadingHTTPServer (the server before hardening)."""
    revs = subprocess.run(["git", "log", "--format=%H", "--", SCRIPT, *OLD_PATHS], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.split()
    for rev in revs:
        text = program_at(rev).decode()
        if "ThreadingHTTPServer" in text and "class BundleServer" not in text:
            return rev
    raise SystemExit("no commit with the unhardened server in this history")


def program_at(rev: str) -> bytes:
    """gpucluster-pull as commit `rev` has it, at whichever of its paths that commit holds."""
    for path in (SCRIPT, *OLD_PATHS):
        proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, check=False)
        if proc.returncode == 0:
            return proc.stdout
    raise SystemExit(f"{rev}: no gpucluster-pull at {SCRIPT} or {', '.join(OLD_PATHS)}")


def _request(url: str, data: bytes | None = None, timeout: float = 5.0) -> tuple[bool, float]:
    started = time.monotonic()
    req = urllib.request.Request(url, data=data, method="PUT" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            ok = resp.status in (200, 204)
    except (OSError, urllib.error.HTTPError):
        ok = False
    return ok, (time.monotonic() - started) * 1000


def _legit(url: str, body: bytes, count: int, timeout: float) -> dict:
    """`count` GETs of the pointer and PUTs of a result, one after the other, as one node does."""
    out = {}
    for kind, path, data in (("get_pointer", "/current.signed", None), ("put_result", "/results/localhost", body)):
        runs = [_request(url + path, data, timeout) for _ in range(count)]
        ms = sorted(t for ok, t in runs if ok)
        out[kind] = {"ok": len(ms), "of": count,
                     "median_ms": round(statistics.median(ms), 2) if ms else None,
                     "max_ms": round(max(ms), 2) if ms else None,
                     "failed_after_ms": round(max((t for ok, t in runs if not ok), default=0), 1)}
    return out


def _flood(port: int, count: int, seconds: float) -> list[socket.socket]:
    """Up to `count` idle connections, opened by 128 threads at once (a server whose listen queue is short makes
    each connect wait for a SYN retry), within `seconds`."""
    from concurrent.futures import ThreadPoolExecutor

    deadline = time.monotonic() + seconds

    def one(_i: int) -> socket.socket | None:
        while time.monotonic() < deadline:
            try:
                wait = max(0.1, min(5.0, deadline - time.monotonic()))
                return socket.create_connection(("127.0.0.1", port), timeout=wait)
            except OSError:
                time.sleep(0.05)
        return None

    with ThreadPoolExecutor(max_workers=128) as pool:
        return [c for c in pool.map(one, range(count)) if c is not None]


def _process(pid: int) -> dict:
    """The server process's threads and open files (what an idle connection costs it)."""
    status = Path(f"/proc/{pid}/status").read_text()
    threads = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:"))
    return {"threads": threads, "open_files": len(os.listdir(f"/proc/{pid}/fd"))}


def measure(label: str, script: Path, work: Path, body: bytes, args: argparse.Namespace, nofile: int) -> dict:
    published, results = work / f"{label}-published", work / f"{label}-results"
    published.mkdir()
    results.mkdir()
    pointer = {"version": 2, "bundle": "a" * 64, "serial": 1, "full": False, "cluster": "bench", "published": 0,
               "expires": 2**40, "hosts": ["localhost"]}
    (published / "current.signed").write_text(json.dumps({"pointer": json.dumps(pointer), "signature": "x"}))
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(script), str(published), str(results), str(nofile)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        idle = _legit(url, body, args.requests, args.timeout)
        started = time.monotonic()
        conns = _flood(port, args.connections, args.open_seconds)
        opened = time.monotonic() - started
        time.sleep(1.0)  # the server has seen them all
        held = _process(proc.pid)
        flooded = _legit(url, body, args.requests, args.timeout)
        time.sleep(max(0.0, 12.0 - (time.monotonic() - started - opened)))  # past the hardened server's timeout
        still = _process(proc.pid)
        for conn in conns:
            conn.close()
        after = _legit(url, body, max(1, args.requests // 2), args.timeout)
        return {"server_nofile_soft": nofile, "idle_server": idle, "idle_connections_held": len(conns),
                "seconds_to_open_them": round(opened, 2), "server_while_held": held,
                "server_12s_after_the_flood_began": still, "under_flood": flooded, "after_flood": after}
    finally:
        proc.kill()
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=2000, help="idle connections held (at most 20,000)")
    parser.add_argument("--requests", type=int, default=10, help="legitimate GETs and PUTs measured in each phase")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds a legitimate request may take")
    parser.add_argument("--open-seconds", type=float, default=60.0, help="seconds to open the idle connections")
    parser.add_argument("--deadline", type=float, default=600.0, help="the whole run stops after this")
    parser.add_argument("--before", default="", help="git revision of the server before (default: found)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "pull-server-flood.json"))
    args = parser.parse_args()
    args.connections = max(1, min(args.connections, 20000))
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds every idle connection
    if hard < args.connections + 256:
        print(f"the file limit is {hard}: fewer than {args.connections} connections will open", file=sys.stderr)
    import signal

    signal.signal(signal.SIGALRM, lambda *_: sys.exit("stopped at --deadline"))
    signal.alarm(int(args.deadline))

    from gpucluster.node import pullrunner as node  # the node program, to sign a result as a node does

    rev = args.before or before_revision()
    old = program_at(rev)
    figures: dict = {"connections": args.connections, "requests_per_phase": args.requests,
                     "request_timeout_s": args.timeout, "before_revision": rev,
                     "limits_after": {"workers": node.SERVER_WORKERS, "max_connections": node.SERVER_MAX_CONNECTIONS,
                                      "request_timeout_s": node.SERVER_TIMEOUT, "max_head_bytes": node.MAX_HEAD,
                                      "max_result_bytes": node.MAX_RESULT, "min_send_rate_bytes_s": node.SEND_RATE},
                     "limits_before": "one thread per connection, no timeout, no connection cap, every interface",
                     "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "load_before": os.getloadavg()}}
    with tempfile.TemporaryDirectory(prefix="pull-flood-") as tmp:
        work = Path(tmp)
        work.chmod(0o700)
        before_script = work / "gpucluster-pull-before"
        before_script.write_bytes(old)
        node.WORK = str(work / "node")
        key = work / "host.key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        signed = node.sign_result({"host": "localhost", "serial": 1, "bundle": "a" * 64, "failed": 0, "changed": 0,
                                   "rc": 0}, str(key), "bench")
        plain = json.dumps({"host": "localhost", "serial": 1, "bundle": "a" * 64, "failed": 0}).encode()
        figures["before"] = measure("before", before_script, work, plain, args, 1024)
        figures["after"] = measure("after", ROOT / SCRIPT, work, signed, args, node.SERVER_MAX_CONNECTIONS + 1024)
    figures["machine"]["load_after"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    print(f"{'server':8} {'phase':12} {'GET pointer ok':>15} {'median ms':>10} {'PUT result ok':>14} {'median ms':>10}")
    for label in ("before", "after"):
        for phase in ("idle_server", "under_flood", "after_flood"):
            f = figures[label][phase]
            g, p = f["get_pointer"], f["put_result"]
            print(f"{label:8} {phase:12} {g['ok']:>9}/{g['of']:<5} {g['median_ms']!s:>10} {p['ok']:>8}/{p['of']:<5} "
                  f"{p['median_ms']!s:>10}")
    for label in ("before", "after"):
        f = figures[label]
        print(f"{label}: {f['idle_connections_held']} idle connections held; the server had "
              f"{f['server_while_held']['threads']} threads and {f['server_while_held']['open_files']} open files, "
              f"{f['server_12s_after_the_flood_began']['open_files']} open files 12 s after the flood began")
    print(f"figures in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
