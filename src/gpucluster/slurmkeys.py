"""slurm.conf's keys, once: who sets each, how Slurm reads its value, and what a change to it needs on
each Slurm release gpucluster supports (a table, not logic; ParallelCluster's update_policy.py is the model).

Everything else that names slurm.conf keys is derived from this table:
- the keys slurm.parameters may not set (`owned()`: spec/rules.py refuses them, naming the field);
- the keys whose change needs a daemon restart (`restart_keys()`: the slurm_common role's filter);
- the keys the slurm.conf template writes (`template_keys()`: tests/test_slurmkeys.py holds the two equal);
- the disruption class of a change (`change_class()`: `gpucluster diff`, docs/operations.md).

Each class names where it was read (`source`): the man pages Debian ships for the three lines gpucluster
runs (22.05.8, 24.11.5, 26.05.5), quoted below. 23.02 follows 22.05's pages, 23.11 to 25.11 follow 24.11's
(scontrol(1): the new reconfigure started in 23.11).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

# The releases of spec/slurm_versions.py (floor 1 cannot be imported from floor 0; tests/test_slurmkeys.py
# holds the two equal).
RELEASES: tuple[str, ...] = ("22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05")

# ---- change classes, least disruptive first ---------------------------------------------------------------
RECONFIGURE = "reconfigure"  # scontrol reconfigure: running jobs keep running
RESTART_SLURMCTLD = "restart-slurmctld"  # systemctl restart slurmctld (the controller only)
RESTART_SLURMD = "restart-slurmd"  # systemctl restart slurmd (every compute node)
RESTART = "restart"  # both: slurmctld, then every slurmd
CLASSES = (RECONFIGURE, RESTART_SLURMCTLD, RESTART_SLURMD, RESTART)

# ---- the sentences each class comes from --------------------------------------------------------------------
# slurm.conf(5) of 22.05.8, at the top: "Changes to the configuration file take effect upon restart of Slurm
# daemons, daemon receipt of the SIGHUP signal, or execution of the command "scontrol reconfigure" unless
# otherwise noted." So a key with no note is RECONFIGURE.
UNLESS_NOTED = "slurm.conf(5) 22.05.8: changes take effect on 'scontrol reconfigure' unless otherwise noted"
# The notes, per key, in slurm.conf(5) of 22.05.8:
CTLD_22 = 'slurm.conf(5) 22.05.8: "A restart of slurmctld is required for changes to this parameter to take effect."'
BOTH_22 = ('slurm.conf(5) 22.05.8: "A restart of slurmctld and the slurmd daemons is required for changes to this '
           'parameter to take effect."')
SLURMD_22 = 'slurm.conf(5) 22.05.8: "A restart of the slurmd daemons is required for changes to this parameter"'
AUTH = ('slurm.conf(5) 22.05.8, 24.11.5, 26.05.5, AuthType: "All Slurm daemons and commands must be terminated prior '
        'to changing the value of AuthType and later restarted."')
# Keys with no note in 22.05.8 that name a file, port, user or plugin the daemon takes once, at start (its pid
# file, its spool folder, the user it drops to): gpucluster restarts for them on 22.05 and 23.02, as it did
# before this table. Conservative: a restart on a quiet cluster costs seconds, a missed one leaves daemons on
# different settings.
AT_START = "read once at daemon start before 23.11 (no man page note; gpucluster's conservative choice)"
# scontrol(1) of 24.11.5 and 26.05.5, reconfigure: "Starting in 23.11, this command operates by creating new
# processes for the daemons, then passing control to the new processes when or if they start up successfully.
# [...] This will not be able to change the daemons' listening TCP port settings or authentication mechanism."
# And slurm.conf(5) of 24.11.5 and 26.05.5, at the top: "Changes to TCP listening settings will require a daemon
# restart." So from 23.11 every key reconfigures, except the listening ports and the authentication.
SINCE_2311 = "scontrol(1) 24.11.5/26.05.5: 'Starting in 23.11' reconfigure starts new daemon processes"
PORTS_2311 = 'slurm.conf(5) 24.11.5/26.05.5: "Changes to TCP listening settings will require a daemon restart."'
# CommunicationParameters, slurm.conf(5) 22.05.8, 24.11.5 and 26.05.5: "NoCtldInAddrAny: Used to directly bind to
# the address of what the node resolves to running the slurmctld [...]", and "NoInAddrAny [...] is for all
# daemons/clients except for the slurmctld". A listening socket is made once, at start: measured on all three
# lines (tests/test_diff_classes_real.py), a reconfigure leaves each daemon listening on every address (23.11+'s
# new processes take the old socket), a slurmctld restart binds slurmctld alone, a slurmd restart its slurmd.
NO_CTLD_IN_ADDR_ANY = ('slurm.conf(5) 22.05.8-26.05.5, CommunicationParameters: "NoCtldInAddrAny Used to directly '
                       'bind to the address of what the node resolves to running the slurmctld"; 24.11.5/26.05.5: '
                       '"Changes to TCP listening settings will require a daemon restart."')
# Node definitions. slurm.conf(5) 22.05.8: "Changes in node configuration (e.g. adding nodes, changing their
# processor count, etc.) require restarting both the slurmctld daemon and the slurmd daemons."; 24.11.5 and
# 26.05.5: "... require restarting or reconfiguring all slurmctld and slurmd daemons." The change came with
# 23.11's new reconfigure (scontrol(1) above); 23.02's man page still says restart. Measured (tests/test_diff.py):
# 22.05.8's slurmctld stops on such a reconfigure ("fatal: MaxNodeCount has changed (4->6) during reconfig,
# slurmctld must be restarted"); 24.11.5 and 26.05.5 take the new nodes.
NODES_22 = 'slurm.conf(5) 22.05.8: node changes "require restarting both the slurmctld daemon and the slurmd daemons"'
NODES_2311 = 'slurm.conf(5) 24.11.5/26.05.5: nodes "require restarting or reconfiguring all slurmctld and slurmd"'
# SlurmctldHost: 22.05.8 "A restart of slurmctld is required"; 24.11.5 and 26.05.5: "Slurm daemons need to be
# reconfigured (e.g. "scontrol reconfig") for changes to this parameter to take effect."

# ---- value syntax -----------------------------------------------------------------------------------------------
TOKEN = "token"  # one word, no whitespace (a plugin, a path, a name)
LIST = "list"  # items joined by `sep`, each one token
KV_LIST = "kv-list"  # comma-separated flags and key=value items (SchedulerParameters, SlurmctldParameters)
NUMBER = "number"  # a whole number in [0, max]
CHOICE = "choice"  # one of `choices` (case-insensitive)
RECORD = "record"  # a line of several Key=Value (NodeName, PartitionName): never a slurm.parameters value
SYNTAXES = (TOKEN, LIST, KV_LIST, NUMBER, CHOICE, RECORD)

# Plugin values: those Debian's slurm-wlm-basic-plugins ships on all three lines gpucluster runs (22.05.8,
# 24.11.5, 26.05.5: the .so files under /usr/lib/x86_64-linux-gnu/slurm-wlm), and the built-in "none"s.
# A plugin slurmctld cannot load stops it ("Couldn't load specified plugin name"); spec/slurm_versions.py
# gates those a release removed (select/cons_res: gone in 23.11).
SCHEDULERS = ("sched/backfill", "sched/builtin")
SELECTS = ("select/cons_tres", "select/cons_res", "select/linear")
PRIORITIES = ("priority/basic", "priority/multifactor")
JOBCOMPS = ("jobcomp/none", "jobcomp/filetxt")
MPIS = ("none", "pmi2")
DEBUG_LEVELS = ("quiet", "fatal", "error", "info", "verbose", "debug", "debug2", "debug3", "debug4", "debug5")
UINT16_MAX = 65534  # Slurm's uint16 settings keep 65535 (NO_VAL16) for "unset"
UINT32_MAX = 4294967294


@dataclass(frozen=True)
class Flag:
    """One flag of a KV_LIST key that one daemon alone reads: a change to it (added, removed or given another
    value) needs less than a change to the rest of the key."""

    name: str
    changes: tuple[tuple[str, str], ...]
    source: str


@dataclass(frozen=True)
class Key:
    """One slurm.conf key gpucluster writes, owns or knows.

    owner: the spec field that sets it (slurm.parameters refuses it naming that field), or None when the
    user may set it through slurm.parameters. of: for an alias or companion, the key it stands beside
    (SlurmctldAddr beside SlurmctldHost); it is refused naming that key's owner. written: where gpucluster
    writes it ("template": slurm.conf.j2; "health": the health checks' lines; None: not written). changes:
    (first release, class) steps, oldest first: a release takes the last step at or before it. loses_jobs:
    on every release, a change to it loses the jobs it finds (drain the whole cluster first)."""

    name: str
    owner: str | None = None
    syntax: str = TOKEN
    sep: str = ","
    max: int = UINT32_MAX
    choices: tuple[str, ...] = ()
    of: str | None = None
    written: str | None = "template"
    changes: tuple[tuple[str, str], ...] = (("22.05", RECONFIGURE),)
    source: str = UNLESS_NOTED
    loses_jobs: str = ""  # the man page sentence when a change loses running jobs: the cluster must be empty
    value: str | None = None  # the fixed value gpucluster writes (slurm.conf.j2 writes these in table order)
    flags: tuple[Flag, ...] = ()  # flags classed apart from the key (value_change_class)


def _steps(before: str, after: str = RECONFIGURE) -> tuple[tuple[str, str], ...]:
    """A class on 22.05 and 23.02, and another from 23.11 (the new reconfigure)."""
    return (("22.05", before), ("23.11", after))


_CTLD = _steps(RESTART_SLURMCTLD)
_BOTH = _steps(RESTART)
_SLURMD = _steps(RESTART_SLURMD)
_ALWAYS = (("22.05", RESTART),)
_ROLES = "gpucluster's Slurm roles"
_CONTROLLER = "node_groups (role: controller)"
_PROFILE = "slurm.profile"
_ACCOUNTING = "slurm.accounting"

KEYS: tuple[Key, ...] = (
    # -- identity and daemons
    Key("ClusterName", "name", changes=_ALWAYS,
        source="slurmctld refuses to start on state saved under another ClusterName: a new name is a new cluster",
        loses_jobs="a new ClusterName starts from empty state (slurmctld will not read state saved under the old)"),
    Key("SlurmctldHost", _CONTROLLER, changes=_CTLD, source=CTLD_22 + "; 24.11.5: reconfigure"),
    Key("ControlMachine", _CONTROLLER, of="SlurmctldHost", written=None, changes=_CTLD, source=CTLD_22),
    Key("ControlAddr", _CONTROLLER, of="SlurmctldHost", written=None, changes=_CTLD, source=CTLD_22),
    Key("BackupController", _CONTROLLER, of="SlurmctldHost", written=None, changes=_CTLD, source=CTLD_22),
    Key("BackupAddr", _CONTROLLER, of="SlurmctldHost", written=None, changes=_CTLD, source=CTLD_22),
    Key("SlurmctldAddr", _CONTROLLER, of="SlurmctldHost", written=None, changes=_CTLD, source=CTLD_22),
    Key("SlurmUser", "gpucluster's Slurm packages (role slurm_common)", changes=_steps(RESTART), source=AT_START,
        value="slurm"),
    Key("SlurmdUser", "gpucluster's Slurm packages (role slurm_common)", changes=_SLURMD, source=AT_START,
        value="root"),
    Key("SlurmctldPort", f"{_ROLES} and validator", changes=_ALWAYS, source=CTLD_22 + "; " + PORTS_2311,
        value="6817"),
    Key("SlurmdPort", f"{_ROLES} and validator", changes=_ALWAYS, source=CTLD_22 + "; " + PORTS_2311,
        value="6818"),
    Key("AuthType", "gpucluster's munge setup (role munge)", changes=_ALWAYS, source=AUTH,
        value="auth/munge"),
    Key("StateSaveLocation", f"{_ROLES} (role slurm_controller)", changes=_CTLD, source=CTLD_22,
        value="/var/lib/slurm/slurmctld"),
    Key("SlurmdSpoolDir", f"{_ROLES} (role slurm_compute)", changes=_SLURMD, source=AT_START,
        value="/var/lib/slurm/slurmd"),
    Key("SlurmctldPidFile", _ROLES, changes=_CTLD, source=AT_START,
        value="/run/slurmctld.pid"),
    Key("SlurmdPidFile", _ROLES, changes=_SLURMD, source=AT_START,
        value="/run/slurmd.pid"),
    Key("SlurmctldLogFile", f"{_ROLES} and validator",
        value="/var/log/slurm/slurmctld.log"),
    Key("SlurmdLogFile", f"{_ROLES} and validator",
        value="/var/log/slurm/slurmd.log"),
    Key("SlurmctldDebug", syntax=CHOICE, choices=DEBUG_LEVELS),
    Key("SlurmdDebug", syntax=CHOICE, choices=DEBUG_LEVELS),
    Key("MpiDefault", syntax=CHOICE, choices=MPIS, changes=_SLURMD, source=AT_START),
    Key("ReturnToService", syntax=NUMBER, max=2),
    Key("PropagateResourceLimitsExcept", syntax=LIST),
    Key("Prolog", "slurm.prolog"),
    Key("Epilog", "slurm.epilog"),
    # -- health checks (render/health/slurmconf.py writes these lines)
    Key("HealthCheckProgram", "health (gpucluster's checks; health.enabled)", written="health"),
    Key("HealthCheckInterval", "health.interval", syntax=NUMBER, written="health"),
    Key("HealthCheckNodeState", "health.node_state", syntax=LIST, written="health"),
    # Licenses: the health checks' license, and the user's joined to it (render/slurm.py merges the two)
    Key("Licenses", syntax=LIST, written="health"),
    # -- process tracking and containment
    Key("ProctrackType", _PROFILE, changes=_CTLD, source=CTLD_22),
    Key("TaskPlugin", _PROFILE, syntax=LIST, changes=_SLURMD, source=AT_START),
    Key("JobAcctGatherType", _PROFILE, changes=_SLURMD, source=AT_START),
    Key("PrologFlags", _PROFILE, syntax=LIST, changes=_BOTH, source=AT_START),
    Key("SlurmdParameters", syntax=KV_LIST, changes=_SLURMD, source=AT_START),
    # -- scheduling
    Key("SchedulerType", syntax=CHOICE, choices=SCHEDULERS, changes=_CTLD, source=CTLD_22),
    Key("SelectType", syntax=CHOICE, choices=SELECTS, changes=_BOTH,
        source='slurm.conf(5) 22.05.8: "A restart of slurmctld and slurmd is required"',
        loses_jobs='slurm.conf(5) 22.05.8-26.05.5: "When changed, all job information (running and pending) will be '
                   'lost"'),
    Key("SelectTypeParameters", syntax=LIST, changes=_CTLD, source=CTLD_22),
    Key("GresTypes", "node_groups[].gpu", syntax=LIST, changes=_BOTH, source=BOTH_22),
    Key("TopologyPlugin", "slurm.topology", changes=_CTLD, source=AT_START),
    Key("TopologyParam", "slurm.topology", syntax=LIST, written=None),
    # 22.05.8 notes a restart for one flag only (no_backup_scheduling), which gpucluster never writes
    Key("SchedulerParameters", syntax=KV_LIST),
    Key("MaxJobCount", syntax=NUMBER, changes=_CTLD, source=CTLD_22),
    # -- scale
    Key("TreeWidth", syntax=NUMBER, max=65533),
    Key("SlurmctldTimeout", syntax=NUMBER, max=UINT16_MAX),
    Key("SlurmdTimeout", syntax=NUMBER, max=UINT16_MAX),
    Key("MessageTimeout", syntax=NUMBER, max=UINT16_MAX),
    Key("TCPTimeout", syntax=NUMBER, max=UINT16_MAX),
    Key("InactiveLimit", syntax=NUMBER, max=UINT16_MAX),
    Key("MinJobAge", syntax=NUMBER),
    Key("KillWait", syntax=NUMBER, max=UINT16_MAX),
    Key("Waittime", syntax=NUMBER, max=UINT16_MAX),
    # -- reboots (scontrol reboot; gpucluster rollout): slurmd runs RebootProgram, the script slurm_compute installs;
    # a node not back within ResumeTimeout is set DOWN "reboot timed out" (22.05.8's default, 60 s, is shorter
    # than a GPU server's firmware takes to boot)
    Key("RebootProgram"),
    Key("ResumeTimeout", syntax=NUMBER, max=UINT16_MAX),
    # -- accounting
    Key("AccountingStorageType", _ACCOUNTING, changes=_CTLD, source=AT_START),
    Key("AccountingStorageHost", f"{_ACCOUNTING} (slurmdbd runs on the first controller)", changes=_CTLD,
        source=AT_START),
    Key("AccountingStoragePort", _ACCOUNTING, changes=_CTLD, source=AT_START),
    Key("AccountingStorageTRES", _ACCOUNTING, syntax=LIST),
    Key("JobCompType", syntax=CHOICE, choices=JOBCOMPS),
    Key("PriorityType", syntax=CHOICE, choices=PRIORITIES, changes=_CTLD, source=AT_START),
    # -- records
    Key("NodeName", "node_groups", syntax=RECORD, changes=(("22.05", RESTART), ("23.11", RECONFIGURE)),
        source=NODES_22 + "; " + NODES_2311),
    Key("PartitionName", "slurm.partitions", syntax=RECORD),
    Key("Include", "gpucluster's rendered files (render the spec instead)", written=None),
    # -- not written, but a change to them needs a restart (a user may set them through slurm.parameters)
    Key("AuthAltTypes", syntax=LIST, written=None, changes=_ALWAYS, source=AUTH),
    Key("AuthAltParameters", syntax=KV_LIST, written=None, changes=_ALWAYS, source=AUTH),
    Key("AuthInfo", syntax=KV_LIST, written=None, changes=_ALWAYS, source=AUTH),
    Key("CommunicationParameters", syntax=KV_LIST, written=None, changes=_ALWAYS, source=PORTS_2311,
        flags=(Flag("NoCtldInAddrAny", (("22.05", RESTART_SLURMCTLD),), NO_CTLD_IN_ADDR_ANY),)),
    Key("CredType", written=None, changes=_CTLD, source=CTLD_22),
    Key("LaunchType", written=None, changes=_BOTH, source=AT_START),
    Key("PluginDir", written=None, changes=_BOTH, source=BOTH_22),
    # 22.05.8 notes a restart for its enable_configless flag; the key is taken whole here, to be safe. The
    # template writes it: enable_configless (configless Slurm, docs/roles.md) merged with the spec's flags.
    Key("SlurmctldParameters", syntax=KV_LIST, changes=_CTLD, source=CTLD_22 + " (enable_configless)"),
    Key("SwitchType", written=None, changes=_BOTH,
        source='slurm.conf(5) 22.05.8: "All Slurm daemons, commands and running jobs must be restarted"',
        loses_jobs='slurm.conf(5) 22.05.8-26.05.5: "If running jobs exist at the time slurmctld is restarted with a '
                   'new value of SwitchType, records of all jobs in any state may be lost."'),
)

BY_NAME: dict[str, Key] = {k.name.lower(): k for k in KEYS}


def key(name: str) -> Key | None:
    """The table's entry for a key, read as Slurm reads it (case-insensitively), or None."""
    return BY_NAME.get(name.lower())


def owned() -> dict[str, str]:
    """{key: the spec field that sets it} for every key slurm.parameters may not set (aliases included)."""
    return {k.name: k.owner for k in KEYS if k.owner}


_ITEM = re.compile(r"^[A-Za-z0-9_./:@%+*-]+$")  # one item of a list: no '=', ',' or whitespace
_FLAG = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(=[^\s,=]+)?$")  # one flag of a key=value list: name or name=value


def value_problem(name: str, value: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) with `value` for slurm.conf key `name`, or None when Slurm reads it as meant.

    Slurm's parser splits a line at whitespace, so a value with a space is two settings
    (`SlurmctldDebug=info HealthCheckInterval=7` sets HealthCheckInterval behind gpucluster's back): no
    value may hold whitespace or a quote. A key the table does not hold is taken as one token."""
    entry = key(name)
    syntax = entry.syntax if entry else TOKEN
    if any(c.isspace() for c in value) or '"' in value or "'" in value:
        what = "a list" if syntax in (LIST, KV_LIST) else "one token"
        return (f"'{value}' holds whitespace or a quote, and Slurm reads {name} as {what}: the rest would be "
                "read as further settings", f"write {name} without spaces or quotes")
    if not value:
        return f"{name} is empty", f"give {name} a value, or leave it out"
    if syntax == NUMBER:
        if not value.isdigit() or int(value) > entry.max:
            return (f"'{value}' is not a whole number from 0 to {entry.max}",
                    f"write {name} as a number up to {entry.max}")
    elif syntax == CHOICE:
        if value.lower() not in entry.choices:
            return (f"'{value}' is not one of {', '.join(entry.choices)}",
                    f"set {name} to one of {', '.join(entry.choices)}")
    elif syntax in (LIST, KV_LIST):
        pattern = _ITEM if syntax == LIST else _FLAG
        bad = [item for item in value.split(entry.sep) if not pattern.match(item)]
        if bad:
            shape = "NAME or NAME=VALUE" if syntax == KV_LIST else "one word"
            return (f"{', '.join(repr(b) for b in bad)} is not an item of {name}'s list (each item is {shape}, "
                    f"separated by '{entry.sep}')", f"write {name} as items separated by '{entry.sep}', none empty")
    return None


def change_class(name: str, version: str) -> str:
    """What a change to `name` needs on Slurm `version` (a release of RELEASES); a key the table does not
    hold reconfigures (slurm.conf(5): "unless otherwise noted")."""
    entry = key(name)
    return _step(entry.changes, version) if entry else RECONFIGURE


def value_change_class(name: str, old: str | None, new: str | None, version: str) -> tuple[str, str]:
    """(class, source) of `name` going from `old` to `new` on `version`: the key's own, unless every flag that
    differs is one the table classes apart (Key.flags); then the most disruptive of those flags' classes."""
    entry = key(name)
    if entry is None or not entry.flags:
        return change_class(name, version), entry.source if entry else UNLESS_NOTED
    items = [set((value or "").split(entry.sep)) - {""} for value in (old, new)]
    flags = {f.name.lower(): f for f in entry.flags}
    changed = {item.split("=", 1)[0].lower() for item in items[0] ^ items[1]}
    if not changed or not changed <= set(flags):
        return change_class(name, version), entry.source
    classes = sorted(((_step(flags[c].changes, version), flags[c].source) for c in changed),
                     key=lambda cs: CLASSES.index(cs[0]))
    return classes[-1]


def _step(changes: tuple[tuple[str, str], ...], version: str) -> str:
    """The class of the last (first release, class) step at or before `version`."""
    v = _tuple(version)
    out = RECONFIGURE
    for since, cls in changes:
        if _tuple(since) <= v:
            out = cls
    return out


def restart_keys(version: str | None = None) -> frozenset[str]:
    """Lower-case keys whose change needs a daemon restart on `version`; with None, on any supported
    release (what a role that does not know the running release must assume). Records (NodeName lines)
    are compared whole, by `change_class("NodeName", version)`."""
    versions = RELEASES if version is None else (version,)
    return frozenset(k.name.lower() for k in KEYS for v in versions
                     if k.syntax != RECORD and change_class(k.name, v) != RECONFIGURE)


def fixed_settings() -> list[tuple[str, str]]:
    """(key, value) of the settings gpucluster always writes as they are: the daemons' users, ports, auth,
    folders, pid and log files (roles install to these paths and ports; the validator checks them)."""
    return [(k.name, k.value) for k in KEYS if k.value is not None]


def template_keys() -> frozenset[str]:
    """The keys slurm.conf.j2 writes itself (the health checks' lines come from render/health/slurmconf.py)."""
    return frozenset(k.name for k in KEYS if k.written == "template")


def _tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


# ---- every key each line's slurm.conf(5) documents (its PARAMETERS section), for `check` ----------------------------
# A key slurmctld does not know stops it ("Parsing error at unrecognized key"), so slurm.parameters may only name
# these, the table's keys above and the version table's (spec/slurm_versions.py). Read from Debian's pages of the
# lines gpucluster runs; a release between two lines takes the older line's list (never a key too new for it).
_MAN_22 = """
AccountingStorageBackupHost AccountingStorageEnforce AccountingStorageExternalHost AccountingStorageHost
AccountingStorageParameters AccountingStoragePass AccountingStoragePort AccountingStorageTRES AccountingStorageType
AccountingStorageUser AccountingStoreFlags AcctGatherEnergyType AcctGatherFilesystemType AcctGatherInterconnectType
AcctGatherNodeFreq AcctGatherProfileType AllowSpecResourcesUsage AuthAltParameters AuthAltTypes AuthInfo AuthType
BackupAddr BackupController BatchStartTimeout BcastExclude BcastParameters BurstBufferType CliFilterPlugins
ClusterName CommunicationParameters CompleteWait ControlAddr ControlMachine CoreSpecPlugin CpuFreqDef
CpuFreqGovernors CredType DebugFlags DefCpuPerGPU DefMemPerCPU DefMemPerGPU DefMemPerNode DependencyParameters
DisableRootJobs EioTimeout EnforcePartLimits EpilogMsgTime EpilogSlurmctld ExtSensorsFreq ExtSensorsType
FairShareDampeningFactor FederationParameters FirstJobId GetEnvTimeout GresTypes GroupUpdateForce GroupUpdateTime
HealthCheckInterval HealthCheckNodeState HealthCheckProgram InactiveLimit InteractiveStepOptions
JobAcctGatherFrequency JobAcctGatherParams JobAcctGatherType JobCompHost JobCompLoc JobCompParams JobCompPass
JobCompPort JobCompType JobCompUser JobContainerType JobFileAppend JobRequeue JobSubmitPlugins KillOnBadExit
KillWait LaunchParameters LaunchType Licenses LogTimeFormat MCSParameters MCSPlugin MailDomain MailProg MaxArraySize
MaxDBDMsgs MaxJobCount MaxJobId MaxMemPerCPU MaxMemPerNode MaxNodeCount MaxStepCount MaxTasksPerNode MessageTimeout
MinJobAge MpiDefault MpiParams NodeFeaturesPlugins OverTimeLimit PlugStackConfig PluginDir PowerParameters
PowerPlugin PrEpParameters PrEpPlugins PreemptExemptTime PreemptMode PreemptType PriorityCalcPeriod
PriorityDecayHalfLife PriorityFavorSmall PriorityFlags PriorityMaxAge PriorityParameters
PrioritySiteFactorParameters PrioritySiteFactorPlugin PriorityType PriorityUsageResetPeriod PriorityWeightAge
PriorityWeightAssoc PriorityWeightFairshare PriorityWeightJobSize PriorityWeightPartition PriorityWeightQOS
PriorityWeightTRES PrivateData ProctrackType PrologEpilogTimeout PrologFlags PrologSlurmctld PropagatePrioProcess
PropagateResourceLimits PropagateResourceLimitsExcept RebootProgram ReconfigFlags RequeueExit RequeueExitHold
ResumeFailProgram ResumeProgram ResumeRate ResumeTimeout ResvEpilog ResvOverRun ResvProlog ReturnToService
RoutePlugin SchedulerParameters SchedulerTimeSlice SchedulerType ScronParameters SelectType SelectTypeParameters
SlurmSchedLogFile SlurmSchedLogLevel SlurmUser SlurmctldAddr SlurmctldDebug SlurmctldHost SlurmctldLogFile
SlurmctldParameters SlurmctldPidFile SlurmctldPlugstack SlurmctldPort SlurmctldPrimaryOffProg SlurmctldPrimaryOnProg
SlurmctldSyslogDebug SlurmctldTimeout SlurmdDebug SlurmdLogFile SlurmdParameters SlurmdPidFile SlurmdPort
SlurmdSpoolDir SlurmdSyslogDebug SlurmdTimeout SlurmdUser SrunEpilog SrunPortRange SrunProlog StateSaveLocation
SuspendExcNodes SuspendExcParts SuspendProgram SuspendRate SuspendTime SuspendTimeout SwitchParameters SwitchType
TCPTimeout TaskEpilog TaskPlugin TaskPluginParam TaskProlog TopologyParam TopologyPlugin TrackWCKey TreeWidth
UnkillableStepProgram UnkillableStepTimeout VSizeFactor WaitTime X11Parameters"""
# 24.11.5 and 26.05.5: what they add to 22.05.8's list, and what they no longer document
_MAN_24_ADDED = """
HashPlugin MaxBatchRequeue PreemptParameters SuspendExcStates"""
_MAN_24_GONE = """
CoreSpecPlugin ExtSensorsFreq ExtSensorsType LaunchType PowerParameters PowerPlugin RoutePlugin SlurmctldPlugstack"""
_MAN_26_ADDED = """
CertgenParameters CertgenType CertmgrParameters CertmgrType CliFilterParameters EpilogTimeout HashPlugin
HealthCheckTimeout HttpParserType JobCompPassScript LicenseParameters MaxBatchRequeue MetricsAuthUsers
MetricsParameters MetricsType NamespaceType PreemptParameters PrologTimeout SlurmctldHttpAuthParameters
SlurmdHttpAuthParameters SuspendExcStates TLSParameters TLSType UrlParserType"""
_MAN_26_GONE = """
AccountingStorageUser BackupAddr BackupController ControlAddr ControlMachine CoreSpecPlugin ExtSensorsFreq
ExtSensorsType GetEnvTimeout JobContainerType LaunchType PowerParameters PowerPlugin RoutePlugin SlurmctldPlugstack"""


def _names(text: str) -> frozenset[str]:
    return frozenset(text.lower().split())


MAN_KEYS: dict[str, frozenset[str]] = {
    "22.05": _names(_MAN_22),
    "24.11": (_names(_MAN_22) | _names(_MAN_24_ADDED)) - _names(_MAN_24_GONE),
    "26.05": (_names(_MAN_22) | _names(_MAN_26_ADDED)) - _names(_MAN_26_GONE),
}
# The names as the man pages spell them, for suggestions.
SPELLED: dict[str, str] = {n.lower(): n for text in (_MAN_22, _MAN_24_ADDED, _MAN_26_ADDED) for n in text.split()}
SPELLED.update({k.name.lower(): k.name for k in KEYS})


def suggest(name: str) -> str:
    """The documented key `name` most likely misspells, as the man pages spell it ("" when none is close)."""
    close = difflib.get_close_matches(name.lower()[:64], sorted(SPELLED), n=1, cutoff=0.8)
    return SPELLED[close[0]] if close else ""


def documented(name: str, version: str) -> bool:
    """Whether `name` is a slurm.conf key of Slurm `version`: one gpucluster writes, or one the man page of
    the line at or before that release documents (22.05.8 for 22.05 and 23.02, 24.11.5 for 23.11 to 25.11,
    26.05.5 for 26.05)."""
    entry = key(name)
    if entry and (entry.written or entry.syntax == RECORD or entry.name == "Include"):
        return True
    line = max((v for v in MAN_KEYS if _tuple(v) <= _tuple(version)), key=_tuple)
    return name.lower() in MAN_KEYS[line]
