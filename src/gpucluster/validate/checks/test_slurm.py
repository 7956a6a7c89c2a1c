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
