"""The replay's figures: trials and wall time to come within 2% of a table's best, and the speed-up
reached at fixed budgets, per strategy (median and quartiles over seeds), as data, Markdown and a plot."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from recipetune.bench.replay import Trajectory

BUDGETS = (8, 16, 32)
WITHIN = 0.02


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    """Median and quartiles; an unreached target counts as infinitely late, so it can be the median."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        if math.isinf(xs[hi]):
            return xs[hi] if pos > lo or math.isinf(xs[lo]) else xs[lo]
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return q(0.5), q(0.25), q(0.75)


def summarize(trajectories: list[Trajectory], best: float, budget: int) -> dict[str, Any]:
    """Per strategy: trials and wall seconds to a recipe within 2% of ``best``, incumbent at budgets."""
    target = (1 - WITHIN) * best
    out: dict[str, Any] = {}
    for name in dict.fromkeys(t.strategy for t in trajectories):
        runs = [t for t in trajectories if t.strategy == name]
        reach = [t.to_reach(target) for t in runs]
        trials = [float(n) if n is not None else math.inf for n, _ in reach]
        wall = [w if w is not None else math.inf for _, w in reach]
        row: dict[str, Any] = {
            "seeds": len(runs), "reached": sum(n is not None for n, _ in reach),
            "trials_to_2pct": _quartiles(trials), "wall_s_to_2pct": _quartiles(wall),
            "trials_run": statistics.median(len(t.trials) for t in runs),
        }
        for b in BUDGETS:
            if b <= budget:
                row[f"incumbent_at_{b}"] = _quartiles([t.incumbent(b) for t in runs])
                row[f"found_at_{b}"] = _quartiles([t.found(b) for t in runs])
        out[name] = row
    return out


def _num(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:.1f}".removesuffix(".0")


def markdown(name: str, summary: dict[str, Any], best: float, n_recipes: int, budget: int) -> str:
    """One Markdown table: the strategies as rows."""
    cols = [b for b in BUDGETS if b <= budget]
    head = ("| strategy | trials to within 2% (median [IQR]) | reached | wall s to within 2% | "
            + " | ".join(f"speed-up at {b}" for b in cols) + " |")
    lines = [f"**{name}**: {n_recipes} recipes, best {best:.2f}x the baseline; budget {budget} trials, "
             f"speed-ups are the true (median over repeats) speed-up of each strategy's incumbent.", "",
             head, "|" + "---|" * (4 + len(cols))]
    for strategy, r in summary.items():
        m, lo, hi = r["trials_to_2pct"]
        wm, wlo, whi = r["wall_s_to_2pct"]
        cells = [f"{r[f'incumbent_at_{b}'][0]:.2f}x [{r[f'incumbent_at_{b}'][1]:.2f}-{r[f'incumbent_at_{b}'][2]:.2f}]"
                 for b in cols]
        lines.append(f"| {strategy} | {_num(m)} [{_num(lo)}-{_num(hi)}] | {r['reached']}/{r['seeds']} | "
                     f"{_num(wm)} [{_num(wlo)}-{_num(whi)}] | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(panels: list[tuple[str, list[Trajectory], float, int]], path: Path) -> None:
    """Per table: the incumbent's true speed-up against trials (median line, quartile band), and the
    trials each seed needed to come within 2% of the best (one dot per seed; 'never' at the top)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 4.2 * len(panels)), squeeze=False)
    for row, (name, trajectories, best, budget) in enumerate(panels):
        ax, ax2 = axes[row]
        strategies = list(dict.fromkeys(t.strategy for t in trajectories))
        xs = list(range(0, budget + 1))
        for i, s in enumerate(strategies):
            runs = [t for t in trajectories if t.strategy == s]
            q = [_quartiles([t.incumbent(n) for t in runs]) for n in xs]
            color = plt.cm.tab10(i)
            ax.plot(xs, [m for m, _, _ in q], label=s, color=color, lw=2.2 if s.startswith("mcts") else 1.3)
            ax.fill_between(xs, [lo for _, lo, _ in q], [hi for _, _, hi in q], color=color, alpha=0.12)
            reach = [t.to_reach((1 - WITHIN) * best)[0] for t in runs]
            ys = [r if r is not None else budget + 2 for r in reach]
            ax2.scatter([i + (j - len(ys) / 2) * 0.02 for j in range(len(ys))], ys, s=10, color=color, alpha=0.6)
            med = _quartiles([float(r) if r is not None else math.inf for r in reach])[0]
            if not math.isinf(med):
                ax2.hlines(med, i - 0.3, i + 0.3, color="black", lw=2)
        ax.axhline(best, color="grey", ls="--", lw=1)
        ax.axhline((1 - WITHIN) * best, color="grey", ls=":", lw=1)
        ax.set(title=f"{name}: incumbent's true speed-up (median, IQR)", xlabel="trials", ylabel="speed-up vs baseline")
        ax.legend(fontsize=8, loc="lower right")
        ax2.axhline(budget + 2, color="grey", ls=":", lw=1)
        ax2.set_xticks(range(len(strategies)), strategies, rotation=30, ha="right", fontsize=8)
        ax2.set(title=f"{name}: trials to within 2% of the best", ylabel="trials (bar: median; dotted: never)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
