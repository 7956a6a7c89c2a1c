"""GPUs and the fabric. Where the hardware is absent (staged nodes, a node without HCAs) these skip with
the reason "no GPU" / "no HCA" and what was found instead; on real nodes they run."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from gpc_checklib import is_stand_in_device, max_busbw, parse_busbw, run

GPU_GROUPS = ("gpu_nvidia", "gpu_amd")
FABRIC_GROUPS = ("fabric_ib", "fabric_roce")


def _gpu(doc, host) -> dict:
    return doc["hosts"][host]["gpu"]


def _require_gpus(ctx, node, target) -> dict:
    """The vendor tool's view of the GPUs, or a skip saying why there is none."""
    gpu = _gpu(ctx.doc, target.host)

    def probe():
        if gpu["vendor"] == "nvidia":
            if is_stand_in_device(node, "/dev/nvidia0"):
                return None, "no GPU: /dev/nvidia0 is a stand-in (character device 1:3, /dev/null, or 120:N)"
            if run(node, "command -v nvidia-smi").rc != 0:
                return None, "no GPU: nvidia-smi is not installed"
            out = run(node, "nvidia-smi --query-gpu=index,name,ecc.mode.current,persistence_mode "
                            "--format=csv,noheader", timeout=60)
            if out.rc != 0:
                return None, f"no GPU: nvidia-smi failed: {(out.stderr or out.stdout).strip()[-200:]}"
            rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
            return [{"index": r[0], "name": r[1], "ecc": r[2], "persistence": r[3]} for r in rows], ""
        if run(node, "ls /dev/dri/renderD128").rc != 0 or is_stand_in_device(node, "/dev/dri/renderD128"):
            return None, "no GPU: no AMD render device (or a /dev/null stand-in)"
        if run(node, "command -v rocm-smi").rc != 0:
            return None, "no GPU: rocm-smi is not installed"
        out = run(node, "rocm-smi --showproductname --showmemuse --json", timeout=60)
        try:
            cards = json.loads(out.stdout)
        except ValueError:
            return None, f"no GPU: rocm-smi gave no JSON: {(out.stderr or out.stdout).strip()[-200:]}"
        rows = []
        for card, info in sorted(cards.items()):
            if not card.startswith("card"):
                continue
            rows.append({"index": card[4:], "name": info.get("Card series") or info.get("Card SKU") or "",
                         "ecc": "Enabled", "persistence": "Enabled"})
        return rows, ""

    gpus, why = ctx.cached(("gpus", target.host), probe)
    if gpus is None:
        pytest.skip(f"{target.host}: {why}")
    return {"expected": gpu, "found": gpus}


def _model_words(name: str) -> list[str]:
    """'NVIDIA H100 SXM5 80GB' -> ['H100']: the model token nvidia-smi / rocm-smi print too."""
    return [w for w in name.split() if re.match(r"^(H|A|B|GB|MI)\d+", w, re.I)][:1]


@pytest.mark.per(GPU_GROUPS)
def test_gpu_count_and_model(ctx, node, target):
    g = _require_gpus(ctx, node, target)
    want = g["expected"]
    assert len(g["found"]) == want["count"], (
        f"{target.host}: {len(g['found'])} GPUs visible, node group declares {want['count']} x {want['name']}")
    words = _model_words(want["name"])
    wrong = [x for x in g["found"] if words and not all(w.lower() in x["name"].lower() for w in words)]
    assert not wrong, f"{target.host}: GPU {wrong[0]['index']} is '{wrong[0]['name']}', expected {want['name']}"


def _gpu_indices(ctx, host):
    for i in range(ctx.hostinfo(host)["gpu"]["count"]):
        yield f"gpu{i}", i


def _gpu_row(ctx, node, target, item) -> dict:
    """The vendor tool's row of GPU `item` (index, name, ecc, persistence); a failure when it is not visible."""
    g = _require_gpus(ctx, node, target)
    row = next((x for x in g["found"] if x["index"] == str(item)), None)
    assert row is not None, f"{target.host}: GPU {item} not visible"
    return row


@pytest.mark.per("gpu_nvidia", items=_gpu_indices)
def test_gpu_ecc_enabled(ctx, node, target, item):
    row = _gpu_row(ctx, node, target, item)
    assert row["ecc"] == "Enabled", f"{target.host}: GPU {item} ECC is {row['ecc']}"


@pytest.mark.per("gpu_nvidia", items=_gpu_indices)
def test_gpu_persistence_mode(ctx, node, target, item):
    row = _gpu_row(ctx, node, target, item)
    assert row["persistence"] == "Enabled", f"{target.host}: GPU {item} persistence mode is {row['persistence']}"


def _first_of_node_group(ctx, host):
    """The all_reduce test runs on one node per node group (of those validated in this run)."""
    ng = ctx.hostinfo(host)["node_group"]
    pool = ctx.run_hosts if ctx.mode == "ssh" else (ctx.peers or [host])
    first = next((h for h in pool if ctx.hostinfo(h)["node_group"] == ng), host)
    if first == host:
        yield "all_reduce", None


@pytest.mark.per(GPU_GROUPS, items=_first_of_node_group)
def test_nccl_all_reduce_busbw(ctx, node, target, doc):
    g = _require_gpus(ctx, node, target)
    want = g["expected"]
    t = want.get("threshold")
    if not t:
        pytest.skip(f"{target.host}: no busbw threshold for {want['key']} x {doc['fabric']['type']} x "
                    f"{want['count']} GPUs; add one with --thresholds FILE")
    binary = doc["nccl_test"]["binary"]
    if run(node, f"command -v {shlex.quote(binary)}").rc != 0:
        pytest.fail(f"{target.host}: {binary} (nccl-tests / rccl-tests) is not installed", pytrace=False)
    size = doc["nccl_test"]["bytes"]
    env = (doc["nccl"].get(ctx.hostinfo(target.host)["node_group"]) or {}).get("env", {}).get("path")
    # `. missing-file` ends a POSIX sh: test first (the env script's own check reports it missing).
    source = f"if [ -r {shlex.quote(env)} ]; then . {shlex.quote(env)}; fi; " if env else ""
    out = run(node, f"{source}{binary} -b {size} -e {size} -f 2 -g {want['count']} -n 20 -w 5", timeout=600)
    assert out.rc == 0, f"{target.host}: {binary} failed: {(out.stderr or out.stdout).strip()[-400:]}"
    busbw = max_busbw(out.stdout) or parse_busbw(out.stdout)
    assert busbw is not None, f"{target.host}: no bus bandwidth in {binary} output"
    assert busbw >= t["busbw"], (f"{target.host}: all_reduce busbw {busbw:.0f} GB/s at {size}, threshold "
                                 f"{t['busbw']:.0f} GB/s ({want['key']} x {want['count']}, fabric {t['fabric']})")


# ------------------------------------------------------------------ fabric


def _hcas(ctx, host):
    for hca in ctx.hostinfo(host).get("hcas") or []:
        yield hca, hca


def _require_hca(ctx, node, target, hca: str) -> dict:
    """`rdma link` for this HCA (port state, netdev), or a skip when the node has no RDMA device."""
    def probe():
        have = run(node, "ls /sys/class/infiniband 2>/dev/null").stdout.split()
        if not have:
            return None
        out = run(node, "rdma -j link show 2>/dev/null")
        try:
            links = json.loads(out.stdout or "[]")
        except ValueError:
            links = []
        return {"devices": have, "links": links}
    info = ctx.cached(("rdma", target.host), probe)
    if info is None:
        nic = ctx.doc["hosts"].get(target.host, {}).get("nic", {}).get("name", "")
        pytest.skip(f"{target.host}: no HCA: /sys/class/infiniband is empty (declared {hca}"
                    f"{', on a NIC that is a ' + nic if 'stand-in' in nic else ''})")
    if hca not in info["devices"]:
        pytest.fail(f"{target.host}: HCA {hca} missing; RDMA devices: {', '.join(info['devices'])}", pytrace=False)
    return info


def _rate_gbps(text: str) -> float | None:
    m = re.search(r"([0-9.]+)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


@pytest.mark.per(FABRIC_GROUPS, items=_hcas)
def test_hca_port_active_at_rate(ctx, node, target, item):
    _require_hca(ctx, node, target, item)
    want = ctx.hostinfo(target.host)["nic"]["speed_gbps"]
    state = run(node, f"cat /sys/class/infiniband/{item}/ports/1/state").stdout.strip()
    rate = run(node, f"cat /sys/class/infiniband/{item}/ports/1/rate").stdout.strip()
    assert "ACTIVE" in state.upper(), f"{target.host}: {item} port 1 is {state or 'unknown'}, expected ACTIVE"
    got = _rate_gbps(rate)
    assert got is not None and got >= want, f"{target.host}: {item} port 1 rate {rate}, declared {want} Gb/s"


def _netdev(ctx, node, target, hca: str) -> str:
    info = _require_hca(ctx, node, target, hca)
    for link in info["links"]:
        if link.get("ifname") == hca and link.get("netdev"):
            return link["netdev"]
    out = run(node, f"ls /sys/class/infiniband/{hca}/device/net 2>/dev/null")
    if out.stdout.split():
        return out.stdout.split()[0]
    pytest.fail(f"{target.host}: {hca} has no network interface (RoCE needs one)", pytrace=False)
    return ""


@pytest.mark.per("fabric_roce", items=_hcas)
def test_roce_pfc_priority(ctx, node, target, doc, item):
    dev = _netdev(ctx, node, target, item)
    prio = doc["fabric"]["roce"]["pfc_priority"]
    out = run(node, f"dcb pfc show dev {dev} prio-pfc 2>&1")
    assert out.rc == 0, f"{target.host}: dcb pfc show dev {dev} failed: {out.stdout.strip()[-200:]}"
    on = sorted(int(p) for p, v in re.findall(r"(\d):(on|off)", out.stdout) if v == "on")
    assert on == [prio], f"{target.host}: {dev} PFC on priorities {on or 'none'}, declared only {prio}"


@pytest.mark.per("fabric_roce", items=_hcas)
def test_roce_trust_dscp(ctx, node, target, item):
    dev = _netdev(ctx, node, target, item)
    out = run(node, f"dcb app show dev {dev} 2>&1; mlnx_qos -i {dev} 2>/dev/null | grep -i trust")
    text = out.stdout.lower()
    assert "dscp" in text, f"{target.host}: {dev} does not trust DSCP ({out.stdout.strip()[-200:] or 'no dcb output'})"


@pytest.mark.per("fabric_roce", items=_hcas)
def test_roce_mtu(ctx, node, target, doc, item):
    dev = _netdev(ctx, node, target, item)
    r = doc["fabric"]["roce"]
    link = run(node, f"cat /sys/class/net/{dev}/mtu").stdout.strip()
    assert link == str(r["link_mtu"]), f"{target.host}: {dev} MTU {link}, declared {r['link_mtu']}"
    out = run(node, f"ibv_devinfo -d {item} 2>/dev/null | grep active_mtu")
    m = re.search(r"active_mtu:\s*(\d+)", out.stdout)
    assert m and int(m.group(1)) == r["mtu"], (
        f"{target.host}: {item} active RoCE MTU {m.group(1) if m else '?'}, declared {r['mtu']}")
