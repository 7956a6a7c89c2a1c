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
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from gpucluster.errors import UsageError
from gpucluster.fabric.asbuilt.findings import Finding
from gpucluster.fabric.asbuilt.graph import AGGREGATION, HCA, NO_PEER, PORT_SPAN, ROUTER, SWITCH, Fabric
from gpucluster.fabric.asbuilt.names import is_aggregation

_NODE = re.compile(r'(Switch|Ca|Rt)\s+(\d+)\s+"([SHR?])-([0-9A-Fa-f]+)"\s*(?:#\s*(.*))?$')
_PORT = re.compile(r'\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9A-Fa-f]+)\))?\s*'
                   r'"([SHR?])-([0-9A-Fa-f]+)"\[(\d+)\](?:\[ext \d+\])?\s*(?:\(([0-9A-Fa-f]+)\))?\s*'
                   r'(?:#\s*(.*))?$')
_IDS = (b"vendid=", b"devid=", b"sysimgguid=", b"switchguid=", b"caguid=", b"rtguid=")
_OTHER = ("Chassis ", "Non-Chassis Nodes", "Hostname:")
_KINDS = {ord("S"): SWITCH, ord("H"): HCA, ord("R"): ROUTER}
_HEADER_KINDS = {"Switch": SWITCH, "Ca": HCA, "Rt": ROUTER}
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
    the fast path (`_Scan`) does not take, read with the full patterns."""

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


# The dump as ibnetdiscover prints it, a block or a line per match, tried in order (re's scanner walks
# the text match by match, in C; Python sees one match per switch port line and one per CA block):
#   1. a switch's port line          [p]\t"S-guid"[q][(guid) ]\t\t# "desc" lid N 4xNDR[...]
#   2. a whole CA block              vendid= devid= [sysimgguid=] caguid= Ca\tN "H-guid"\t\t# "desc", its ports
#   3. a whole switch block          vendid= devid= [sysimgguid=] switchguid= Switch\tN "S-guid"\t\t# "desc" ...,
#                                    its port lines taken apart by one findall (in C, again)
#   4. blank lines (also taken after 1 and 2, saving a match each)
#   5. any other line: read alone, with the full patterns (_Reader.line)
_SCAN = re.compile(
    rb'\[(\d+)\]\t"([SHR]-[0-9a-f]{16})"\[(\d+)\](?:\([0-9a-f]+\) )?\t\t# "([^"\n]*)" lid \d+ (\S+)[^\n]*\n\n*'
    rb'|vendid=0x[0-9a-f]+\ndevid=0x[0-9a-f]+\n(?:sysimgguid=0x[0-9a-f]+\n)?caguid=0x[0-9a-f]+\n'
    rb'Ca\t(\d+) "(H-[0-9a-f]{16})"\t\t# "([^"\n]*)"\n((?:\[\d+\]\([0-9a-f]+\) \t"[SHR]-[0-9a-f]{16}"\[\d+\]'
    rb'\t\t# lid \d+ lmc \d+ "[^"\n]*" lid \d+ \S+[^\n]*\n)*)\n*'
    rb'|vendid=0x[0-9a-f]+\ndevid=0x[0-9a-f]+\n(?:sysimgguid=0x[0-9a-f]+\n)?switchguid=0x[0-9a-f]+\([0-9a-f]+\)\n'
    rb'Switch\t(\d+) "(S-[0-9a-f]{16})"\t\t# "([^"\n]*)" (?:enhanced|base) port 0 lid \d+ lmc \d+\n'
    rb'((?:\[\d+\]\t"[SHR]-[0-9a-f]{16}"\[\d+\](?:\([0-9a-f]+\) )?\t\t# "[^"\n]*" lid \d+ \S+[^\n]*\n)*)\n*'
    rb'|(\n+)'
    rb'|([^\n]*\n)')
_SW_PORT = re.compile(rb'\[(\d+)\]\t"([SHR]-[0-9a-f]{16})"\[(\d+)\](?:\([0-9a-f]+\) )?\t\t# "([^"\n]*)" lid \d+ (\S+)')
_CA_PORT = re.compile(rb'\[(\d+)\]\([0-9a-f]+\) \t"([SHR]-[0-9a-f]{16})"\[(\d+)\]\t\t# lid \d+ lmc \d+ '
                      rb'"([^"\n]*)" lid \d+ (\S+)')


def _file_chunks(fh, size: int = CHUNK) -> Iterator[bytes]:
    """The file in pieces that end after a blank line (a whole number of blocks), else at a line end."""
    rest = b""
    while True:
        block = fh.read(size)
        if not block:
            if rest:
                yield rest if rest.endswith(b"\n") else rest + b"\n"
            return
        block = rest + block
        cut = block.rfind(b"\n\n") + 2
        if cut < 2:
            cut = block.rfind(b"\n") + 1
        rest = block[cut:]
        if cut:
            yield block[:cut]


def _counted(chunks: Iterator[bytes], advance: Callable[[int], None]) -> Iterator[bytes]:
    done = told = 0
    for chunk in chunks:
        yield chunk
        done += len(chunk)
        if done >> 20 > told:
            advance((done >> 20) - told)
            told = done >> 20


def parse(dump: str | bytes | Iterable[str | bytes], source: str = "<dump>") -> Fabric:
    """Read ibnetdiscover output (the whole text, or its lines) into a Fabric, findings included."""
    if not isinstance(dump, str | bytes):
        dump = b"".join(line.encode("utf-8", "replace") if isinstance(line, str) else line for line in dump)
    if isinstance(dump, str):
        dump = dump.encode("utf-8", "replace")
    if dump and not dump.endswith(b"\n"):
        dump += b"\n"
    return _parse([dump], source)


def _parse(chunks: Iterable[bytes], source: str) -> Fabric:
    """The cost of a 200,000-link dump is its ~1.2 million port lines, each link printed from both ends
    (switches first, then CAs). So the text is walked by one pattern in C, a switch port line or a
    whole CA block per match; a port whose link the other end already recorded costs one comparison;
    anything unusual goes to `_Reader.line` with the full patterns. A second sighting is not compared
    with the first: a dump that contradicts itself is caught where a first sighting finds the peer's
    port already taken (Fabric.connect)."""
    r = _Reader(source)
    scan = _Scan(r)
    for chunk in chunks:
        scan.walk(chunk)
    return _finish(r)


class _Scan:
    """The fast path of `_parse`: the chunks walked by _SCAN, a match at a time, each link written into
    both ends' port arrays at its first sighting. Line numbers are counted only where one is needed: a
    node's first line, a finding."""

    def __init__(self, r: _Reader):
        self.r = r
        self.fab = r.fab
        self.nodes = r.fab.nodes
        self.by_key = r.fab.by_key
        self.rate_of: dict[bytes, int] = {}
        self.lines = 0  # lines before the chunk
        self.chunk = b""
        self.at = 0  # where the chunk's lines are counted up to
        self.line_at = 0  # lines before `at`

    def number(self, pos: int) -> int:
        """The line number of position `pos` in the chunk, counted on from the last one asked for."""
        self.line_at += self.chunk.count(b"\n", self.at, pos)
        self.at = pos
        return self.line_at + 1

    def walk(self, chunk: bytes) -> None:
        """One chunk: switch port lines and node blocks on the fast path, any other line on the slow one."""
        self.chunk, self.at, self.line_at = chunk, 0, self.lines
        r, nodes, number = self.r, self.nodes, self.number
        match = _SCAN.scanner(chunk).match
        m = match()
        cur_peers = nodes[r.cur].peers if r.cur >= 0 else None
        while m is not None:
            last = m.lastindex
            if last == 5:  # a switch port line
                port, peer_port = m.group(1, 3)
                port, peer_port = int(port), int(peer_port)
                if r.cur < 0:
                    r.bad(m.group(0).decode("utf-8", "replace"), number(m.start()),
                          "a port line outside any node block")
                elif port and peer_port and (port >= len(cur_peers) or cur_peers[port] == NO_PEER):
                    self.first_sight(r.cur, port, peer_port, *m.group(2, 4, 5), m.start())
                    cur_peers = nodes[r.cur].peers
            elif last == 9 or last == 8:  # a CA block, with its port lines
                cur_peers = self.ca_block(m)
            elif last == 13:  # a switch block, with its port lines
                cur_peers = self.switch_block(m)
            elif last == 15:  # any other line
                r.line(m.group(15), number(m.start()))
                cur_peers = nodes[r.cur].peers if r.cur >= 0 else None
            m = match()
        self.lines += chunk.count(b"\n")

    def ca_block(self, m: re.Match) -> array:
        """A whole CA block: the node, made the current one, and each of its links not recorded yet.
        Returns the node's port array."""
        nports, key, desc, ports = m.group(6, 7, 8, 9)
        i = self.by_key.get(key)
        if i is None:
            text = desc.decode("utf-8", "replace")
            i = self.fab.node(key, HCA, text, int(nports), self.number(m.start()))
        node = self.nodes[i]
        if node.line == 0 or node.kind == SWITCH or len(node.peers) <= int(nports):
            node.nports = max(node.nports, int(nports))
            node.grow(node.nports)
            node.line = node.line or self.number(m.start())
        node.kind = HCA  # an aggregation node is told apart by _finish, from its description
        node.desc = desc.decode("utf-8", "replace")
        self.r.cur = i
        cur_peers = node.peers
        if ports and not (ports.startswith(b"[1](") and cur_peers[1] != NO_PEER
                          and ports.count(b"\n") == 1):
            for pm in _CA_PORT.finditer(ports):
                port = int(pm.group(1))
                if port and (port >= len(cur_peers) or cur_peers[port] == NO_PEER):
                    self.first_sight(i, port, int(pm.group(3)), *pm.group(2, 4, 5), m.start(9) + pm.start())
                    cur_peers = node.peers
        return cur_peers

    def switch_block(self, m: re.Match) -> array:
        """A whole switch block: the node, made the current one, and each of its links not recorded yet
        (its port lines taken apart by one findall). Returns the node's port array."""
        nports, key, desc, ports = m.group(10, 11, 12, 13)
        n = self.number(m.start(10))
        i = self.by_key.get(key)
        if i is None:
            i = self.fab.node(key, SWITCH, None, int(nports), n)
        node = self.nodes[i]
        node.nports = max(node.nports, int(nports))
        node.grow(node.nports)
        node.line = node.line or n
        node.desc, node.kind = desc.decode("utf-8", "replace"), SWITCH
        self.r.cur = i
        cur_peers = node.peers
        if ports:
            at_ports = m.start(13)
            first_sight = self.first_sight
            for port, key, peer_port, desc, rate in _SW_PORT.findall(ports):
                port = int(port)
                if port < len(cur_peers) and cur_peers[port] != NO_PEER:
                    continue  # seen from the other end already
                peer_port = int(peer_port)
                if port and peer_port:
                    first_sight(i, port, peer_port, key, desc, rate, at_ports, ports)
                    cur_peers = node.peers
        return cur_peers

    def first_sight(self, cur: int, port: int, peer_port: int, key: bytes, desc: bytes, rate: bytes, pos: int,
                    lines: bytes | None = None) -> None:
        """A link not recorded yet: both ends at once (the other end's own line will find it set).
        `pos` is where the line starts in the chunk, or where `lines` (the block's port lines) do."""
        fab, nodes = self.fab, self.nodes
        peer = self.by_key.get(key)
        if peer is None:
            peer = fab.node(key, _KINDS.get(key[0], HCA), desc.decode("utf-8", "replace") or None, peer_port)
        pn, cn = nodes[peer], nodes[cur]
        if peer_port >= len(pn.peers):
            pn.grow(peer_port)
        if port >= len(cn.peers):
            cn.grow(port)
        here = cur * PORT_SPAN + port
        if pn.peers[peer_port] != NO_PEER and pn.peers[peer_port] != here:
            if lines is not None:
                pos += max(0, lines.find(b"[%d]" % port))
            fab.connect(cur, port, peer, peer_port, 0, self.number(pos))  # records the contradiction
            return
        code = self.rate_of.get(rate)
        if code is None:
            code = self.rate_of[rate] = fab.rate_code(rate.decode("utf-8", "replace"))
        cn.peers[port] = peer * PORT_SPAN + peer_port
        pn.peers[peer_port] = here
        cn.rates[port] = pn.rates[peer_port] = code
        if pn.desc is None and desc:
            pn.desc = desc.decode("utf-8", "replace")


def _finish(r: _Reader) -> Fabric:
    fab = r.fab
    for node in fab.nodes:  # SHARP aggregation nodes are Ca nodes that describe themselves so
        if node.kind == HCA and is_aggregation(node.desc):
            node.kind = AGGREGATION
    if r.unparsed > MAX_LINE_FINDINGS:
        fab.findings.append(Finding("unparsed-line", f"{r.unparsed - MAX_LINE_FINDINGS} more lines not understood",
                                    where=fab.source))
    return fab


def read(path: str | Path, advance: Callable[[int], None] | None = None) -> Fabric:
    """Parse a dump file. A file with no node block at all is not an ibnetdiscover topology: exit 2.
    `advance(n)` is told each whole MB read (the CLI's progress bar on a large dump)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            chunks = _file_chunks(fh) if advance is None else _counted(_file_chunks(fh), advance)
            fab = _parse(chunks, str(p))
    except OSError as exc:
        raise UsageError(f"{p}: cannot read ({exc.strerror or exc}); give the file `ibnetdiscover > FILE` wrote") \
            from None
    if not any(node.line for node in fab.nodes):
        first = next((f for f in fab.findings if f.kind == "unparsed-line" and ":" in f.where), None)
        where = first.where if first else f"{p}:1"
        raise UsageError(f"{where}: no node block (Switch/Ca lines) found, so this is not `ibnetdiscover` "
                         "topology output; run `ibnetdiscover > FILE` (no -l, -p, -S or -H) and pass that file")
    return fab
