"""A streaming, forgiving reader of `ibnetdiscover` topology output (infiniband-diags / rdma-core).

The format, as ibnetdiscover prints it (out_switch, out_ca, out_switch_port, out_ca_port):

    #                                            comments; also "# Chassis CAs" headings with -g
    vendid=0x2c9                                 a node block starts; blank lines separate blocks
    devid=0xd2f2
    sysimgguid=0x...                             [\\t\\t# Chassis N (...)] with -g
    switchguid=0x<node guid>(<port guid>)        or caguid=0x.. / rtguid=0x..
    Switch  64 "S-<16 hex>"  # "<desc>" enhanced port 0 lid 1 lmc 0
    [1]  "H-<16 hex>"[1](<port guid>)   # "<peer desc>" lid 5 4xNDR      a switch port and its peer
    Ca  1 "H-<16 hex>"  # "<desc>"
    [1](<port guid>)  "S-<16 hex>"[7]   # lid 5 lmc 0 "<peer desc>" lid 1 4xNDR
    Rt  2 "R-<16 hex>"  # "<desc>"                                         routers print like CAs

Variants read too: [ext N] external port numbers and "Chassis"/"Non-Chassis Nodes"/"Hostname:" lines
(-g), " s=.. w=.. v=.. e=.." after the rate (-f/--full), ports without descriptions (""), and dumps from
before port GUIDs were printed. Every link is printed from both ends; each end is kept once.

A line it does not understand becomes a finding with its line number; only a file in which no node
block can be found at all is refused (UsageError, exit 2). Memory is linear in the nodes and ports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpucluster.asbuilt.findings import Finding
from gpucluster.asbuilt.graph import AGGREGATION, HCA, NO_PEER, PORT_SPAN, ROUTER, SWITCH, Fabric
from gpucluster.asbuilt.names import is_aggregation
from gpucluster.errors import UsageError

_NODE = re.compile(r'(Switch|Ca|Rt)\s+(\d+)\s+"([SHR?])-([0-9A-Fa-f]+)"\s*(?:#\s*(.*))?$')
_PORT = re.compile(r'\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9A-Fa-f]+)\))?\s*'
                   r'"([SHR?])-([0-9A-Fa-f]+)"\[(\d+)\](?:\[ext \d+\])?\s*(?:\(([0-9A-Fa-f]+)\))?\s*'
                   r'(?:#\s*(.*))?$')
_IDS = (b"vendid=", b"devid=", b"sysimgguid=", b"switchguid=", b"caguid=", b"rtguid=")
_OTHER = ("Chassis ", "Non-Chassis Nodes", "Hostname:")
_KINDS = {ord("S"): SWITCH, ord("H"): HCA, ord("R"): ROUTER}
_HEADER_KINDS = {"Switch": SWITCH, "Ca": HCA, "Rt": ROUTER}
_HEADER_WORDS = {b"Switch": SWITCH, b"Ca": HCA, b"Rt": ROUTER}
_PORTS = {str(i).encode(): i for i in range(PORT_SPAN)}  # int() of bytes costs 1.5x a dict lookup
MAX_LINE_FINDINGS = 50  # unparsed lines kept one by one; the rest are counted
CHUNK = 4 << 20


def _key(letter: str, guid: str) -> bytes:
    """A node's key: its quoted name as ibnetdiscover prints it: "S-", "H-" or "R-" and 16 lower-case
    hex digits (node_name() in ibnetdiscover.c). The fast path takes the quoted name as printed."""
    return f"{letter.upper()}-{guid.lower().zfill(16)}".encode()


def _quoted(text: str) -> str | None:
    """The description in `"desc" ...`; None when the text has no quoted part."""
    start = text.find('"')
    end = text.rfind('"')
    if start < 0 or end <= start:
        return None
    return text[start + 1:end]


def _switch_header_desc(comment: str) -> str | None:
    """`"desc" enhanced port 0 lid 1 lmc 0`: the description may itself hold quotes, so cut at the
    last quote before the SMA tail."""
    for tail in ('" enhanced port', '" base port'):
        at = comment.rfind(tail)
        if at >= 0 and comment.startswith('"'):
            return comment[1:at]
    return _quoted(comment)


def _port_comment(comment: str | None) -> tuple[str | None, str]:
    """(peer description, rate) from a port line's comment:
    switch side `"desc" lid 5 4xNDR [s=.. w=..]`, CA side `lid 5 lmc 0 "desc" lid 1 4xNDR`."""
    if not comment:
        return None, ""
    head, sep, tail = comment.rpartition('" lid ')
    if not sep:
        return None, ""
    start = head.find('"')
    desc = head[start + 1:] if start >= 0 else None
    parts = tail.split(None, 2)
    return desc, parts[1] if len(parts) > 1 else ""


class _Reader:
    """The parse state (the current node block, the findings) and the slow paths: lines in any form
    the fast loop in `parse` does not take, read with the full patterns."""

    def __init__(self, source: str):
        self.fab = Fabric(source=source)
        self.cur = -1
        self.unparsed = 0

    def bad(self, line: str, n: int, why: str) -> None:
        self.unparsed += 1
        if self.unparsed <= MAX_LINE_FINDINGS:
            self.fab.findings.append(Finding(
                "unparsed-line", f"{why}: {line.strip()[:120]!r}",
                fix="check the line; run ibnetdiscover without -l/-p/-S/-H for a full topology",
                where=f"{self.fab.source}:{n}"))

    def open_node(self, word: str, nports: str, letter: str, guid: str, comment: str | None, n: int) -> None:
        kind = _HEADER_KINDS[word]
        if kind == SWITCH:
            desc = _switch_header_desc(comment) if comment else None
        else:
            desc = _quoted(comment) if comment else None
            if kind == HCA and is_aggregation(desc):
                kind = AGGREGATION
        self.cur = self.fab.node(_key(letter, guid), kind, desc, int(nports), n)
        node = self.fab.nodes[self.cur]
        if desc is not None:
            node.desc = desc
        node.kind = kind

    def port_line(self, line: str, n: int) -> None:
        m = _PORT.match(line.strip())
        if m is None:
            self.bad(line, n, "a port line the parser does not understand")
            return
        if self.cur < 0:
            self.bad(line, n, "a port line outside any node block")
            return
        port, _, letter, guid, peer_port, _, comment = m.groups()
        desc, rate = _port_comment(comment)
        fab = self.fab
        key = _key(letter, guid)
        peer = fab.node(key, _KINDS.get(key[0], HCA), desc or None)
        if int(peer_port) and int(port):  # the switch's management port 0 is no cable
            fab.connect(self.cur, int(port), peer, int(peer_port), fab.rate_code(rate) if rate else 0, n)
        if desc and fab.nodes[peer].desc is None:
            fab.nodes[peer].desc = desc

    def line(self, raw: bytes, n: int) -> None:
        text = raw.decode("utf-8", "replace").strip()
        if not text or text.startswith("#"):
            return
        if text.startswith("["):
            self.port_line(text, n)
        elif text.startswith(tuple(i.decode() for i in _IDS)):
            if text.startswith("vendid="):
                self.cur = -1  # a new block: its node line names it
        elif text.startswith(("Switch", "Ca", "Rt")):
            m = _NODE.match(text)
            if m is None:
                self.bad(text, n, "a node line the parser does not understand")
            else:
                self.open_node(*m.groups(), n)
        elif not text.startswith(_OTHER):
            self.bad(text, n, "not part of the ibnetdiscover format")


def _line_chunks(lines: Iterable[str | bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in lines:
        batch.append(line.encode("utf-8", "replace") if isinstance(line, str) else line)
        if len(batch) >= 4096:
            yield batch
            batch = []
    yield batch


def _file_chunks(fh, size: int = CHUNK) -> Iterator[list[bytes]]:
    """The file's lines in batches, split in C; a batch ends at a line end."""
    rest = b""
    while True:
        block = fh.read(size)
        if not block:
            if rest:
                yield [rest]
            return
        block = rest + block
        cut = block.rfind(b"\n") + 1
        rest = block[cut:]
        if cut:
            yield block[:cut - 1].split(b"\n")


def parse(dump: str | bytes | Iterable[str | bytes], source: str = "<dump>") -> Fabric:
    """Read ibnetdiscover output (the whole text, or its lines) into a Fabric, findings included."""
    if isinstance(dump, str):
        dump = dump.encode("utf-8", "replace")
    if isinstance(dump, bytes):
        return _parse([dump.split(b"\n")], source)
    return _parse(_line_chunks(dump), source)


def _parse(batches: Iterable[list[bytes]], source: str) -> Fabric:
    """The loop is the cost of a 200,000-link dump (~1.2 million port lines), and ibnetdiscover prints
    every link from both ends (switches first, then CAs). So it works on bytes, reads only the port
    number of a port line whose link the other end already recorded, and takes the rest of a port or
    node line apart with one split on its quotes; anything unusual goes to `_Reader.line`, with the
    full patterns. A second sighting is not compared with the first: a dump that contradicts itself
    is caught where a first sighting finds the peer's port already taken."""
    r = _Reader(source)
    fab = r.fab
    bad, slow = r.bad, r.line
    by_key, nodes, node_at = fab.by_key, fab.nodes, fab.node
    kinds, words, span, port_of = _KINDS, _HEADER_WORDS, PORT_SPAN, _PORTS.get
    rate_of: dict[bytes, int] = {}
    cur, cur_node, cur_peers = -1, None, None
    n = 0
    for batch in batches:
        for line in batch:
            n += 1
            c = line[:1]
            if c != b"[":
                if not c or c == b"\r":
                    continue
                if c in b"vdscr" and line.startswith(_IDS):
                    if c == b"v":
                        cur = -1  # a new block: its node line names it
                    continue
                parts = line.split(b'"')
                kind = words.get(line[:line.find(b"\t")]) if c in b"SCR" else None
                if kind is None or len(parts) != 5 or len(parts[1]) != 18 or parts[2][-2:] != b"# ":
                    r.cur = cur
                    slow(line, n)
                else:  # Switch\t64 "S-guid"\t\t# "desc" enhanced port 0 lid 1 lmc 0, or Ca\t1 "H-guid"\t\t# "desc"
                    raw = parts[3]
                    desc = raw.decode("utf-8", "replace")
                    if kind == HCA and b"ggregation" in raw and is_aggregation(desc):
                        kind = AGGREGATION
                    nports = port_of(parts[0][parts[0].find(b"\t") + 1:])
                    if nports is None:
                        r.cur = cur
                        slow(line, n)
                    else:
                        key = parts[1]
                        i = by_key.get(key)
                        if i is None:
                            i = node_at(key, kind, desc, nports, n)
                        node = nodes[i]
                        if nports >= len(node.peers):
                            node.grow(nports)
                        node.nports = max(node.nports, nports)
                        node.line = node.line or n
                        node.desc, node.kind = desc, kind
                        r.cur = i
                cur = r.cur
                if cur >= 0:
                    cur_node = nodes[cur]
                    cur_peers = cur_node.peers
                continue
            if cur < 0:
                bad(line.decode("utf-8", "replace"), n, "a port line outside any node block")
                continue
            port = port_of(line[1:line.find(b"]")], -1)
            if 0 < port < len(cur_peers) and cur_peers[port] != NO_PEER:
                continue  # seen from the other end already
            parts = line.split(b'"')
            if port <= 0 or len(parts) != 5 or parts[2][:1] != b"[" or len(parts[1]) != 18:
                r.cur = cur
                slow(line, n)
                cur_peers = cur_node.peers
                continue
            mid = parts[2]
            peer_port = port_of(mid[1:mid.find(b"]")])
            if peer_port is None:
                r.cur = cur
                slow(line, n)
                cur_peers = cur_node.peers
                continue
            key = parts[1]
            peer = by_key.get(key)
            if peer is None:
                peer = node_at(key, kinds.get(key[0], HCA), parts[3].decode("utf-8", "replace") or None)
            pn = nodes[peer]
            if peer_port >= len(pn.peers):
                pn.grow(peer_port)
            if port >= len(cur_peers):
                cur_node.grow(port)
                cur_peers = cur_node.peers
            here = cur * span + port
            if pn.peers[peer_port] not in (NO_PEER, here):
                fab.connect(cur, port, peer, peer_port, 0, n)  # records the contradiction
                continue
            tail = parts[4].split(None, 3)
            rate = tail[2] if len(tail) > 2 and tail[0] == b"lid" else b""
            code = rate_of.get(rate)
            if code is None:
                code = rate_of[rate] = fab.rate_code(rate.decode("utf-8", "replace"))
            cur_peers[port] = peer * span + peer_port
            pn.peers[peer_port] = here
            cur_node.rates[port] = code
            pn.rates[peer_port] = code
            if pn.desc is None and parts[3]:
                pn.desc = parts[3].decode("utf-8", "replace")
    return _finish(r)


def _finish(r: _Reader) -> Fabric:
    fab = r.fab
    for node in fab.nodes:  # peers seen only from the other end still get their kind right
        if node.kind == HCA and is_aggregation(node.desc):
            node.kind = AGGREGATION
    if r.unparsed > MAX_LINE_FINDINGS:
        fab.findings.append(Finding("unparsed-line", f"{r.unparsed - MAX_LINE_FINDINGS} more lines not understood",
                                    where=fab.source))
    return fab


def read(path: str | Path) -> Fabric:
    """Parse a dump file. A file with no node block at all is not an ibnetdiscover topology: exit 2."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            fab = _parse(_file_chunks(fh), str(p))
    except OSError as exc:
        raise UsageError(f"{p}: cannot read ({exc.strerror or exc}); give the file `ibnetdiscover > FILE` wrote") \
            from None
    if not any(node.line for node in fab.nodes):
        first = next((f for f in fab.findings if f.kind == "unparsed-line" and ":" in f.where), None)
        where = first.where if first else f"{p}:1"
        raise UsageError(f"{where}: no node block (Switch/Ca lines) found, so this is not `ibnetdiscover` "
                         "topology output; run `ibnetdiscover > FILE` (no -l, -p, -S or -H) and pass that file")
    return fab
