"""`recipetune watch` on real long runs of the reference trainer (docs/guard.md, "After approval").

Trains, one after another and niced, the runs it needs (kept in --runs DIR and reused on a rerun):
three seeds of the baseline recipe (nano model, warm-up then cosine decay to --decay steps), an
equivalent on other batches (another seed), and a late drift made without touching the trainer: the
same recipe and seed with half the decay horizon, to zero (``lr_decay_steps``, ``min_lr_ratio``), so
its learning rate equals the baseline's through the warm-up (K steps: the runs are identical there),
then falls faster, and the run stops learning where the baseline goes on; and data repetition from a
late step (issue 50): the same recipe and seed whose data loader, from step --repeat-from on, cycles a
cached set of 16 batches (tests/fixtures/repeating_trainer.py patches the sampler in its own process:
the trainer has no such knob), so its training loss falls below the baseline's while its validation
loss rises. Every run validates every --eval-interval steps. Then watches each run against the
baseline seeds, on both losses (the default where the runs record a validation loss: each at
alpha / 2), on the validation loss alone (--measure val_loss) and on the training loss alone
(--measure loss), and prints what each finding says.

    python benchmarks/watch_reference.py --runs /tmp/watch-runs --steps 1000 --warmup 150 --decay 500 --repeat-from 500
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPEATING = Path(__file__).parents[1] / "tests" / "fixtures" / "repeating_trainer.py"

RECIPE = {"model": "nano", "data": "stdlib", "seq_len": 64, "global_batch_size": 8, "micro_batch_size": 8,
          "lr": 0.003, "lr_schedule": "cosine", "min_lr_ratio": 0.1, "num_threads": 1}


def campaign(folder: Path, steps: int, warmup: int, decay: int, eval_interval: int) -> Path:
    file = folder / "watch-nano.yaml"
    body = {**RECIPE, "warmup_steps": warmup, "lr_decay_steps": decay, "eval_interval": eval_interval}
    lines = "\n".join(f"  {k}: {v}" for k, v in body.items())
    file.write_text(f"workload:\n  kind: reference\nbaseline:\n{lines}\nrun:\n  steps: {steps}\n  timeout_s: 3600\n")
    return file


def train(file: Path, out: Path, steps: int, edits: list[str]) -> Path:
    if (out / "status.json").exists():
        return out
    cmd = ["nice", "-n", "10", sys.executable, "-m", "recipetune", "run", str(file), *edits, "--out", str(out),
           "--steps", str(steps)]
    print("training:", " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def repeating(like: Path, out: Path, steps: int, repeat_from: int) -> Path:
    """The run ``like`` (its recipe and seed) trained again with the loader cycling 16 cached batches from
    step ``repeat_from``: identical to it before."""
    if (out / "status.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(like / "recipe.json", out / "recipe.json")
    cmd = ["nice", "-n", "10", sys.executable, str(REPEATING), "--repeat-from", str(repeat_from), "--",
           "--recipe", str(out / "recipe.json"), "--steps", str(steps), "--out", str(out)]
    print("training:", " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def watch(file: Path, run: Path, baselines: list[Path], out: Path, *options: str) -> dict:
    cmd = [sys.executable, "-m", "recipetune", "watch", str(file), str(run), "--out", str(out), *options]
    for b in baselines:
        cmd += ["--baseline", str(b)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(textwrap.indent(done.stdout.strip(), "    "))
    return json.loads(out.read_text()) if out.exists() and done.returncode in (0, 5) else {"exit": done.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--decay", type=int, default=500, help="the baseline's lr_decay_steps")
    ap.add_argument("--repeat-from", type=int, default=500, help="the step the loader starts cycling 16 batches")
    ap.add_argument("--eval-interval", type=int, default=25)
    args = ap.parse_args()
    args.runs.mkdir(parents=True, exist_ok=True)
    file = campaign(args.runs, args.steps, args.warmup, args.decay, args.eval_interval)
    base = [train(file, args.runs / f"base-{s}", args.steps, [f"seed={s}"]) for s in (0, 1, 2)]
    other = train(file, args.runs / "other-7", args.steps, ["seed=7"])
    drift = train(file, args.runs / "drift-0", args.steps, ["seed=0", f"lr_decay_steps={args.decay // 2}",
                                                            "min_lr_ratio=0.0"])
    repeat = repeating(base[0], args.runs / "repeat-0", args.steps, args.repeat_from)
    cases = [("equivalent, other batches (seed 7) vs seeds 0-2", other, base),
             ("baseline seed 2 vs seeds 0-1 (A/A)", base[2], base[:2]),
             (f"late drift: half the decay horizon, to 0 (seed 0, equal for {args.warmup} steps) vs seeds 0-2",
              drift, base),
             (f"data repetition: 16 cached batches from step {args.repeat_from} (seed 0, equal before) vs seeds 0-2",
              repeat, base)]
    for i, (name, run, baselines) in enumerate(cases):
        for measure in ("auto", "val_loss", "loss"):
            print(f"{name}, --measure {measure}:", flush=True)
            f = watch(file, run, baselines, args.runs / f"finding-{i}-{measure}.json", "--measure", measure)
            if "decision" in f:
                for x in [f, *f["also_judged"]]:
                    d = x["design"]
                    print(f"    -> {f['decision']} on {x['measure']}; {x['delay']}; h {d['h']:.2f}, alpha "
                          f"{d['alpha']}, {d['blocks']} blocks of {d['block_points']}; noise {json.dumps(x['noise'])}")


if __name__ == "__main__":
    main()
