#!/usr/bin/env bash
# GPU checks: the gpu-marked tests on cuda:0 (they skip without CuPy or a device).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -m pip install --quiet -e '.[dev,cuda]'
"$PY" -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())"
"$PY" -m pytest -q -m gpu -rs
