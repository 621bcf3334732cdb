"""``python -m recipetune.finetune FILE --out DIR [--child CHILD.json] [--checkpoints N] [key=value ...]``: one
experiment in its own process, so a search can give it a timeout and kill it (core/process.py's
``run_process``). With ``--checkpoints N`` it writes the validation metric on the first
``--checkpoint-examples`` rows at N points of the training to ``DIR/progress.jsonl`` (a pruner reads it).

``CHILD.json`` holds ``{"recipe": {...}, "data": [...]}``: a child experiment (``Experiment.derive``).
Exit codes: 0 ok (``report.json`` written), 2 invalid input (message on stderr, nothing written),
1 the experiment failed (``report.json`` says how: crash, nan, oom).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recipetune.core.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipetune.finetune", description=__doc__)
    parser.add_argument("experiment", type=Path)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--child", type=Path, help="JSON: recipe changes and/or a data chain")
    parser.add_argument("--checkpoints", type=int, default=0, help="validation reports during training")
    parser.add_argument("--checkpoint-examples", type=int, default=64, help="validation rows per report")
    args = parser.parse_args(argv)

    from recipetune.finetune.experiment import load_experiment, prepare_data, run_experiment

    try:
        exp = load_experiment(args.experiment, args.overrides)
        if args.child is not None:
            try:
                child = json.loads(args.child.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ConfigError(args.child, "", f"not a readable JSON file: {e}") from None
            exp = exp.derive(recipe=child.get("recipe"), data=child.get("data"))
        rows, version = prepare_data(exp, args.out)
        report = run_experiment(exp, args.out, rows, version, checkpoints=args.checkpoints,
                                checkpoint_examples=args.checkpoint_examples)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
