#!/usr/bin/env bash
# The test command: the set-up without the run (when .venv is missing), every extra the tests use
# (the `dev` extra: pytest, ruff, Ray, PostgreSQL driver, transformers/PEFT/TRL, datasets, MLflow,
# openai), then pytest. Arguments go to pytest: bash scripts/test.sh tests/test_cli.py -x
# The tests run in parallel: one pytest-xdist worker per core, at most 4 (-n 0: one at a time), a
# module on one worker, the Ray modules together (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh --no-run
.venv/bin/python -m pip install -q -e ".[dev]"
exec .venv/bin/python -m pytest -q -n auto --maxprocesses 4 "$@"
