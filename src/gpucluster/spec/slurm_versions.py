"""The Slurm releases gpucluster renders for, and what each one takes: a table, not logic.

Every entry says when a slurm.conf key, a value of a key (a plugin, or one flag of a comma-separated
list), or a feature gpucluster renders was added, deprecated or removed, and where that was read:
- SchedMD's CHANGELOG/slurm-YY.MM.md (the SchedMD/slurm repository): the section a line sits in is the
  release that made the change;
- slurm.conf(5), topology.conf(5), topology.yaml(5) and gres.conf(5) as Debian ships them for 22.05.8
  (bookworm), 24.11.5 (trixie) and 26.05.5 (sid);
- "measured": what those three slurmctld builds did with the key (tests/test_slurm_versions_real.py
  checks the table against them on every CI run).
Where only an upper bound is known (a key defunct in 24.11.5 but present in 22.05.8's manual), the entry
says so (`exact=False`) and messages say "by" rather than "in".

The spec checks (spec/versions.py) and the renderer (render/slurm.py, render/topology.py) read this table;
adding a release or a key is an edit here and a test run, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

# Two releases a year; gpucluster renders for each and verifies on the lines in emulate/roots.py.
RELEASES: tuple[str, ...] = ("22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05")

CHANGELOG = "SchedMD CHANGELOG/slurm-{}.md"
MAN = "{}(5) of Debian's Slurm {}"
MEASURED = "measured: slurmctld {}"


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def is_release(version: str) -> bool:
    return version in RELEASES


def previous(version: str) -> str | None:
    """The release before `version` (None for the oldest)."""
    i = RELEASES.index(version)
    return RELEASES[i - 1] if i else None


@dataclass(frozen=True)
class Change:
    """One setting whose support changed across RELEASES.

    `key` is a slurm.conf key a user may set through slurm.parameters (None: a feature only gpucluster
    renders, named by `feature`); `value` narrows it to one value of the key, or one flag of a
    comma-separated key (compared case-insensitively, and before any '=')."""

    setting: str
    key: str | None = None
    value: str | None = None
    feature: str | None = None
    added: str | None = None
    deprecated: str | None = None
    removed: str | None = None
    replacement: str = ""  # the fix, as an instruction ("use X=Y", "remove it")
    source: str = ""
    exact: bool = True  # False: `removed` is the first release seen without it, maybe later than the truth
    example: str | None = None  # the full value tests set (default: `value`, or "1")
    silent: bool = False  # the real slurmctld neither fails nor logs when this is used outside its span

    def supported(self, version: str) -> bool:
        v = version_tuple(version)
        if self.added and v < version_tuple(self.added):
            return False
        return not (self.removed and v >= version_tuple(self.removed))

    def deprecated_in(self, version: str) -> bool:
        return bool(self.deprecated and self.supported(version)
                    and version_tuple(version) >= version_tuple(self.deprecated))

    def matches(self, key: str, value: str) -> bool:
        if self.key is None or key.lower() != self.key.lower():
            return False
        if self.value is None:
            return True
        wanted = self.value.lower()
        if "/" in wanted:  # a plugin: the whole value
            return value.strip().lower() == wanted
        return wanted in {item.split("=", 1)[0].strip().lower() for item in value.split(",")}

    @property
    def test_value(self) -> str:
        if self.example is not None:
            return self.example
        return self.value if self.value is not None else "1"


def _flag(key: str, flag: str, **kw) -> Change:
    return Change(f"{key}={flag}", key=key, value=flag, **kw)


def _key(key: str, **kw) -> Change:
    return Change(key, key=key, **kw)


# Features gpucluster renders (spec fields choose them); the renderer and the spec checks ask by `feature`.
FEATURES: tuple[Change, ...] = (
    Change("TopologyPlugin=topology/block", feature="topology-block", added="23.11",
           source=CHANGELOG.format("24.05") + " ('topology/block - Replaced the BlockLevels with BlockSizes') and "
           + MAN.format("topology.conf", "24.11.5") + "; absent from " + MAN.format("slurm.conf", "22.05.8")),
    Change("BlockSizes (topology/block)", feature="block-sizes", added="24.05",
           source=CHANGELOG.format("24.05") + ": 'topology/block - Replaced the BlockLevels with BlockSizes in "
           "topology.conf'"),
    Change("blocks with fewer nodes than the base BlockSize", feature="block-below-base", added="25.05",
           source=CHANGELOG.format("25.05") + ": 'Allow topology/block Block definitions to have fewer nodes than "
           "the minimum BlockSize'; " + MEASURED.format("24.11.5") + " refuses ('children count lower than "
           "bblock_node_cnt')"),
    Change("topology.yaml with named topologies, PartitionName Topology=", feature="topology-yaml", added="25.05",
           source=CHANGELOG.format("25.05") + ": 'Add ability to configure multiple topology plugins via the new "
           "topology.yaml configuration file'; " + MAN.format("topology.yaml", "26.05.5")),
    Change("dynamic topology (NodeName Topology=, slurmd --conf topology=)", feature="dynamic-topology",
           added="25.11",
           source=CHANGELOG.format("25.11") + ": 'Allow cloud nodes to dynamically set topology at registration "
           "with slurmd --conf=\"topology=...\"'; " + MAN.format("slurm.conf", "26.05.5") + " (NodeName Topology=)"),
    Change("TopologyPlugin=topology/ring", feature="topology-ring", added="26.05",
           source=CHANGELOG.format("26.05") + ": 'Add new topology/ring plugin'"),
    Change("topology.yaml torus3d", feature="topology-torus3d", added="26.05",
           source=CHANGELOG.format("26.05") + ": 'Add topology/torus3d plugin for 3D torus network topologies'"),
    Change("an invalid BlockSizes in topology.yaml is fatal", feature="block-sizes-fatal-yaml", added="26.05",
           source=MEASURED.format("26.05.5") + ": 'fatal: Invalid BlockSizes value in topology NAME' (topology.conf "
           "has refused one since 24.05: BlockSizes each a power-of-two multiple of the first, at most 2^15)"),
    Change("gres.conf AutoDetect=nvidia", feature="gres-autodetect-nvidia", added="24.11",
           source=MAN.format("gres.conf", "24.11.5") + " lists AutoDetect=nvidia; " + MAN.format("gres.conf", "22.05.8")
           + " does not"),
    _flag("HealthCheckNodeState", "NONDRAINED_IDLE", feature="hc-nondrained-idle", added="23.02",
          source=CHANGELOG.format("23.02") + ": 'Add HealthCheckNodeState=NONDRAINED_IDLE option'; "
          + MEASURED.format("22.05.8") + ": 'Invalid HealthCheckNodeState value NONDRAINED_IDLE ignored'"),
    _flag("HealthCheckNodeState", "START_ONLY", feature="hc-start-only", added="25.11",
          source=CHANGELOG.format("25.11") + ": 'Add HealthCheckNodeState=START_ONLY option'; "
          + MEASURED.format("24.11.5") + " ignores it with an error"),
    _flag("HealthCheckNodeState", "REBOOT_ONLY", feature="hc-reboot-only", added="26.05",
          source=CHANGELOG.format("26.05") + ": 'Add HealthCheckNodeState=REBOOT_ONLY option'"),
)

# slurm.conf keys and values a user may set through slurm.parameters.
PARAMETERS: tuple[Change, ...] = (
    # --- 23.02
    _key("MaxBatchRequeue", added="23.02", example="5",
         source=CHANGELOG.format("23.02") + ": 'Add configurable job requeue limit parameter - MaxBatchRequeue'; "
         + MEASURED.format("22.05.8") + ": unrecognized key"),
    _key("SuspendExcStates", added="23.02", example="down",
         source=CHANGELOG.format("23.02") + ": 'Add SuspendExcStates option to slurm.conf'; "
         + MEASURED.format("22.05.8") + ": unrecognized key"),
    _key("PreemptParameters", added="23.02", example="reclaim_licenses",
         source=CHANGELOG.format("23.02") + ": 'Add new PreemptParameters=reclaim_licenses option'; "
         + MEASURED.format("22.05.8") + ": unrecognized key"),
    _flag("ReconfigFlags", "KeepPowerSaveSettings", added="23.02",
          source=CHANGELOG.format("23.02") + ": 'ReconfigFlags=KeepPowerSaveSettings'; " + MEASURED.format("22.05.8")
          + ": 'Invalid ReconfigFlag'"),
    _flag("DebugFlags", "JobComp", added="23.02",
          source=CHANGELOG.format("23.02") + ": 'Add new DebugFlags option JobComp to replace Elasticsearch'; "
          + MEASURED.format("22.05.8") + ": 'Invalid DebugFlag'"),
    _flag("DebugFlags", "Elasticsearch", deprecated="23.02", replacement="use DebugFlags=JobComp", silent=True,
          source=CHANGELOG.format("23.02") + "; " + MAN.format("slurm.conf", "26.05.5") + ": 'deprecated. Alias of "
          "JobComp'"),
    _flag("SlurmctldParameters", "rl_enable", added="23.02", silent=True,
          source=CHANGELOG.format("23.02") + ": 'RPC rate limiting ... SlurmctldParameters=rl_enable'"),
    _flag("SlurmctldParameters", "validate_nodeaddr_threads", added="23.02", silent=True,
          example="validate_nodeaddr_threads=4",
          source=CHANGELOG.format("23.02") + ": 'Add new SlurmctldParameters=validate_nodeaddr_threads'"),
    _flag("CommunicationParameters", "getnameinfo_cache_timeout", added="23.02", silent=True,
          example="getnameinfo_cache_timeout=60",
          source=CHANGELOG.format("23.02") + ": 'Add CommunicationParameters=getnameinfo_cache_timeout'"),
    _flag("LaunchParameters", "ulimit_pam_adopt", added="23.02", silent=True,
          source=CHANGELOG.format("23.02") + ": 'Add LaunchParameters=ulimit_pam_adopt'"),
    _flag("SchedulerParameters", "defer_batch", added="23.02", silent=True,
          source=CHANGELOG.format("23.02") + ": 'Add new defer_batch option to SchedulerParameters'"),
    _flag("JobAcctGatherParams", "DisableGPUAcct", added="23.02", silent=True,
          source=CHANGELOG.format("23.02") + " (23.02.7): 'Add JobAcctGatherParams=DisableGPUAcct'"),
    _key("LaunchType", removed="23.02", silent=True, replacement="remove it (srun launches steps itself)",
         source=CHANGELOG.format("23.02") + ": \"Removed 'launch' plugin\"; " + MEASURED.format("24.11.5")
         + " ignores the key"),
    # --- 23.11
    Change("SelectType=select/cons_res", key="SelectType", value="select/cons_res", removed="23.11",
           replacement="use SelectType=select/cons_tres",
           source=CHANGELOG.format("23.11") + ": 'Removed select/cons_res. Please update your configuration to "
           "select/cons_tres'; " + MEASURED.format("24.11.5") + ": fatal"),
    _key("RoutePlugin", removed="23.11", silent=True,
         replacement="remove it (TopologyParam=RouteTree replaced it; gpucluster sets TopologyParam)",
         source=CHANGELOG.format("23.11") + ": 'RoutePlugin=route/topology has been replaced with "
         "TopologyParam=RouteTree'; " + MEASURED.format("24.11.5") + " ignores the key"),
    _flag("CommunicationParameters", "NoAddrCache", removed="23.11", replacement="remove it",
          source=CHANGELOG.format("23.11") + ": 'Remove NoAddrCache CommunicationParameter'; "
          + MEASURED.format("24.11.5") + ": 'is defunct'"),
    _flag("SchedulerParameters", "extra_constraints", added="23.11", silent=True,
          source=CHANGELOG.format("23.11") + ": 'Add SchedulerParameters=extra_constraints'"),
    _flag("SchedulerParameters", "max_submit_line_size", added="23.11", silent=True,
          example="max_submit_line_size=1000000",
          source=CHANGELOG.format("23.11") + ": 'Added max_submit_line_size to SchedulerParameters'"),
    _flag("SchedulerParameters", "time_min_as_soft_limit", added="23.11", silent=True,
          source=CHANGELOG.format("23.11") + ": 'Add SchedulerParameters=time_min_as_soft_limit option'"),
    _flag("SlurmctldParameters", "no_quick_restart", added="23.11", silent=True,
          source=CHANGELOG.format("23.11") + ": 'Add SlurmctldParameters=no_quick_restart'"),
    _flag("PreemptParameters", "suspend_grace_time", added="23.11", example="suspend_grace_time=5",
          source=CHANGELOG.format("23.11") + ": 'Add PreemptParameters=suspend_grace_time parameter'"),
    _flag("LogTimeFormat", "format_stderr", added="23.11", removed="25.05", silent=True,
          replacement="remove it (logs and stderr always use the same format)", example="iso8601_ms,format_stderr",
          source=CHANGELOG.format("23.11") + ": 'Add format_stderr to LogTimeFormat'; " + CHANGELOG.format("25.05")
          + ": 'Remove LogTimeFormat=format_stderr'"),
    # --- 24.05
    _flag("SlurmctldParameters", "enable_stepmgr", added="24.05", silent=True,
          source=CHANGELOG.format("24.05") + ": 'Add SlurmctldParameters=enable_stepmgr'"),
    _flag("SlurmctldParameters", "max_powered_nodes", added="24.05", silent=True, example="max_powered_nodes=100",
          source=CHANGELOG.format("24.05") + ": 'Add SlurmctldParameters=max_powered_nodes=N'"),
    _flag("SlurmdParameters", "contain_spank", added="24.05", silent=True,
          source=CHANGELOG.format("24.05") + ": 'Add contain_spank option to SlurmdParameters'"),
    _flag("AccountingStorageParameters", "max_step_records", added="24.05", silent=True,
          example="max_step_records=100",
          source=CHANGELOG.format("24.05") + ": 'Add AccountingStorageParameters=max_step_records'"),
    # --- removed by 24.11 (defunct in 24.11.5, documented in 22.05.8; the release between is not recorded)
    *(_key(k, removed="24.11", exact=False, replacement="remove it", example=ex,
           source=MAN.format("slurm.conf", "22.05.8") + " documents it; " + MEASURED.format("24.11.5")
           + ": 'The option \"" + k + "\" is defunct'")
      for k, ex in (("ExtSensorsType", "ext_sensors/none"), ("ExtSensorsFreq", "10"), ("PowerPlugin", "power/none"),
                    ("PowerParameters", "balance_interval=60"), ("CoreSpecPlugin", "core_spec/none"))),
    # --- 24.11
    _key("DataParserParameters", added="24.11", example="v0.0.42",
         source=CHANGELOG.format("24.11") + ": 'Add DataParserParameters slurm.conf parameter'; "
         + MEASURED.format("22.05.8") + ": unrecognized key"),
    _flag("TaskPluginParam", "OOMKillStep", added="24.11",
          source=CHANGELOG.format("24.11") + ": 'Add TaskPluginParam=OOMKillStep'; " + MEASURED.format("22.05.8")
          + ": 'Bad TaskPluginParam'"),
    _flag("SchedulerParameters", "bf_allow_magnetic_slot", added="24.11", silent=True,
          source=CHANGELOG.format("24.11") + ": 'Add SchedulerParameters=bf_allow_magnetic_slot option'"),
    _flag("SchedulerParameters", "bf_topopt_enable", added="24.11", silent=True,
          source=CHANGELOG.format("24.11") + ": 'Add SchedulerParameters=bf_topopt_enable option'"),
    _flag("SlurmctldParameters", "ignore_constraint_validation", added="24.11", silent=True,
          source=CHANGELOG.format("24.11") + ": 'Add SlurmctldParamters=ignore_constraint_validation'"),
    # --- 25.05
    _key("PrologTimeout", added="25.05", example="300",
         source=CHANGELOG.format("25.05") + ": 'Added slurm.conf parameters PrologTimeout and EpilogTimout'; "
         + MEASURED.format("24.11.5") + ": unrecognized key"),
    _key("EpilogTimeout", added="25.05", example="300",
         source=CHANGELOG.format("25.05") + ": 'Added slurm.conf parameters PrologTimeout and EpilogTimout'"),
    _key("GetEnvTimeout", deprecated="25.05", removed="26.05", exact=False, example="2",
         replacement="remove it (the user environment is read with a fixed 120 s timeout)",
         source=CHANGELOG.format("25.05") + ": 'Deprecate \"GetEnvTimeout\" from slurm.conf'; "
         + MEASURED.format("26.05.5") + ": 'The option \"GetEnvTimeout\" is defunct' (25.11 not measured)"),
    _flag("SchedulerParameters", "no_env_cache", deprecated="25.05", silent=True, replacement="remove it",
          source=CHANGELOG.format("25.05") + ": 'Deprecate SchedulerParameters=no_env_cache and requeue_setup_env'"),
    _flag("SchedulerParameters", "requeue_setup_env", deprecated="25.05", silent=True, replacement="remove it",
          source=CHANGELOG.format("25.05") + ": 'Deprecate SchedulerParameters=no_env_cache and requeue_setup_env'"),
    _flag("TaskPluginParam", "SlurmdSpecOverride", added="25.05",
          source=CHANGELOG.format("25.05") + ": 'Add new TaskPluginParam=SlurmdSpecOverride'; "
          + MEASURED.format("24.11.5") + ": 'Bad TaskPluginParam'"),
    _flag("CommunicationParameters", "host_unreach_retry_count", added="25.05", silent=True,
          example="host_unreach_retry_count=3",
          source=CHANGELOG.format("25.05") + ": 'Add CommunicationParameters=host_unreach_retry_count=#'"),
    # --- 25.11
    _key("MetricsType", added="25.11", example="metrics/openmetrics",
         source=CHANGELOG.format("25.11") + ": 'Add MetricsType option to slurm.conf'; " + MEASURED.format("24.11.5")
         + ": unrecognized key"),
    _key("HttpParserType", added="25.11", example="http_parser/libhttp_parser",
         source=CHANGELOG.format("25.11") + ": 'Add HttpParserType parameter to slurm.conf'"),
    _key("UrlParserType", added="25.11", example="url_parser/libhttp_parser",
         source=CHANGELOG.format("25.11") + ": 'Add UrlParserType parameter to slurm.conf'"),
    _key("CliFilterParameters", added="25.11", example="cli_filter_lua_path=/etc/slurm/cli_filter.lua",
         source=CHANGELOG.format("25.11") + ": 'Add a new CliFilterParameters=cli_filter_lua_path=<path>'"),
    _key("NamespaceType", added="25.11", example="namespace/tmpfs",
         source=CHANGELOG.format("25.11") + ": 'Change job_container/tmpfs plugin to be named namespace/tmpfs'; "
         + MEASURED.format("24.11.5") + ": unrecognized key"),
    _key("JobContainerType", deprecated="25.11", replacement="use NamespaceType=namespace/tmpfs",
         example="job_container/tmpfs",
         source=CHANGELOG.format("25.11") + ": 'Change job_container/tmpfs plugin to be named namespace/tmpfs'; "
         + MEASURED.format("26.05.5") + ": 'JobContainerType has been replaced with NamespaceType and will be "
         "removed in a future release'"),
    _flag("DebugFlags", "Namespace", added="25.11",
          source=CHANGELOG.format("25.11") + ": 'Rename DebugFlags=JobContainer to DebugFlags=Namespace'; "
          + MEASURED.format("24.11.5") + ": 'Invalid DebugFlag'"),
    _flag("DebugFlags", "JobContainer", deprecated="25.11", replacement="use DebugFlags=Namespace", silent=True,
          source=CHANGELOG.format("25.11") + ": 'Rename DebugFlags=JobContainer to DebugFlags=Namespace'"),
    _flag("CommunicationParameters", "disable_http", added="25.11", silent=True,
          source=CHANGELOG.format("25.11") + ": 'Add CommunicationParameters=disable_http to slurm.conf'"),
    _flag("SlurmctldParameters", "reconfig_on_restart", added="25.11", silent=True,
          source=CHANGELOG.format("25.11") + ": \"Add a new 'reconfig_on_restart' to 'SlurmctldParameters'\""),
    _flag("SlurmctldParameters", "enable_async_reply", added="25.11", silent=True,
          source=CHANGELOG.format("25.11") + ": 'Add SlurmctldParameters=enable_async_reply to slurm.conf'"),
    _flag("LaunchParameters", "interactive_step_set_cpu_freq", added="25.11", silent=True,
          source=CHANGELOG.format("25.11") + ": 'Add interactive_step_set_cpu_freq parameter to the list of "
          "LaunchParameters'"),
    # --- 26.05
    _flag("DebugFlags", "thread", added="26.05",
          source=CHANGELOG.format("26.05") + ": 'Add \"thread\" as possible flag to \"debugflags=\"'; "
          + MEASURED.format("24.11.5") + ": 'Invalid DebugFlag'"),
    _flag("JobCompParams", "send_comment", added="26.05", silent=True,
          source=CHANGELOG.format("26.05") + ": \"a new JobCompParams of 'send_comment'\""),
)

CHANGES: tuple[Change, ...] = FEATURES + PARAMETERS
_BY_FEATURE = {c.feature: c for c in FEATURES if c.feature}


def feature(name: str) -> Change:
    return _BY_FEATURE[name]


def has(version: str, name: str) -> bool:
    """Whether release `version` has the feature `name` (a FEATURES entry)."""
    return feature(name).supported(version)


def changes_for(key: str, value: str) -> list[Change]:
    """Table entries a slurm.parameters key (with its value) touches."""
    return [c for c in CHANGES if c.matches(key, value)]
