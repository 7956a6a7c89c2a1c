"""What the bandwidth tools print, read back into one figure per case.

A case's job runs its tasks under `srun --label`, so every line arrives as "<task>: <line>"; the task
script's first line names its node and job ("@@gpucluster-fabric node=gpu01 job=123 role=client").
Each tool's own output follows, read here in its real format:

- iperf3 -J (3.7+): a JSON document; `end.sum_received` is what crossed the link from client to server,
  `end.sum_received_bidir_reverse` the other way with --bidir. A failed run is JSON too, with `error`.
- ib_write_bw (perftest): a table headed `#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] ...`
  (`[MB/sec]` without --report_gbits); the data row's fourth column is the average.
- all_reduce_perf (nccl-tests / rccl-tests): a table whose header line names its columns (`size count
  type redop root time algbw busbw #wrong ...`, older releases without `root`); the out-of-place busbw
  of the largest size is the figure, `# Avg bus bandwidth` where no row can be read. NCCL INFO lines
  may interleave.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

MARK = "@@gpucluster-fabric"
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


@dataclass
class TaskOutput:
    """One task's lines, and what its first line said about it."""

    task: int
    lines: list[str] = field(default_factory=list)  # before any part
    parts: dict[str, list[str]] = field(default_factory=dict)  # "@@... part=mlx5_3" -> the lines after it
    node: str = ""
    job: str = ""
    role: str = ""
    to: str = ""  # ring: the node this task sends to
    _part: str = ""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def add(self, line: str) -> None:
        (self.parts[self._part] if self._part else self.lines).append(line)


def demux(text: str) -> dict[int, TaskOutput]:
    """Split `srun --label` output into its tasks; srun's own messages (no label) go to task -1."""
    out: dict[int, TaskOutput] = {}
    for raw in text.splitlines():
        m = _LABEL.match(raw)
        task, line = (int(m.group(1)), m.group(2)) if m else (-1, raw)
        t = out.setdefault(task, TaskOutput(task))
        if line.startswith(MARK):
            for word in line.split()[1:]:
                key, _, value = word.partition("=")
                if key in ("node", "job", "role", "to"):
                    setattr(t, key, value)
                elif key == "part":
                    t._part = value
                    t.parts.setdefault(value, [])
            continue
        t.add(line)
    return out


class ToolError(Exception):
    """The tool ran but its output holds no figure (it failed, or printed something else)."""


def _json_document(text: str) -> dict:
    start = text.find("{")
    end = text.rfind("}")
    if start < 0 or end < start:
        raise ToolError(f"no JSON in the iperf3 output: {_tail(text)}")
    try:
        doc = json.loads(text[start:end + 1])
    except json.JSONDecodeError as exc:
        raise ToolError(f"iperf3's JSON does not parse ({exc.msg} at {exc.pos}): {_tail(text)}") from None
    if not isinstance(doc, dict):
        raise ToolError("iperf3's JSON is not an object")
    return doc


def iperf3_gbps(text: str) -> tuple[float, str]:
    """(Gb/s, detail) from `iperf3 -c ... -J [--bidir]`: the slower direction that crossed the link."""
    doc = _json_document(text)
    if doc.get("error"):
        raise ToolError(f"iperf3: {doc['error']}")
    end = doc.get("end") or {}
    directions = {"client -> server": end.get("sum_received"),
                  "server -> client": end.get("sum_received_bidir_reverse")}
    got = {k: v["bits_per_second"] / 1e9 for k, v in directions.items()
           if isinstance(v, dict) and isinstance(v.get("bits_per_second"), int | float)}
    if not got:
        raise ToolError("iperf3's JSON has no end.sum_received (the test did not finish)")
    slowest = min(got, key=got.__getitem__)
    detail = ", ".join(f"{k} {v:.3g}" for k, v in got.items())
    return got[slowest], detail


def ib_write_bw_gbps(text: str) -> float:
    """Gb/s from ib_write_bw's result table (MB/sec converted where --report_gbits was not given)."""
    unit = None
    for line in text.splitlines():
        cols = line.split()
        if "#bytes" in line and "BW average[" in line:
            unit = line.split("BW average[", 1)[1].split("]", 1)[0]
            continue
        if unit and len(cols) >= 4 and cols[0].isdigit() and cols[1].isdigit():
            try:
                value = float(cols[3])
            except ValueError:
                continue
            if unit == "Gb/sec":
                return value
            if unit == "MB/sec":  # perftest's MB is 2^20 bytes
                return value * 1048576 * 8 / 1e9
            raise ToolError(f"ib_write_bw reports BW average in [{unit}], which gpucluster does not read")
    raise ToolError(f"no result row in the ib_write_bw output: {_tail(text)}")


def all_reduce_busbw(text: str) -> float:
    """GB/s: the out-of-place busbw of the largest message size in an all_reduce_perf table."""
    column = None
    best: tuple[int, float] | None = None
    avg = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            words = stripped.lstrip("#").split()
            if "busbw" in words and "size" in words:
                column = words.index("busbw")
            m = re.match(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", stripped)
            if m:
                avg = float(m.group(1))
            continue
        cols = stripped.split()
        if column is None or len(cols) <= column or not cols[0].isdigit():
            continue
        try:
            size, busbw = int(cols[0]), float(cols[column])
        except ValueError:
            continue
        if best is None or size >= best[0]:
            best = (size, busbw)
    if best is not None:
        return best[1]
    if avg is not None:
        return avg
    raise ToolError(f"no bus bandwidth in the all_reduce_perf output: {_tail(text)}")


def _tail(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text[-n:] if text else "(nothing)"
