#!/usr/bin/env bash
# GPU checks: the gpu-marked tests on cuda:0 (they skip without CuPy or a device).
# CuPy comes from the `cuda` extra; where the machine cannot reach a package index, have
# CuPy installed in .venv beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! "$PY" -c "import cupy" 2>/dev/null; then
  "$PY" -m pip install --quiet -e '.[dev,cuda]'
fi
"$PY" -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())"
"$PY" -m pytest -q -m gpu -rs
# GPU figures: streamed device-to-host throughput against CuPy's copy, and the capture stall
timeout 300 "$PY" -m bench.gpu_stream
