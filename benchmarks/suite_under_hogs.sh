#!/usr/bin/env bash
# The whole suite from a fresh clone of this checkout's HEAD, while two CPU hogs hold the machine's
# cores (issue 36): the README's two commands as a new user on a busy machine runs them. Run from the
# repository root; arguments go to pytest (e.g. -m "not slow"):
#   bash benchmarks/suite_under_hogs.sh
# It prints the set-up's and the suite's wall time and the load; the clone is removed at the end.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
sh -c 'while :; do :; done' & H1=$!
sh -c 'while :; do :; done' & H2=$!
trap 'kill $H1 $H2 2>/dev/null; rm -rf "$work"' EXIT
git clone -q "$repo" "$work/recipetune" && cd "$work/recipetune" || exit 1
s=$(date +%s)
bash scripts/setup.sh --no-run >setup.log 2>&1 || { tail -20 setup.log; exit 1; }
echo "set-up (scripts/setup.sh --no-run): $(( $(date +%s) - s )) s, load $(cut -d' ' -f1 /proc/loadavg)"
s=$(date +%s)
bash scripts/test.sh "$@"; rc=$?
echo "suite (scripts/test.sh, the dev extra installed first): rc $rc, $(( $(date +%s) - s )) s, load $(cut -d' ' -f1 /proc/loadavg)"
exit $rc
