#!/usr/bin/env bash
# The test command: sets up what it needs (scripts/setup.sh), then lint and the whole suite, staged-node
# tests included. Extra arguments go to both pytest phases (e.g. -k plan); with `-m EXPR` they make one serial run.
#
# Phases, each timed (the table is printed at the end, also after a failure):
#   setup      scripts/setup.sh --tests (Debian packages, .venv, the trixie and sid Slurm roots, chromium, iperf3)
#   ruff, ansible-lint
#   unit       every test not marked `staged`, under pytest-xdist, `--dist loadgroup` (GPUCLUSTER_TEST_WORKERS,
#              default 2, one per core: more workers overlap the real-daemon tests' timing checks (a job that must
#              still run, a munged that must be gone) with other tests' daemons and load, and made them flaky;
#              each cluster a module-scoped fixture starts stays on one worker, tests/conftest.py)
#   staged     the staged-node tests under pytest-xdist, `--dist loadgroup` (GPUCLUSTER_STAGED_WORKERS, default
#              2): one worker per staged cluster (22.05 and 24.11), each cluster brought up once by its worker
#              (tests/staged/conftest.py gives every staged test its cluster's group)
# Each pytest phase ends with its slowest tests (--durations), so every log shows where the time went.
# Every phase runs even when an earlier one failed, so one run reports everything; the exit status is the
# first failure's. The last line sums both pytest phases ("N passed, N failed, N skipped").
set -uo pipefail
cd "$(dirname "$0")/.."

phases=()
status=0
last_rc=0
started=$SECONDS
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

run_phase() {  # run_phase NAME COMMAND...: time it, remember its outcome (last_rc), keep the first failure's status
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "== $name"
  "$@" || rc=$?
  last_rc=$rc
  local took=$((SECONDS - t0)) verdict=ok
  if [ "$rc" -ne 0 ]; then
    verdict="FAILED (exit $rc)"
    [ "$status" -ne 0 ] || status=$rc
  fi
  phases+=("$(printf '%-14s %5d s  %s  %s' "$name" "$took" "$(budget_of "$name" "$took")" "$verdict")")
  return 0
}

budget_of() {  # budget_of PHASE SECONDS: "budget N s", and "OVER BUDGET" when SECONDS passed it (a warning only)
  local b
  b=$(awk -v p="$1" '$1 == p {print $2}' scripts/test-budget.txt 2>/dev/null)
  [ -n "$b" ] || { printf '%-16s' "(no budget)"; return; }
  if [ "$2" -gt "$b" ]; then
    printf 'budget %5d s  OVER BUDGET' "$b"
    echo "WARNING: phase $1 took $2 s, over its budget of $b s (scripts/test-budget.txt)" >&2
  else
    printf 'budget %5d s' "$b"
  fi
}

pytest_phase() {  # pytest_phase NAME MARKER [ARGS...]: a pytest run; "no test collected" (exit 5) is not a failure
  local name=$1 marker=$2 rc=0
  shift 2
  local select=()
  [ -z "$marker" ] || select=(-m "$marker")
  .venv/bin/pytest -ra --durations=25 --durations-min=1 "${select[@]}" --junitxml="$results/$name.xml" "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "$name: no test selected"
    return 0
  fi
  return "$rc"
}

workers=${GPUCLUSTER_TEST_WORKERS:-2}
staged_workers=${GPUCLUSTER_STAGED_WORKERS:-2}

run_phase setup bash scripts/setup.sh --tests
if [ "$status" -ne 0 ]; then
  printf '%s\n' "${phases[@]}"
  exit "$status"
fi
run_phase ruff .venv/bin/ruff check .
if [ -d roles ] && ls roles/*/tasks/main.yml >/dev/null 2>&1; then
  run_phase ansible-lint .venv/bin/ansible-lint --profile production --offline -q roles/ playbooks/
  # The unit tests that lint a part of the same files skip, saying so, once the whole of both passed here.
  [ "$last_rc" -ne 0 ] || export GPUCLUSTER_ANSIBLE_LINT_PASSED="roles/ playbooks/"
fi
own_marker=false
for arg in "$@"; do
  case $arg in -m|-m*) own_marker=true ;; esac
done
if $own_marker; then  # the caller chose the tests: one serial run of exactly those
  run_phase tests pytest_phase tests "" "$@"
else
  run_phase unit pytest_phase unit "not staged" -n "$workers" --dist loadgroup "$@"
  # --timeout: the two clusters' session set-ups (image build, stage up, first configure) now run at the same
  # time on the same cores, so each takes longer than alone; seen past 1,500 s at load average 40-50.
  run_phase staged pytest_phase staged "staged" -n "$staged_workers" --dist loadgroup --timeout 3000 "$@"
fi

echo
echo "== phase times"
printf '%s\n' "${phases[@]}"
printf '%-14s %5d s  %s\n' total "$((SECONDS - started))" "$(budget_of total "$((SECONDS - started))")"
.venv/bin/python - "$results" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

passed = failed = skipped = 0
for f in sorted(Path(sys.argv[1]).glob("*.xml")):
    for suite in ET.parse(f).getroot().iter("testsuite"):
        tests, fails, errors, skips = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        passed += tests - fails - errors - skips
        failed += fails + errors
        skipped += skips
print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
# The staged phase's workers: seconds of tests (set-up included) per cluster group (tests/staged/conftest.py).
groups: dict[str, list[float]] = {}
staged = Path(sys.argv[1]) / "staged.xml"
if staged.exists():
    for case in ET.parse(staged).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        groups.setdefault(props.get("xdist_group", "(none)"), []).append(float(case.get("time", 0)))
for name, times in sorted(groups.items()):
    print(f"staged group {name}: {sum(times):.0f} s in {len(times)} tests")
EOF
exit "$status"
