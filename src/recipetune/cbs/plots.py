"""Figures for the CBS summary: steps vs batch size, and B* vs data/model size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from recipetune.cbs.table import PAPER_EXPONENTS, GroupResult, ScalingResult


def _figure(width: float, height: float) -> Figure:
    # A bare Figure on the Agg canvas: no pyplot global state, no display needed on training hosts.
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def plot_steps_vs_batch(groups: list[GroupResult], path: Path) -> Path:
    """Measured S(B), the fit a + b/B, linear scaling from B_opt (dotted) and B* (vertical line)."""
    fig = _figure(7, 5)
    ax = fig.add_subplot()
    colors = colormaps["viridis"](np.linspace(0.0, 0.85, max(len(groups), 1)))
    for g, color in zip(groups, colors, strict=False):
        bs = g.fit.batch_sizes
        hi = max(bs.max(), g.b_star or 0.0) * 1.5
        grid = np.geomspace(min(bs.min(), g.b_opt), hi, 200)
        # B* goes in the legend: text labels at the vertical lines collide when groups are close.
        label = f"{g.label}: B*={g.b_star_text}, r2={g.fit.r2:.3f}"
        ax.scatter(bs, g.fit.steps, color=color, zorder=3, label=label)
        ax.plot(grid, g.fit.predict(grid), color=color)
        lin = grid[grid >= g.b_opt]
        ax.plot(lin, g.fit.predict(g.b_opt) * g.b_opt / lin, color=color, linestyle=":", alpha=0.8)
        if g.b_star is not None:
            ax.axvline(g.b_star, color=color, linestyle="--", alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("steps to target loss S(B)")
    ax.set_title("S(B) = a + b/B; dotted: linear scaling from B_opt; dashed: B*")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_scaling(scaling: list[ScalingResult], path: Path) -> Path:
    """B* with its 95% CI against each scaled variable, with the fitted power law."""
    variables = sorted({s.variable for s in scaling}, key=lambda v: v != "data_size")
    fig = _figure(6 * len(variables), 4.5)
    axes = fig.subplots(1, len(variables), squeeze=False)[0]
    for ax, var in zip(axes, variables, strict=True):
        for s in (s for s in scaling if s.variable == var):
            x, y = np.array(s.x), np.array(s.b_star)
            # Unbounded upper ends (inf) are drawn as reaching twice the point, so the bar still shows.
            lo = np.array([c[0] for c in s.b_star_ci])
            hi = np.array([c[1] if np.isfinite(c[1]) else 2 * v for c, v in zip(s.b_star_ci, y, strict=True)])
            err = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
            fixed = ", ".join(f"{k}={v:g}" for k, v in s.fixed.items())
            ci = s.fit.exponent_ci
            ci_text = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if np.all(np.isfinite(ci)) else " (no CI)"
            label = f"{fixed + ': ' if fixed else ''}exponent {s.fit.exponent:.2f}{ci_text}"
            points = ax.errorbar(x, y, yerr=err, fmt="o", capsize=3)
            grid = np.geomspace(x.min(), x.max(), 100)
            ax.plot(grid, s.fit.predict(grid), color=points[0].get_color(), label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(var)
        ax.set_ylabel("critical batch size B*")
        ax.set_title(f"B* vs {var} (paper exponent {PAPER_EXPONENTS[var]})")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
