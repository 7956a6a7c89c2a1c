"""Waves of a rollout: whole topology units, never more than --max-unavailable nodes out at once.

Pure: the plan in, waves out, the same order every time. A wave never splits a unit, so the units a
wave does not touch stay whole and free for the large jobs a training cluster runs (the anchors batch
25 % of the nodes or random nodes, which leaves every leaf with a hole in it).

Units by `--by`:
    leaf   Slurm's leaf switches: topology/tree's logical leaves (one scalable unit, or
           slurm.tree_merge_leaves units merged), the unit that decides whether a job fits one leaf
    su     the plan's scalable units (a unit's rail leaves together)
    block  a pod: the units under one set of spines, the largest block Slurm aggregates
    node   single nodes (no topology)
Compute hosts in no unit (a group off the fabric) are units of one node each.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import groupby

import hostlist

from gpucluster.fabric import Plan
from gpucluster.render.topology import logical_leaves

BY = ("leaf", "su", "block", "node")
# Without a spec field for it, 5 % of the nodes (rounded up), and never less than one whole unit, so the
# rollout can always make progress: the share Slurm sites commonly keep out for maintenance, and five times
# less than Slinky's 25 % (a training cluster's large jobs need the rest).
DEFAULT_SHARE = 0.05


class WaveError(ValueError):
    """The waves cannot be made as asked; the message names the option and the fix."""


@dataclass(frozen=True)
class Wave:
    index: int  # from 1
    units: tuple[str, ...]
    nodes: tuple[str, ...]

    def as_json(self) -> dict:
        return {"index": self.index, "units": list(self.units), "nodes": list(self.nodes)}

    @classmethod
    def from_json(cls, data: dict) -> Wave:
        return cls(int(data["index"]), tuple(data["units"]), tuple(data["nodes"]))


def topology_units(plan: Plan, by: str, hosts: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(unit name, its hosts among `hosts`) in plan order; hosts in no unit come last, one unit each."""
    if by not in BY:
        raise WaveError(f"--by {by}: not one of {', '.join(BY)}")
    wanted = set(hosts)
    out: list[tuple[str, tuple[str, ...]]] = []
    if by != "node":
        if by == "leaf":
            groups = [(g[0].name, g) for g in logical_leaves(plan)]
        elif by == "su":
            groups = [(u.name, (u,)) for u in plan.units]
        else:
            groups = [(f"pod{pod + 1:03d}", tuple(us)) for pod, us in groupby(plan.units, key=lambda u: u.pod)]
        for name, units in groups:
            nodes = tuple(h for u in units for h in hostlist.expand_hostlist(plan.unit_hostlist(u)) if h in wanted)
            if nodes:
                out.append((name, nodes))
    placed = {h for _, nodes in out for h in nodes}
    out += [(h, (h,)) for h in hosts if h not in placed]
    return out


def parse_max_unavailable(text: str | None, total: int, largest_unit: int) -> int:
    """'5%' (of `total`, rounded up) or 'N'; None: the default (DEFAULT_SHARE, at least one unit)."""
    if text is None:
        return max(math.ceil(total * DEFAULT_SHARE), largest_unit, 1)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", text)
    if not m:
        raise WaveError(f"--max-unavailable {text!r}: give a node count (e.g. 8) or a share of the nodes (e.g. 5%)")
    value = float(m.group(1))
    n = math.ceil(total * value / 100) if m.group(2) else int(value)
    if (m.group(2) and value > 100) or (not m.group(2) and value != int(value)):
        raise WaveError(f"--max-unavailable {text!r}: a share is at most 100%, a count a whole number")
    if n < 1:
        raise WaveError(f"--max-unavailable {text!r}: that is no node at all; allow at least one")
    return n


def plan_waves(units: list[tuple[str, tuple[str, ...]]], max_unavailable: int, *, by: str = "leaf",
               skip: frozenset[str] | set[str] = frozenset()) -> list[Wave]:
    """Pack whole units, in order, into waves of at most `max_unavailable` nodes. `skip`: nodes drained by
    someone else; they are in no wave (never resumed, never counted as done) and take no room in one."""
    waves: list[Wave] = []
    cur_units: list[str] = []
    cur_nodes: list[str] = []
    for name, nodes in units:
        mine = [n for n in nodes if n not in skip]
        if not mine:
            continue
        if len(mine) > max_unavailable:
            raise WaveError(
                f"--max-unavailable {max_unavailable}: {by} {name} has {len(mine)} nodes to change and a wave "
                f"never splits one; allow at least {len(mine)}, or roll out --by node")
        if len(cur_nodes) + len(mine) > max_unavailable:
            waves.append(Wave(len(waves) + 1, tuple(cur_units), tuple(cur_nodes)))
            cur_units, cur_nodes = [], []
        cur_units.append(name)
        cur_nodes += mine
    if cur_nodes:
        waves.append(Wave(len(waves) + 1, tuple(cur_units), tuple(cur_nodes)))
    return waves
