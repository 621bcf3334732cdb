"""What each way of measuring the loss cuts from the parity test's noise, and what it costs in truth.

    python benchmarks/parity_noise.py tests/fixtures/edge-campaign.yaml --seeds 8 \\
        --other order_seed=1000 --poison micro_batch=16,grad_accum=4,poison=drop

The parity test needs about (q sigma_d / T)^2 seeds, sigma_d the spread of one pair's difference and T
the tolerance of the same measure (docs/guard.md): a measure is cheaper only if it shrinks sigma_d
against its own T. For the baseline and two candidates, each at N seeds (the guard's own runs:
stored under ``--runs`` and trained side by side on the local executor), the script computes per
seed and per measure the candidate's difference from the baseline and reports sigma_d, T (the
spread of the measure over the baseline's first three seeds, or the runs' within-run error where
larger, as the guard sets it) and the seeds the test would need at that ratio; and, for the poison,
what each measure sees of its effect:

- ``tail 50%`` (the guard's training measure), ``tail 25%``, ``tail 75%``: the mean logged loss over
  the last share of the tokens;
- ``tail end``: a straight line fitted to the last 50% and read at the last step (the whole curve's
  slope, not only its level);
- ``validation``: the loss on fixed held-out data at the end (where the trainer prints one);
- ``cuped``: the tail mean less theta times the difference over the first half of the run (a control
  variate, theta fitted on the equivalent's pairs). Its expectation is known only when the candidate
  is equivalent: a poison moves the early difference too, and the control variate then subtracts
  part of the effect it should show.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import numpy as np
import yaml

from recipetune.config import load_campaign
from recipetune.core import stats
from recipetune.core.measure import RunResult
from recipetune.core.sequential import seeds_needed
from recipetune.execute.executor import LocalExecutor
from recipetune.guard.baseline import with_seed
from recipetune.guard.loss import tail, tokens
from recipetune.guard.runs import Runs, wait_all


def edits(text: str) -> dict:
    return {k: yaml.safe_load(v) for k, v in (e.split("=", 1) for e in text.split(",") if e)}


def tail_mean(run: RunResult, share: float) -> float:
    return float(np.mean([s.loss for s in tail(run, tokens(run)[-1], share)]))


def tail_end(run: RunResult) -> float:
    recs = tail(run, tokens(run)[-1], 0.5)
    x = np.array([s.step for s in recs], dtype=float)
    return float(np.polyval(np.polyfit(x, [s.loss for s in recs], 1), x[-1]))


def early(run: RunResult) -> float:
    total = tokens(run)[-1]
    return float(np.mean([s.loss for s, k in zip(run.steps, tokens(run), strict=True) if k <= total / 2]))


MEASURES = {
    "tail 50%": lambda r: tail_mean(r, 0.5),
    "tail 25%": lambda r: tail_mean(r, 0.25),
    "tail 75%": lambda r: tail_mean(r, 0.75),
    "tail end": tail_end,
    "validation": lambda r: r.evals[-1].val_loss if r.evals else math.nan,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("campaign", type=Path)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--other", required=True, help="an equivalent candidate on other batches: knob=value,...")
    p.add_argument("--poison", required=True, help="a poisoned candidate: knob=value,...")
    p.add_argument("--runs", type=Path, default=Path("runs/parity-noise"))
    args = p.parse_args()
    c = load_campaign(args.campaign, [])
    wl, base, steps = c.workload, c.baseline, c.config.guard.parity.steps
    first = int(base.get("seed", 0))
    seeds = [first + k for k in range(args.seeds)]
    runs = Runs(wl, LocalExecutor(), args.runs.resolve(), c.config.guard.timeout_s)
    recipes = {"baseline": base, "other": wl.resolve({**dict(base), **edits(args.other)}),
               "poison": wl.resolve({**dict(base), **edits(args.poison)})}
    futures = {(name, s): runs.start(with_seed(r, s), steps, args.runs.resolve() / f"{name}-{s}")
               for name, r in recipes.items() for s in seeds}
    got = dict(zip(futures, wait_all(list(futures.values())), strict=True))
    assert all(r.ok for r in got.values()), [r.cause for r in got.values() if not r.ok]
    print(f"{args.campaign}: {args.seeds} seeds, {steps} steps; runs trained {runs.launched}, reused {runs.reused}\n")
    profile = [got["baseline", s] for s in seeds[:3]]

    def diffs(name: str, fn) -> list[float]:
        return [fn(got[name, s]) - fn(got["baseline", s]) for s in seeds]

    rows = []
    within = math.sqrt(statistics.fmean(
        stats.mean_with_error([x.loss for x in tail(r, tokens(r)[-1], 0.5)]).se ** 2 for r in profile))
    for label, fn in MEASURES.items():
        if any(math.isnan(fn(r)) for r in profile):
            continue
        sigma = statistics.stdev(fn(r) for r in profile)
        T = max(sigma, within) if label == "tail 50%" else sigma
        rows.append((label, diffs("other", fn), diffs("poison", fn), T))
    # The control variate: theta from the equivalent's pairs, the early difference's expectation taken as 0.
    e_other, e_poison = diffs("other", early), diffs("poison", early)
    d_other, d_poison = diffs("other", MEASURES["tail 50%"]), diffs("poison", MEASURES["tail 50%"])
    theta = float(np.cov(d_other, e_other)[0, 1] / np.var(e_other, ddof=1))
    rows.append((f"cuped (theta {theta:.2f})", [d - theta * e for d, e in zip(d_other, e_other, strict=True)],
                 [d - theta * e for d, e in zip(d_poison, e_poison, strict=True)], rows[0][3]))
    print("| measure | sigma_d (other batches) | T | sigma_d / T | seeds the test needs | poison: mean effect | "
          "effect / T |")
    print("|---|---|---|---|---|---|---|")
    for label, other, poison, T in rows:
        sd = statistics.stdev(other)
        need = seeds_needed(sd, T, 0.04, 0.8, 3, 10_000, True, 3)
        print(f"| {label} | {sd:.4f} | {T:.4f} | {sd / T:.2f} | {need} | {statistics.fmean(poison):+.4f} | "
              f"{statistics.fmean(poison) / T:+.2f} |")


if __name__ == "__main__":
    main()
