"""The staged-node base image: a debootstrapped Debian root with systemd and sshd, imported into podman.

No image registry is reachable from the machines that stage clusters, so the image is built locally
from the Debian mirror the host's apt sources name. The recipe text (suite, packages, files, build
script, apt sources) is hashed; the hash is the image tag, so an unchanged recipe is never rebuilt and
any change to it builds a new tag. There is one image per Debian suite: staged nodes run the Slurm their
Debian release ships (SUITES), so a spec on Slurm 24.11 stages Debian 13 nodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from string import Template

from gpucluster.aptsources import SUITE, debian_mirror
from gpucluster.errors import UsageError

from ._proc import Log, StageError, run, run_streaming, tail

IMAGE_REPO = "localhost/gpucluster-node"
# The Slurm release each Debian suite ships, and so the suite a staged cluster on that release runs:
# the roles install Debian's own Slurm packages, which exist at exactly one release per suite.
SUITES: dict[str, str] = {"22.05": "bookworm", "24.11": "trixie"}
_RELEASES = {"bookworm": "12", "trixie": "13"}
# Bump when the build procedure changes in a way the recipe text below does not show.
RECIPE_VERSION = 1

# What every staged node needs before any role runs: systemd as PID 1, sshd for Ansible, Python for
# Ansible modules, and the tools the validation suite calls. No locales package: C.UTF-8 is built
# into glibc. Time sync: systemd-timesyncd, which skips itself in a container
# (ConditionVirtualization=!container) instead of failing like chronyd without CAP_SYS_TIME; the
# container shares the host's clock, which the host keeps.
BASE_PACKAGES: tuple[str, ...] = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-apt", "sudo",
    "iproute2", "procps", "ca-certificates", "gnupg", "less", "fuse3", "systemd-timesyncd",
)

# Golden-image speed-up only: a staged cluster starts up to seven nodes, and each would otherwise
# download these packages itself. The Ansible roles still install (and pin) every one of them, so
# bare-metal nodes and cloud images without this pre-bake get the same result. Their services are
# disabled (not masked) after installation: a fresh node runs only sshd until a role enables more.
PREBAKED_PACKAGES: tuple[str, ...] = (
    "slurm-wlm", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server",
    "moosefs-master", "moosefs-chunkserver", "moosefs-client", "moosefs-cli",
    "nfs-ganesha", "nfs-ganesha-vfs", "libnfs-utils", "nfs-common",
    "rdma-core", "ibverbs-utils", "infiniband-diags", "perftest",
    # roles/pull_runner (pull_runner_packages): site.yml installs the pull runner on every configure, and each
    # node downloading these three cost every staged configure an apt run; the role still installs them.
    "python3-jinja2", "python3-yaml", "python3-packaging",
    # roles/rdma's fabric test (rdma_fabric_test_packages) on every GPU node: its first configure downloaded it.
    "iperf3",
)

# Files written into the root before the build script runs: path -> (mode, content).
_FILES: dict[str, tuple[int, str]] = {
    "/etc/ssh/sshd_config.d/10-gpucluster.conf": (0o644, (
        "# gpucluster staged node: key-only root login for Ansible and the validation suite.\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
    )),
    # Host keys are removed from the image and generated at a node's first boot, so every
    # container has its own and strict host key checking means something.
    "/etc/systemd/system/gpucluster-ssh-hostkeys.service": (0o644, (
        "[Unit]\n"
        "Description=Generate SSH host keys unique to this staged node (gpucluster)\n"
        "ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key\n"
        "Before=ssh.service\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "ExecStart=/usr/bin/ssh-keygen -A\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )),
    "/etc/systemd/system/ssh.service.d/10-gpucluster-hostkeys.conf": (0o644, (
        "[Unit]\n"
        "Wants=gpucluster-ssh-hostkeys.service\n"
        "After=gpucluster-ssh-hostkeys.service\n"
    )),
    "/etc/default/locale": (0o644, "LANG=C.UTF-8\n"),
    # Services must not start inside the build chroot; the build script removes this at the end.
    "/usr/sbin/policy-rc.d": (0o755, "#!/bin/sh\nexit 101\n"),
}

# Runs inside the debootstrapped root (chroot, private mount namespace, /proc mounted).
_BUILD_SCRIPT = Template(r"""#!/bin/sh
set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 LANG=C.UTF-8
enabled() { systemctl list-unit-files --state=enabled --no-legend --no-pager | awk '{print $$1}' | sort; }
rm -f /etc/apt/sources.list
echo "STEP apt-get update"
apt-get -q update
echo "STEP installing base packages"
apt-get -q -y --no-install-recommends install $base
enabled > /tmp/enabled.base
echo "STEP installing pre-baked packages (golden-image speed-up)"
apt-get -q -y --no-install-recommends install $prebake
enabled > /tmp/enabled.all
new=$$(comm -13 /tmp/enabled.base /tmp/enabled.all | tr '\n' ' ')
echo "STEP disabling units the pre-baked packages enabled: $$new"
if [ -n "$$new" ]; then systemctl disable $$new; fi
# apt's timers would take the dpkg lock while Ansible installs packages.
systemctl disable apt-daily.timer apt-daily-upgrade.timer
systemctl enable gpucluster-ssh-hostkeys.service
echo "STEP removing per-node identity and secrets from the image"
rm -f /etc/ssh/ssh_host_*
rm -f /etc/munge/munge.key
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
echo "STEP cleaning up"
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log
rm -f /usr/sbin/policy-rc.d /etc/resolv.conf /etc/hostname
rm -rf /tmp/* /var/tmp/*
echo "STEP enabled units: $$(enabled | tr '\n' ' ')"
""")


def _build_script() -> str:
    return _BUILD_SCRIPT.substitute(base=" ".join(BASE_PACKAGES), prebake=" ".join(PREBAKED_PACKAGES))


def suite_for(slurm_version: str, source: str = "the spec") -> str:
    """The Debian suite whose own Slurm packages are `slurm_version`; a usage error naming the staged
    releases for any other (no Debian release ships 23.x or 25.x, and sid moves too fast to stage)."""
    if slurm_version not in SUITES:
        staged = ", ".join(f"{v} on Debian {_RELEASES.get(s, s)} ({s})" for v, s in SUITES.items())
        raise UsageError(f"{source}: slurm.version: {slurm_version} cannot be staged: staged nodes install the "
                         f"Slurm their Debian release ships ({staged}); set slurm.version to "
                         f"{' or '.join(SUITES)} in the spec you stage (`gpucluster render --slurm-version` "
                         "renders the real cluster's files for any release)")
    return SUITES[slurm_version]


def image_recipe(suite: str = SUITE) -> str:
    """Everything the image is made from, as text; its sha256[:12] is the image tag."""
    mirror = debian_mirror(suite=suite)
    parts = [
        f"gpucluster-node recipe v{RECIPE_VERSION}",
        f"debootstrap --variant=minbase {suite}",
        "base: " + " ".join(BASE_PACKAGES),
        "prebaked: " + " ".join(PREBAKED_PACKAGES),
        "--- /etc/apt/sources.list.d/debian.sources",
        mirror.sources_deb822(),
    ]
    for path, (mode, content) in sorted(_FILES.items()):
        parts += [f"--- {path} {mode:o}", content]
    parts += ["--- build script", _build_script()]
    return "\n".join(parts)


def image_ref(recipe: str | None = None, suite: str = SUITE) -> str:
    recipe = image_recipe(suite) if recipe is None else recipe
    return f"{IMAGE_REPO}:{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def image_exists(ref: str) -> bool:
    return run(["podman", "image", "exists", ref], check=False, what="podman image exists").returncode == 0


def ensure_image(log: Log = print, suite: str = SUITE) -> str:
    """Return the image ref for the suite's current recipe, building it first if podman does not have it."""
    recipe = image_recipe(suite)
    ref = image_ref(recipe)
    if image_exists(ref):
        log(f"stage: reusing image {ref}")
        return ref
    with _build_lock(suite):
        if image_exists(ref):  # another process built it while we waited
            log(f"stage: reusing image {ref}")
            return ref
        _build(ref, suite, log)
    return ref


def image_size(ref: str) -> int:
    out = run(["podman", "image", "inspect", "--format", "{{.Size}}", ref], what="podman image inspect")
    return int(out.stdout.strip())


@contextlib.contextmanager
def _build_lock(suite: str) -> Iterator[None]:
    """One image build per suite at a time per user (two suites build side by side: their refs and work
    folders differ; the staged tests bring up a bookworm and a trixie cluster in parallel). The lock lives in
    the user's private cache folder, never in the shared /tmp, where another user could plant a link under
    its name."""
    from gpucluster.paths import cache_dir, locked

    with locked(cache_dir("locks") / f"node-image-{suite}.lock"):
        yield


def _progress(log: Log, prefix: str) -> Callable[[str], None]:
    """A line handler that logs milestones and, at most every 30 s, the latest line as a heartbeat."""
    start = time.monotonic()
    last = [start]
    seen: set[str] = set()

    def on_line(line: str) -> None:
        now = time.monotonic()
        stamp = f"{prefix}[{now - start:4.0f}s] "
        if line.startswith("STEP "):
            log(f"{stamp}{line[5:]}")
            last[0] = now
            return
        m = re.match(r"I: (\w+)", line)
        if m and m.group(1) not in seen:  # debootstrap phases: Retrieving, Validating, Extracting, ...
            seen.add(m.group(1))
            log(f"{stamp}debootstrap: {line[3:]}")
            last[0] = now
        elif now - last[0] >= 30:
            log(f"{stamp}... {line.strip()[:100]}")
            last[0] = now

    return on_line


def _build(ref: str, suite: str, log: Log) -> None:
    for tool in ("debootstrap", "unshare", "chroot", "tar", "podman"):
        if shutil.which(tool) is None:
            raise StageError(f"building the staged-node image needs '{tool}': run scripts/stage-deps.sh")
    if os.geteuid() != 0:
        raise StageError("building the staged-node image needs root (debootstrap, chroot, podman import)")
    mirror = debian_mirror(suite=suite)
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="gpucluster-image-", dir=base))
    root = work / "root"
    started = time.monotonic()
    log(f"stage: building image {ref} (debootstrap {suite} minbase from the host's apt mirror; "
        "takes minutes once, then cached by recipe hash)")
    try:
        on_line = _progress(log, "stage: image: ")
        # A private mount namespace: whatever debootstrap or the build mounts vanishes with it,
        # even when it is killed, so no mount under the work directory outlives the build.
        run_streaming(
            ["unshare", "--mount", "--propagation", "private", "--",
             "debootstrap", "--variant=minbase", suite, str(root), mirror.uri],
            on_line=on_line, timeout=1800, what="debootstrap",
        )
        (root / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/apt/sources.list.d/debian.sources").write_text(mirror.sources_deb822())
        for path, (mode, content) in _FILES.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(mode)
        (root / "tmp/gpucluster-build.sh").write_text(_build_script())
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")  # DNS for apt in the chroot
        inner = (f"mount -t proc proc {shlex.quote(str(root / 'proc'))} && "
                 f"exec chroot {shlex.quote(str(root))} /bin/sh /tmp/gpucluster-build.sh")
        run_streaming(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner],
            on_line=on_line, timeout=3600, what="image build script (chroot)",
        )
        built = time.monotonic() - started
        log(f"stage: image: root file system ready after {built:.0f}s; importing into podman")
        _import(root, ref, built)
    finally:
        _remove_work(work, log)
    size = image_size(ref)
    log(f"stage: built image {ref} in {time.monotonic() - started:.0f}s, size {size / 2**20:.0f} MiB")


def _import(root: Path, ref: str, built_s: float) -> None:
    tar_cmd = ["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", str(root), "-cf", "-", "."]
    import_cmd = [
        "podman", "import",
        "--change", 'CMD ["/sbin/init"]',
        "--change", "STOPSIGNAL SIGRTMIN+3",
        "--change", f"LABEL gpucluster.recipe={ref.rsplit(':', 1)[1]}",
        "--change", f"LABEL gpucluster.build-seconds={built_s:.0f}",
        "--message", "gpucluster staged node",
        "-", ref,
    ]
    with tempfile.TemporaryFile() as tar_err:
        tar = subprocess.Popen(tar_cmd, stdout=subprocess.PIPE, stderr=tar_err)
        assert tar.stdout is not None
        imp = subprocess.run(import_cmd, stdin=tar.stdout, capture_output=True, text=True, check=False)
        tar.stdout.close()
        tar_rc = tar.wait()
        tar_err.seek(0)
        tar_stderr = tar_err.read().decode(errors="replace")
    if tar_rc != 0:
        raise StageError(f"tar of the image root failed with exit status {tar_rc}", cmd=tar_cmd,
                         stderr=tar_stderr)
    if imp.returncode != 0:
        raise StageError(f"podman import failed with exit status {imp.returncode}", cmd=import_cmd,
                         stderr=imp.stderr)


def _remove_work(work: Path, log: Log) -> None:
    # Never rm -rf through a mount (a bind-mounted /dev would be emptied): refuse if any remain.
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    inside = [m for m in mounts if m == str(work) or m.startswith(str(work) + "/")]
    if inside:
        log(f"stage: NOT removing {work}: still mounted: {', '.join(inside)}")
        return
    try:
        shutil.rmtree(work)
    except OSError as exc:
        log(f"stage: could not remove build directory {work}: {tail(str(exc), 3)}")
