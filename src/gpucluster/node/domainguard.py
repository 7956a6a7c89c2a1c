#!/usr/bin/python3
"""An NVLink domain (a GB200/GB300 NVL72 rack) degrades as a unit: the controller's guard, run by a timer.

A tray sees only itself, so the rack-level decision needs every tray's state side by side, which slurmctld has.
Each run reads the domains' trays from slurmctld (`scontrol show node -o <hostlist>`, one call per node group) and,
per domain:

- **degraded** when more than `out_of_service_pct` of its trays are out of service (drained, down or failed, by
  anyone; this guard's own drains do not count), or IMEX has lost its quorum there: half or more of the trays have
  no IMEX running (a tray DOWN or FAILED, whose host cannot run it, or one drained because its `nvlink-fabric`
  check found `nvidia-imex.service` not active);
- then the rest of the domain (the trays still in service) is drained, `gpc:domain:<domain> ...`: a drain, never a
  kill or a requeue, so running jobs keep running and no new job lands there; only within the circuit breaker's
  out-of-service limit of the group (breaker.admit_many);
- once it is no longer degraded, exactly the trays that carry this domain's reason are resumed, together, in one
  `scontrol update ... state=undrain`.

A tray drained by hand or for another `gpc:` reason is never touched. Slurm's reasons are free text and are only
compared with the prefix this guard writes. Standard library only, like every file beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

try:
    from . import breaker, decide, nodestate, slurmctl
except ImportError:  # run as a script on the controller: the files sit side by side
    import breaker
    import decide
    import nodestate
    import slurmctl

CHECK = nodestate.DOMAIN_REASON  # the reason's name: gpc:domain:<domain> ... (decide.check_of gives "domain")
DEFAULT_CONFIG = "/etc/gpucluster/health/domains.json"
IMEX_DOWN = "gpc:nvlink-fabric: nvidia-imex.service is "  # the check's message when IMEX is not active
DOWN_WORDS = frozenset(("DOWN", "FAIL"))  # no host: no IMEX there either
RUN_BUDGET_S = 50.0  # the whole run's scontrol calls end by then (the timer's unit allows 60 s)


@dataclass(frozen=True)
class Verdict:
    """One domain's decision: `action` is drain, resume or none; `nodes` the trays it changes, in tray order."""

    domain: str
    action: str
    nodes: tuple[str, ...]
    reason: str  # the reason a drain sets (gpc:domain:<domain> ...), "" otherwise
    why: str
    out: tuple[str, ...] = field(default=())  # the trays counted out of service


def prefix(domain: str) -> str:
    return f"{decide.PREFIX}{CHECK}:{domain} "


def ours(reason: str, domain: str) -> bool:
    """Whether a reason is this guard's for this domain (`gpc:domain:nvl0001 ...`); nothing else is ever resumed."""
    return str(reason).startswith(prefix(domain))


def words(state: str) -> set[str]:
    return set(str(state).upper().split("+"))


def out_of_service(info: Mapping[str, str] | None, domain: str) -> bool:
    """Drained, down or failed, by anyone but this guard for this domain (a tray it drained that went DOWN is out).
    A tray Slurm does not list (None) is out: no job can land there."""
    if info is None:
        return True
    state = info.get("State", "")
    if not words(state) & DOWN_WORDS and ours(info.get("reason", ""), domain):
        return False
    return breaker.out_of_service(state)


def no_imex(info: Mapping[str, str] | None) -> bool:
    """A tray where IMEX is not running: no host (down, failed, not listed), or drained for IMEX by its own check."""
    if info is None or words(info.get("State", "")) & DOWN_WORDS:
        return True
    return decide.is_drained(info.get("State", "")) and str(info.get("reason", "")).startswith(IMEX_DOWN)


def over_share(out: int, trays: int, pct: float) -> bool:
    """More than pct % of the trays: compared in whole numbers of hundredths, so 25 % of 18 is 4.5 and 5 is over."""
    return out * 100 > pct * trays


def imex_lost(without: int, trays: int) -> bool:
    """IMEX's quorum: more than half of the domain's trays with IMEX running; lost at half or more without it."""
    return trays > 0 and without * 2 >= trays


def decide_domain(domain: str, trays: list[str], nodes: Mapping[str, Mapping[str, str]], pct: float) -> Verdict:
    """The domain's verdict from Slurm's view of its trays (`nodes`: NodeName -> parse_node fields)."""
    out = tuple(t for t in trays if out_of_service(nodes.get(t), domain))
    without = sum(1 for t in trays if no_imex(nodes.get(t)))
    share = f"{len(out)} of {len(trays)} trays out of service"
    causes = []
    if over_share(len(out), len(trays), pct):
        causes.append(f"{share} (more than {pct:g}%)")
    if imex_lost(without, len(trays)):
        causes.append(f"IMEX quorum lost ({without} of {len(trays)} trays without IMEX)")
    if causes:
        serving = tuple(t for t in trays if t in nodes and not breaker.out_of_service(nodes[t].get("State", "")))
        reason = decide.clean(f"{prefix(domain)}{'; '.join(causes)}")[:decide.MAX_REASON]
        if not serving:
            return Verdict(domain, "none", (), "", f"degraded: {'; '.join(causes)}; no tray left in service", out)
        return Verdict(domain, "drain", serving, reason, f"degraded: {'; '.join(causes)}", out)
    back = tuple(t for t in trays if t in nodes and ours(nodes[t].get("reason", ""), domain)
                 and decide.is_drained(nodes[t].get("State", "")))
    why = f"healthy: {share} (at most {pct:g}%), IMEX quorum held"
    return Verdict(domain, "resume" if back else "none", back, "", why, out)


# ---------------------------------------------------------------- one run, in Slurm


def still(ctl: slurmctl.Session, v: Verdict, seen: Mapping[str, Mapping[str, str]]) -> tuple[list[str], str]:
    """The verdict's trays read again right before the change, kept only where Slurm's reason and drain flag are
    those the verdict was made on (an operator's drain in between wins); (trays, why not) when it cannot read."""
    now, why_not = ctl.show_nodes(",".join(v.nodes))
    if now is None:
        return [], f"not changed: cannot read the trays again: {why_not}"
    keep = [t for t in v.nodes if t in now and t in seen
            and (now[t].get("reason", ""), decide.is_drained(now[t].get("State", "")))
            == (seen[t].get("reason", ""), decide.is_drained(seen[t].get("State", "")))]
    return keep, ""


def apply(ctl: slurmctl.Session, v: Verdict, seen: Mapping[str, Mapping[str, str]], settings) -> dict:
    """The verdict in Slurm: a drain within the breaker's limit, or a resume of exactly this domain's trays. One
    `scontrol update` for all of them, so they leave or come back together."""
    out: dict = {"domain": v.domain, "action": v.action, "why": v.why, "nodes": list(v.nodes)}
    if v.action == "none":
        return out
    if v.action == "drain" and settings is not None:
        ok, why = breaker.admit_many(ctl, settings, list(v.nodes))
        out["breaker"] = why
        if not ok:
            out.update(action="held", applied=False)
            return out
    keep, why_not = still(ctl, v, seen)
    if not keep:
        out.update(applied=why_not or "not changed: every tray changed since this run read it")
        return out
    change = ["state=drain", f"reason={v.reason}"] if v.action == "drain" else ["state=undrain"]
    rc, text = ctl.call(["update", f"nodename={','.join(keep)}", *change])
    out.update(nodes=keep, applied=True if rc == 0 else f"scontrol update failed: {text}")
    if v.action == "drain":
        out["reason"] = v.reason
    return out


def run(config: dict, ctl: slurmctl.Session) -> list[dict]:
    """Every domain of the config: read each group's trays at once, decide, apply. What happened, per domain."""
    pct = float(config["out_of_service_pct"])
    groups: dict[str, tuple[dict | None, str]] = {}
    for g, hosts in config.get("groups", {}).items():
        groups[g] = ctl.show_nodes(hosts)
    results = []
    for d in config.get("domains", []):
        nodes, why_not = groups.get(d["group"], (None, "no such group in the config"))
        if nodes is None:
            results.append({"domain": d["name"], "action": "none", "why": f"trays unknown: {why_not}"})
            continue
        v = decide_domain(d["name"], list(d["trays"]), nodes, pct)
        results.append(apply(ctl, v, nodes, breaker.settings({"breaker": config.get("breakers", {}).get(d["group"])})))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="gpucluster: drain an NVLink domain as a unit, resume it together.")
    p.add_argument("--config", default=DEFAULT_CONFIG)
    args = p.parse_args(argv)
    with open(args.config) as fh:
        config = json.load(fh)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           **{str(k): str(v) for k, v in config.get("env", {}).items()}}
    with slurmctl.Session(env, munge_key=None, deadline=time.monotonic() + RUN_BUDGET_S) as ctl:
        results = run(config, ctl)
    for r in results:
        if r["action"] != "none" or r.get("applied") not in (None, True):
            print(f"gpucluster-domain-guard {r['domain']}: {r['action']} ({r['why']})"
                  + (f"; {r['breaker']}" if r.get("breaker") else "") + f"; applied: {r.get('applied')}")
    print(f"gpucluster-domain-guard: {len(results)} domains, "
          f"{sum(1 for r in results if r.get('applied') is True)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
