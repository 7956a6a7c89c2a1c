"""Dynamic providers: node enrollment over SSH, and cluster secrets generated once per stack (munge key,
slurmdbd password, bundle-signing key).

The engine runs these in a separate process (`python -m pulumi.dynamic`): each resource's inputs carry
the provider pickled by dill, and that process unpickles it. So the providers here keep no state of
their own (no clients, locks, keys or config): an instance pickles by reference to this module, which
the stack's virtualenv imports. It also keeps the pickle free of dicts, which matters in SDK 3.272:
`serialize_provider` wraps pickle's `_batch_setitems` once more on every call, and pickling a dict
after a few hundred dynamic resources overflows the stack (see docs/pulumi.md).

NodeEnrollment properties (inputs; outputs repeat them and add facts):
    cluster, group, target, spec       names, for messages and the marker
    owner: {project, stack}            whose marker a node may carry
    expect: Expectation.as_dict()      what each node of the group has (facts.py)
    nodes: ["host address:port"]       the batch
    ssh: {user, known_hosts, key_path | key_text, timeout}   secret in state (key_text may be a key)
    parallel                           SSH sessions at once within this batch
Outputs add: facts {host: Facts as one JSON line}, notes {note: hostlist}, drift {host: [..]}, enrolled,
enrolled_at.
"""

from __future__ import annotations

import base64
import secrets as _secrets
import sys
from typing import Any

import pulumi
from pulumi import dynamic as dyn
from pulumi.runtime import rpc

from gpucluster.configure.secrets import signing_key_b64
from gpucluster.deploy import enroll

# What decides whether a batch must be checked again (plus expect and ssh, compared without file:line
# of spec fields and without the timeout): the rest (parallelism, timeouts) changes nothing on the machines.
_CHECKED = ("nodes", "target", "owner", "cluster", "group")
_REPLACES = ("cluster", "group", "owner")


def _expect_core(props: dict) -> dict:
    return {k: v for k, v in (props.get("expect") or {}).items() if k != "where"}


def _ssh_core(props: dict) -> dict:
    return {k: v for k, v in (props.get("ssh") or {}).items() if k != "timeout"}


def _plain(value: Any) -> Any:
    """Inputs come back from the engine with tuples as lists; compare them as JSON would."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class EnrollmentProvider(dyn.ResourceProvider):
    """create enrolls a batch (all or nothing), read reports drift, delete releases the nodes."""

    serialize_as_secret_always = False  # nothing secret in the provider itself; ssh.key_text is an input

    def check(self, _olds: dict, news: dict) -> dyn.CheckResult:
        failures = []
        for key in ("cluster", "group", "target", "owner", "expect", "nodes", "ssh"):
            if key not in news:
                failures.append(dyn.CheckFailure(key, f"missing {key}"))
        ssh = news.get("ssh") or {}
        if ssh and not (ssh.get("key_path") or ssh.get("key_text")):
            failures.append(dyn.CheckFailure("ssh", "no SSH key: set gpucluster:sshKeyPath or "
                                                    "gpucluster:sshPrivateKey"))
        return dyn.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict, news: dict) -> dyn.DiffResult:
        olds, news = _unwrap(olds), _unwrap(news)
        changed = [k for k in _CHECKED if _plain(olds.get(k)) != _plain(news.get(k))]
        if _plain(_expect_core(olds)) != _plain(_expect_core(news)):
            changed.append("expect")
        if _plain(_ssh_core(olds)) != _plain(_ssh_core(news)):
            changed.append("ssh")
        replaces = [k for k in changed if k in _REPLACES]
        return dyn.DiffResult(changes=bool(changed), replaces=replaces, stables=[],
                              delete_before_replace=bool(replaces))

    def create(self, props: dict) -> dyn.CreateResult:
        outs = _run(enroll.enroll, props)
        first = enroll.parse_entry(props["nodes"][0])[0]
        return dyn.CreateResult(id_=f"{props['owner']['stack']}/{props['group']}/{first}", outs=outs)

    def read(self, id_: str, props: dict) -> dyn.ReadResult:
        return dyn.ReadResult(id_=id_, outs=_run(enroll.refresh, props))

    def update(self, _id: str, olds: dict, news: dict) -> dyn.UpdateResult:
        olds = _unwrap(olds)
        outs = _run(enroll.enroll, news)
        kept = {enroll.parse_entry(n)[0] for n in news.get("nodes") or []}
        gone = [n for n in olds.get("nodes") or [] if enroll.parse_entry(n)[0] not in kept]
        if gone:
            enroll.release({**olds, "nodes": gone})
        return dyn.UpdateResult(outs=outs)

    def delete(self, _id: str, props: dict) -> None:
        for line in enroll.release(_unwrap(props)):
            print(f"gpucluster: release left a node as it was: {line}", file=sys.stderr)


def _unwrap(value: Any) -> Any:
    """The engine strips secretness before calling a provider that does not accept secrets (ours);
    unwrap anyway, so a wrapped value (mocks, other engines) never reaches SSH as a dict."""
    if rpc.is_rpc_secret(value):
        return _unwrap(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _run(fn, props: dict) -> dict:
    try:
        return fn(_unwrap(props))
    except enroll.EnrollError as exc:
        # A plain exception: the engine shows its message; a traceback would only bury the node list.
        raise Exception(str(exc)) from None


class NodeEnrollment(dyn.Resource, module="gpucluster", name="NodeEnrollment"):
    """A batch of nodes of one group, enrolled together (see nodes.py for the granularity)."""

    facts: pulumi.Output[dict]
    drift: pulumi.Output[dict]
    notes: pulumi.Output[dict]
    enrolled: pulumi.Output[int]

    def __init__(self, name: str, props: dict, opts: pulumi.ResourceOptions | None = None):
        outs = {"facts": None, "drift": None, "notes": None, "enrolled": None, "enrolled_at": None}
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["ssh"]))
        super().__init__(EnrollmentProvider(), name, {**props, **outs}, opts)


# ---------------------------------------------------------------- secrets

# The bundle-signing key's form is configure.secrets's (signing_key_b64, is_signing_key): one writer, one check.


SECRET_KINDS = {
    # munge wants 32..1024 bytes of key; mungekey(8) makes 1024 by default. Base64 so it is text.
    "munge-key": lambda n: base64.b64encode(_secrets.token_bytes(n)).decode(),
    "password": lambda n: _secrets.token_urlsafe(n),
    # the bundle-signing key (pull_runner_signing_key_b64); an ed25519 key is 32 bytes, nothing else fits
    "ssh-ed25519": lambda _n: signing_key_b64(),
}
FIXED_LENGTH = {"ssh-ed25519": 32}


class SecretProvider(dyn.ResourceProvider):
    """create draws the value once; it lives in the stack state (encrypted as a secret) from then on.
    Nothing outside the state holds it, and nothing re-draws it unless kind or length change."""

    serialize_as_secret_always = False

    def check(self, _olds: dict, news: dict) -> dyn.CheckResult:
        failures = []
        if news.get("kind") not in SECRET_KINDS:
            failures.append(dyn.CheckFailure("kind", f"use one of {', '.join(SECRET_KINDS)}"))
        length = news.get("length")
        fixed = FIXED_LENGTH.get(news.get("kind"))
        if fixed is not None:
            if length != fixed:
                failures.append(dyn.CheckFailure("length", f"{fixed} for {news.get('kind')}"))
        elif not isinstance(length, (int, float)) or not 16 <= int(length) <= 1024:
            failures.append(dyn.CheckFailure("length", "between 16 and 1024"))
        return dyn.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict, news: dict) -> dyn.DiffResult:
        changed = [k for k in ("kind", "length") if olds.get(k) != news.get(k)]
        return dyn.DiffResult(changes=bool(changed), replaces=changed, stables=["value"])

    def create(self, props: dict) -> dyn.CreateResult:
        value = SECRET_KINDS[props["kind"]](int(props["length"]))
        return dyn.CreateResult(id_=f"{props['kind']}-{_secrets.token_hex(4)}",
                                outs={"kind": props["kind"], "length": int(props["length"]), "value": value})

    def read(self, id_: str, props: dict) -> dyn.ReadResult:
        return dyn.ReadResult(id_=id_, outs=props)


class ClusterSecret(dyn.Resource, module="gpucluster", name="ClusterSecret"):
    value: pulumi.Output[str]

    def __init__(self, name: str, kind: str, length: int, opts: pulumi.ResourceOptions | None = None):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["value"]))
        super().__init__(SecretProvider(), name, {"kind": kind, "length": length, "value": None}, opts)
