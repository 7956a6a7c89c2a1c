"""Slurm: config files equal the renderer's, nodes known and usable, GRES, topology, profile."""

from __future__ import annotations

import difflib

import pytest
from gpc_checklib import (
    expand_hostlist,
    journal,
    node_state_ok,
    parse_gres,
    parse_scontrol_records,
    parse_show_config,
    run,
    slurm_conf_dir,
)

SLURM_HOSTS = ("slurm_controller", "slurm_compute", "slurm_login")


def _slurm_files(ctx, host):
    for name in ctx.doc["slurm"]["files"]:
        yield name, name


@pytest.mark.per(SLURM_HOSTS, items=_slurm_files)
def test_slurm_config_file(ctx, node, target, doc, item):
    """Hash compare against `gpucluster render`; the diff is printed (Slurm configs hold no secret). A configless
    compute node: slurmd's cache holds the file slurmctld served, and conf_dir holds no stale copy."""
    want = doc["slurm"]["files"][item]
    conf_path = f"{doc['slurm']['conf_dir']}/{item}"
    path = f"{slurm_conf_dir(ctx, target.host)}/{item}"
    if path != conf_path:
        stale = run(node, f"test -e {conf_path}")
        assert stale.rc != 0, (f"{target.host}: {conf_path} exists on a configless compute node (slurmctld serves "
                               "it; `gpucluster configure` removes the stale copy)")
    out = run(node, f"sha256sum {path}")
    assert out.rc == 0, f"{target.host}: {path} is missing ({out.stderr.strip()})"
    if out.stdout.split()[0] != want["sha256"]:
        f = node.file(path)
        diff = "\n".join(list(difflib.unified_diff(want["text"].splitlines(), f.content_string.splitlines(),
                                                   "gpucluster render", f"{target.host}:{path}", lineterm=""))[:40])
        pytest.fail(f"{target.host}: {path} differs from what `gpucluster render` produces\n{diff}", pytrace=False)


def _nccl_files(ctx, host):
    group = ctx.hostinfo(host)["node_group"]
    entry = ctx.doc["nccl"].get(group)
    if entry:
        for kind in ("conf", "env"):
            yield entry[kind]["path"], entry[kind]


@pytest.mark.per(("gpu_nvidia", "gpu_amd"), items=_nccl_files)
def test_nccl_config_file(node, target, item):
    out = run(node, f"sha256sum {item['path']}")
    assert out.rc == 0, f"{target.host}: {item['path']} is missing (rendered as {item['name']})"
    if out.stdout.split()[0] != item["sha256"]:
        f = node.file(item["path"])
        diff = "\n".join(list(difflib.unified_diff(
            item["text"].splitlines(), f.content_string.splitlines(), f"gpucluster render: {item['name']}",
            f"{target.host}:{item['path']}", lineterm=""))[:40])
        pytest.fail(f"{target.host}: {item['path']} differs from the rendered {item['name']}\n{diff}", pytrace=False)


def _slurm_nodes(ctx, host: str) -> dict[str, dict]:
    """`scontrol show node -o`, once per worker (one RPC for the whole cluster over SSH; the node itself
    in local mode)."""
    def fetch():
        cmd = "scontrol show node -o" + (f" {host}" if ctx.mode == "local" else "")
        out = run(ctx.slurm_host(), cmd, timeout=60)
        if out.rc != 0:
            return {"__error__": {"text": (out.stderr or out.stdout).strip()}}
        return {r.get("NodeName"): r for r in parse_scontrol_records(out.stdout) if r.get("NodeName")}
    key = ("nodes", host if ctx.mode == "local" else "*")
    return ctx.cached(key, fetch)


def _where(ctx) -> str:
    return ctx.me if ctx.mode == "local" else ctx.controller


@pytest.mark.per("slurm_compute")
def test_node_known_and_usable(ctx, target):
    nodes = _slurm_nodes(ctx, target.host)
    if "__error__" in nodes:
        pytest.fail(f"{target.host}: scontrol on {_where(ctx)} failed: {nodes['__error__']['text']}", pytrace=False)
    rec = nodes.get(target.host)
    assert rec is not None, f"{target.host}: slurmctld does not know this node (not in `scontrol show node`)"
    ok, why = node_state_ok(rec.get("State", "?"))
    reason = f" (Reason={rec['Reason']})" if rec.get("Reason") else ""
    assert ok, f"{target.host}: Slurm state {why}{reason}"


@pytest.mark.per("slurm_compute")
def test_slurmd_answers(node, target):
    """The node's own slurmd answers an authenticated RPC now (slurmctld only notices a dead slurmd after
    SlurmdTimeout)."""
    out = run(node, "scontrol show slurmd", timeout=30)
    assert out.rc == 0 and "Slurmd PID" in out.stdout, (
        f"{target.host}: slurmd does not answer: {(out.stderr or out.stdout).strip()[-300:]}\n"
        f"{journal(node, 'slurmd')}")


@pytest.mark.per("slurm_compute")
def test_node_gres(ctx, target, doc):
    want = doc["slurm"]["nodes"][target.host]["gres"]
    nodes = _slurm_nodes(ctx, target.host)
    if "__error__" in nodes:
        pytest.fail(f"{target.host}: scontrol on {_where(ctx)} failed: {nodes['__error__']['text']}", pytrace=False)
    rec = nodes.get(target.host)
    assert rec is not None, f"{target.host}: slurmctld does not know this node"
    got = parse_gres(rec.get("Gres", ""))
    assert got == ([want] if want else []), (
        f"{target.host}: Gres={rec.get('Gres')}, node group {doc['hosts'][target.host]['node_group']} "
        f"declares {want or 'none'}")


def _topology(ctx) -> dict[str, dict]:
    def fetch():
        out = run(ctx.slurm_host(), "scontrol show topology", timeout=60)
        if out.rc != 0:
            return {"__error__": {"text": (out.stderr or out.stdout).strip()}}
        return {r["SwitchName"]: r for r in parse_scontrol_records(out.stdout) if "SwitchName" in r}
    return ctx.cached("topology", fetch)


def _switches(ctx, host):
    for sw in ctx.doc["slurm"]["switches"]:
        yield sw["name"], sw


@pytest.mark.per("slurm_controller", items=_switches)
def test_topology_switch(ctx, target, item):
    """`scontrol show topology` equals the plan, switch by switch (level, nodes, child switches)."""
    topo = _topology(ctx)
    if "__error__" in topo:
        pytest.fail(f"{target.host}: scontrol show topology failed: {topo['__error__']['text']}", pytrace=False)
    rec = topo.get(item["name"])
    assert rec is not None, f"{target.host}: slurmctld has no switch {item['name']} (the plan has it)"
    got_nodes = sorted(expand_hostlist(rec.get("Nodes", ""))) if rec.get("Nodes") not in (None, "(null)") else []
    got_sw = sorted(expand_hostlist(rec.get("Switches", ""))) if rec.get("Switches") not in (None, "(null)") else []
    problems = []
    if int(rec.get("Level", -1)) != item["level"]:
        problems.append(f"Level={rec.get('Level')}, plan {item['level']}")
    want_nodes = item["nodes_below"] if item["switches"] else item["nodes"]
    if got_nodes != want_nodes:
        problems.append(f"Nodes={rec.get('Nodes')}, plan {','.join(want_nodes) or 'none'}")
    if got_sw != item["switches"]:
        problems.append(f"Switches={rec.get('Switches')}, plan {','.join(item['switches']) or 'none'}")
    assert not problems, f"{target.host}: switch {item['name']}: " + "; ".join(problems)


@pytest.mark.per("slurm_controller")
def test_topology_has_no_extra_switch(ctx, target, doc):
    if doc["slurm"]["topology"] != "tree":
        pytest.skip(f"topology {doc['slurm']['topology']}: no switch tree to compare")
    topo = _topology(ctx)
    if "__error__" in topo:
        pytest.fail(f"{target.host}: scontrol show topology failed: {topo['__error__']['text']}", pytrace=False)
    extra = sorted(set(topo) - {s["name"] for s in doc["slurm"]["switches"]})
    assert not extra, f"{target.host}: slurmctld has switches the plan lacks: {', '.join(extra)}"


# ---- topology/block: slurmctld's blocks against the plan's (one per NVLink domain, or per unit) ----------------

def parse_blocks(text: str) -> dict[str, dict]:
    """`scontrol show topology` on topology/block, read as data: block -> {nodes (sorted), size, aggregated}.
    Base blocks are BlockName records; the ones slurmctld built from BlockSizes are AggregatedBlock records."""
    out: dict[str, dict] = {}
    for r in parse_scontrol_records(text):
        name = r.get("BlockName") or r.get("AggregatedBlock")
        if name is None:
            continue
        nodes = r.get("Nodes")
        size = r.get("BlockSize", "")
        out[name] = {"nodes": sorted(expand_hostlist(nodes)) if nodes not in (None, "", "(null)") else [],
                     "size": int(size) if size.isdigit() else None, "aggregated": "AggregatedBlock" in r}
    return out


def _names(nodes, limit: int = 8) -> str:
    nodes = list(nodes)
    more = f" and {len(nodes) - limit} more" if len(nodes) > limit else ""
    return ", ".join(nodes[:limit]) + more if nodes else "none"


def block_problems(want: dict, planned: list[dict], got: dict[str, dict]) -> list[str]:
    """One planned block against slurmctld's: the nodes it lacks, each with the block slurmctld has it in, and
    the nodes it has beyond the plan, each with the block the plan puts it in."""
    rec = got.get(want["name"])
    if rec is None or rec["aggregated"]:
        return [f"slurmctld has no block {want['name']} (the plan has it, with {_names(want['nodes'])})"]
    in_got = {n: b for b, r in got.items() if not r["aggregated"] for n in r["nodes"]}
    in_plan = {n: b["name"] for b in planned for n in b["nodes"]}
    missing = sorted(set(want["nodes"]) - set(rec["nodes"]))
    extra = sorted(set(rec["nodes"]) - set(want["nodes"]))
    problems = []
    if missing:
        problems.append("missing " + _names(f"{n} (slurmctld has it in {in_got.get(n, 'no block')})" for n in missing))
    if extra:
        problems.append("extra " + _names(f"{n} (the plan has it in {in_plan.get(n, 'no block')})" for n in extra))
    return problems


def extra_blocks(planned: list[dict], got: dict[str, dict]) -> list[str]:
    """slurmctld's base blocks the plan lacks, each with its nodes."""
    names = {b["name"] for b in planned}
    return [f"{b} ({_names(r['nodes'])})" for b, r in sorted(got.items()) if not r["aggregated"] and b not in names]


def aggregation_problems(plan: dict, got: dict[str, dict]) -> list[str]:
    """BlockSizes as slurmctld applied them: each base block's BlockSize is the plan's base size, and the
    aggregated blocks are the plan's (members, nodes, size), none missing and none beyond them. Aggregated
    blocks are matched by their member blocks, not by how Slurm spells the name."""
    problems = []
    base = plan["sizes"][0]
    wrong = [f"{b} BlockSize={r['size']}" for b, r in sorted(got.items()) if not r["aggregated"] and r["size"] != base]
    if wrong:
        problems.append(f"base blocks not of the plan's base size {base}: {_names(wrong)}")
    nodes_of = {b["name"]: b["nodes"] for b in plan["blocks"]}
    have = {tuple(sorted(expand_hostlist(name))): (name, r) for name, r in got.items() if r["aggregated"]}
    for agg in plan["aggregated"]:
        found = have.pop(tuple(sorted(agg["members"])), None)
        if found is None:
            problems.append(f"no aggregated block {agg['name']} of size {agg['size']}")
            continue
        name, r = found
        want_nodes = sorted(n for m in agg["members"] for n in nodes_of[m])
        if r["size"] != agg["size"]:
            problems.append(f"aggregated block {name}: BlockSize={r['size']}, plan {agg['size']}")
        if r["nodes"] != want_nodes:
            problems.append(f"aggregated block {name}: missing {_names(sorted(set(want_nodes) - set(r['nodes'])))}, "
                            f"extra {_names(sorted(set(r['nodes']) - set(want_nodes)))}")
    problems.extend(f"aggregated block {name} (BlockSize={r['size']}) the plan lacks" for name, r in
                    sorted(have.values(), key=lambda v: v[0]))
    return problems


def _blocks(ctx, target) -> dict[str, dict]:
    """slurmctld's blocks, once per worker; a failed scontrol fails the check with its message."""
    def fetch():
        out = run(ctx.slurm_host(), "scontrol show topology", timeout=60)
        if out.rc != 0:
            return {"__error__": (out.stderr or out.stdout).strip()}
        return {"blocks": parse_blocks(out.stdout)}
    got = ctx.cached("blocks", fetch)
    if "__error__" in got:
        pytest.fail(f"{target.host}: scontrol show topology failed: {got['__error__']}", pytrace=False)
    return got["blocks"]


def _skip_unless_blocks(doc) -> dict:
    plan = doc["slurm"].get("blocks")
    if plan is None:
        pytest.skip(f"topology {doc['slurm']['topology']}: no blocks to compare (topology/block only)")
    return plan


def _planned_blocks(ctx, host):
    plan = ctx.doc["slurm"].get("blocks")
    if plan is None:  # one item, so the check reports its skip instead of vanishing
        yield ctx.doc["slurm"]["topology"], None
        return
    for b in plan["blocks"]:
        yield b["name"], b


@pytest.mark.per("slurm_controller", items=_planned_blocks)
def test_topology_block(ctx, target, doc, item):
    """slurmctld's block has exactly the plan's nodes: a tray missing names the block slurmctld put it in, an
    extra one the block the plan has it in."""
    plan = _skip_unless_blocks(doc)
    problems = block_problems(item, plan["blocks"], _blocks(ctx, target))
    assert not problems, f"{target.host}: block {item['name']}: " + "; ".join(problems)


@pytest.mark.per("slurm_controller")
def test_topology_has_no_extra_block(ctx, target, doc):
    plan = _skip_unless_blocks(doc)
    extra = extra_blocks(plan["blocks"], _blocks(ctx, target))
    assert not extra, f"{target.host}: slurmctld has blocks the plan lacks: {'; '.join(extra)}"


@pytest.mark.per("slurm_controller")
def test_topology_block_sizes(ctx, target, doc):
    """BlockSizes as the plan renders them, read back as slurmctld applied them: its aggregated blocks."""
    plan = _skip_unless_blocks(doc)
    if not plan["sizes"]:
        pytest.skip(f"no BlockSizes in the rendered {plan['file']} (Slurm {doc['slurm']['version']}): slurmctld's "
                    "default levels apply")
    problems = aggregation_problems(plan, _blocks(ctx, target))
    assert not problems, (f"{target.host}: BlockSizes {','.join(map(str, plan['sizes']))} "
                          f"({plan['file']}): " + "; ".join(problems))


def _profile_items(ctx, host):
    for d in ctx.doc["slurm"]["profile_differences"]:
        yield d["key"], d


@pytest.mark.per("slurm_controller", items=_profile_items)
def test_production_profile(ctx, node, target, item):
    """Where the staging profile swaps a plugin, say so: xfail with the difference, never a silent pass."""
    def fetch():
        out = run(node, "scontrol show config", timeout=60)
        return parse_show_config(out.stdout) if out.rc == 0 else None
    conf = ctx.cached(("config", target.host), fetch)
    if conf is None:
        pytest.fail(f"{target.host}: scontrol show config failed", pytrace=False)
    key, rendered, prod = item["key"], item["rendered"], item["production"]
    got = conf.get(key)
    if got == rendered:
        pytest.xfail(f"staging profile: {key}={rendered or '(unset)'}, production has {key}={prod or '(unset)'}: "
                     "differs from production")
    if got == prod:
        return
    pytest.fail(f"{target.host}: {key}={got or '(unset)'}: neither the rendered {rendered or '(unset)'} nor "
                f"production's {prod or '(unset)'}", pytrace=False)
