"""Streamed outputs (cabling.csv, fabric.topo) are made on a thread ahead of the writer: the bytes are the
same, an error while making reaches the caller (and nothing is written), and a writer that stops early
stops the thread. Speed is measured by bench/cli_speed.py, never asserted here."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from gpucluster.render.fileset import RUN_CHARS, made_ahead, write_outputs


def chunks(n: int) -> list[str]:
    return [f"row{i},port{i % 7},node-leaf,AOC\n" * (i % 5 + 1) for i in range(n)]


def test_the_runs_hold_the_chunks_in_order_encoded():
    parts = chunks(20_000)
    runs = list(made_ahead(lambda: iter(parts)))
    assert b"".join(runs) == "".join(parts).encode()
    assert all(len(r) >= RUN_CHARS for r in runs[:-1]) and len(runs) > 2


def test_an_error_while_making_reaches_the_caller():
    def make():
        yield from chunks(5_000)
        raise ValueError("the plan broke")

    with pytest.raises(ValueError, match="the plan broke"):
        list(made_ahead(make))


def test_a_failed_stream_writes_nothing(tmp_path):
    out = tmp_path / "out"
    write_outputs({"a.conf": "old\n"}, out)

    def make():
        yield "half a file\n"
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        write_outputs({"a.conf": "new\n", "cabling.csv": make}, out)
    assert sorted(p.name for p in out.iterdir()) == [".gpucluster-manifest.json", "a.conf"]
    assert (out / "a.conf").read_text() == "old\n"


def test_a_caller_that_stops_early_stops_the_thread():
    def endless():
        for i in itertools.count():
            yield "x" * 1000 + f"{i}\n"

    runs = made_ahead(endless)
    next(runs)
    runs.close()
    deadline = time.monotonic() + 30  # a loaded machine may schedule the thread late
    while any(t.name == "gpucluster-render-ahead" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "gpucluster-render-ahead" for t in threading.enumerate())
