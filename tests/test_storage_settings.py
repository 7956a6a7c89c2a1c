"""The storage settings of the spec (storage.flash.moosefs, storage.nfs[].ganesha): every bound and pattern,
and what each setting changes in the files `gpucluster render` writes.

Each bound has a case just inside it (the spec loads) and one just outside (a finding at that field, with
a fix); values land unquoted in MooseFS and Ganesha config files and systemd units, so text fields are
patterns, not free text. Expected file contents come from the spec data the test sets.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import compiled, dump_spec, example_data, findings_of, spec_from_data

from gpucluster.render import render_all
from gpucluster.spec.model import Ganesha, MooseFs


@dataclass(frozen=True)
class Bound:
    tier: str  # "flash" (storage.flash.moosefs) or "nfs" (storage.nfs[0].ganesha)
    settings: dict
    field: str | None  # the finding's field below the block; None: the spec loads
    rule: str = ""


def _spec_text(tier: str, settings: dict) -> str:
    data = example_data("staging")
    if tier == "flash":
        data["storage"]["flash"]["moosefs"] = settings
    else:
        data["storage"]["nfs"][0]["ganesha"] = settings
    return dump_spec(data)


PORTS = "ports"
BOUNDS = {
    # ---- storage.flash.moosefs.ports: unprivileged, distinct
    "port at 1024": Bound("flash", {PORTS: {"metalogger": 1024}}, None),
    "port at 65535": Bound("flash", {PORTS: {"client": 65535}}, None),
    "port below 1024": Bound("flash", {PORTS: {"metalogger": 1023}}, "ports.metalogger", "greater_than_equal"),
    "port above 65535": Bound("flash", {PORTS: {"chunkserver": 65536}}, "ports.chunkserver", "less_than_equal"),
    "two roles on one port": Bound("flash", {PORTS: {"client": 9420}}, "ports.client", "value_error"),
    # ---- data_path, chunk_dirs, limits and leave_space
    "data path": Bound("flash", {"data_path": "/data/mfs-state"}, None),
    "relative data path": Bound("flash", {"data_path": "var/lib/mfs"}, "data_path", "string_pattern_mismatch"),
    "data path with ..": Bound("flash", {"data_path": "/var/../etc"}, "data_path", "string_pattern_mismatch"),
    "data path with a trailing /": Bound("flash", {"data_path": "/var/lib/mfs/"}, "data_path",
                                         "string_pattern_mismatch"),
    "data path /": Bound("flash", {"data_path": "/"}, "data_path", "string_pattern_mismatch"),
    "data path of 256 characters": Bound("flash", {"data_path": "/" + "a" * 255}, "data_path", "string_too_long"),
    "chunk dirs with limits": Bound("flash", {"chunk_dirs": [{"path": "/nvme0", "limit": "3.5TiB"},
                                                             {"path": "/nvme1", "limit": "500GB"}]}, None),
    "no chunk dir": Bound("flash", {"chunk_dirs": []}, "chunk_dirs", "value_error"),
    "65 chunk dirs": Bound("flash", {"chunk_dirs": [{"path": f"/nvme{i}"} for i in range(65)]}, "chunk_dirs",
                           "too_long"),
    "a chunk dir twice": Bound("flash", {"chunk_dirs": [{"path": "/nvme0"}, {"path": "/nvme0"}]}, "chunk_dirs",
                               "value_error"),
    "a chunk dir with a space": Bound("flash", {"chunk_dirs": [{"path": "/nvme 0"}]}, "chunk_dirs[0].path",
                                      "string_pattern_mismatch"),
    "a chunk dir marked for removal": Bound("flash", {"chunk_dirs": [{"path": "*/nvme0"}]}, "chunk_dirs[0].path",
                                            "string_pattern_mismatch"),
    "a limit without a unit": Bound("flash", {"chunk_dirs": [{"path": "/nvme0", "limit": "3.5T"}]},
                                    "chunk_dirs[0].limit", "string_pattern_mismatch"),
    "a negative limit": Bound("flash", {"chunk_dirs": [{"path": "/nvme0", "limit": "-5GiB"}]},
                              "chunk_dirs[0].limit", "string_pattern_mismatch"),
    "leave space": Bound("flash", {"leave_space": "4GiB"}, None),
    "leave space without a unit": Bound("flash", {"leave_space": "256"}, "leave_space", "string_pattern_mismatch"),
    # ---- client_networks (mfsexports.cfg addresses)
    "every address form": Bound("flash", {"client_networks": ["*", "10.0.0.0/16", "10.0.0.5", "10.1.0.0/255.255.0.0",
                                                              "10.0.0.1-10.0.0.99"]}, None),
    "no network": Bound("flash", {"client_networks": []}, "client_networks", "value_error"),
    "a host name": Bound("flash", {"client_networks": ["gpu01"]}, "client_networks[0]", "value_error"),
    "an octet over 255": Bound("flash", {"client_networks": ["300.1.1.1"]}, "client_networks[0]", "value_error"),
    "a reversed range": Bound("flash", {"client_networks": ["10.0.0.9-10.0.0.1"]}, "client_networks[0]",
                              "value_error"),
    "65 networks": Bound("flash", {"client_networks": [f"10.0.{i}.0/24" for i in range(65)]}, "client_networks",
                         "too_long"),
    # ---- root_squash, mount options and timeout
    "root squash": Bound("flash", {"root_squash": True}, None),
    "root squash as a number": Bound("flash", {"root_squash": 5}, "root_squash", "bool_type"),
    "mount options": Bound("flash", {"mount_options": ["mfscachemode=AUTO", "mfsattrcacheto=1.0", "nosuid"]}, None),
    "a mount option with a comma": Bound("flash", {"mount_options": ["a,b"]}, "mount_options[0]",
                                         "string_pattern_mismatch"),
    "a mount option the spec sets": Bound("flash", {"mount_options": ["mfsport=1"]}, "mount_options", "value_error"),
    "33 mount options": Bound("flash", {"mount_options": [f"o{i}" for i in range(33)]}, "mount_options", "too_long"),
    "mount timeout 1": Bound("flash", {"mount_timeout": 1}, None),
    "mount timeout 3600": Bound("flash", {"mount_timeout": 3600}, None),
    "mount timeout 0": Bound("flash", {"mount_timeout": 0}, "mount_timeout", "greater_than_equal"),
    "mount timeout 3601": Bound("flash", {"mount_timeout": 3601}, "mount_timeout", "less_than_equal"),
    # ---- master_extra / chunkserver_extra
    "extra settings": Bound("flash", {"master_extra": {"CHUNKS_LOOP_MAX_CPS": 100000, "ATIME_MODE": 4},
                                      "chunkserver_extra": {"HDD_TEST_SPEED": "2.0"}}, None),
    "an extra key the template writes": Bound("flash", {"master_extra": {"DATA_PATH": "/x"}}, "master_extra",
                                              "value_error"),
    "an extra key fixed by the template": Bound("flash", {"chunkserver_extra": {"WORKING_USER": "root"}},
                                                "chunkserver_extra", "value_error"),
    "a lower-case extra key": Bound("flash", {"master_extra": {"atime_mode": 4}}, "master_extra.atime_mode",
                                    "string_pattern_mismatch"),
    "a boolean extra value": Bound("flash", {"master_extra": {"LOCK_MEMORY": True}}, "master_extra.LOCK_MEMORY",
                                   "value_error"),
    "an extra value with a space": Bound("flash", {"master_extra": {"SYSLOG_IDENT": "a b"}},
                                         "master_extra.SYSLOG_IDENT", "value_error"),
    "an extra value with a comment": Bound("flash", {"chunkserver_extra": {"SYSLOG_IDENT": "a#b"}},
                                           "chunkserver_extra.SYSLOG_IDENT", "value_error"),
    "65 extra settings": Bound("flash", {"master_extra": {f"K{i}": i for i in range(65)}}, "master_extra",
                               "too_long"),
    "an unknown moosefs key": Bound("flash", {"port": {}}, "port", "unknown-key"),
    # ---- storage.nfs[].ganesha
    "NFSv4 only": Bound("nfs", {"protocols": [4]}, None),
    "no protocol": Bound("nfs", {"protocols": []}, "protocols", "value_error"),
    "NFSv2": Bound("nfs", {"protocols": [2]}, "protocols[0]", "literal_error"),
    "a protocol twice": Bound("nfs", {"protocols": [3, 3]}, "protocols", "value_error"),
    "three protocols": Bound("nfs", {"protocols": [3, 4, 3]}, "protocols", "too_long"),
    "grace 0 (none)": Bound("nfs", {"grace_period": 0}, None),
    "grace 180 with lease 120": Bound("nfs", {"grace_period": 180, "lease_lifetime": 120}, None),
    "grace -1": Bound("nfs", {"grace_period": -1}, "grace_period", "greater_than_equal"),
    "grace 181": Bound("nfs", {"grace_period": 181}, "grace_period", "less_than_equal"),
    "lease 1": Bound("nfs", {"lease_lifetime": 1}, None),
    "lease 0": Bound("nfs", {"lease_lifetime": 0}, "lease_lifetime", "greater_than_equal"),
    "lease 121": Bound("nfs", {"grace_period": 180, "lease_lifetime": 121}, "lease_lifetime", "less_than_equal"),
    "lease longer than grace": Bound("nfs", {"grace_period": 30, "lease_lifetime": 60}, "lease_lifetime",
                                     "value_error"),
    "no root squash": Bound("nfs", {"squash": "No_Root_Squash"}, None),
    "squash in lower case": Bound("nfs", {"squash": "root_squash"}, "squash", "literal_error"),
    "every client form": Bound("nfs", {"clients": ["*", "10.0.0.0/8", "gpu*", "@ops", "nfs01", "fd00::/8"]}, None),
    "no client": Bound("nfs", {"clients": []}, "clients", "value_error"),
    "a client with a space": Bound("nfs", {"clients": ["a b"]}, "clients[0]", "string_pattern_mismatch"),
    "a client with a semicolon": Bound("nfs", {"clients": ["a;b"]}, "clients[0]", "string_pattern_mismatch"),
    "NFS mount timeout 0": Bound("nfs", {"mount_timeout": 0}, "mount_timeout", "greater_than_equal"),
    "NFS mount timeout 3601": Bound("nfs", {"mount_timeout": 3601}, "mount_timeout", "less_than_equal"),
}


@pytest.mark.parametrize("case", BOUNDS.values(), ids=BOUNDS.keys())
def test_storage_setting_bounds(case: Bound, write_spec):
    findings = findings_of(write_spec(_spec_text(case.tier, case.settings)))
    if case.field is None:
        assert findings == [], "\n".join(f.render() for f in findings)
        return
    block = "storage.flash.moosefs." if case.tier == "flash" else "storage.nfs[0].ganesha."
    # one finding per mistake (an item refused is not also reported as a list too short)
    assert [(f.field, f.rule) for f in findings] == [(block + case.field, case.rule)], "\n".join(
        f.render() for f in findings)
    hits = findings
    assert hits[0].fix and hits[0].line, hits[0].render()


def test_defaults_are_the_old_role_defaults():
    """Moving the knobs from the roles into the spec changed no default (the defaults roles/*/defaults held before)."""
    m, g = MooseFs(), Ganesha()
    assert (m.ports.metalogger, m.ports.chunkserver, m.ports.client) == (9419, 9420, 9421)
    assert (m.data_path, [d.path for d in m.chunk_dirs], m.leave_space) == ("/var/lib/mfs", ["/srv/mfs/chunks"],
                                                                            "256MiB")
    assert (m.client_networks, m.root_squash, m.mount_options, m.mount_timeout) == (("*",), False, (), 60)
    assert (g.protocols, g.grace_period, g.lease_lifetime, g.squash, g.clients, g.mount_timeout) == (
        (3, 4), 90, 60, "Root_Squash", ("*",), 60)


def test_tiers_of_one_server_agree_on_its_grace_and_lease(write_spec):
    """grace and lease are NFS-Ganesha's, not an export's: two tiers on one server group must agree."""
    data = example_data("staging")
    data["storage"]["nfs"].append({"name": "scratch", "server_group": "nfs", "ganesha": {"grace_period": 120},
                                   "exports": [{"path": "/export/scratch", "mount": "/scratch"}]})
    findings = findings_of(write_spec(dump_spec(data)))
    assert [(f.field, f.rule) for f in findings] == [("storage.nfs[1].ganesha.grace_period", "storage")]
    assert "'home'" in findings[0].message and findings[0].line


# ---- what each setting changes in the rendered files ------------------------------------------------

def _render(flash: dict | None = None, nfs: dict | None = None) -> dict[str, str]:
    data = example_data("staging")
    if flash is not None:
        data["storage"]["flash"]["moosefs"] = flash
    if nfs is not None:
        data["storage"]["nfs"][0]["ganesha"] = nfs
    return {k: v for k, v in render_all(compiled(spec_from_data(data)), cabling=False).items()}


def _cfg(text: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line and not line.startswith("#"))


def test_moosefs_settings_reach_every_daemon_file():
    flash = {"ports": {"metalogger": 19419, "chunkserver": 19420, "client": 19421}, "data_path": "/data/mfs",
             "chunk_dirs": [{"path": "/nvme0", "limit": "3.5TiB"}, {"path": "/nvme1"}], "leave_space": "4GiB",
             "client_networks": ["10.0.0.0/16"], "root_squash": True, "mount_options": ["mfscachemode=AUTO"],
             "mount_timeout": 120, "master_extra": {"ATIME_MODE": 4}, "chunkserver_extra": {"HDD_TEST_SPEED": "2.0"}}
    out = _render(flash=flash)
    master, chunk, meta = _cfg(out["mfsmaster.cfg"]), _cfg(out["mfschunkserver.cfg"]), _cfg(out["mfsmetalogger.cfg"])
    assert (master["MATOML_LISTEN_PORT"], master["MATOCS_LISTEN_PORT"], master["MATOCL_LISTEN_PORT"]) == (
        "19419", "19420", "19421")
    assert master["DATA_PATH"] == chunk["DATA_PATH"] == meta["DATA_PATH"] == "/data/mfs"
    assert master["ATIME_MODE"] == "4" and chunk["HDD_TEST_SPEED"] == "2.0" and "ATIME_MODE" not in chunk
    assert (chunk["MASTER_PORT"], meta["MASTER_PORT"], chunk["HDD_LEAVE_SPACE_DEFAULT"]) == ("19420", "19419", "4GiB")
    dirs = [line for line in out["mfshdd.cfg"].splitlines() if line and not line.startswith("#")]
    assert dirs == ["/nvme0 3.5TiB", "/nvme1"]
    exports = [line.split("\t") for line in out["mfsexports.cfg"].splitlines() if line and not line.startswith("#")]
    assert exports == [["10.0.0.0/16", "/", "rw,alldirs,maproot=nobody"], ["10.0.0.0/16", ".", "rw"]]
    unit = out["mnt-flash.mount"]
    assert "\nOptions=mfsmaster=flash01,mfsport=19421,_netdev,mfscachemode=AUTO\n" in unit
    assert "\nTimeoutSec=120\n" in unit


def test_ganesha_settings_reach_the_export_and_the_mount_units():
    out = _render(nfs={"protocols": [4], "grace_period": 120, "lease_lifetime": 30, "squash": "All_Squash",
                       "clients": ["10.0.0.0/8", "@ops"], "mount_timeout": 90})
    conf = out["ganesha.conf"]
    assert "\tProtocols = 4;\n\tNFS_Port" in conf and "\tGrace_Period = 120;\n\tLease_Lifetime = 30;\n" in conf
    assert "\tSquash = All_Squash;\n" in conf and "\t\tClients = 10.0.0.0/8, @ops;\n" in conf
    assert "\nTimeoutSec=90\n" in out["home-shared.mount"]


def test_moosefs_admin_grants_admin_rights_on_the_root_export_only():
    """MooseFS 4 needs admin rights to create the storage class of the replicas; off by default (no change)."""
    def exports(out):
        return [line.split("\t") for line in out["mfsexports.cfg"].splitlines() if line and not line.startswith("#")]

    assert all("admin" not in opts for _n, _d, opts in exports(_render()))
    granted = exports(_render(flash={"admin": True}))
    assert [opts.split(",") for _n, d, opts in granted if d == "/"] == [["rw", "alldirs", "admin", "maproot=0:0"]]
    assert all("admin" not in opts for _n, d, opts in granted if d == ".")


def test_ganesha_may_start_without_the_io_flusher_only_when_asked():
    """Ganesha 6 exits when prctl(PR_SET_IO_FLUSHER) is refused (no CAP_SYS_RESOURCE); the knob is the server's."""
    assert "allow_set_io_flusher_fail" not in _render()["ganesha.conf"]
    core = _render(nfs={"allow_set_io_flusher_fail": True})["ganesha.conf"].split("NFS_CORE_PARAM {", 1)[1]
    assert core.split("}", 1)[0].splitlines()[-1] == "\tallow_set_io_flusher_fail = true;"
