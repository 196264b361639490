#!/usr/bin/env bash
# Install what autosched needs on Debian/Ubuntu: an OpenCL driver (PoCL's CPU device
# when there is no GPU driver), and the Python package with its pinned TVM.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

need_apt=()
# g++: TVM links llvm-target kernels into shared libraries.
# chromium: the report test renders the HTML report headless.
for pkg in ocl-icd-libopencl1 pocl-opencl-icd g++ chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! $PY - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
import autosched, pyopencl, tvm, sklearn, xgboost, optuna, pandas, pytest  # noqa: F401
sys.exit(0 if m.version("apache-tvm-ffi") == "0.1.14.post1" else 1)
PY
then
  echo "installing autosched and its Python dependencies (TVM 0.27, pyopencl, ...)"
  $PY -m pip install -q --disable-pip-version-check -e ".[test,bench]"
fi
