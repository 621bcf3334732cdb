#!/usr/bin/env bash
# One command from a fresh clone: a virtual environment with what the main job needs (PyTorch and
# recipetune's own dependencies, no extras), then the main job on the embedded default (a tiny model
# on the Python standard library's sources, on this machine's CPU or GPU). Pass --no-run to install
# only. The extras (Ray, PostgreSQL, transformers/TRL, MLflow, pytest, ...) come with the test
# command, scripts/test.sh, or one at a time: pip install 'recipetune[ray]'.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The pinned torch is a CPU wheel that pip finds locally here; elsewhere pip fetches the build for your platform.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e .
if [ "${1:-}" != "--no-run" ]; then
  .venv/bin/recipetune run examples/tiny.yaml micro_batch_size=16
fi
