"""The circuit breaker as the controller sees it: each compute group's latch and tokens, read from slurmctld's
reservations and licenses (node/breaker.py takes and opens them), for `gpucluster health status`; and what
`gpucluster health reset-breaker` deletes. Pure functions over scontrol's output; remote.py runs the commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.node.breaker import LATCH_PREFIX, TOKEN_PREFIX, latch_of, latch_why
from gpucluster.node.slurmctl import licenses_of, parse_reservations
from gpucluster.slurmtext import printable

RESERVATIONS = ["scontrol", "show", "reservation", "-o"]
LICENSES = ["scontrol", "show", "license", "-o"]


@dataclass
class GroupBreaker:
    group: str
    tokens: int  # the window's budget: the license gpc_drain_<group>'s count
    used: list[str] = field(default_factory=list)  # the token reservations held now (gpc_drain_<node>)
    latch: str = ""  # the open latch's reservation name; "" when closed
    since: str = ""
    why: str = ""

    @property
    def open(self) -> bool:
        return bool(self.latch)

    def as_json(self) -> dict:
        return {"group": self.group, "state": "open" if self.open else "closed", "since": self.since,
                "why": self.why, "latch": self.latch, "tokens_used": len(self.used), "tokens": self.tokens,
                "token_reservations": self.used}


def license_totals(text: str) -> dict[str, int]:
    """`scontrol show license -o` -> {license: Total}."""
    out = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "LicenseName" in fields and fields.get("Total", "").isdigit():
            out[fields["LicenseName"]] = int(fields["Total"])
    return out


def breakers(reservations_text: str, licenses_text: str) -> list[GroupBreaker]:
    """One row per group that slurm.conf gives a token license (gpc_drain_<group>), by group name."""
    reservations = parse_reservations(reservations_text)
    rows = []
    for license, total in sorted(license_totals(licenses_text).items()):
        if not license.startswith(TOKEN_PREFIX):
            continue
        group = license[len(TOKEN_PREFIX):]
        used = sorted(r["ReservationName"] for r in reservations if license in licenses_of(r))
        row = GroupBreaker(group, total, used)
        latch = latch_of(reservations, group)
        if latch is not None:
            row.latch, row.since = latch["ReservationName"], latch.get("StartTime", "")
            row.why = printable(latch_why(latch, group))
        rows.append(row)
    return rows


def reset_commands(reservations_text: str, group: str | None = None) -> list[list[str]]:
    """`scontrol delete reservation NAME` for each latch and token of `group` (None: every group): the breaker
    closes and its window starts over (tokens left would open it again at the next drain)."""
    names = []
    for r in parse_reservations(reservations_text):
        for license in licenses_of(r):
            for prefix in (LATCH_PREFIX, TOKEN_PREFIX):
                if license.startswith(prefix) and (group is None or license == f"{prefix}{group}"):
                    names.append(r["ReservationName"])
    return [["scontrol", "delete", "reservation", name] for name in dict.fromkeys(names)]


def format_breakers(rows: list[GroupBreaker]) -> str:
    lines = ["circuit breaker:"] if rows else []
    for r in rows:
        tokens = f"drain tokens {len(r.used)} of {r.tokens} used in this window"
        if r.open:
            lines.append(f"  {r.group}: OPEN since {r.since or '?'}: {r.why} ({tokens}; "
                         f"gpucluster health reset-breaker INVENTORY --group {r.group})")
        else:
            lines.append(f"  {r.group}: closed ({tokens})")
    return "".join(f"{line}\n" for line in lines)
