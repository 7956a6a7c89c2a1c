#!/usr/bin/env bash
# Everything gpucluster needs on a fresh Debian 12 machine, idempotently and without questions:
#   - Debian packages: Slurm + munge (the real consumer of rendered configs, emulated clusters),
#     podman/runc/debootstrap (staged nodes, via scripts/stage-deps.sh), graphviz (fabric diagrams)
#   - the project's virtual environment in .venv with every Python dependency
# With --tests (scripts/test.sh), also what only the tests use: chromium (the HTML plan's browser test), iperf3
# (fabric test's ring script, in namespaces), and the Debian trixie and sid roots whose slurmctld verifies the
# newer Slurm lines. The demo (scripts/demo.sh) runs without it and so sets up only what it uses.
# Run as root (or with password-less sudo). Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

tests=false
case "${1:-}" in
  --tests) tests=true ;;
  "") ;;
  *) echo "usage: bash scripts/setup.sh [--tests]" >&2; exit 2 ;;
esac

packages=(
  slurmctld slurmd slurm-client   # Debian's Slurm 22.05: tests start it on rendered configs
  munge                           # Slurm's authentication
  python3-venv                    # only used where the system python lacks venv
  openssh-client
  graphviz                        # dot: lays out the fabric diagram (plan --svg, plan --html)
  fonts-dejavu-core               # the diagram's and the page's font, so text widths match everywhere
)
if $tests; then
  packages+=(
    chromium                      # headless browser: tests/test_report_browser.py loads plan.html
    iperf3 iproute2               # fabric test's stand-in transport, run between two network namespaces in a test
    prometheus                    # promtool: tests/test_metrics.py checks the rendered Prometheus files and runs their alert tests
  )
fi

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts the daemons it installs; gpucluster runs its own instances on private ports (of Prometheus, only
# promtool is used).
for svc in slurmctld slurmd munge prometheus; do
  as_root systemctl disable --now "$svc" >/dev/null 2>&1 || true
done

bash scripts/stage-deps.sh

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.gpucluster-deps
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing Python dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[ops,pulumi,dev]'
  touch "$stamp"
fi
# The newer Slurm lines the tests verify on (24.11 from Debian trixie, 26.05 from sid): roots built once
# with debootstrap from this machine's apt mirror, cached by recipe hash (gpucluster.emulate.roots).
if $tests && [ "$(id -u)" -eq 0 ] && command -v debootstrap >/dev/null; then
  .venv/bin/python -m gpucluster.emulate.roots || echo "setup: WARNING: a Slurm root could not be built; its tests will say why"
fi
echo "setup: ready (.venv/bin/gpucluster)"
