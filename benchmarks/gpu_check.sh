#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, in about 8 minutes,
#   1. the GPU-marked tests (pytest -m gpu: bf16, fused optimizer, compile, memory, NCCL with >= 2 GPUs)
#   2. one measured `recipetune run` of the gpt2-124m preset in bf16 (tokens/s, MFU against bf16 peak)
#   3. a short `recipetune tune` campaign on it (micro-batch, compile, optimizer, checkpointing, attention)
# and writes the figures to benchmarks/results/gpu_check-<date>-<gpu>.{json,md}, quoted by docs/benchmarks.md.
#
#   bash benchmarks/gpu_check.sh             # the check (exits 1 at once without an NVIDIA GPU)
#   bash benchmarks/gpu_check.sh --dry-run   # anywhere: validates the files and prints the plan
#
# Environment: PYTHON (default .venv/bin/python, else python3), OUT (default runs/gpu_check-<time>).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
if [[ $# -gt 0 && $DRY == 0 ]]; then echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2; exit 2; fi

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi; fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT=${OUT:-runs/gpu_check-$STAMP}
CAMPAIGN=examples/gpt2-gpu.yaml
RUN_OVERRIDES=(attention=sdpa optimizer_impl=fused micro_batch_size=16)

if [[ $DRY == 0 ]]; then  # fail fast, before anything loads
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi is missing or sees no device); nothing was run." >&2
    echo "gpu_check: run it on a GPU machine, or use --dry-run to check the files." >&2
    exit 1
  fi
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: nvidia-smi sees a GPU but this PyTorch has no CUDA ($("$PY" -c 'import torch; print(torch.__version__)'))." >&2
    exit 1
  fi
fi

# Every file the check uses must load before anything runs (a typo should not cost a GPU lease).
"$PY" - "$CAMPAIGN" "${RUN_OVERRIDES[@]}" <<'EOF'
import sys
from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError
try:
    load_campaign(sys.argv[1], sys.argv[2:])
    load_campaign(sys.argv[1])
except ConfigError as e:
    sys.exit(f"gpu_check: {e}")
EOF

if [[ $DRY == 1 ]]; then
  echo "gpu_check --dry-run: $CAMPAIGN loads; with a GPU this would run, into $OUT:"
  echo "  1. $PY -m pytest -q -m gpu                                  (limit 180 s)"
  echo "  2. recipetune run $CAMPAIGN ${RUN_OVERRIDES[*]} --steps 30  (limit 120 s)"
  echo "  3. recipetune tune $CAMPAIGN                               (limit 300 s)"
  echo "  4. $PY benchmarks/gpu_check_report.py $OUT  -> benchmarks/results/gpu_check-<date>-<gpu>.{json,md}"
  exit 0
fi

mkdir -p "$OUT"
echo "== gpu_check into $OUT"
nvidia-smi -L | tee "$OUT/gpus.txt"

# Each phase has a hard limit so the whole check stays under ~8 minutes; a phase that fails or runs
# out of time is recorded (its exit code) and the check goes on to report what it has.
set +e
echo "== 1/3 pytest -m gpu"
timeout 180 "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.txt"
echo "${PIPESTATUS[0]}" > "$OUT/pytest.rc"

echo "== 2/3 recipetune run (gpt2-124m, bf16)"
timeout 120 "$PY" -m recipetune run "$CAMPAIGN" "${RUN_OVERRIDES[@]}" --steps 30 --out "$OUT/run" 2>&1 | tee "$OUT/run.txt"
echo "${PIPESTATUS[0]}" > "$OUT/run.rc"

echo "== 3/3 recipetune tune (gpt2-124m)"
timeout 300 "$PY" -m recipetune tune "$CAMPAIGN" --out "$OUT/tune" 2>&1 | tee "$OUT/tune.txt"
echo "${PIPESTATUS[0]}" > "$OUT/tune.rc"
set -e

"$PY" benchmarks/gpu_check_report.py "$OUT"
