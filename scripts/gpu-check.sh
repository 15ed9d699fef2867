#!/usr/bin/env bash
# GPU checks: the gpu-marked tests on cuda:0.
# On a machine without an NVIDIA GPU (no nvidia-smi, or it lists none) there is nothing to
# check: say so and exit 0, having installed nothing (this check comes first; `make
# gpu-check` has no prerequisite). With a GPU, the test environment is installed by make's
# own target, then CuPy from the `cuda` extra; where the machine cannot reach a package
# index, have CuPy installed in .venv beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PY:-$VENV/bin/python}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi is missing or lists none);" \
    "the gpu tests are skipped, nothing was installed"
  exit 0
fi
"${MAKE:-make}" --no-print-directory VENV="$VENV" "$VENV/.installed-test"
if ! "$PY" -c "import cupy" 2>/dev/null; then
  "$PY" -m pip install --quiet -e '.[dev,cuda]'
fi
"$PY" -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())"
"$PY" -m pytest -q -m gpu -rs
# GPU figures: streamed device-to-host throughput against CuPy's copy, and the capture stall
timeout 300 "$PY" -m bench.gpu_stream
