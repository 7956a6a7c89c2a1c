#!/usr/bin/env bash
# The main job on a fresh machine: sets up what it needs, then stages examples/staging.yaml as local
# containers, converges it with Ansible, validates it and runs a Slurm job (gpucluster demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/gpucluster demo "${1:-examples/staging.yaml}"
