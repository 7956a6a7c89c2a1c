"""One case's job output -> its figure: the slowest link of a ring (iperf3, ib_write_bw summed over the
case's HCAs), or all_reduce_perf's bus bandwidth. A job that gave no figure raises ToolError with why."""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.fabric.asbuilt.jobs import ring_links
from gpucluster.fabric.asbuilt.tooloutput import (
    TaskOutput,
    ToolError,
    all_reduce_busbw,
    demux,
    ib_write_bw_gbps,
    iperf3_gbps,
)


@dataclass(frozen=True)
class Measured:
    value: float
    job: str
    detail: str


def measure(transport: str, nodes: tuple[str, ...], rc: int, text: str) -> Measured:
    tasks = demux(text)
    job = next((t.job for t in tasks.values() if t.job), "")
    srun_says = " ".join(" ".join(t.lines) for k, t in tasks.items() if k < 0).strip()
    if not any(k >= 0 for k in tasks):
        raise ToolError(f"the job ran nothing (srun exit {rc}): {srun_says[-400:] or 'no output'}")
    if transport == "nccl":
        text_all = "\n".join(t.text for _, t in sorted(tasks.items()) if _ >= 0)
        try:
            return Measured(all_reduce_busbw(text_all), job, "")
        except ToolError as exc:
            raise ToolError(f"{exc} (srun exit {rc}{'; ' + srun_says[-200:] if srun_says else ''})") from None
    by_node = {t.node: t for t in tasks.values() if t.role == "ring"}
    links: dict[tuple[str, str], float] = {}
    problems: list[str] = []
    for a, b in ring_links(nodes):
        t = by_node.get(a)
        if t is None:
            problems.append(f"{a} sent no result")
            continue
        try:
            links[(a, b)] = _ring_value(transport, t)
        except ToolError as exc:
            problems.append(f"{a} -> {b}: {exc}")
    if problems:
        raise ToolError("; ".join(problems) + f" (srun exit {rc}{'; ' + srun_says[-200:] if srun_says else ''})")
    slowest = min(links, key=links.__getitem__)
    if len(links) <= 2:
        detail = ", ".join(f"{a} -> {b} {v:.3g}" for (a, b), v in links.items())
    else:
        fastest = max(links, key=links.__getitem__)
        detail = (f"slowest {slowest[0]} -> {slowest[1]} {links[slowest]:.3g}, fastest {fastest[0]} -> "
                  f"{fastest[1]} {links[fastest]:.3g} of {len(links)} streams")
    return Measured(links[slowest], job, detail)


def _ring_value(transport: str, t: TaskOutput) -> float:
    if transport == "iperf3":
        return iperf3_gbps(t.text)[0]
    parts = {k: v for k, v in t.parts.items() if k != "server"}
    if not parts:
        raise ToolError("no ib_write_bw output")
    return sum(ib_write_bw_gbps("\n".join(lines)) for lines in parts.values())
