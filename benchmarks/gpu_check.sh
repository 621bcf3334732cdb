#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, within its phases' hard limits (16 minutes on one GPU, 20 on two),
#   1. the GPU-marked tests (pytest -m gpu: bf16, fused optimizer, compile, memory, grouped experts; NCCL,
#      expert, pipeline and context parallelism with >= 2 GPUs)
#   2. one measured `recipetune run` of the gpt2-124m preset in bf16 (tokens/s, MFU against bf16 peak)
#   3. a short `recipetune tune` campaign on it (micro-batch, compile, optimizer, checkpointing, attention)
#   4. the layouts of the 8-expert moe-8x (experts' loop against batched matmuls; with >= 2 GPUs expert
#      parallelism and pipeline schedules) and of the dense gpt2-124m (with >= 2 GPUs: FSDP2, TP, CP, PP),
#      with the profile the analyst reads (all-to-all share, pipeline bubble, expert load, memory per stage)
# and writes the figures to benchmarks/results/gpu_check-<date>-<gpu>.{json,md}, quoted by docs/benchmarks.md.
# Phase 4 and the layout tests of phase 1 were written without a GPU and have never run on one.
#
#   bash benchmarks/gpu_check.sh             # the check (exits 1 at once without an NVIDIA GPU)
#   bash benchmarks/gpu_check.sh --dry-run   # anywhere: validates the files and prints the plan
#
# Environment: PYTHON (default .venv/bin/python, else python3), OUT (default runs/gpu_check-<time>), and each
# phase's hard limit in seconds, to fit a shorter lease: LIMIT_TESTS (240), LIMIT_RUN (120), LIMIT_TUNE (300),
# LIMIT_LAYOUTS (300), LIMIT_DENSE (240, two GPUs); TUNE_OVERRIDES, key=value overrides of the campaign
# (e.g. "search.budget.wall_time_s=80" for a shorter search). The tests are those of the two GPU modules, so a
# machine with recipetune's own dependencies alone (no dev extra) collects them.
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
LIMIT_TESTS=${LIMIT_TESTS:-240} LIMIT_RUN=${LIMIT_RUN:-120} LIMIT_TUNE=${LIMIT_TUNE:-300}
LIMIT_LAYOUTS=${LIMIT_LAYOUTS:-300} LIMIT_DENSE=${LIMIT_DENSE:-240}
GPU_TESTS=(tests/test_gpu.py tests/test_layouts_gpu.py)
read -r -a TUNE_ARGS <<< "${TUNE_OVERRIDES:-}"

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
# ... and so must every layout of phase 4 (the knob checks, on any machine)
"$PY" benchmarks/layouts.py --suite moe --presets moe-8x --device cuda --check >/dev/null
"$PY" benchmarks/layouts.py --suite dense --presets gpt2-124m --device cuda --check >/dev/null

if [[ $DRY == 1 ]]; then
  echo "gpu_check --dry-run: $CAMPAIGN loads; with a GPU this would run, into $OUT:"
  echo "  1. $PY -m pytest -q -m gpu ${GPU_TESTS[*]}  (limit $LIMIT_TESTS s)"
  echo "  2. recipetune run $CAMPAIGN ${RUN_OVERRIDES[*]} --steps 30  (limit $LIMIT_RUN s)"
  echo "  3. recipetune tune $CAMPAIGN ${TUNE_ARGS[*]}  (limit $LIMIT_TUNE s)"
  echo "  4. $PY benchmarks/layouts.py --suite moe --presets moe-8x --device cuda     (limit $LIMIT_LAYOUTS s)"
  echo "     $PY benchmarks/layouts.py --suite dense --presets gpt2-124m --device cuda (limit $LIMIT_DENSE s, >= 2 GPUs)"
  echo "  5. $PY benchmarks/gpu_check_report.py $OUT  -> benchmarks/results/gpu_check-<date>-<gpu>.{json,md}"
  exit 0
fi

mkdir -p "$OUT"
echo "== gpu_check into $OUT"
nvidia-smi -L | tee "$OUT/gpus.txt"

# Each phase has a hard limit so the whole check stays under 16 minutes (20 with two GPUs); a phase that fails or runs
# out of time is recorded (its exit code) and the check goes on to report what it has.
set +e
echo "== 1/4 pytest -m gpu"
timeout "$LIMIT_TESTS" "$PY" -m pytest -q -m gpu "${GPU_TESTS[@]}" -p no:cacheprovider --junitxml="$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.txt"
echo "${PIPESTATUS[0]}" > "$OUT/pytest.rc"

echo "== 2/4 recipetune run (gpt2-124m, bf16)"
timeout "$LIMIT_RUN" "$PY" -m recipetune run "$CAMPAIGN" "${RUN_OVERRIDES[@]}" --steps 30 --out "$OUT/run" 2>&1 | tee "$OUT/run.txt"
echo "${PIPESTATUS[0]}" > "$OUT/run.rc"

echo "== 3/4 recipetune tune (gpt2-124m)"
timeout "$LIMIT_TUNE" "$PY" -m recipetune tune "$CAMPAIGN" "${TUNE_ARGS[@]}" --out "$OUT/tune" 2>&1 | tee "$OUT/tune.txt"
echo "${PIPESTATUS[0]}" > "$OUT/tune.rc"

# Two processes where there are two GPUs; on one GPU only the single-process layouts run (the others are
# listed as left out in the figures).
NGPU=$(nvidia-smi -L | wc -l)
echo "== 4/4 layouts (moe-8x; gpt2-124m with >= 2 GPUs), $NGPU GPU(s)"
timeout "$LIMIT_LAYOUTS" "$PY" benchmarks/layouts.py --suite moe --presets moe-8x --device cuda --nproc 2 --steps 10 \
  --repeats 1 --json "$OUT/layouts-moe.json" 2>&1 | tee "$OUT/layouts-moe.txt"
echo "${PIPESTATUS[0]}" > "$OUT/layouts.rc"
if [[ $NGPU -ge 2 ]]; then
  timeout "$LIMIT_DENSE" "$PY" benchmarks/layouts.py --suite dense --presets gpt2-124m --device cuda --nproc 2 --steps 10 \
    --repeats 1 --json "$OUT/layouts-dense.json" 2>&1 | tee "$OUT/layouts-dense.txt"
  rc=${PIPESTATUS[0]}; [[ $rc -ne 0 ]] && echo "$rc" > "$OUT/layouts.rc"
fi
set -e

"$PY" benchmarks/gpu_check_report.py "$OUT"
