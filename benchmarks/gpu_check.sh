#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, within its phases' hard limits (12 minutes on one GPU; 16 with
# the dense layouts of two),
#   1. the GPU-marked tests (pytest -m gpu: bf16, fused optimizer, compile, memory, grouped experts; NCCL,
#      expert, pipeline and context parallelism with >= 2 GPUs)
#   2. the hand-tuned recipe (examples/gpt2-gpu-hand.yaml: bf16, SDPA, fused AdamW, torch.compile, TF32, micro-batch
#      32) on gpt2-124m at sequence length 1024: tokens/s, MFU against the dense bf16 peak (goal 40%), and the
#      torch.profiler breakdown of its last steps (profile.json: kernel time by kind, launch gaps, optimizer)
#   3. `recipetune tune` from the plain recipe (examples/gpt2-gpu.yaml: math attention, for-loop AdamW, no
#      compile, micro-batch 8) with its verdict: the goal is an approved recipe at >= 0.9x the hand-tuned tokens/s
#   4. the layouts of the 8-expert moe-8x (experts' loop against batched matmuls; with >= 2 GPUs expert
#      parallelism and pipeline schedules) and, with >= 2 GPUs, of the dense gpt2-124m (FSDP2, TP, CP, PP)
#      and the experts three ways (benchmarks/moe_kernels.py: loop, padded, grouped GEMMs without padding)
# Each phase's figures are written as it ends (benchmarks/results/gpu_check-<date>-<gpu>.{json,md}, quoted by
# docs/benchmarks.md), so a lease that ends early keeps what was measured. Compiled graphs go to the shared
# cache (TORCHINDUCTOR_CACHE_DIR, default <OUT>/inductor): phase 2 compiles the hand-tuned shapes once for phase 3.
#
#   bash benchmarks/gpu_check.sh             # the check (exits 1 at once without an NVIDIA GPU)
#   bash benchmarks/gpu_check.sh --dry-run   # anywhere: validates the files and prints the plan
#
# Environment: PYTHON (default .venv/bin/python, else python3), OUT (default runs/gpu_check-<time>), and each
# phase's hard limit in seconds, to fit a shorter lease: LIMIT_TESTS (80), LIMIT_HAND (110), LIMIT_TUNE (450),
# LIMIT_LAYOUTS (40), LIMIT_MOE (40), LIMIT_DENSE (240, two GPUs); TUNE_OVERRIDES, key=value overrides of the campaign
# (e.g. "search.budget.wall_time_s=200" for a shorter search). The tests are those of the two GPU modules, so a
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
HAND=examples/gpt2-gpu-hand.yaml
HAND_STEPS=40
LIMIT_TESTS=${LIMIT_TESTS:-80} LIMIT_HAND=${LIMIT_HAND:-110} LIMIT_TUNE=${LIMIT_TUNE:-450}
LIMIT_LAYOUTS=${LIMIT_LAYOUTS:-40} LIMIT_MOE=${LIMIT_MOE:-40} LIMIT_DENSE=${LIMIT_DENSE:-240}
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
"$PY" - "$CAMPAIGN" "$HAND" "${TUNE_ARGS[@]}" <<'EOF'
import sys
from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError
try:
    load_campaign(sys.argv[1], sys.argv[3:])
    load_campaign(sys.argv[2])
except ConfigError as e:
    sys.exit(f"gpu_check: {e}")
EOF
# ... and so must every layout of phase 4 (the knob checks, on any machine)
"$PY" benchmarks/layouts.py --suite moe --presets moe-8x --device cuda --check >/dev/null
"$PY" benchmarks/moe_kernels.py --preset moe-8x --device cuda --check >/dev/null
"$PY" benchmarks/layouts.py --suite dense --presets gpt2-124m --device cuda --check >/dev/null

if [[ $DRY == 1 ]]; then
  echo "gpu_check --dry-run: $CAMPAIGN loads; with a GPU this would run, into $OUT:"
  echo "  1. $PY -m pytest -q -m gpu ${GPU_TESTS[*]}  (limit $LIMIT_TESTS s)"
  echo "  2. recipetune run $HAND --steps $HAND_STEPS  (limit $LIMIT_HAND s; the hand-tuned recipe)"
  echo "  3. recipetune tune $CAMPAIGN ${TUNE_ARGS[*]}  (limit $LIMIT_TUNE s; from the plain recipe)"
  echo "  4. $PY benchmarks/layouts.py --suite moe --presets moe-8x --device cuda     (limit $LIMIT_LAYOUTS s)"
  echo "     $PY benchmarks/moe_kernels.py --preset moe-8x --device cuda    (limit $LIMIT_MOE s; loop, padded, segmented experts)"
  echo "     $PY benchmarks/layouts.py --suite dense --presets gpt2-124m --device cuda (limit $LIMIT_DENSE s, >= 2 GPUs)"
  echo "  after each: $PY benchmarks/gpu_check_report.py $OUT  -> benchmarks/results/gpu_check-<date>-<gpu>.{json,md}"
  echo "  limits: $((LIMIT_TESTS + LIMIT_HAND + LIMIT_TUNE + LIMIT_LAYOUTS + LIMIT_MOE)) s in all on one GPU"
  exit 0
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the cache folder below and every phase's --out
echo "== gpu_check into $OUT"
nvidia-smi -L | tee "$OUT/gpus.txt"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUT/inductor}

# phase NAME LIMIT COMMAND...: run it under its hard limit, keep its output, exit code and wall seconds, and
# write the figures so far. A phase that fails or runs out of time is recorded and the check goes on.
phase() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s.%N)
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  echo "${PIPESTATUS[0]}" > "$OUT/$name.rc"
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f\n", b - a }' > "$OUT/$name.s"
  "$PY" benchmarks/gpu_check_report.py "$OUT" > /dev/null || true
}

set +e
echo "== 1/4 pytest -m gpu"
phase pytest "$LIMIT_TESTS" "$PY" -m pytest -q -m gpu "${GPU_TESTS[@]}" -p no:cacheprovider --junitxml="$OUT/pytest.xml"

echo "== 2/4 the hand-tuned recipe ($HAND)"
phase run "$LIMIT_HAND" "$PY" -m recipetune run "$HAND" --steps "$HAND_STEPS" --out "$OUT/run"

echo "== 3/4 recipetune tune from the plain recipe ($CAMPAIGN)"
phase tune "$LIMIT_TUNE" "$PY" -m recipetune tune "$CAMPAIGN" "${TUNE_ARGS[@]}" --out "$OUT/tune"

# Two processes where there are two GPUs; on one GPU only the single-process layouts run (the others are
# listed as left out in the figures).
NGPU=$(nvidia-smi -L | wc -l)
echo "== 4/4 layouts (moe-8x; gpt2-124m with >= 2 GPUs), $NGPU GPU(s)"
phase layouts "$LIMIT_LAYOUTS" "$PY" benchmarks/layouts.py --suite moe --presets moe-8x --device cuda --nproc 2 \
  --steps 10 --repeats 1 --json "$OUT/layouts-moe.json"
# the experts three ways at the measured imbalance (loop, padded bmm, grouped GEMMs without padding): issue 43
phase moe "$LIMIT_MOE" "$PY" benchmarks/moe_kernels.py --preset moe-8x --device cuda --json "$OUT/moe-kernels.json"
if [[ $NGPU -ge 2 ]]; then
  cp "$OUT/layouts.rc" "$OUT/layouts-moe.rc"
  phase layouts "$LIMIT_DENSE" "$PY" benchmarks/layouts.py --suite dense --presets gpt2-124m --device cuda --nproc 2 \
    --steps 10 --repeats 1 --json "$OUT/layouts-dense.json"
  [[ $(cat "$OUT/layouts-moe.rc") -ne 0 ]] && cp "$OUT/layouts-moe.rc" "$OUT/layouts.rc"
fi
set -e

"$PY" benchmarks/gpu_check_report.py "$OUT"
