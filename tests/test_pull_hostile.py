"""The pull path against a hostile node, a hostile user on a node, and mistakes (docs/roles.md, "Converging a
fleet"): bundles, pointers, result bodies and connections an attacker controls. Every case asserts no traceback
and no wrong action (nothing unpacked or run, no pointer accepted, no result taken as converged, no escape
sequence printed). Real ssh-keygen keys and signatures, the real bundle server on 127.0.0.1 (never any other
address), the real node program (gpucluster.node.pullrunner, installed as gpucluster-pull); no cluster."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="not run: ssh-keygen is missing")

CLUSTER = "c1"
WANT = hashlib.sha256(b"MANIFEST of a bundle the operator promised\n").hexdigest()
NOISE = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(3000))  # 96 KiB that does not compress
CONTROL = [chr(c) for c in [*range(0, 9), *range(11, 32), 127, *range(0x80, 0xA0)]] + ["\u202e", "\u200b"]


def _key(folder: Path, name: str) -> Path:
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The cluster's bundle-signing key and a stranger's; two nodes' host keys and a stranger's; the node's
    allowed_signers and the operator's known_hosts."""
    folder = tmp_path_factory.mktemp("keys")
    folder.chmod(0o700)
    k = {name: _key(folder, name) for name in ("cluster", "stranger", "localhost_host", "node2_host", "other_host")}

    def public(name: str) -> str:
        return " ".join(Path(f"{k[name]}.pub").read_text().split()[:2])

    signers = folder / "allowed_signers"
    signers.write_text(f'gpucluster-bundle namespaces="gpucluster-bundle" {public("cluster")}\n')
    known = folder / "known_hosts"
    known.write_text("".join(f"{host} {public(host + '_host')}\n" for host in ("localhost", "node2")))
    return argparse.Namespace(**k, signers=signers, known_hosts=known, folder=folder)


@pytest.fixture
def node(tmp_path, monkeypatch):
    from gpucluster.node import pullrunner as pull

    monkeypatch.setattr(pull, "WORK", str(tmp_path / "work"))
    return pull


def _sign_pointer(key: Path, work: Path, **fields) -> bytes:
    from gpucluster.configure.pull import sign_pointer

    now = int(time.time())
    pointer = {"version": 2, "bundle": WANT, "serial": 10, "full": False, "cluster": CLUSTER, "published": now,
               "expires": now + 3600, "hosts": ["localhost", "node2"], **fields}
    return sign_pointer(key, pointer, work)


@contextlib.contextmanager
def _server(node, tmp_path: Path, **limits):
    published, results = tmp_path / "published", tmp_path / "results"
    published.mkdir(exist_ok=True)
    results.mkdir(exist_ok=True)
    httpd = node.make_server(0, str(published), str(results), "127.0.0.1", **limits)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield argparse.Namespace(url=f"http://127.0.0.1:{httpd.server_address[1]}", port=httpd.server_address[1],
                                 published=published, results=results, httpd=httpd)
    finally:
        httpd.shutdown()
        httpd.server_close()


def _no_traceback(capsys) -> tuple[str, str]:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return out, err


# ---------------------------------------------------------------- bundles


def _tar(members: list[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return raw.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


def _gz(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)


def _bomb(size: int = 1 << 30) -> bytes:
    """A gzip of about 1 MB that a tar reader inflates to `size` bytes of one member (a 1 GiB file): the same
    deflate block of 1 MiB of zeros, repeated (each ends on a full flush, so the copies chain)."""
    info = tarfile.TarInfo("compiled/facts.json")
    info.size = size
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = comp.compress(info.tobuf(format=tarfile.USTAR_FORMAT)) + comp.flush(zlib.Z_FULL_FLUSH)
    first = comp.compress(b"\0" * (1 << 20)) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(b"\0" * (1 << 20)) + comp.flush(zlib.Z_FULL_FLUSH)
    return head + first + block * (size // (1 << 20) - 1) + comp.flush()


def _pax_header(size: int) -> bytes:
    info = tarfile.TarInfo("roles/x")
    info.size = 1
    info.pax_headers = {"comment": "x" * size}
    return _gz(_tar([(info, b"x")]))


@dataclass
class BundleCase:
    id: str
    build: object  # () -> bytes served as the bundle
    says: str  # in the node's error
    limits: dict = field(default_factory=dict)  # node constants lowered for this case (fast, same code path)


BUNDLES = [
    BundleCase("gzip-bomb-1GiB-member", _bomb, "is 1073741824 bytes"),
    BundleCase("bomb-many-members-over-total", lambda: _gz(_tar([_file(f"f{i}", b"\0" * 3000) for i in range(8)])),
               "bytes in all", {"MAX_TOTAL": 16 * 1024}),
    BundleCase("not-gzip", lambda: b"PK\x03\x04 this is a zip, not a tar.gz" * 40, "not a well-formed bundle"),
    BundleCase("plain-tar-not-gzip", lambda: _tar([_file("MANIFEST")]), "not a well-formed bundle"),
    BundleCase("truncated-gzip", lambda: _gz(_tar([_file("MANIFEST", NOISE)]))[:5000], "not a well-formed"),
    BundleCase("empty-body", lambda: b"", "not a well-formed bundle"),
    BundleCase("path-traversal", lambda: _gz(_tar([_file("../outside")])), "not a plain relative"),
    BundleCase("absolute-path", lambda: _gz(_tar([_file("/etc/cron.d/evil")])), "not a plain relative"),
    BundleCase("dot-path", lambda: _gz(_tar([_file("roles/./x")])), "not a plain relative"),
    BundleCase("symlink", lambda: _gz(_tar([_special("roles/x", tarfile.SYMTYPE, "/etc/shadow")])),
               "not a plain relative"),
    BundleCase("hardlink", lambda: _gz(_tar([_file("a"), _special("roles/x", tarfile.LNKTYPE, "a")])),
               "not a plain relative"),
    BundleCase("device", lambda: _gz(_tar([_special("dev/sda", tarfile.BLKTYPE)])), "not a plain relative"),
    BundleCase("fifo", lambda: _gz(_tar([_special("fifo", tarfile.FIFOTYPE)])), "not a plain relative"),
    BundleCase("oversize-member", lambda: _gz(_tar([_file("big", b"z" * 5000)])), "at most 4096",
               {"MAX_MEMBER": 4096}),
    BundleCase("too-many-members", lambda: _gz(_tar([_file(f"f{i}") for i in range(12)])), "more than 10 members",
               {"MAX_MEMBERS": 10}),
    BundleCase("huge-pax-header", lambda: _pax_header(1 << 20), "extended tar header"),
    BundleCase("duplicate-member", lambda: _gz(_tar([_file("a", b"1"), _file("a", b"2")])), "appears twice"),
    BundleCase("oversize-download", lambda: b"\x1f\x8b" + b"\0" * 5000, "more than 4096", {"MAX_BYTES": 4096}),
    BundleCase("not-published", lambda: None, "HTTP Error 404"),
    BundleCase("wrong-manifest-hash", lambda: _gz(_tar([_file("MANIFEST", b"")])), "MANIFEST hashes to"),
    BundleCase("manifest-bad-line", lambda: _gz(_tar([_file("MANIFEST", b"../../x\n")])), "MANIFEST hashes to"),
]


@pytest.mark.parametrize("case", BUNDLES, ids=lambda c: c.id)
def test_a_hostile_bundle_is_refused_with_a_result(case, node, tmp_path, monkeypatch, capsys):
    for name, value in case.limits.items():
        monkeypatch.setattr(node, name, value)
    with _server(node, tmp_path) as srv:
        data = case.build()
        if data is not None:
            (srv.published / f"{WANT}.tar.gz").write_bytes(data)
        started = time.monotonic()
        rc = node.main(["run", "--hash", WANT, "--url", srv.url, "--host", "localhost"])
    out, _err = _no_traceback(capsys)
    result = json.loads(out.splitlines()[-1])
    assert rc == 1 and result["failed"] == 1 and case.says in result["error"], result
    assert time.monotonic() - started < 30, "refused while reading, not after inflating it all"
    cache = Path(node.WORK) / "bundles"
    assert [p.name for p in cache.iterdir()] == [], "nothing of a refused bundle stays in the cache"
    assert not (Path(node.WORK) / "last.log").exists(), "no Ansible ran"


def test_a_bundle_is_checked_while_it_streams_not_read_whole(node, tmp_path, monkeypatch):
    """The 1 GiB member is refused from its header: Python allocates a few MiB at most, not the member."""
    import tracemalloc

    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(_bomb())
    tracemalloc.start()
    try:
        with pytest.raises(node.Refused, match="1073741824"):
            node.unpack_checked(str(bomb), WANT, str(tmp_path / "dest"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated to refuse a gzip bomb"
    assert not (tmp_path / "dest").exists()


def test_a_slow_bundle_server_is_cut_off_at_the_fetch_deadline(node, tmp_path, monkeypatch, capsys):
    """A server that sends a byte now and then never trips a per-read timeout; the overall deadline ends it."""
    monkeypatch.setattr(node, "FETCH_DEADLINE", 1.0)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def dribble():
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(25):  # 5 s at most, so a broken deadline fails the test instead of hanging it
                if stop.wait(0.2):
                    break
                with contextlib.suppress(OSError):
                    conn.sendall(b"\x1f")

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    rc = node.main(["run", "--hash", WANT, "--url", f"http://127.0.0.1:{listener.getsockname()[1]}",
                    "--host", "localhost"])
    stop.set()
    listener.close()
    out, _ = _no_traceback(capsys)
    assert rc == 1 and "not fetched within 1 s" in json.loads(out.splitlines()[-1])["error"]


# ---------------------------------------------------------------- pointers


def _deep(n: int = 100000) -> bytes:
    return b"[" * n + b"]" * n


@dataclass
class PointerCase:
    id: str
    build: object  # (keys, work) -> bytes published as current.signed
    says: str
    seen: int = 0  # the newest serial this node has seen before the tick


POINTERS = [
    PointerCase("deep-nesting-envelope", lambda k, w: _deep(), "not JSON"),
    PointerCase("deep-nesting-signed", lambda k, w: _signed_text(k.cluster, w, _deep().decode()), "not JSON"),
    PointerCase("wrong-cluster", lambda k, w: _sign_pointer(k.cluster, w, cluster="c2"), "for cluster 'c2'"),
    PointerCase("no-cluster", lambda k, w: _sign_pointer(k.cluster, w, cluster=None), "for cluster 'None'"),
    PointerCase("expired", lambda k, w: _sign_pointer(k.cluster, w, expires=int(time.time()) - 60), "expired"),
    PointerCase("no-expiry", lambda k, w: _sign_pointer(k.cluster, w, expires=None), "expires is not"),
    PointerCase("wrong-signature", lambda k, w: _sign_pointer(k.stranger, w), "does not verify"),
    PointerCase("altered-after-signing", lambda k, w: _sign_pointer(k.cluster, w).replace(b"c1", b"c2"),
                "does not verify"),
    PointerCase("replayed-serial", lambda k, w: _sign_pointer(k.cluster, w, serial=10), "older than 20", seen=20),
    PointerCase("huge", lambda k, w: b"{" + b" " * (5 << 20) + b"}", "more than 4194304"),
    PointerCase("old-version-1", lambda k, w: _sign_pointer(k.cluster, w, version=1), "version 1, not 2"),
    PointerCase("bad-host-names", lambda k, w: _sign_pointer(k.cluster, w, hosts=["../x"]), "hosts is not"),
    PointerCase("bad-bundle", lambda k, w: _sign_pointer(k.cluster, w, bundle="../../etc/passwd"), "not a sha256"),
    PointerCase("not-json", lambda k, w: b"\xff\xfe garbage", "not JSON"),
    PointerCase("envelope-of-wrong-types", lambda k, w: b'{"pointer": 1, "signature": []}', "unreadable"),
]


def _signed_text(key: Path, work: Path, text: str) -> bytes:
    """An envelope signed by `key` around any text (sign_pointer signs JSON of a dict; this signs raw text)."""
    work.mkdir(mode=0o700, exist_ok=True)
    (work / "t").write_text(text)
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", "gpucluster-bundle", str(work / "t")],
                   check=True, capture_output=True)
    return json.dumps({"pointer": text, "signature": (work / "t.sig").read_text()}).encode()


@pytest.mark.parametrize("case", POINTERS, ids=lambda c: c.id)
def test_a_hostile_pointer_is_refused_with_a_result(case, node, keys, tmp_path, capsys):
    if case.seen:
        work = Path(node._private(node.WORK))
        (work / node.TIMER_STATE).write_text(json.dumps({"seen": case.seen}))
    with _server(node, tmp_path) as srv:
        (srv.published / node.POINTER).write_bytes(case.build(keys, tmp_path / "sign"))
        rc = node.main(["timer", "--url", srv.url, "--host", "localhost", "--cluster", CLUSTER,
                        "--signers", str(keys.signers), "--host-key", str(keys.localhost_host)])
    out, _ = _no_traceback(capsys)
    result = json.loads(out.splitlines()[-1])
    assert rc == 1 and result["failed"] == 1 and case.says in result["error"], result
    assert not (Path(node.WORK) / "bundles").exists(), "no bundle fetched for a refused pointer"
    assert not (Path(node.WORK) / "last.log").exists(), "no Ansible ran"
    state_file = Path(node.WORK) / node.TIMER_STATE
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    assert int(state.get("seen") or 0) == case.seen and not state.get("done"), "a refused pointer moves nothing"


# ---------------------------------------------------------------- result bodies


RESET = 0  # what _put returns when the server closed the connection before the client had sent its body


def _put(url: str, name: str, body: bytes, headers: dict | None = None) -> int:
    req = urllib.request.Request(f"{url}/results/{name}", data=body, method="PUT", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError as exc:  # refused while the body was still on its way: a broken pipe or a reset
        if isinstance(exc.reason, (BrokenPipeError, ConnectionResetError)):
            return RESET
        raise


def _result(**fields) -> dict:
    return {"host": "localhost", "serial": 10, "bundle": WANT, "changed": 0, "failed": 0, "rc": 0,
            "trigger": "timer", "seconds": 1.5, **fields}


def _signed_result(node, key: Path, result: dict, cluster: str = CLUSTER) -> bytes:
    return node.sign_result(result, str(key), cluster)


@dataclass
class ResultCase:
    id: str
    build: object  # (node, keys) -> (name the client PUTs to, body, headers)
    status: int | tuple[int, ...]  # what the server answers (any of them)
    says: str = ""  # in localhost's failure line at the operator ("" when the server refused it)


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31mRED\u202eevil\x9b1m\r\n"
RESULTS = [
    ResultCase("name-as-decimal-address", lambda n, k: ("2130706433", _signed_result(n, k.localhost_host,
                                                                                         _result())), 404),
    ResultCase("name-as-hex-address", lambda n, k: ("0x7f.1", _signed_result(n, k.localhost_host, _result())), 404),
    ResultCase("name-as-dotted-address", lambda n, k: ("127.0.0.1", _signed_result(n, k.localhost_host,
                                                                                       _result())), 404),
    ResultCase("name-not-in-pointer", lambda n, k: ("node9", b"{}"), 404),
    ResultCase("name-traversal", lambda n, k: ("..%2f..%2fetc%2fpasswd", b"{}"), 404),
    ResultCase("from-another-address", lambda n, k: ("node2", _signed_result(n, k.node2_host, _result(
        host="node2"))), 403),
    ResultCase("bad-json", lambda n, k: ("localhost", b"{not json"), 400),
    ResultCase("deep-json", lambda n, k: ("localhost", _deep()[:60000]), 400),
    ResultCase("names-another-host", lambda n, k: ("localhost", _signed_result(n, k.localhost_host,
                                                                                   _result(host="node2"))), 400),
    ResultCase("huge", lambda n, k: ("localhost", b"x" * (65 * 1024)), 413),
    # refused on its headers: the client may still be sending the chunk when the server answers and closes
    ResultCase("chunked-no-length", lambda n, k: ("localhost", iter([b"{}"]),), (413, RESET)),
    ResultCase("unsigned", lambda n, k: ("localhost", json.dumps({"result": json.dumps(_result()), "signature": "",
                                                                  "unsigned": ESCAPES}).encode()), 204, "unsigned"),
    ResultCase("signed-by-another-host-key", lambda n, k: ("localhost", _signed_result(n, k.other_host, _result())),
               204, "does not verify"),
    ResultCase("signed-by-node2-for-localhost", lambda n, k: ("localhost", _signed_result(n, k.node2_host,
                                                                                              _result())),
               204, "does not verify"),
    ResultCase("signed-for-another-cluster", lambda n, k: ("localhost", _signed_result(n, k.localhost_host, _result(),
                                                                                           "c2")),
               204, "does not verify"),
    ResultCase("signature-garbage", lambda n, k: ("localhost", json.dumps({"result": json.dumps(_result()),
                                                                           "signature": ESCAPES}).encode()),
               204, "does not verify"),
    ResultCase("wrong-types", lambda n, k: ("localhost", _signed_result(n, k.localhost_host, _result(
        changed="lots"))), 204, "changed is not a count"),
    ResultCase("wrong-type-verified", lambda n, k: ("localhost", _signed_result(n, k.localhost_host, _result(
        verified=[1, 2]))), 204, "verified is not"),
    ResultCase("bool-as-count", lambda n, k: ("localhost", _signed_result(n, k.localhost_host, _result(
        failed=False))), 204, "failed is not a count"),
    ResultCase("nan-seconds", lambda n, k: ("localhost", _signed_result(n, k.localhost_host, _result(
        seconds=float("nan")))), 204, "seconds is not"),
    ResultCase("bundle-not-a-hash", lambda n, k: ("localhost", _signed_result(n, k.localhost_host, _result(
        bundle="\x1b[2J"))), 204, "bundle is not a sha256"),
    ResultCase("escape-sequences-signed", lambda n, k: ("localhost", _signed_result(n, k.localhost_host, _result(
        failed=1, error=ESCAPES, changes=[ESCAPES], drift=[ESCAPES]))), 204, "RED?evil"),
    ResultCase("converged-claim-for-another-bundle", lambda n, k: ("localhost", _signed_result(
        n, k.localhost_host, _result(bundle="b" * 64))), 204, "ran bundle bbbbbbbbbbbb"),
]


def _inventory(keys, tmp_path: Path):
    from gpucluster.inventory.reader import Host, Inventory

    common = f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={keys.known_hosts}"
    hosts = {name: Host(name, ["slurm_compute"], {"ansible_ssh_common_args": common})
             for name in ("localhost", "node2")}
    hosts["ctl01"] = Host("ctl01", ["slurm_controller"], {"ansible_ssh_common_args": common})
    return Inventory(path=tmp_path / "hosts.yml", hosts=hosts,
                     groups={"slurm_controller": ["ctl01"], "slurm_compute": ["localhost", "node2"]},
                     vars={"gpucluster_cluster": CLUSTER})


@pytest.mark.parametrize("case", RESULTS, ids=lambda c: c.id)
def test_a_hostile_result_is_refused_and_the_other_hosts_carry_on(case, node, keys, tmp_path, capsys):
    from gpucluster.configure.pull import collect

    with _server(node, tmp_path) as srv:
        (srv.published / node.POINTER).write_bytes(_sign_pointer(keys.cluster, tmp_path / "sign"))
        name, body, *headers = case.build(node, keys)
        assert _put(srv.url, name, body, *headers) in (case.status if isinstance(case.status, tuple)
                                                       else (case.status,))
        assert {p.name for p in srv.results.iterdir()} <= {"localhost.json"}, "one result file, the pointer's name"
        # node2, a well-behaved node, answered too (written where the server files it)
        good = json.loads(_signed_result(node, keys.node2_host, _result(host="node2")))
        (srv.results / "node2.json").write_text(json.dumps({**good, "host": "node2", "received": 1.0}))

        def read() -> str:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                node.main(["results", "--results", str(srv.results), "--serial", "10"])
            return out.getvalue()

        lines: list[str] = []
        got = collect(_inventory(keys, tmp_path), 10, ["localhost", "node2"], WANT, 0.0, lines.append, read=read)
    _no_traceback(capsys)
    assert got["node2"].failed == 0 and got["node2"].line().startswith("node2  ok"), "the others carry on"
    assert got["localhost"].failed == 1, f"never converged: {got['localhost']}"
    mine = next(line for line in lines if line.startswith("localhost"))
    assert case.says in mine if case.says else "no result within" in mine, mine
    assert not any(c in "\n".join(lines) for c in CONTROL), "no control character reaches the terminal"


def test_a_good_signed_result_is_accepted(node, keys, tmp_path):
    """The corpus's counterpart: the node's own signed result, PUT from its own address, is converged."""
    from gpucluster.configure.pull import collect

    with _server(node, tmp_path) as srv:
        (srv.published / node.POINTER).write_bytes(_sign_pointer(keys.cluster, tmp_path / "sign"))
        assert node.report(srv.url, "localhost", _signed_result(node, keys.localhost_host, _result())) == ""

        def read() -> str:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                node.main(["results", "--results", str(srv.results), "--serial", "10"])
            return out.getvalue()

        got = collect(_inventory(keys, tmp_path), 10, ["localhost"], WANT, 0.0, print, read=read)
    assert got["localhost"].failed == 0 and got["localhost"].bundle == WANT


def test_the_fan_outs_result_line_is_checked_too():
    from gpucluster.configure.pull import _parse

    bad = subprocess.CompletedProcess([], 0, json.dumps({"bundle": WANT, "changed": {"a": 1}}) + "\n", "")
    assert "changed is not a count" in _parse("gpu01", bad, WANT).error
    deep = subprocess.CompletedProcess([], 0, "{" + '"a":' * 5 + _deep(50000).decode() + "}\n", "")
    assert _parse("gpu01", deep, WANT).failed == 1
    escape = subprocess.CompletedProcess([], 255, "", ESCAPES)
    assert not any(c in _parse("gpu01", escape, WANT).line() for c in CONTROL)


# ---------------------------------------------------------------- connections


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _idle(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


def _slowloris(port: int, count: int) -> list[socket.socket]:
    conns = _idle(port, count)
    for conn in conns:
        conn.sendall(b"GET /current.signed HTTP/1.1\r\nHost: x\r\n")  # never the blank line
    return conns


def _dripping_put(port: int, count: int) -> list[socket.socket]:
    conns = _idle(port, count)
    for conn in conns:
        conn.sendall(b"PUT /results/localhost HTTP/1.1\r\nContent-Length: 60000\r\n\r\n{")
    return conns


@dataclass
class FloodCase:
    id: str
    attack: object  # (port) -> open sockets held during the legitimate requests
    paths: tuple[tuple[str, int], ...] = (("/current.signed", 200), (f"/{WANT}.tar.gz", 200))


FLOODS = [
    FloodCase("idle-connections-over-the-cap", lambda port: _idle(port, 300)),
    FloodCase("slowloris-headers", lambda port: _slowloris(port, 100)),
    FloodCase("dripping-result-bodies", lambda port: _dripping_put(port, 100)),
    FloodCase("no-directory-listing-nor-other-files", lambda port: [], (
        ("/", 404), ("/results/", 404), ("/results/localhost.json", 404), ("/../../etc/passwd", 404),
        ("/%2e%2e/etc/passwd", 404), (f"/{WANT}.tar.gz/", 404), (f"/.part-{WANT}", 404), ("/current.signed?x", 404),
        (f"/{'0' * 64}.tar.gz", 404), ("/README", 404))),
]


@pytest.mark.parametrize("case", FLOODS, ids=lambda c: c.id)
def test_a_connection_flood_does_not_keep_a_node_out(case, node, keys, tmp_path, capsys):
    with _server(node, tmp_path, workers=4, max_connections=64, timeout=1.0) as srv:
        (srv.published / node.POINTER).write_bytes(_sign_pointer(keys.cluster, tmp_path / "sign"))
        (srv.published / f"{WANT}.tar.gz").write_bytes(b"bundle bytes")
        (srv.published / "README").write_text("not a published name")
        held = case.attack(srv.port)
        try:
            for path, status in case.paths:
                started = time.monotonic()
                got, _body = _get(srv.url + path)
                assert got == status and time.monotonic() - started < 3.0, (path, got)
            result = _signed_result(node, keys.localhost_host, _result())
            assert _put(srv.url, "localhost", result) == 204, "a node's result still goes in under the flood"
            if case.id != "idle-connections-over-the-cap" and held:
                time.sleep(2.0)  # the server closes a request that has not arrived whole within its timeout
                assert srv.httpd.stats["timed_out"] >= len(held) // 2, srv.httpd.stats
        finally:
            for conn in held:
                conn.close()
    _no_traceback(capsys)


def test_the_server_binds_only_the_address_it_is_given(node, tmp_path):
    with _server(node, tmp_path) as srv:
        assert srv.httpd.server_address[0] == "127.0.0.1"
    with pytest.raises(ValueError, match="--bind"):
        node.make_server(0, str(tmp_path), str(tmp_path), "")


# ---------------------------------------------------------------- inventory secrets in the bundle


SECRETS = [
    ("group_vars/all.yml", "ansible_become_password: !unsafe 'hunter2hunter2'\n", "ansible_become_password"),
    ("group_vars/all.yml", "ansible_password: pw\n", "ansible_password"),
    ("group_vars/slurm_compute.yml", "ansible_ssh_pass: pw\n", "ansible_ssh_pass"),
    ("host_vars/gpu01.yml", "ansible_sudo_pass: pw\n", "ansible_sudo_pass"),
    ("host_vars/gpu01.yml", "ansible_become_pass: pw\n", "ansible_become_pass"),
    ("group_vars/all.yml", "x: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n", "vault-encrypted"),
    ("group_vars/all/vault.yml", "$ANSIBLE_VAULT;1.1;AES256\n61626364\n", "vault-encrypted"),
    ("group_vars/all.yml", "key: |\n  -----BEGIN OPENSSH PRIVATE KEY-----\n  b3Bl\n", "private key"),
    ("hosts.yml", "all:\n  hosts:\n    gpu01: {ansible_host: 10.0.0.1, ansible_password: pw}\n", "ansible_password"),
    ("group_vars/all.ini", "[all:vars]\nansible_become_password=pw\n", "ansible_become_password"),
]


@pytest.mark.parametrize(("path", "text", "says"), SECRETS, ids=[f"{s[0]}-{s[2]}" for s in SECRETS])
def test_a_connection_secret_in_the_inventory_refuses_the_bundle(path, text, says, tmp_path):
    from gpucluster.configure.bundle import refuse_connection_secrets
    from gpucluster.errors import UsageError

    files = {"inventory/hosts.yml": b"all:\n  vars: {gpucluster_cluster: c1}\n", f"inventory/{path}": text.encode()}
    with pytest.raises(UsageError) as err:
        refuse_connection_secrets(files, tmp_path / "inv")
    message = str(err.value)
    assert f"{tmp_path / 'inv' / path}:" in message and says in message and "ANSIBLE_BECOME_PASSWORD_FILE" in message
    assert "pw\n" not in message and "hunter2" not in message, "the message names the secret, never its value"


def test_an_inventory_without_connection_secrets_passes(tmp_path):
    from gpucluster.configure.bundle import refuse_connection_secrets

    refuse_connection_secrets({"inventory/hosts.yml": b"all:\n  vars: {ansible_user: root, "
                                                      b"ansible_ssh_private_key_file: /home/op/.ssh/id}\n",
                               "inventory/group_vars/all.yml": b"# passwords live elsewhere\nslurm_x: 1\n"},
                              tmp_path)
