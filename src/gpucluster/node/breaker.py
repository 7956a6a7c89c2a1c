"""The circuit breaker: how many nodes of a group the health checks may drain, decided in slurmctld.

A check that fails on many nodes at once (a slow metadata server failing every mount check) is a shared
cause, not many broken nodes: draining them all would take the group out of service. So before an automatic
drain of a node that is not drained yet, the runner asks `admit()`, and the answer lives in slurmctld, where
every node sees it, a restart keeps it, and taking it is atomic:

- a **token** per drain: a reservation `gpc_drain_<node>` of one license `gpc_drain_<group>` (slurm.conf gives
  the group's budget as that license's count), lasting the window. slurmctld refuses a reservation once the
  license is all reserved ("Invalid license specification"), under its own lock: many nodes asking at once
  never get more tokens than the count. A node that already holds its token of the window (drained, resumed,
  failing again) drains again without a second one: the budget counts nodes;
- the **latch**: a reservation of the license `gpc_breaker_<group>` (count 1, so one per group), named
  `gpc_breaker_<group>.<limit>.<cause>` and, where the line has Comment=, with the whole reason. The runner opens it
  when the budget is spent or `out_of_service` nodes of the group are drained, down or failed already; while
  it exists, no automatic drain in the group. It lasts until an operator deletes it
  (`gpucluster health reset-breaker`), Duration=UNLIMITED (slurmctld keeps it 365 days).

The controller's NVLink domain guard (domainguard.py) asks `admit_many()` before it drains a degraded domain's
healthy trays: held while the latch is open or when they would pass the out-of-service limit, all or nothing.

Anything the breaker cannot read holds the drain (the next run asks again): a breaker that cannot be asked
must not let the whole fleet drain. Standard library only, like every file beside it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

try:
    from . import decide, slurmctl
except ImportError:  # run as a script on a node: the files sit side by side
    import decide
    import slurmctl

TOKEN_PREFIX = "gpc_drain_"  # a token: reservation gpc_drain_<node>, of the license gpc_drain_<group>
LATCH_PREFIX = "gpc_breaker_"  # the latch: reservation gpc_breaker_<group>.<limit>.<cause>, license gpc_breaker_<group>
OUT_OF_SERVICE = frozenset(("DOWN", "DRAIN", "FAIL"))  # Slurm state words (IDLE+DRAIN, DOWN+NOT_RESPONDING, ...)
# slurmctld's answers to `scontrol create reservation` (22.05, 24.11 and 26.05 word them the same)
SPENT = "Invalid license specification"  # the license is all reserved (or unknown: license_total tells which)
TAKEN = "Duplicate reservation name"
MAX_COMMENT = 200


@dataclass(frozen=True)
class Settings:
    """The config's `breaker` section (render/health/breakerconf.py writes it)."""

    group: str
    nodes: str  # the group's hostlist, as slurm.conf names its nodes
    size: int
    drains: int  # tokens per window (the license's count; kept here for messages)
    out_of_service: int  # nodes out of service at which the breaker opens
    window_minutes: int

    @property
    def token_license(self) -> str:
        return f"{TOKEN_PREFIX}{self.group}"

    @property
    def latch_license(self) -> str:
        return f"{LATCH_PREFIX}{self.group}"


def settings(config: dict) -> Settings | None:
    """None when the config has no breaker or it is off (health.breaker.enabled false)."""
    raw = config.get("breaker")
    if not isinstance(raw, dict) or not raw.get("enabled", True):
        return None
    return Settings(group=str(raw["group"]), nodes=str(raw["nodes"]), size=int(raw["size"]),
                    drains=int(raw["drains"]), out_of_service=int(raw["out_of_service"]),
                    window_minutes=int(raw["window_minutes"]))


def token_name(node: str) -> str:
    return f"{TOKEN_PREFIX}{node}"


def out_of_service(state: str) -> bool:
    """Drained, draining, down or failed: a whole word of Slurm's BASE+FLAG state (POWERED_DOWN is not DOWN)."""
    return not OUT_OF_SERVICE.isdisjoint(str(state).upper().split("+"))


def slug(text: str, limit: int = 60) -> str:
    """What a reservation name may carry of a text: letters, digits, '-' and '_' ('.' parts the name)."""
    return re.sub(r"[^A-Za-z0-9-]+", "_", text).strip("_")[:limit] or "unknown"


def latch_of(reservations: list[dict[str, str]], group: str) -> dict[str, str] | None:
    """The group's open latch: the reservation holding its license gpc_breaker_<group> (whatever its name)."""
    license = f"{LATCH_PREFIX}{group}"
    return next((r for r in reservations if license in slurmctl.licenses_of(r)), None)


def latch_why(latch: dict[str, str], group: str) -> str:
    """The latch's reason: its Comment, else (22.05 has no Comment) the cause its name carries."""
    if latch.get("Comment"):
        return latch["Comment"]
    name = latch.get("ReservationName", "")
    head = f"{LATCH_PREFIX}{group}."
    return name[len(head):].replace(".", "; ").replace("_", " ") if name.startswith(head) else name


def shared_cause(nodes: dict[str, dict[str, str]], check: str, node: str) -> tuple[str, int]:
    """The check failing on most of the group's nodes: the group's gpc: drains by check, plus this node's
    failing `check`; a tie goes to `check`. ('mount-flash', 12) is 'mount-flash on 12 nodes'."""
    counts = Counter(decide.check_of(info.get("reason", "")) for name, info in nodes.items()
                     if name != node and decide.is_drained(info.get("State", "")))
    counts.pop(None, None)
    counts[check] += 1
    best = min(counts.items(), key=lambda kv: (-kv[1], kv[0] != check, str(kv[0])))
    return str(best[0]), best[1]


def admit(ctl: slurmctl.Session, config: dict, node: str, check: str) -> tuple[bool, str]:
    """Whether this run may drain `node` (not drained yet) for `check`: (True, why) with a token taken, or
    (False, why) held, nothing changed on the node; the why goes to the run's summary. Makes one scontrol
    call while the breaker is open, three when a token is taken, up to six when it opens; all within the session's
    deadline."""
    s = settings(config)
    if s is None:
        return True, "no circuit breaker configured"
    group, held = closed_group(ctl, s)
    if group is None:
        return False, held
    cause = shared_cause(group, check, node)
    out = sum(1 for name, info in group.items() if name != node and out_of_service(info.get("State", "")))
    if out >= s.out_of_service:
        return False, trip(ctl, s, f"{out} of {s.size} nodes out of service (limit {s.out_of_service})",
                           f"{out} of {s.size} out of service", cause)
    rc, text = ctl.reserve(token_name(node), s.token_license, str(s.window_minutes))
    if rc == 0:
        return True, f"drain token {token_name(node)} taken (of {s.drains} per {s.window_minutes} min)"
    if TAKEN in text:
        return True, f"this node's drain token of the window ({token_name(node)}) is still held"
    if SPENT not in text:
        return False, f"held by the breaker: no drain token ({text}); the next run asks again"
    total, _ = ctl.license_total(s.token_license)
    if total is None:
        return False, f"held by the breaker: slurm.conf has no license {s.token_license} (Licenses=)"
    return False, trip(ctl, s, f"drain budget spent ({total} drains in {s.window_minutes} min)",
                       f"{total} drains in {s.window_minutes} min", cause)


def closed_group(ctl: slurmctl.Session, s: Settings) -> tuple[dict | None, str]:
    """The group's nodes as Slurm shows them while the breaker is closed; (None, why the action is held) while it is
    open or its state or the nodes cannot be read."""
    reservations, why_not = ctl.reservations()
    if reservations is None:
        return None, f"held by the breaker: its state could not be read ({why_not}); the next run asks again"
    latch = latch_of(reservations, s.group)
    if latch is not None:
        return None, f"held by the breaker: open since {latch.get('StartTime', '?')}: {latch_why(latch, s.group)}"
    group, why_not = ctl.show_nodes(s.nodes)
    if group is None:
        return None, f"held by the breaker: the group's nodes could not be read ({why_not})"
    return group, ""


def admit_many(ctl: slurmctl.Session, s: Settings, nodes: list[str]) -> tuple[bool, str]:
    """Whether one action may drain all of `nodes` (in service) at once: the domain guard's drain of an NVLink
    domain's healthy trays (domainguard.py). Held while the group's latch is open, or when the group's nodes out
    of service now plus these would pass `out_of_service`; all or nothing. It takes no drain token and never
    opens the latch: the tokens count suspect nodes per window (a shared cause among failing checks), and these
    nodes failed nothing; holding leaves the domain as the node runs left it, which needs no person."""
    group, held = closed_group(ctl, s)
    if group is None:
        return False, held
    out = sum(1 for name, info in group.items() if name not in nodes and out_of_service(info.get("State", "")))
    if out + len(nodes) > s.out_of_service:
        return False, (f"held by the breaker: draining {len(nodes)} more would put {out + len(nodes)} of {s.size} "
                       f"nodes out of service (limit {s.out_of_service})")
    return True, f"within the breaker's limit: {out + len(nodes)} of {s.size} out of service (limit {s.out_of_service})"


def trip(ctl: slurmctl.Session, s: Settings, what: str, short: str, cause: tuple[str, int]) -> str:
    """Open the group's latch (once: its license has a count of 1); the why for the summary. The name carries
    `short` and the cause (`gpc_breaker_gpu.25_drains_in_60_min.mount-flash_on_26_nodes`: 22.05 has no
    Comment), the Comment all of it."""
    check, count = cause
    why = decide.clean(f"{what}; shared cause: {check} on {count} nodes")[:MAX_COMMENT]
    name = f"{LATCH_PREFIX}{s.group}.{slug(short, 40)}.{slug(f'{check} on {count} nodes')}"
    rc, text = ctl.reserve(name, s.latch_license, "UNLIMITED", comment=why)
    if rc == 0:
        return f"held by the breaker: opened it ({name}): {why}"
    if SPENT in text:  # another node opened it first
        return f"held by the breaker: open ({why}; another node opened it first)"
    return f"held by the breaker: {why}; the latch could not be set ({text})"
