"""What discover and verify report: one finding per fault, with what to do about it.

A finding is not an error of the program: `verify` exits 1 when it has any (the fabric differs from the
plan), and the findings are the answer. Input it cannot read at all is a UsageError (exit 2) instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Kinds, in the order a report lists them. docs/fabric.md has an example of each.
KINDS = (
    "missing-link",          # a planned cable not seen
    "extra-link",            # seen, not planned
    "miscabled",             # both ends exist, but land on the wrong port or switch
    "wrong-rail",            # a node's NIC on rail r reaches the leaf of another rail
    "degraded-bundle",       # a switch-to-switch bundle with fewer links than planned (or than its peers)
    "wrong-speed",           # a link up at a lower width or speed than planned (4xHDR where NDR was planned)
    "unidentified-endpoint",  # an HCA without a usable node description (none, localhost, ubuntu, model string)
    "unknown-switch",        # a switch not in the plan
    "unparsed-line",         # a line of the dump the parser did not understand
    "dump-conflict",         # the dump contradicts itself (one port, two peers)
)


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    fix: str = ""
    where: str = ""  # file:line for input problems
    detail: dict = field(default_factory=dict, compare=False)

    def render(self) -> str:
        head = f"{self.where}: " if self.where else ""
        tail = f"; {self.fix}" if self.fix else ""
        return f"{head}{self.kind}: {self.message}{tail}"

    def as_dict(self) -> dict:
        out = {"kind": self.kind, "message": self.message}
        if self.fix:
            out["fix"] = self.fix
        if self.where:
            out["where"] = self.where
        if self.detail:
            out["detail"] = self.detail
        return out


def by_kind(findings: list[Finding]) -> dict[str, int]:
    """{kind: count} in report order, kinds with no finding left out."""
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    order = {k: i for i, k in enumerate(KINDS)}
    return dict(sorted(counts.items(), key=lambda kv: order.get(kv[0], len(order))))


def ordered(findings: list[Finding]) -> list[Finding]:
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(findings, key=lambda f: order.get(f.kind, len(order)))
