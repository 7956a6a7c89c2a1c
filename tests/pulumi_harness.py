"""Run the stack program under `pulumi.runtime.set_mocks` and record what it registered.

Shared by tests/test_pulumi_*.py and bench/pulumi_mocks.py (which puts tests/ on sys.path); a test harness,
not part of the package. Each `run_program` call is a fresh program: new mocks, new monitor, new root stack,
the stack config given as a dict, exactly the path `pulumi up` takes through `program.main` minus the engine.

The mocks stand in for the engine's side of the dynamic providers:
- every dynamic resource's serialized provider (`__provider`) is unpickled the way the provider
  process does it (base64, dill) and must give the provider class the resource names;
- the provider's own `check` runs on the inputs and must pass;
- ClusterSecret: the real `create` runs (it only draws random bytes). With a `state` (the dict a previous
  run's mocks filled), a secret that is already there goes through the provider's own `diff` first, as the
  engine does on `pulumi up`: no change keeps the stored id and value, a replacement draws again;
- NodeEnrollment: no SSH here; outputs are the inputs plus facts that match the expectation, the
  same shape `enroll.enroll` returns.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dill
import pulumi
from pulumi.runtime import mocks as _mocks
from pulumi.runtime import rpc
from pulumi.runtime import settings as _settings
from pulumi.runtime._serialization import _deserialize
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from gpucluster.deploy.facts import Expectation, Facts
from gpucluster.paths import pulumi_project

ENROLLMENT = "pulumi-python:dynamic/gpucluster:NodeEnrollment"
SECRET = "pulumi-python:dynamic/gpucluster:ClusterSecret"
STACK_TYPE = "pulumi:pulumi:Stack"
ROOT = pulumi_project() or Path.cwd()  # the folder with Pulumi.yaml (gpucluster.paths)


def matching_facts(expect: dict, host: str) -> dict:
    """Facts (as stored: one JSON line) that a node matching its group exactly would report."""
    e = Expectation.from_dict(expect)
    gpus = e.gpus
    return Facts(
        hostname=host, sockets=e.sockets, cores_per_socket=e.cores_per_socket, threads_per_core=e.threads_per_core,
        cpus=e.sockets * e.cores_per_socket * e.threads_per_core, memory_mb=e.memory_gb * 1024 + 1024,
        gpus=gpus, gpu_source="device files",
        gpu_devices=tuple(f"/dev/nvidia{i}" for i in range(gpus)), nics=("eth0",),
        hcas={h: e.link_layer or "" for h in e.hcas},
    ).to_text()


def unwrap(value: Any) -> Any:
    if rpc.is_rpc_secret(value):
        return unwrap(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


def has_secret(value: Any) -> bool:
    if rpc.is_rpc_secret(value):
        return True
    if isinstance(value, dict):
        return any(has_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(has_secret(v) for v in value)
    return False


class ClusterMocks(pulumi.runtime.Mocks):
    """enroll=True: NodeEnrollment runs the real provider's create (SSH to the nodes), as `pulumi up` would;
    `created` then holds (id, outputs) of each batch, for the caller to release. `state`: ClusterSecret
    resources by name -> (id, outputs), the stack state's part that secrets live in; pass one run's
    `mocks.state` to the next to run the program again on the same stack."""

    def __init__(self, enroll: bool = False, state: dict[str, tuple[str, dict]] | None = None) -> None:
        self.providers: dict[str, Any] = {}  # serialized provider -> unpickled instance
        self.enroll = enroll
        self.created: list[tuple[str, dict]] = []
        self.state: dict[str, tuple[str, dict]] = {} if state is None else dict(state)

    def provider(self, serialized: str):
        if serialized not in self.providers:
            self.providers[serialized] = _deserialize(lambda: dill.loads(base64.b64decode(serialized)))
        return self.providers[serialized]

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        inputs = unwrap(args.inputs)
        if args.typ in (ENROLLMENT, SECRET):
            from gpucluster.deploy.provider import EnrollmentProvider, SecretProvider

            prov = self.provider(inputs["__provider"])
            want = EnrollmentProvider if args.typ == ENROLLMENT else SecretProvider
            if not isinstance(prov, want):
                raise AssertionError(f"{args.name}: __provider unpickles to {type(prov)}, not {want}")
            checked = prov.check({}, inputs)
            if checked.failures:
                raise AssertionError(f"{args.name}: check failed: {[(f.property, f.reason) for f in checked.failures]}")
            if args.typ == SECRET:
                return self._secret(prov, args.name, inputs)
            if self.enroll:
                created = prov.create(inputs)
                if args.typ == ENROLLMENT:
                    self.created.append((created.id, created.outs))
                return created.id, {**inputs, **(created.outs or {})}
            hosts = [n.split()[0] for n in inputs["nodes"]]
            outs = {**inputs, "facts": {h: matching_facts(inputs["expect"], h) for h in hosts}, "notes": {},
                    "drift": {}, "enrolled": len(hosts), "enrolled_at": "2025-01-01T00:00:00+00:00"}
            return f"{inputs['owner']['stack']}/{inputs['group']}/{hosts[0]}", outs
        return f"{args.name}-id", args.inputs

    def _secret(self, prov, name: str, inputs: dict) -> tuple[str, dict]:
        if name in self.state:
            old_id, olds = self.state[name]
            if not prov.diff(old_id, olds, inputs).changes:
                return old_id, olds
        created = prov.create(inputs)
        self.state[name] = (created.id, {**inputs, **(created.outs or {})})
        return self.state[name]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}, None


@dataclass
class Registration:
    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    secret_outputs: tuple[str, ...]
    inputs: dict


@dataclass
class ProgramRun:
    resources: list[Registration] = field(default_factory=list)
    outputs: dict[str, dict] = field(default_factory=dict)  # urn -> registered outputs (secrets still wrapped)
    serialized_providers: set[str] = field(default_factory=set)

    def of_type(self, typ: str) -> list[Registration]:
        return [r for r in self.resources if r.type == typ]

    @property
    def stack_urn(self) -> str:
        return next(u for u in self.outputs if u.split("::")[2].endswith(STACK_TYPE))

    @property
    def stack_outputs(self) -> dict:
        return self.outputs[self.stack_urn]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.resources if r.urn == urn)


class RecordingMonitor(_mocks.MockMonitor):
    def __init__(self, mocks: ClusterMocks, run: ProgramRun):
        super().__init__(mocks)
        self.run = run

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != STACK_TYPE:
            inputs = rpc.deserialize_properties(request.object, keep_unknowns=True)
            if "__provider" in inputs:
                self.run.serialized_providers.add(unwrap(inputs["__provider"]))
            self.run.resources.append(Registration(
                urn=response.urn, type=request.type, name=request.name, parent=request.parent,
                custom=request.custom, secret_outputs=tuple(request.additionalSecretOutputs), inputs=inputs))
        return response

    def RegisterResourceOutputs(self, request):
        self.run.outputs[request.urn] = rpc.deserialize_properties(request.outputs, keep_unknowns=True)
        return super().RegisterResourceOutputs(request)


def stack_config(spec: Path | str, **extra: Any) -> dict[str, str]:
    """A stack config as `pulumi config` would hold it (gpucluster:* keys, string values)."""
    out = {"gpucluster:spec": str(spec)}
    for key, value in extra.items():
        out[f"gpucluster:{key}"] = str(value)
    return out


def run_program(config: dict[str, str], *, stack: str = "test", project: str = "gpucluster",
                secret_keys: tuple[str, ...] = (), preview: bool = False, root: Path = ROOT,
                mocks: ClusterMocks | None = None) -> ProgramRun:
    """Run program.main under fresh mocks with this config; raises what the program raises."""
    from gpucluster.deploy.program import main

    run = ProgramRun()
    mocks = mocks or ClusterMocks()
    _ensure_event_loop()  # set_mocks may build a Stack, which needs one (asyncio.run elsewhere unsets it)
    pulumi.runtime.set_all_config(dict(config), list(secret_keys))
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=preview,
                             monitor=RecordingMonitor(mocks, run))
    _settings.SETTINGS.rpc_manager.clear()
    _settings.SETTINGS.outputs.clear()
    _settings.ROOT.set(None)  # run_in_stack makes the root stack, as the language host does
    _sync_await(run_in_stack(lambda: main(root)))
    return run
