#!/usr/bin/env bash
# The test suite, on the real OpenCL device, TVM, SQLite and a PostgreSQL server it starts
# itself: installs what the tests need into .venv (the test, bench, farm, iree and models extras,
# Debian's chromium, postgresql and Mesa's Vulkan driver), then runs pytest there, in two
# phases:
#   1. every test not marked `timed`, spread over up to 4 worker processes (pytest-xdist),
#      a test file per worker (its fixtures, a PostgreSQL server say, are made once);
#   2. the `timed` tests (they assert that a tuned kernel beats the default), one at a
#      time with nothing else running: a second process timing kernels beside them makes
#      the speeds they compare a matter of luck (TVM's llvm thread pool slows 100-fold
#      when another process holds the cores).
# Arguments go to pytest in both phases (a file, -k EXPR, -x ...); a phase with nothing
# selected is not a failure. Exits with the first failing phase's status.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test,bench,farm,iree,models bash scripts/install.sh
workers=$(nproc)
((workers > 4)) && workers=4  # each worker holds TVM and torch (about 2 GiB)
status=0
phase() {
  local rc=0
  .venv/bin/python -m pytest -q --durations=25 "$@" || rc=$?
  ((rc == 5)) && rc=0  # no test selected in this phase
  ((status == 0)) && status=$rc
  return 0
}
phase -m "not timed" -n "$workers" --dist loadfile "$@"
phase -m timed "$@"
exit "$status"
