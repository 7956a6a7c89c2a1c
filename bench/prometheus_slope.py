"""What one Prometheus costs as the node count grows: Debian's Prometheus scraping N node targets on loopback, at
three sizes, each target serving a real node_exporter body from a staged compute node (with its health metrics).
Prints and writes, never asserts.

    .venv/bin/python bench/prometheus_slope.py --body BODY.txt             # -> bench/prometheus-slope.json
    .venv/bin/python bench/prometheus_slope.py --body BODY.txt --sizes 100 300 1000 --interval 15 --scrapes 4

BODY.txt is one scrape of a staged node's node_exporter (`curl -s 127.0.0.1:9100/metrics` on it). One Python HTTP
server on 127.0.0.1 serves it to every target; the targets differ by a URL parameter (Prometheus's `__param_node`
label), so each is its own series set, labelled as the rendered target files label a node (group, unit, rack).
Per size: a fresh Prometheus with a private data folder, SCRAPES scrape intervals after its first scrape of every
target; then its head series, its resident memory (VmRSS, VmHWM), and its CPU per scrape interval over the last
SCRAPES - 1 intervals (/proc/PID/stat). The slope between sizes gives the cost per node; docs/metrics.md carries it
to 3,072 and 25,000 nodes.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def serve(body: bytes) -> tuple[http.server.ThreadingHTTPServer, int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory(pid: int) -> dict[str, int]:
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in
            Path(f"/proc/{pid}/status").read_text().splitlines()) if k in ("VmRSS", "VmHWM")}


def own_metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def one_size(size: int, port: int, interval: int, scrapes: int, work: Path) -> dict:
    folder = work / str(size)
    folder.mkdir()
    targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {
        "__param_node": f"gpu{i:05d}", "instance": f"gpu{i:05d}", "group": "gpu", "unit": f"su{i // 256:04d}",
        "rack": f"rack{i // 4:04d}", "cluster": "bench"}} for i in range(size)]
    (folder / "targets.json").write_text(json.dumps(targets))
    (folder / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": f"{interval}s", "evaluation_interval": f"{interval}s"},
        "scrape_configs": [{"job_name": "node", "file_sd_configs": [{"files": [str(folder / "targets.json")]}]}]}))
    web = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if own_metric(web, "prometheus_tsdb_head_series") >= 0:
                    break
            except (OSError, StopIteration):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start")
            time.sleep(0.5)
        time.sleep(interval + 2)  # every target scraped once
        before, t0 = cpu(proc.pid), time.monotonic()
        time.sleep(interval * (scrapes - 1))
        spent, wall = cpu(proc.pid) - before, time.monotonic() - t0
        return {"nodes": size, "head_series": int(own_metric(web, "prometheus_tsdb_head_series")),
                "memory_kib": memory(proc.pid), "cpu_s_per_interval": round(spent * interval / wall, 3),
                "scrapes_per_interval_cpu_ms_per_node": round(1000 * spent * interval / wall / size, 3)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--body", type=Path, required=True, help="one scrape of a staged node's node_exporter")
    p.add_argument("--sizes", type=int, nargs="*", default=[100, 300, 1000])
    p.add_argument("--interval", type=int, default=15)
    p.add_argument("--scrapes", type=int, default=4)
    p.add_argument("--json", default=str(ROOT / "bench" / "prometheus-slope.json"))
    args = p.parse_args()
    if shutil.which("prometheus") is None:
        sys.exit("prometheus is not installed (Debian's prometheus package; scripts/setup.sh --tests)")
    body = args.body.read_bytes()
    server, port = serve(body)
    work = Path(tempfile.mkdtemp(prefix="gpc-prom-slope-"))
    try:
        rows = []
        for size in args.sizes:
            rows.append(one_size(size, port, args.interval, args.scrapes, work))
            print(json.dumps(rows[-1]))
    finally:
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    version = subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    out = {"when": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
           "prometheus": version, "body_bytes": len(body), "interval_s": args.interval, "sizes": rows}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
