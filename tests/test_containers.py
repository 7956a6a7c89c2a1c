"""Jobs in containers: the spec's containers: sections (defaults, refusals by `gpucluster check`) and the files
rendered from them (oci.conf for each Slurm release, the SPANK stack and pyxis line, enroot.conf, the apt pins).

The oci.conf keys of each release are checked twice: against the table in render/containers.py for every release
gpucluster renders for, and against the real Slurm of each line gpucluster runs (Debian 12's 22.05 on the host,
24.11 and 26.05 from their Debian roots, gpucluster.emulate.roots): every key rendered for a line is one its
binary parses (slurmstepd in 22.05, libslurmfull from 23.02) and, where the line installs oci.conf(5), one the page
documents. docs/containers.md.
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from conftest import cluster_example, compiled, example_data, example_text, line_of, need_slurm_line, spec_from_data

from gpucluster.catalog import CONTAINER_STACK
from gpucluster.cluster import load_cluster
from gpucluster.render import render_all
from gpucluster.render.containers import (
    APT_PINS,
    OCI_KEYS,
    apt_preferences,
    arch_of,
    group_files,
    oci_keys,
    oci_settings,
    pyxis_file,
    render_containers,
    role_facts,
)
from gpucluster.spec import jobcontainers
from gpucluster.spec.slurm_versions import RELEASES

EVERY_OCI_KEY = sorted(set().union(*OCI_KEYS.values()))


def _text(value) -> str:
    return value if isinstance(value, str) else "".join(value())


@cache
def _rendered(name: str, version: str | None = None) -> dict[str, str]:
    from conftest import example_path

    cluster = load_cluster(example_path(name), slurm_version=version) if version else cluster_example(name)
    return render_containers(cluster)


def _settings(text: str) -> dict[str, str]:
    """oci.conf's Key="value" lines."""
    return dict(re.findall(r'^([A-Za-z]+)="([^"]*)"$', text, re.M))


def _with(name: str, edit) -> dict[str, str]:
    data = example_data(name)
    edit(data)
    return render_containers(compiled(spec_from_data(data)))


# ---- defaults -------------------------------------------------------------------------------------------------

# example -> {group: (oci, enroot_pyxis)}: compute groups run oci; NVIDIA GPU compute groups, and login groups
# beside them, run pyxis; AMD GPU groups and service groups do not.
DEFAULTS = {
    "staging": {"ctl": (False, False), "gpu": (True, True), "flash": (False, False), "nfs": (False, False)},
    "meta-24k-roce": {"login": (False, True), "h100": (True, True)},
    "frontier-mi250x-roce": {"mi250x": (True, False)},
    "gb200-superpod": {"login": (False, True), "gb200": (True, True)},
    "mi355x-800g-roce": {"mi355x": (True, False)},
}
DEFAULT_CASES = [(name, group, want) for name, groups in DEFAULTS.items() for group, want in groups.items()]


@pytest.mark.parametrize(("name", "group", "want"), DEFAULT_CASES, ids=[f"{n}/{g}" for n, g, _ in DEFAULT_CASES])
def test_each_group_gets_the_default_of_its_role_and_gpu(name: str, group: str, want: tuple[bool, bool]) -> None:
    spec = cluster_example(name).spec
    g = spec.group(group)
    assert (jobcontainers.oci(spec, g), jobcontainers.enroot_pyxis(spec, g)) == want


@pytest.mark.parametrize(("name", "cache"), [("staging", "flash"), ("meta-24k-roce", "flash"),
                                             ("gb200-superpod", "local"), ("b300-xdr-superpod", "local")])
def test_the_image_cache_is_on_the_flash_tier_when_there_is_one(name: str, cache: str) -> None:
    spec = cluster_example(name).spec
    assert jobcontainers.image_cache(spec) == cache
    enroot = dict(line.split(" ", 1) for line in _rendered(name)["enroot.conf"].splitlines()
                  if line and not line.startswith("#"))
    if cache == "flash":
        assert enroot["ENROOT_CACHE_PATH"] == f"{spec.storage.flash.mount}/containers/enroot-cache/user-$(id -u)"
    else:
        assert enroot["ENROOT_CACHE_PATH"] == f"{spec.containers.local_dir}/cache/user-$(id -u)"
    assert enroot["ENROOT_RUNTIME_PATH"] == f"{spec.containers.runtime_dir}/user-$(id -u)"
    assert enroot["ENROOT_DATA_PATH"] == f"{spec.containers.local_dir}/data/user-$(id -u)"
    assert enroot["ENROOT_TEMP_PATH"] == f"{spec.containers.local_dir}/tmp"


def test_a_pyxis_group_that_does_not_mount_the_flash_tier_keeps_the_cache_local() -> None:
    """The default follows what the nodes can reach: a group running pyxis outside the flash tier's clients."""
    def edit(data):
        data["storage"]["flash"]["client_groups"] = ["h100"]

    data = example_data("colossus-200k")
    edit(data)
    spec = spec_from_data(data)
    assert jobcontainers.image_cache(spec) == "local"
    assert "/var/lib/enroot/cache/user-" in _with("colossus-200k", edit)["enroot.conf"]


# ---- refusals through `gpucluster check` ----------------------------------------------------------------------

def _gpu_block(text: str) -> str:
    return text.replace("    nodes_per_rack: 2\n", "    nodes_per_rack: 2\n    containers: {enroot_pyxis: true}\n", 1)


# name -> (example, edit of its text, the line's start, field, rule, words of the fix)
REFUSALS = {
    "pyxis on AMD GPUs": (
        "frontier-mi250x-roce",
        lambda t: t.replace("    gpus_per_node: 8\n",
                            "    gpus_per_node: 8\n    containers:\n      enroot_pyxis: true\n", 1),
        "      enroot_pyxis: true", "node_groups[1].containers.enroot_pyxis", "containers",
        "run ROCm containers with srun --container"),
    "pyxis on a compute group without GPUs": (
        "staging",
        lambda t: _gpu_block(t.replace("    gpu: h100-sxm5-80g\n    gpus_per_node: 4\n    gres_detect: \"off\"      "
                                       "# explicit File= lines: the staged nodes carry stand-in /dev/nvidiaN files\n",
                                       "")),
        "    containers: {enroot_pyxis", "node_groups[1].containers.enroot_pyxis", "containers",
        "set enroot_pyxis: false"),
    "pyxis on a storage group": (
        "staging",
        lambda t: t.replace("  - name: nfs\n    role: storage\n",
                            "  - name: nfs\n    role: storage\n    containers:\n      enroot_pyxis: true\n", 1),
        "      enroot_pyxis: true", "node_groups[3].containers.enroot_pyxis", "containers", "remove enroot_pyxis here"),
    "pyxis on a login group with no compute group running it": (
        "meta-24k-roce",
        lambda t: t.replace("    role: login\n", "    role: login\n    containers: {enroot_pyxis: true}\n", 1)
        .replace("    gpu: h100-sxm5-80g\n", "    gpu: h100-sxm5-80g\n    containers: {enroot_pyxis: false}\n", 1),
        "    containers: {enroot_pyxis: true}", "node_groups[1].containers.enroot_pyxis", "containers",
        "turn it on for a compute group with NVIDIA GPUs"),
    "oci on a controller": (
        "staging",
        lambda t: t.replace("  - name: ctl\n    role: controller\n",
                            "  - name: ctl\n    role: controller\n    containers:\n      oci: true\n", 1),
        "      oci: true", "node_groups[0].containers.oci", "containers", "compute groups have it by default"),
    "an image cache on a flash tier the spec lacks": (
        "gb200-superpod",
        lambda t: t + "containers:\n  image_cache: flash\n",
        "  image_cache: flash", "containers.image_cache", "containers", "add storage.flash, or set image_cache: local"),
    "an image cache on a flash tier a pyxis group does not mount": (
        "staging",
        lambda t: t.replace("    mount: /mnt/flash\n", "    mount: /mnt/flash\n    client_groups: [nfs]\n", 1)
        + "containers:\n  image_cache: flash\n",
        "  image_cache: flash", "containers.image_cache", "containers", "add it to storage.flash.client_groups"),
    "a runtime Slurm's guide has no oci.conf for": (
        "staging",
        lambda t: t + "containers:\n  runtime: podman\n",
        "  runtime: podman", "containers.runtime", "literal_error", "use one of 'runc' or 'crun'"),
    "a relative local folder": (
        "staging",
        lambda t: t + "containers:\n  local_dir: var/lib/enroot\n",
        "  local_dir: var/lib/enroot", "containers.local_dir", "string_pattern_mismatch", "(/[A-Za-z0-9_-]"),
    "a number where oci takes a boolean": (
        "staging",
        lambda t: t.replace("    nodes_per_rack: 2\n", "    nodes_per_rack: 2\n    containers: {oci: 1}\n", 1),
        "    containers: {oci: 1}", "node_groups[1].containers.oci", "bool_type", ""),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_refused_with_file_line_rule_and_fix(case, tmp_path) -> None:
    example, edit, anchor, field, rule, fix = case
    text = edit(example_text(example))
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith(f"error: {path}:{line_of(text, anchor)}: {field}: "), errors[0]
    assert errors[0].endswith(f"[{rule}]") and fix in errors[0], errors[0]


def test_oci_off_on_one_compute_group_of_several_warns_and_passes() -> None:
    """Configless Slurm serves the one oci.conf to every slurmd: a compute group without oci is said, not refused."""
    data = example_data("colossus-200k")
    h200 = next(g for g in data["node_groups"] if g["name"] == "h200")
    h200["containers"] = {"oci": False}
    cluster = compiled(spec_from_data(data))
    warnings = [f for f in cluster.warnings if f.rule == "oci-partial"]
    assert [f.field for f in warnings] == [f"node_groups[{data['node_groups'].index(h200)}].containers.oci"]
    assert warnings[0].level == "warning"
    assert "oci.conf" in render_containers(cluster)


# ---- oci.conf --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", RELEASES)
def test_oci_conf_writes_only_keys_its_release_reads(version: str) -> None:
    text = _rendered("staging", version)["oci.conf"]
    got = _settings(text)
    assert set(got) <= oci_keys(version), sorted(set(got) - oci_keys(version))
    assert f"Rendered for Slurm {version}." in text
    # run, not create/start (Slurm's guide: no polling), with what each release requires beside it
    assert {"RunTimeRun", "RunTimeQuery", "RunTimeKill", "RunTimeDelete"} <= set(got)
    assert not {"RunTimeCreate", "RunTimeStart"} & set(got)
    newer = tuple(int(p) for p in version.split(".")) >= (23, 2)
    assert ("EnvExclude" in got) == ("RunTimeEnvExclude" in got) == newer


@pytest.mark.parametrize("version", [v for v in RELEASES if v != "22.05"])
def test_the_runtime_never_sees_systemds_notify_socket(version: str) -> None:
    """slurmd runs as a systemd notify unit, and the RunTime* commands get slurmstepd's environment: with
    NOTIFY_SOCKET set, a foreground `runc run` waits for READY=1 from the container and never returns (the 24.11
    staged job hung so). The container's own environment keeps only the Slurm configuration out."""
    got = _settings(_rendered("staging", version)["oci.conf"])
    runtime_env, env = re.compile(got["RunTimeEnvExclude"]), re.compile(got["EnvExclude"])
    for name in ("NOTIFY_SOCKET", "SLURM_CONF", "SLURM_CONF_SERVER"):
        assert runtime_env.search(f"{name}=/run/x")
    assert not runtime_env.search("NOTIFY_SOCKETS=1") and not runtime_env.search("XNOTIFY_SOCKET=1")
    assert env.search("SLURM_CONF=/etc/slurm/slurm.conf") and not env.search("NOTIFY_SOCKET=/run/x")


@pytest.mark.parametrize("version", RELEASES)
def test_every_runtime_call_of_a_container_uses_one_state_folder_and_one_id(version: str) -> None:
    """Query, kill and delete find the container run started only with the same --root and container id."""
    got = _settings(_rendered("staging", version)["oci.conf"])
    calls = {k: v for k, v in got.items() if k.startswith("RunTime") and k != "RunTimeEnvExclude"}
    roots = {re.search(r"--root=(\S+)", v).group(1) for v in calls.values()}
    assert roots == ({"/run/slurm-oci/%U"} if version != "22.05" else {"%b"})
    assert all(v.startswith("runc --rootless=true ") and v.count("%n.%u.%j.%s.%t") == 1 for v in calls.values())
    assert calls["RunTimeRun"].endswith(" run %n.%u.%j.%s.%t -b %b")


def test_crun_takes_its_bundle_as_an_option() -> None:
    def edit(data):
        data["containers"] = {"runtime": "crun"}

    got = _settings(_with("staging", edit)["oci.conf"])
    assert got["RunTimeRun"] == "crun --rootless=true --root=%b run --bundle %b %n.%u.%j.%s.%t"
    assert all(v.startswith("crun ") for k, v in got.items() if k.startswith("RunTime"))


def test_no_oci_conf_without_a_compute_group_that_has_oci() -> None:
    def edit(data):
        for g in data["node_groups"]:
            if g["role"] == "compute":
                g["containers"] = {"oci": False}

    assert "oci.conf" not in _with("staging", edit)


def test_oci_settings_follow_the_key_table_not_the_version_number() -> None:
    """A key the table lacks for a release is never written, whatever the settings list asks for."""
    spec = cluster_example("staging").spec
    assert {k for k, _ in oci_settings(spec)} <= OCI_KEYS[(22, 5)]


def _strings_of(path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _man_keys(text: str) -> set[str]:
    """The parameters oci.conf(5) documents: each is a `.TP` entry whose first word is bold."""
    return set(re.findall(r"^\.TP\n\\fB([A-Za-z]+)", text, re.M))


# The line -> the binary that parses oci.conf: slurmstepd in 22.05 (src/slurmd/slurmstepd/read_oci_conf.c), Slurm's
# common library from 23.02 (src/common/oci_config.c).
PARSER = {"22.05": "/usr/sbin/slurmstepd", "24.11": "/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so",
          "26.05": "/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so"}


@pytest.mark.parametrize("line", PARSER)
def test_the_real_slurm_of_each_line_reads_every_key_rendered_for_it(line: str) -> None:
    """The keys rendered for a line are the ones the binary that parses oci.conf knows (a key ends with NUL among
    its strings), and the keys of later releases are absent from the 22.05 one: the table is the binaries'."""
    from gpucluster.emulate.roots import runtime

    need_slurm_line(line)
    rt = runtime(line)
    data = _strings_of(rt.host_path(PARSER[line]))
    assert data, f"no {PARSER[line]} in {rt.where}"
    known = {k for k in EVERY_OCI_KEY if k.encode() + b"\0" in data}
    assert known == set(oci_keys(line)), f"the binary's keys differ from the table: {sorted(known ^ oci_keys(line))}"
    rendered = set(_settings(_rendered("staging", line)["oci.conf"]))
    assert rendered <= known
    man = rt.host_path("/usr/share/man/man5/oci.conf.5.gz")
    if man.exists():  # 24.11 and 26.05 install it; Debian 12's 22.05 packages do not
        documented = _man_keys(gzip.decompress(man.read_bytes()).decode())
        assert rendered <= documented and documented <= set(oci_keys(line)), sorted(documented ^ oci_keys(line))


# ---- the SPANK stack, pyxis and enroot --------------------------------------------------------------------------

def test_plugstack_conf_names_no_plugin_only_each_nodes_own_folder() -> None:
    lines = [ln for ln in _rendered("staging")["plugstack.conf"].splitlines() if ln and not ln.startswith("#")]
    assert lines == ["include /etc/slurm/plugstack.conf.d/*.conf"]


@pytest.mark.parametrize(("name", "arches"), [("staging", {"amd64"}), ("gb200-superpod", {"amd64", "arm64"})])
def test_the_pyxis_line_points_at_the_packaged_plugin_of_each_architecture(name: str, arches: set[str]) -> None:
    out = _rendered(name)
    triplet = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
    for arch in arches:
        lines = [ln for ln in out[pyxis_file(arch)].splitlines() if ln and not ln.startswith("#")]
        assert lines == [f"required /usr/lib/{triplet[arch]}/slurm/spank_pyxis.so"]
    assert {n for n in out if n.startswith("pyxis.")} == {pyxis_file(a) for a in arches}


@pytest.mark.parametrize("name", ["mi355x-800g-roce", "frontier-mi250x-roce"])
def test_a_cluster_of_amd_gpus_gets_no_pyxis(name: str) -> None:
    assert set(_rendered(name)) == {"oci.conf"}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_every_group_file_is_rendered_and_every_rendered_file_is_taken(name: str) -> None:
    cluster = cluster_example(name)
    out = _rendered(name)
    taken = {f for g in cluster.spec.node_groups for f in group_files(cluster, g).values()}
    assert taken <= set(out)
    assert taken | {"oci.conf", "plugstack.conf"} >= set(out)
    for g in cluster.spec.node_groups:
        assert bool(group_files(cluster, g)) == jobcontainers.enroot_pyxis(cluster.spec, g)


def test_the_apt_pins_are_the_locks() -> None:
    text = _rendered("staging")[APT_PINS]
    assert text == apt_preferences("staging")
    records = [dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith("#"))
               for block in text.split("\n\n") if "Package:" in block]
    assert records == [
        {"Package": "enroot enroot+caps", "Pin": f"version {CONTAINER_STACK.enroot.version}", "Pin-Priority": "1001"},
        {"Package": "nvslurm-plugin-pyxis", "Pin": f"version {CONTAINER_STACK.pyxis.version}",
         "Pin-Priority": "1001"},
        {"Package": "enroot enroot+caps nvslurm-plugin-pyxis enroot-hardened enroot-hardened+caps",
         "Pin": "version *", "Pin-Priority": "-1"}]


def test_render_all_carries_the_container_files() -> None:
    files = render_all(cluster_example("staging"), cabling=False)
    assert {k: _text(v) for k, v in files.items() if k in _rendered("staging")} == _rendered("staging")


# ---- what the slurm_compute role acts on ------------------------------------------------------------------------

ROLE = Path(__file__).resolve().parents[1] / "roles" / "slurm_compute"


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_facts_json_carries_each_groups_choice_and_files(name: str) -> None:
    """The role reads facts.json's `containers`, never the spec: the same choices and files as the renderer."""
    cluster = cluster_example(name)
    facts = role_facts(cluster)
    for g in cluster.spec.node_groups:
        assert facts["groups"][g.name] == {"oci": jobcontainers.oci(cluster.spec, g),
                                           "enroot_pyxis": jobcontainers.enroot_pyxis(cluster.spec, g),
                                           "gpu_host": g.role == "compute",
                                           "arch": arch_of(cluster.spec, g), "files": group_files(cluster, g)}
    assert facts["runtime"] == cluster.spec.containers.runtime
    assert facts["cache_dir"] == jobcontainers.cache_dir(cluster.spec)


@pytest.mark.parametrize("version", RELEASES)
def test_the_role_makes_the_state_folder_oci_conf_names_and_again_at_boot(version: str) -> None:
    """From 23.02 every runtime call keeps its state under facts.json's oci_state_dir: the role makes it (mode 1777,
    sticky, so each user's runtime makes its own folder and no one else can remove it) and writes a tmpfiles.d rule,
    as /run is empty after a reboot. 22.05's calls use the step's own spool folder: nothing to make."""
    from conftest import example_path

    cluster = load_cluster(example_path("staging"), slurm_version=version)
    rendered = _settings(render_containers(cluster)["oci.conf"])
    roots = {re.search(r"--root=(\S+)", v).group(1) for k, v in rendered.items()
             if k.startswith("RunTime") and k != "RunTimeEnvExclude"}
    state = role_facts(cluster)["oci_state_dir"]
    if version == "22.05":
        assert state is None and roots == {"%b"}
        return
    assert roots == {f"{state}/%U"}
    tasks = {t["name"]: t for t in yaml.safe_load((ROLE / "tasks" / "containers.yml").read_text())}
    rule = tasks["Containers | the runtime's state folder on /run, made again at every boot (systemd-tmpfiles)"]
    assert rule["ansible.builtin.copy"]["content"] == "d {{ __slurm_compute_ct.oci_state_dir }} 1777 root root -\n"
    now = next(t for t in tasks.values() if t.get("ansible.builtin.file", {}).get("path") ==
               "{{ __slurm_compute_ct.oci_state_dir }}")
    assert now["ansible.builtin.file"]["mode"] == "01777"
    assert all("__slurm_compute_ct.oci_state_dir is not none" in t["when"] for t in (rule, now))


def test_the_role_installs_what_the_stand_in_repository_test_installs() -> None:
    """tests/test_containers_repo.py installs the lock's packages by name through the rendered pins and holds them;
    the role does the same: the same package names and versions (from facts.json), the rendered pins file copied
    before the install, a dpkg hold after it, and the installed versions checked against the lock."""
    from test_containers_repo import LOCKED

    facts = role_facts(cluster_example("staging"))
    assert dict.fromkeys(facts["packages"]) == dict.fromkeys(LOCKED) and facts["versions"] == LOCKED
    tasks = yaml.safe_load((ROLE / "tasks" / "containers.yml").read_text())
    flat = [t for task in tasks for t in [task, *task.get("block", [])]]
    names = [t["name"] for t in flat]

    def index(word: str) -> int:
        return next(i for i, n in enumerate(names) if word in n)

    pins, install, hold = index("the pins of the version lock"), index("by name"), index("hold them")
    assert pins < install < hold
    assert flat[pins]["ansible.builtin.copy"]["src"].endswith("files.apt_pins }}")
    assert flat[install]["gpucluster_apt"]["name"] == "{{ __slurm_compute_ct.packages }}"
    assert flat[hold]["ansible.builtin.dpkg_selections"]["selection"] == "hold"
    assert "__slurm_compute_ct.versions" in flat[index("are the lock's")]["failed_when"]


# ---- gpucluster diff ----------------------------------------------------------------------------------------------

def test_turning_pyxis_off_classes_each_file_it_removes(tmp_path) -> None:
    """The SPANK files restart slurmd (spank(8)), enroot.conf needs nothing, the pins drain (packages move)."""
    from gpucluster.diff import diff_specs

    data = example_data("staging")
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    next(g for g in data["node_groups"] if g["name"] == "gpu")["containers"] = {"enroot_pyxis": False}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
    changes = {c.target: c.cls for c in diff_specs(tmp_path / "a.yaml", tmp_path / "b.yaml").changes}
    assert {n: changes.get(n) for n in ("plugstack.conf", "pyxis.amd64.conf", "enroot.conf", APT_PINS)} == {
        "plugstack.conf": "restart-slurmd", "pyxis.amd64.conf": "restart-slurmd", "enroot.conf": "none",
        APT_PINS: "drain"}


@pytest.mark.parametrize(("edit", "name", "cls"), [
    ({"runtime": "crun"}, "oci.conf", "restart-slurmd"),  # oci.conf(5): read at daemon start; slurmctld serves it
    ({"local_dir": "/var/lib/enroot2"}, "enroot.conf", "none"),  # enroot reads it at each container start
])
def test_a_changed_container_file_gets_its_class(tmp_path, edit: dict, name: str, cls: str) -> None:
    from gpucluster.diff import diff_specs

    data = example_data("staging")
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    data["containers"] = {**data.get("containers", {}), **edit}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
    changes = {c.target: c for c in diff_specs(tmp_path / "a.yaml", tmp_path / "b.yaml").changes}
    assert changes[name].cls == cls, changes[name]


# ---- staged nodes ------------------------------------------------------------------------------------------------

def test_only_staged_compute_nodes_are_unmasked_for_nested_containers() -> None:
    """A rootless runc inside a staged node mounts a fresh /proc, which the kernel refuses while podman's masks
    cover parts of the node's own ("mount proc: operation not permitted"): compute nodes start with unmask=ALL,
    nothing else changes, and the other nodes keep podman's masks (docs/testing.md)."""
    from gpucluster.stage.lifecycle import stage_nodes
    from gpucluster.stage.podman import StageConfig, _run_args

    cluster = cluster_example("staging")
    cfg = StageConfig(cluster="staging", state_dir=Path("/nonexistent"))
    compute = set(cluster.contract_groups["slurm_compute"])
    for node in stage_nodes(cluster):
        args = _run_args(cfg, node, "img", 2222)
        unmasked = ("--security-opt", "unmask=ALL") in set(pairwise(args))
        assert unmasked == (node.name in compute), (node.name, args)


def test_a_login_group_gets_pyxis_from_the_same_tasks_without_a_gpu() -> None:
    """srun accepts --container-image only where pyxis is in its own plugin stack: slurm_login runs slurm_compute's
    container tasks, which load the OS constants themselves there, skip the PCI scan (gpu_host is false for a login
    group) and install where a source is named."""
    login = yaml.safe_load((ROLE.parent / "slurm_login" / "tasks" / "main.yml").read_text())
    inc = next(t["ansible.builtin.include_role"] for t in login if "ansible.builtin.include_role" in t)
    assert inc == {"name": "slurm_compute", "tasks_from": "containers.yml"}
    tasks = yaml.safe_load((ROLE / "tasks" / "containers.yml").read_text())
    assert tasks[0]["ansible.builtin.include_vars"] == "{{ ansible_facts['os_family'] }}.yml"
    scan = next(t for t in tasks if "PCI bus" in t["name"] and "ansible.builtin.shell" in t)
    assert "__slurm_compute_ct_group.gpu_host | default(true) | bool" in scan["when"]
    here = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert "gpu_host" in here["__slurm_compute_ct_no_gpu"] and "__slurm_compute_ct_no_gpu" in here[
        "__slurm_compute_ct_pyxis_here"]
    cluster = cluster_example("gb200-superpod")
    facts = role_facts(cluster)
    logins = [g for g in cluster.spec.node_groups if g.role == "login"]
    assert logins and all(facts["groups"][g.name]["enroot_pyxis"] and not facts["groups"][g.name]["gpu_host"]
                          for g in logins)
