#!/bin/bash
# The time of a new user's first experiment (docs/finetune.md, "The time of a first experiment"):
# `recipetune ft run examples/ft-arith.yaml` from the checkout SRC into an empty cache (cold), then
# again with the cache it left (warm), each under /usr/bin/time -v and nice; then where the seconds
# before training go (benchmarks/first_experiment_parts.py).
#
#   git clone -b issue-37 <repo> /tmp/clone
#   bash benchmarks/first_experiment.sh /tmp/clone /tmp/first-after      # OUT must not exist
#   PYTHON=/path/to/venv/bin/python bash benchmarks/first_experiment.sh /tmp/before-checkout /tmp/first-before
set -euo pipefail
SRC=$(realpath "$1")
OUT=$(realpath -m "$2")
PY=${PYTHON:-python}
[ -e "$OUT" ] && { echo "$OUT exists: give a new folder (its cache must start empty)" >&2; exit 2; }
mkdir -p "$OUT"
export RECIPETUNE_CACHE=$OUT/cache HF_HOME=$OUT/cache/hf PYTHONPATH=$SRC/src
cd "$SRC"
for run in cold warm; do
  echo "$run start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
  /usr/bin/time -v nice -n 10 "$PY" -m recipetune ft run examples/ft-arith.yaml --out "$OUT/$run" \
    > "$OUT/$run.stdout" 2> "$OUT/$run.time"
  echo "$run end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
  grep -E "Elapsed|User time|System time" "$OUT/$run.time"
  "$PY" -c "import json, sys; print('report timings_s', json.load(open(sys.argv[1]))['timings_s'])" \
    "$OUT/$run/report.json"
done
nice -n 10 "$PY" "$(dirname "$(realpath "$0")")/first_experiment_parts.py"
