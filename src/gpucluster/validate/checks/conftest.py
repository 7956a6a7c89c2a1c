"""The validation suite's pytest plugin: reads the expectations, parametrizes every check by
(inventory group, host[, item]) and gives tests a testinfra host for the node under test.

Run by `gpucluster validate` (over SSH, in parallel with pytest-xdist) or, with --via-slurm, on each
node inside a Slurm job (`--gpc-mode local`, testinfra's local backend). A check declares where it
applies with `@pytest.mark.per(GROUP, items=FUNC)`: GROUP is a contract group (or a tuple of them,
or "all"); FUNC(ctx, host) yields (item_id, value) or (item_id, value, group) for one test per item.
"""

from __future__ import annotations

import os

import pytest
from gpc_checklib import Ctx, Target, Unreachable, host_of_nodeid, load_doc

_SKIP_NO_HOST = object()


def pytest_addoption(parser):
    g = parser.getgroup("gpucluster", "gpucluster validation suite")
    g.addoption("--gpc-expect", help="expectations JSON written by gpucluster validate")
    g.addoption("--gpc-mode", choices=("ssh", "local"), default="ssh",
                help="ssh: reach nodes from here; local: this process runs on the node under test")
    g.addoption("--gpc-hosts", help="comma-separated hosts to validate (default: the selection in the expectations)")
    g.addoption("--gpc-me", help="local mode: this node's inventory name")
    g.addoption("--gpc-peers", help="local mode: the nodes running the suite in the same job (ring checks)")
    g.addoption("--gpc-control-dir", help="folder for SSH control sockets shared by the workers")
    g.addoption("--gpc-progress", help="append one line per finished check (outcome, then node id) to this file")
    g.addoption("--gpc-ssh", choices=("paramiko", "openssh"), default="paramiko",
                help="paramiko: one connection per host and worker, no process per command (default); "
                     "openssh: the ssh command, multiplexed (ProxyJump and other ssh_config features)")


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config
    config.gpc_progress = None if hasattr(config, "workerinput") else config.getoption("--gpc-progress")
    config.addinivalue_line("markers", "per(group, items=None): parametrize by inventory group, host and item")
    path = config.getoption("--gpc-expect") or os.environ.get("GPUCLUSTER_VALIDATE_EXPECT")
    if not path:
        config._gpc = None
        return
    doc = load_doc(path)
    hosts = config.getoption("--gpc-hosts")
    peers = config.getoption("--gpc-peers")
    config._gpc = Ctx(doc, mode=config.getoption("--gpc-mode"),
                      hosts=[h for h in hosts.split(",") if h] if hosts is not None else None,
                      me=config.getoption("--gpc-me"),
                      peers=[h for h in peers.split(",") if h] if peers else None,
                      control_dir=config.getoption("--gpc-control-dir"),
                      ssh_backend=config.getoption("--gpc-ssh"))


def pytest_runtest_logreport(report):
    """One line per finished check for `gpucluster validate`'s live counter (the controller process only:
    xdist workers forward their reports to it)."""
    path = getattr(_CONFIG, "gpc_progress", None)
    if not path or not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return
    with open(path, "a") as fh:
        fh.write(f"{report.outcome} {report.nodeid}\n")


_CONFIG = None


def _groups(marker) -> tuple[str, ...]:
    g = marker.args[0] if marker.args else marker.kwargs.get("group", "all")
    return (g,) if isinstance(g, str) else tuple(g)


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("per")
    if marker is None or "target" not in metafunc.fixturenames:
        return
    ctx: Ctx | None = metafunc.config._gpc
    params = []
    if ctx is not None:
        items_fn = marker.kwargs.get("items")
        for host in ctx.run_hosts:
            group = next((g for g in _groups(marker) if ctx.in_group(host, g)), None)
            if group is None:
                continue
            entries = [(None, None)] if items_fn is None else list(items_fn(ctx, host))
            for entry in entries:
                # (item_id, item) or (item_id, item, group): an item may belong to a narrower group.
                item_id, item = entry[0], entry[1]
                t = Target(entry[2] if len(entry) > 2 else group, host, item_id, item)
                params.append(pytest.param(t, id=t.id))
    if not params:
        params = [pytest.param(_SKIP_NO_HOST, id="none")]
    metafunc.parametrize("target", params)


@pytest.hookimpl(optionalhook=True)  # unknown without xdist (-n 1, and the nodes of a --via-slurm job)
def pytest_xdist_make_scheduler(config, log):
    """With -n N: every check of one host goes to the same worker (one connection per host, and the
    host's checks run one after another as an operator would run them). A scheduler of our own, grouping
    by the host in the test id: xdist's loadgroup relies on rewriting node ids, which pytest 9.2 no
    longer honours (pytest-xdist#1386), so it silently spreads a host over every worker."""
    if config.getvalue("dist") not in ("loadscope", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByHost(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return host_of_nodeid(nodeid) or super()._split_scope(nodeid)

    return ByHost(config, log)


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        t = callspec.params.get("target") if callspec else None
        if t is _SKIP_NO_HOST or (t is None and item.get_closest_marker("per")):
            drop.append(item)  # no host of this group in the run: not a skip, simply not applicable
            continue
        if isinstance(t, Target):
            item.user_properties += [("group", t.group), ("host", t.host)]
            if t.item_id is not None:
                item.user_properties.append(("item", str(t.item_id)))
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def ctx(pytestconfig) -> Ctx:
    c = pytestconfig._gpc
    if c is None:
        pytest.skip("no expectations: run through `gpucluster validate INVENTORY`")
    return c


@pytest.fixture(scope="session")
def doc(ctx) -> dict:
    return ctx.doc


@pytest.fixture
def node(ctx, target):
    """testinfra host of the node under test; a host that cannot be reached fails each of its checks at
    once, naming it."""
    try:
        return ctx.host(target.host)
    except Unreachable as exc:
        pytest.fail(str(exc), pytrace=False)



@pytest.fixture
def item(target):
    """The item of a per-item check (a unit, a file, a switch, ...)."""
    return target.item
