#!/usr/bin/env bash
# The test command: sets up what it needs (scripts/setup.sh), then lint and the whole suite,
# staged-node tests included. Extra arguments go to pytest (e.g. -k plan, -m 'not staged').
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
if [ -d roles ] && ls roles/*/tasks/main.yml >/dev/null 2>&1; then
  echo "== ansible-lint (production profile)"
  .venv/bin/ansible-lint --profile production --offline -q roles/ playbooks/
fi
echo "== pytest"
.venv/bin/pytest -ra "$@"
