#!/usr/bin/env bash
# Host-side dependencies of `gpucluster stage` (staged nodes as podman containers), Debian 12.
#
# Idempotent and non-interactive: installs only what is missing, then checks that each tool runs.
# Rootful podman needs no uidmap, slirp4netns or fuse-overlayfs (those serve rootless podman), and
# not crun: it fails on these hosts, runc is used instead. --no-install-recommends keeps buildah
# and friends out.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

packages=(
  podman            # container engine
  runc              # OCI runtime the stage layer uses (crun fails on hybrid-cgroup hosts)
  conmon            # podman's container monitor
  netavark          # network backend: per-cluster bridge networks
  aardvark-dns      # DNS on those networks: nodes resolve each other by name
  iptables          # netavark's NAT and port publishing
  debootstrap       # builds the node image from the host's own Debian mirror
  debian-archive-keyring  # debootstrap verifies the mirror's Release file with it
  openssh-client    # ssh-keygen for the cluster key pair, ssh for Ansible and the tests
  tar               # root file system -> podman import
  util-linux        # unshare: private mount namespace for the image build
  procps            # sysctl, for the inotify limits below
)

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E "$0" "$@"
  fi
  echo "stage-deps: must run as root (or with password-less sudo)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "stage-deps: installing ${missing[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
else
  echo "stage-deps: all host packages present"
fi

# systemd in every staged node holds several inotify instances, all charged to host root: the
# default fs.inotify.max_user_instances=128 runs out at about 15 nodes on one host, and later nodes
# then come up "degraded" (measured: systemd-ask-password-*.path failed, "Failed to create inotify
# object: Too many open files"). Raise the limits, never lower them, and keep them across reboots.
sysctl_conf=/etc/sysctl.d/60-gpucluster-stage.conf
declare -A limits=([fs.inotify.max_user_instances]=8192 [fs.inotify.max_user_watches]=524288)
conf="# gpucluster stage: room for many systemd containers (scripts/stage-deps.sh)"$'\n'
for key in fs.inotify.max_user_instances fs.inotify.max_user_watches; do
  want=${limits[$key]}
  conf+="$key = $want"$'\n'
  have=$(sysctl -n "$key")
  if [ "$have" -lt "$want" ]; then
    if sysctl -q -w "$key=$want"; then
      echo "stage-deps: raised $key from $have to $want"
    else
      echo "stage-deps: WARNING: could not raise $key ($have); large staged clusters may come up degraded" >&2
    fi
  fi
done
if [ ! -f "$sysctl_conf" ] || [ "$(cat "$sysctl_conf")"$'\n' != "$conf" ]; then
  printf '%s' "$conf" > "$sysctl_conf"
  echo "stage-deps: wrote $sysctl_conf"
fi

podman --version
/usr/sbin/runc --version | head -n 1
debootstrap --version
podman info --format 'podman: network backend {{.Host.NetworkBackend}}, cgroups {{.Host.CgroupsVersion}}, storage {{.Store.GraphDriverName}}'
