#!/usr/bin/env bash
# The test suite, on the real OpenCL device, TVM, SQLite and a PostgreSQL server it starts
# itself: installs what the tests need into .venv (the test, bench, farm, iree and models extras,
# Debian's chromium, postgresql and Mesa's Vulkan driver), then runs pytest there.
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test,bench,farm,iree,models bash scripts/install.sh
exec .venv/bin/python -m pytest "${@:--q}"
