#!/usr/bin/env bash
# tests/test_engine_replay.py five times under two CPU hogs (issue 36): the replay of the search on a
# table must give its stored trees whatever the timing. Run from the repository root:
#   bash benchmarks/replay_under_hogs.sh
sh -c 'while :; do :; done' & H1=$!
sh -c 'while :; do :; done' & H2=$!
trap 'kill $H1 $H2' EXIT
cd "$(dirname "$0")/.."
for i in 1 2 3 4 5; do
  s=$(date +%s); .venv/bin/python -m pytest -q -p no:randomly tests/test_engine_replay.py 2>&1 | tail -1; echo "run $i: $(( $(date +%s) - s )) s, load $(cut -d' ' -f1 /proc/loadavg)"
done
