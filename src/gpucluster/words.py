"""The words the CLI prints and takes: counts in words (`1 warning`, `2 warnings`, numbers with thousands commas),
help text without markup, and the one meaning of each flag name (FLAGS)."""

from __future__ import annotations

from typing import NamedTuple

# Plurals that are not the singular + "s".
_IRREGULAR = {"leaf": "leaves", "switch": "switches", "chassis": "chassis", "is": "are", "has": "have"}


def plural_of(word: str) -> str:
    head, _, last = word.rpartition(" ")
    many = _IRREGULAR.get(last) or (last[:-1] + "ies" if last.endswith("y") and last[-2:-1] not in "aeiou"
                                    else last + "es" if last.endswith(("s", "sh", "ch", "x")) else last + "s")
    return f"{head} {many}" if head else many


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 rail', '8 rails', '24,576 GPUs' (pass `many` where the plural is not regular: 'GPUs')."""
    return f"{n:,} {word if n == 1 else (many or plural_of(word))}"


def number(x: float) -> str:
    """24576 -> '24,576'; 40000.0 -> '40,000'; 251658.24 -> '251,658.24' (never '40,000.0')."""
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.3f}".rstrip("0").rstrip(".")


def plain(doc: str | None) -> str:
    """A module docstring as a command's --help description: the reST/Markdown code marks (``x``, `x`) a
    terminal shows literally are dropped, and the text kept as written (no markup in help)."""
    return (doc or "").replace("``", "").replace("`", "").strip()


class Flag(NamedTuple):
    """One flag name's one meaning across the whole CLI. `kind` is what the value is (switch: none;
    int, float, text; choice: one of a list); `shown` names the value as --help prints it (its metavar), one of
    these where several fit (a folder or a file); `meaning` says what the flag does on every command that has it."""

    kind: str
    shown: tuple[str, ...]
    meaning: str


def _f(kind: str, shown: str, meaning: str) -> Flag:
    return Flag(kind, tuple(shown.split(" ")) if shown else (), meaning)


# Every option of every command, by name. tests/test_cli_flags.py walks the parser tree and fails when an option is
# missing here, when a use differs in kind or value from its line, and when a line has no use. A new flag, or a new
# command that takes an existing one, adds or reuses a line here; a name wanted with another meaning gets a new
# name instead (the old one kept for a release with gpucluster.commands._flags.deprecated_alias, which warns).
_OUTPUT = _f("text", "DIR FILE", "where the command writes: a folder (replaced as a whole set) or a file")
_LIMIT = _f("text", "PATTERN", "only these hosts or groups, as an Ansible pattern ('gpu[001-064]', 'slurm_compute')")
_VERBOSE = _f("switch", "", "also print the underlying tool's own output (Ansible, pytest)")
_HELP = _f("switch", "", "show the help and exit")
_WORKERS = _f("text", "N", "hosts validated in parallel (or auto)")
FLAGS: dict[str, Flag] = {
    # every command
    "-h": _HELP, "--help": _HELP,
    "--version": _f("switch", "", "print gpucluster's version and exit"),
    # every command that prints a report
    "--json": _f("switch", "", "the report as one JSON document on stdout (progress and notes go to stderr)"),
    "--no-color": _f("switch", "", "plain text even on a terminal; a non-empty NO_COLOR does the same"),
    # what to read and where to write
    "-o": _OUTPUT, "--output": _OUTPUT,
    "--spec": _f("text", "SPEC", "the cluster spec, where the inventory's own gpucluster_spec is not the one"),
    "--inventory": _f("text", "DIR", "the inventory folder to write or remove (default inventories/<cluster>)"),
    "--state-dir": _f("text", "DIR", "the cluster's private state folder (keys, ports, compiled facts, rollout state)"),
    "--hosts": _f("text", "FILE", "how to reach each host: CSV hostname,address[,port][,user]"),
    "--ssh-config": _f("text", "FILE", "how to reach each host: an OpenSSH client config"),
    "--pulumi-stack": _f("text", "STACK", "read what a `pulumi up` of this stack exported"),
    "--secrets": _f("text", "FILE", "the secrets file `gpucluster secrets` wrote (munge key, slurmdbd password)"),
    "--svg": _f("text", "FILE", "write the fabric diagram (SVG) to FILE"),
    "--html": _f("text", "FILE", "write the report as one self-contained HTML page to FILE"),
    "--junit": _f("text", "FILE", "write the results as JUnit XML to FILE"),
    "--workdir": _f("text", "DIR", "keep the run's working files in DIR"),
    "--keep": _f("switch", "", "keep the run's private folder afterwards"),
    # spec checking and rendering
    "--suppress": _f("text", "RULE|FIELD", "hide the warnings of this rule or at this field path (repeatable); "
                     "errors are never hidden"),
    "--fail-on": _f("choice", "", "the least severe finding that fails the run with exit 2: error or warning"),
    "--pod": _f("int", "N", "in the diagram, draw pod N unit by unit"),
    "--no-cabling": _f("switch", "", "skip the per-port cabling map"),
    "--slurm-version": _f("text", "V", "render for this Slurm release instead of the spec's slurm.version"),
    # selecting hosts and running Ansible
    "-l": _LIMIT, "--limit": _LIMIT,
    "--group": _f("text", "GROUP", "only this compute node group of the spec (default: every group)"),
    "-v": _VERBOSE, "--verbose": _VERBOSE,
    "--check": _f("switch", "", "dry run: report what would change, change nothing"),
    "--diff": _f("switch", "", "show the changes to files"),
    "--tags": _f("text", "TAGS", "only these concerns (comma separated)"),
    "--pull": _f("switch", "", "the fleet converges itself from the compiled bundle (docs/roles.md)"),
    "--push": _f("switch", "", "Ansible on this machine reaches every host"),
    "--concurrency": _f("int", "N", "with pull: nodes converging at once"),
    "--full": _f("switch", "", "with pull: every node runs the roles, even where its manifest of the bundle verifies"),
    "--trigger": _f("choice", "", "with pull: how nodes learn of the bundle: ssh (now, one ssh per node) or timer"),
    "--wait": _f("float", "SECONDS", "with --trigger timer: how long to wait for every node's result"),
    "--batch": _f("int", "N", "reconfigure the Slurm daemons N hosts at a time"),
    "--rotate": _f("text", "SECRET", "the secrets to replace (munge, slurmdbd, signing; comma separated): configure "
                   "replaces them, the one way a converge does; diff names what that disrupts"),
    "--playbook": _f("text", "PLAYBOOK", "the playbook under playbooks/ to run"),
    "--project-dir": _f("text", "DIR", "the folder with ansible.cfg, playbooks/ and roles/"),
    "--generate": _f("switch", "", "generate new secrets"),
    "--force": _f("switch", "", "replace an existing file"),
    # staged nodes
    "--runtime": _f("text", "RUNTIME", "the OCI runtime podman uses"),
    "--ulimit": _f("text", "ULIMIT", "a container ulimit (repeatable)"),
    # validation
    "-n": _WORKERS, "--workers": _WORKERS,
    "--via-slurm": _f("switch", "", "run the checks or tests as Slurm jobs on the compute nodes"),
    "--slurm-time": _f("text", "SLURM_TIME", "time limit of the validation job"),
    "--sbatch-args": _f("text", "SBATCH_ARGS", "extra sbatch options"),
    "--srun-args": _f("text", "ARGS", "extra srun options"),
    "--thresholds": _f("text", "FILE", "YAML of NCCL/RCCL bandwidth thresholds"),
    "--nccl-bytes": _f("text", "NCCL_BYTES", "message size of the all_reduce check"),
    "--nccl-binary": _f("text", "FILE", "the all_reduce_perf binary to run"),
    "--ssh": _f("choice", "", "how to reach hosts over SSH: paramiko or openssh"),
    "-k": _f("text", "KEYWORD", "only checks matching this pytest -k expression"),
    "--probes": _f("switch", "", "also run the probes that start a foreign slurmd"),
    # emulated Slurm
    "--nodes": _f("int", "N", "emulate only the first N nodes"),
    "--flat": _f("switch", "", "no topology plugin (the baseline)"),
    "--run": _f("text", "CMD", "run a shell command against the emulated cluster, then stop"),
    "--hold": _f("switch", "", "stay up until Ctrl-C or SIGTERM"),
    # the fabric as built
    "--ibnetdiscover": _f("text", "FILE", "an InfiniBand fabric as `ibnetdiscover > FILE` saw it"),
    "--nvlink": _f("text", "DIR", "NVLink domains: a folder of one `nvidia-smi -q` output per node"),
    "--lldp": _f("text", "DIR_OR_FILE", "a RoCE fabric as `lldpctl -f json` saw it on each device"),
    "--sites": _f("text", "MAP.csv", "the site's own names of the plan's hosts (CSV hostname,address,...)"),
    "--switch-pattern": _f("text", "P", "how the site names its switches: a format with {name} or a regex"),
    "--slurm-topology": _f("text", "FILE", "write the topology the wires describe, as Slurm's topology file"),
    "--max-findings": _f("int", "N", "findings printed per kind (--json has them all)"),
    "--tier": _f("choice", "", "which tier's bandwidth tests: leaf, spine, core, rail, all, all-tiers"),
    "--transport": _f("choice", "", "the bandwidth test's tool: nccl, perftest, iperf3 (or auto)"),
    "--efficiency": _f("float", "F", "fraction of the line rate a healthy pair reaches"),
    "--seconds": _f("int", "S", "duration of each bandwidth case"),
    "--time-limit": _f("int", "MIN", "Slurm time limit of each job, in minutes"),
    "--immediate": _f("int", "S", "give a job up when its nodes are not free within S seconds"),
    "--partition": _f("text", "PARTITION", "the Slurm partition for every job"),
    "--parallel": _f("int", "N", "jobs of one round in flight at once"),
    "--mpi": _f("text", "MPI", "srun --mpi for all_reduce_perf"),
    "--slowest": _f("int", "N", "slow results printed, the slowest first"),
    # rolling a change out
    "--change": _f("choice", "", "the change's class: reboot, drain or reconfigure"),
    "--by": _f("choice", "", "what a wave is made of: leaf, su, block or node"),
    "--max-unavailable": _f("text", "N|P%", "most nodes out at once"),
    "--halt-share": _f("text", "P%", "halt once more than this share of a wave fails"),
    "--apply-command": _f("text", "CMD", "what applies the change to a wave's drained nodes"),
    "--check-command": _f("text", "CMD", "a node's checks before it goes back in service"),
    "--poll": _f("float", "POLL", "seconds between looks at Slurm (hidden, for tests)"),
    "--dry-run": _f("switch", "", "print what would be done; change nothing"),
    "--resume": _f("switch", "", "continue the last run from its state file"),
    "--status": _f("switch", "", "show where the last run stands"),
    "--resize": _f("text", "NEW_SPEC", "grow or shrink to the node counts of NEW_SPEC"),
    "--summary": _f("switch", "", "with --json: the counts alone, without the list of items"),
    # node health
    "--format": _f("choice", "", "how a document is written: markdown (for people) or json (stable keys)"),
    "--webhook": _f("text", "URL", "also POST the document as JSON to this http(s) URL"),
    "--why": _f("text", "TEXT", "why, in words, for the record this command keeps"),
}
