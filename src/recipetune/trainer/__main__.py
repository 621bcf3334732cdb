"""``python -m recipetune.trainer --recipe R.json --steps N --out DIR`` (also under torchrun).

Exit codes say what happened: 0 ok, 2 invalid recipe, 3 out of memory, 4 non-finite loss,
1 anything else. The same is written to ``status.json`` with its cause.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import torch

from recipetune.core.recipe import KnobError
from recipetune.trainer.data import DataError
from recipetune.trainer.knobs import check_recipe, reference_knobs
from recipetune.trainer.loop import NonFiniteLoss, train


def write_status(out_dir: Path, status: str, cause: str = "") -> None:
    # Any rank may fail first; the first to write wins, the others keep quiet.
    path = out_dir / "status.json"
    if status == "ok" and int(os.environ.get("RANK", 0)) != 0:
        return
    if status != "ok" and path.exists():
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status, "cause": cause, "rank": int(os.environ.get("RANK", 0))}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipetune.trainer", description=__doc__)
    parser.add_argument("--recipe", type=Path, required=True, help="JSON file: knob -> value")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--init-from", type=Path, help="checkpoint to continue from")
    parser.add_argument("--save-checkpoint", type=Path, help="where to save the final state")
    parser.add_argument("--stop-at-val-loss", type=float, help="stop early once validation reaches this loss")
    args = parser.parse_args(argv)

    try:
        recipe = reference_knobs().resolve(json.loads(args.recipe.read_text()))
        problems = check_recipe(dict(recipe))
        if problems:
            raise ValueError("; ".join(problems))
    except (OSError, json.JSONDecodeError, KnobError, ValueError) as e:
        write_status(args.out, "invalid", str(e))
        print(f"invalid recipe {args.recipe}: {e}", file=sys.stderr)
        return 2

    try:
        trained = train(dict(recipe), args.steps, args.out, args.init_from, args.save_checkpoint, args.stop_at_val_loss)
    except torch.OutOfMemoryError as e:
        write_status(args.out, "oom", str(e).splitlines()[0])
        traceback.print_exc()
        return 3
    except NonFiniteLoss as e:
        write_status(args.out, "nan", str(e))
        print(str(e), file=sys.stderr)
        return 4
    except (DataError, KnobError) as e:
        write_status(args.out, "invalid", str(e))
        print(str(e), file=sys.stderr)
        return 2
    except Exception as e:  # classified as a crash, with its cause kept
        if "out of memory" in str(e).lower():
            write_status(args.out, "oom", str(e).splitlines()[0])
            traceback.print_exc()
            return 3
        write_status(args.out, "crash", f"{type(e).__name__}: {e}".splitlines()[0][:500])
        traceback.print_exc()
        return 1
    early = trained < args.steps
    write_status(args.out, "ok", f"reached validation loss {args.stop_at_val_loss} after {trained} steps" * early)
    return 0


if __name__ == "__main__":
    sys.exit(main())
