#!/usr/bin/env bash
# Fresh machine -> a real tuning run: install everything into .venv (works with the
# distribution's own python3), then tune a 512^3 float32 matmul on the default OpenCL
# device and print the best kernel found beside the default schedule and numpy/OpenBLAS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/autosched tune --op matmul --shape 512,512,512 --trials 64 --json tune-result.json "$@"
