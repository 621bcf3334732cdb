"""Train and score one recipe of an FT-Bench task on the test split for the seeds a decision asks for
(finetune/final.py: final_evaluation, the one opener of the test split), so that a decision replayed
from stored per-seed evaluations (benchmarks/ft_decision.py) can be carried on with real runs.

    nice -n 10 python benchmarks/ft_decision_run.py examples/ft-chat-recall.yaml --seeds 4,5 \
        --out runs/ft-decision/chat-recall/baseline
    nice -n 10 python benchmarks/ft_decision_run.py examples/ft-chat-recall.yaml epochs=4 lr=0.001 --seeds 4,5 \
        --out runs/ft-decision/chat-recall/candidate

Prints and writes ``final.json`` (the test metric per seed) and the wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from recipetune.finetune.cli import ensure_base
from recipetune.finetune.experiment import load_experiment
from recipetune.finetune.final import final_evaluation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("overrides", nargs="*", help="key=value recipe changes (the candidate's)")
    ap.add_argument("--seeds", required=True, help="comma-separated seeds")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    exp = load_experiment(a.file, a.overrides)
    ensure_base(exp.spec.model)
    start = time.monotonic()
    result = final_evaluation(exp, [int(s) for s in a.seeds.split(",")], a.out, log=lambda t: print(t, flush=True))
    wall = time.monotonic() - start
    (a.out / "wall.json").write_text(json.dumps({"wall_s": wall, "overrides": a.overrides, "seeds": result.seeds}))
    print(json.dumps({"seeds": result.seeds, "values": result.values, "wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
