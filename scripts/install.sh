#!/usr/bin/env bash
# Install what autosched needs on Debian/Ubuntu into a virtual environment in the checkout
# (.venv), so it works with the distribution's own python3 (PEP 668 refuses `pip install`
# outside a venv there): Debian packages first (an OpenCL driver: PoCL's CPU device when
# there is no GPU driver; python3-venv when venv is missing), then the Python package with
# its pinned TVM.
#
#   bash scripts/install.sh                 # the default install: what tuning needs
#   EXTRAS=test,bench bash scripts/install.sh   # plus extras (test, bench, ...)
#
# Safe to run again: it installs only what is missing. PYTHON picks the interpreter that
# creates the venv (default: python3 on PATH); AUTOSCHED_VENV its folder (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AUTOSCHED_VENV:-.venv}
EXTRAS=${EXTRAS:-}

need_apt=()
# g++: TVM links llvm-target kernels into shared libraries.
for pkg in ocl-icd-libopencl1 pocl-opencl-icd g++; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# chromium: the report test renders the HTML report headless.
case ",$EXTRAS," in *,test,*) dpkg -s chromium >/dev/null 2>&1 || need_apt+=(chromium) ;; esac
# farm: a PostgreSQL server for the records tests, and Mesa's rusticl, a second OpenCL
# driver (llvmpipe, with RUSTICL_ENABLE=llvmpipe) for tests of routing by device kind.
case ",$EXTRAS," in *,farm,*)
  for pkg in postgresql mesa-opencl-icd; do dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg"); done ;;
esac
# iree: Mesa's Vulkan driver (lavapipe, a Vulkan compute device on the CPU where there
# is no GPU driver) and vulkaninfo, which autosched reads the device's limits from.
case ",$EXTRAS," in *,iree,*)
  for pkg in mesa-vulkan-drivers libvulkan1 vulkan-tools; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
  done ;;
esac
# Debian/Ubuntu ship venv's pip bootstrap separately.
if [ ! -x "$VENV/bin/python" ] && ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the virtual environment $VENV with $("$PY" -c 'import sys; print(sys.executable)')"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

# Modules each extra brings; a missing one means that extra is installed (again).
check="import importlib.metadata as m, sys
import autosched, pyopencl, tvm, sklearn, lightgbm, optuna, pandas, rich  # noqa: F401
mods = {'test': ['pytest', 'xdist'], 'bench': ['kernel_tuner', 'psutil'], 'farm': ['distributed', 'psycopg'],
        'iree': ['iree.compiler', 'iree.runtime'], 'models': ['onnx', 'onnxruntime', 'torch']}
for extra in filter(None, '$EXTRAS'.split(',')):
    for mod in mods.get(extra, []):
        __import__(mod)
sys.exit(0 if m.version('apache-tvm-ffi') == '0.1.14.post1' else 1)"
if ! "$VPY" -c "$check" >/dev/null 2>&1; then
  spec="."; [ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
  echo "installing autosched${EXTRAS:+ [$EXTRAS]} and its Python dependencies into $VENV (TVM 0.27, pyopencl, ...)"
  # pip's output is kept for when it fails; on success the terminal stays clean.
  log=$(mktemp)
  if ! { "$VPY" -m pip install -q --disable-pip-version-check --upgrade pip &&
         "$VPY" -m pip install -q --disable-pip-version-check -e "$spec"; } >"$log" 2>&1; then
    cat "$log"; rm -f "$log"
    echo "install.sh: pip could not install autosched${EXTRAS:+ [$EXTRAS]} (its output is above)" >&2
    exit 1
  fi
  rm -f "$log"
fi
