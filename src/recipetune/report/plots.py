"""The report's figures, drawn with matplotlib and returned as PNG bytes (the page embeds them).

Each function takes the ``Report`` and returns None when the campaign has nothing to draw for it
(no finalists, no breakdown), so the page simply leaves that figure out.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from recipetune.core.words import Decision
from recipetune.engine.status import Status
from recipetune.guard.loss import matched
from recipetune.report.model import TREE_STATUSES, Curve, Report, Trial
from recipetune.report.sources import QUALITY, smooth

COLORS = {Status.BASELINE: "#6b7280", "approved": "#15803d", Status.PASSED: "#2563eb", Status.REJECTED: "#d97706",
          Status.FAILED: "#dc2626", Status.PRUNED: "#a16207", Status.INTERRUPTED: "#9ca3af",
          Status.DUPLICATE: "#9ca3af", Status.RUNNING: "#0891b2"}
OTHERS = ["#7c3aed", "#0d9488", "#db2777", "#2563eb", "#ca8a04"]  # finalists other than the winner
PARTS = {"data_s": ("data", "#f59e0b"), "compute_s": ("compute", "#3b82f6"), "optim_s": ("optimizer", "#8b5cf6")}
DPI = 110


def _figure(width: float, height: float) -> Figure:
    # A bare Figure on the Agg canvas: no pyplot global state, no display needed.
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _style(ax) -> None:
    ax.grid(True, alpha=0.25)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def data_uri(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode("ascii")


def smoothed(steps: list[int], loss: list[float | None], window: int) -> tuple[np.ndarray, np.ndarray]:
    """The guard's smoothing (a trailing mean over full windows), each value drawn at its window's centre."""
    pts = [(s, v) for s, v in zip(steps, loss, strict=True) if v is not None]
    if not pts:
        return np.array([]), np.array([])
    y = np.asarray(smooth([v for _, v in pts], window))
    lag = (len(pts) - len(y)) // 2
    return np.array([s for s, _ in pts][lag : lag + len(y)], dtype=float), y


def paired_gap(base: Curve, cand: Curve, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Smoothed candidate minus smoothed baseline over the steps both logged (guard/loss.py: ``matched``),
    each value drawn at its window's centre: the gap panel of ``loss_plot``."""
    both = matched({s: v for s, v in zip(base.steps, base.loss, strict=True) if v is not None},
                   {s: v for s, v in zip(cand.steps, cand.loss, strict=True) if v is not None})
    if both is None:
        return np.array([]), np.array([])
    diff = np.asarray(smooth(both.cand.tolist(), window)) - np.asarray(smooth(both.base.tolist(), window))
    lag = (len(both.steps) - len(diff)) // 2
    return np.array(both.steps[lag : lag + len(diff)], dtype=float), diff


def _short(text: str, width: int = 48) -> str:
    text = text.replace('"', "")  # knob=value reads better without JSON's quotes on strings
    return text if len(text) <= width else text[: width - 1] + "\u2026"


# -- the decision -------------------------------------------------------------------------------


def speed_plot(report: Report) -> bytes | None:
    """Each finalist's speed-up with its confidence interval, against 1.0x and the noise margin."""
    rows = [e for e in report.finalists if e.speedup is not None]
    if not rows:
        return None
    rows = sorted(rows, key=lambda e: e.speedup or 0.0)
    fig = _figure(12, 0.55 * len(rows) + 1.4)
    ax = fig.add_subplot()
    # Each finalist has its own margin (the A/A noise seen so far): a band per row, 1/(1+m) .. 1+m.
    margins = [e.noise_margin for e in rows if e.noise_margin is not None]
    for y, e in enumerate(rows):
        if e.noise_margin is not None:
            m = e.noise_margin
            label = f"noise margin (±{100 * m:.1f}%)" if len(set(margins)) == 1 else "noise margin (per finalist)"
            ax.fill_betweenx([y - 0.38, y + 0.38], 1 / (1 + m), 1 + m, color="#9ca3af", alpha=0.3,
                             label=label if y == 0 else None)
    ax.axvline(1.0, color=COLORS["baseline"], lw=1.2, ls="--", label="baseline (1.0x)")
    winner = report.winner.recipe_id if report.winner else None
    for y, e in enumerate(rows):
        color = COLORS["approved"] if e.recipe_id == winner else (
            COLORS[Status.PASSED] if e.decision == Decision.APPROVED else COLORS[Status.REJECTED])
        lo = e.ci_low if e.ci_low is not None else e.speedup
        hi = e.ci_high if e.ci_high is not None else e.speedup
        ax.errorbar([e.speedup], [y], xerr=[[e.speedup - lo], [hi - e.speedup]], fmt="o", color=color,
                    capsize=5, lw=2, ms=8)
        ax.annotate(f"{e.speedup:.3f}x  [{lo:.3f}, {hi:.3f}]  {e.decision}", (hi, y), xytext=(8, 0),
                    textcoords="offset points", va="center", fontsize=8.5, color=color)
    ax.set_yticks(range(len(rows)), [_short(f"#{e.trial} {e.change}", 42) for e in rows], fontsize=8.5)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    right = max((e.ci_high or e.speedup or 1.0) for e in rows)
    left = min([(e.ci_low or e.speedup or 1.0) for e in rows] + [1 / (1 + m) for m in margins])
    if right / max(left, 1e-9) > 4:  # speed-ups of 1.1x and 40x on one axis: ratios read best on a log scale
        ax.set_xscale("log")
        ax.set_xlim(left / 1.3, right * (right / left) ** 0.5)
    else:
        span = max(right - left, 0.05)
        ax.set_xlim(left - 0.08 * span, right + 0.65 * span)
    conf = f"{100 * rows[0].confidence:.0f}% CI"
    ax.set_xlabel(f"speed-up in tokens/s per device (interleaved A/B re-measurement, {conf})")
    ax.set_title("Final verdicts: speed-up vs noise", loc="left", fontsize=11)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    _style(ax)
    return png(fig)


def loss_plot(report: Report) -> bytes | None:
    """The candidates' loss against the baseline at the same seed, with the tolerance band on their gap."""
    base = [c for c in report.curves if c.role == "baseline"]
    others = [c for c in report.curves if c.role != "baseline"]
    if not base and not others:
        return None
    w = report.smoothing_window
    tol = report.baseline.loss_tolerance
    fig = _figure(12, 4.2)
    ax, gap_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    for c in base:  # every seed, raw: the spread the tolerance is measured from
        ax.plot(c.steps, [np.nan if v is None else v for v in c.loss], color=COLORS["baseline"], lw=0.7, alpha=0.4)
    if base:
        x, y = smoothed(base[0].steps, base[0].loss, w)
        # A wide grey stroke under the candidates: a candidate that trains identically still shows.
        ax.plot(x, y, color="#4b5563", lw=5, alpha=0.45, solid_capstyle="round", label="baseline, same seed")
        if tol is not None:
            ax.fill_between(x, y - tol, y + tol, color=COLORS["baseline"], alpha=0.25, label=f"tolerance ±{tol:.4f}")
            gap_ax.axhspan(-tol, tol, color=COLORS["baseline"], alpha=0.25, label=f"tolerance ±{tol:.4f}")
        gap_ax.axhline(0, color=COLORS["baseline"], lw=1.2)
    k = 0
    for c in others:
        color = COLORS["approved"] if c.role == "approved" else OTHERS[k % len(OTHERS)]
        k += c.role != "approved"
        lw = 2.2 if c.role == "approved" else 1.4
        x, y = smoothed(c.steps, c.loss, w)
        ax.plot(x, y, color=color, lw=lw, label=_short(c.label, 40))
        if base:
            gx, gap = paired_gap(base[0], c, w)
            rms = float(np.sqrt(np.mean(gap**2))) if gap.size else float("nan")
            gap_ax.plot(gx, gap, color=color, lw=lw, label=f"#{c.trial}: RMS {rms:.4f}")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss, mean of {w} steps (thin: raw, every seed)")
    ax.set_title("Loss: candidates against the baseline", loc="left", fontsize=11)
    ax.legend(fontsize=8, loc="upper right")
    gap_ax.set_xlabel("step")
    gap_ax.set_ylabel("smoothed loss - baseline (nats)")
    gap_ax.set_title("Gap at the same seed (T shown; the guard judges its tail mean)", loc="left", fontsize=11)
    if gap_ax.lines or gap_ax.patches:
        gap_ax.legend(fontsize=8, loc="upper right")
    if tol is not None:
        lim = max(3 * tol, *(float(np.nanmax(np.abs(line.get_ydata()))) * 1.1 for line in gap_ax.lines[1:]))
        gap_ax.set_ylim(-lim, lim)
    for a in (ax, gap_ax):
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        _style(a)
    return png(fig)


# -- the search ---------------------------------------------------------------------------------


def _bar(value: float, low: float, high: float) -> list[list[float]]:
    """The error bar of ``value`` for the interval [low, high]. A trial's figure is the median over windows and
    its interval the ratio estimator's (report/speed.py: tokens_per_s_interval): with skewed step times the
    median can lie outside it, and matplotlib refuses a negative length (a kill-and-resume campaign's report
    failed to build): the bar then joins the point to the interval's far end."""
    return [[max(value - low, 0.0)], [max(high - value, 0.0)]]


def throughput_plot(report: Report) -> bytes | None:
    """Tokens/s per device of every trial in the order they ran, with 95% intervals and the baseline band."""
    ran = [t for t in report.trials if t.ran]
    if not ran:
        return None
    fig = _figure(12, 3.8)
    ax = fig.add_subplot()
    base = report.baseline.tokens_per_s
    if base:
        ax.axhline(base, color=COLORS["baseline"], lw=1.5, ls="--", label="baseline")
        if report.baseline.throughput_noise:
            noise = report.baseline.throughput_noise
            ax.axhspan(base * (1 - noise), base * (1 + noise), color=COLORS["baseline"], alpha=0.18,
                       label=f"baseline noise ±{100 * noise:.1f}%")
    top = max([t.tokens_per_s for t in ran if t.tokens_per_s] + [base or 1.0])
    for t in ran:
        x = t.number
        if t.tokens_per_s is None or t.status in ("failed", "interrupted"):
            ax.scatter([x], [0.03 * top], marker="x", s=60, color=COLORS.get(t.status, "red"), zorder=3)
            ax.annotate(t.run_status or t.status, (x, 0.03 * top), xytext=(0, 7), textcoords="offset points",
                        ha="center", fontsize=7.5, color=COLORS.get(t.status, "red"))
            continue
        color = COLORS["approved"] if t.winner else COLORS.get(t.status, "#111827")
        ci = t.tokens_per_s_ci or [t.tokens_per_s, t.tokens_per_s]
        ax.errorbar([x], [t.tokens_per_s], yerr=_bar(t.tokens_per_s, ci[0], ci[1]), fmt="o",
                    color=color, capsize=3, ms=9 if t.winner else 6, zorder=3)
    handles = [Line2D([], [], color=COLORS[s], marker=m, ls="", label=lab) for s, m, lab in (
        ("approved", "o", "approved"), (Status.PASSED, "o", "passed screening"),
        (Status.REJECTED, "o", "rejected (loss)"), (Status.FAILED, "x", "failed run"))]
    existing, _ = ax.get_legend_handles_labels()
    ax.legend(handles=existing + handles, fontsize=8, loc="upper left", ncol=3)
    ax.set_xlabel("trial (in the order they ran)")
    ax.set_ylabel("tokens/s per device")
    ax.set_xticks([t.number for t in ran])
    ax.set_ylim(0, top * 1.25)
    ax.set_title("Throughput of every trial (95% interval over its measured steps)", loc="left", fontsize=11)
    if base:
        sec = ax.secondary_yaxis("right", functions=(lambda y: y / base, lambda s: s * base))
        sec.set_ylabel("speed-up")
    _style(ax)
    return png(fig)


def _layout(report: Report) -> tuple[dict[str, tuple[float, int]], dict[str, str | None], dict[str, Trial]]:
    """A layered layout: depth down the page, leaves spread in trial order, parents over their children."""
    nodes = {str(t.number): t for t in report.trials if t.status in TREE_STATUSES}
    by_recipe: dict[str, str] = {}
    for key, t in nodes.items():
        if t.recipe_id not in by_recipe or nodes[by_recipe[t.recipe_id]].status == "interrupted":
            by_recipe[t.recipe_id] = key
    parent: dict[str, str | None] = {"root": None}
    for key, t in nodes.items():
        p = by_recipe.get(t.parent or "")
        parent[key] = p if p is not None and p != key else "root"
    children: dict[str, list[str]] = {k: [] for k in parent}
    for key in sorted(nodes, key=int):
        children[parent[key] or "root"].append(key)
    pos: dict[str, tuple[float, int]] = {}
    next_leaf = [0.0]
    seen: set[str] = set()

    def place(key: str, depth: int) -> float:
        seen.add(key)
        kids = [k for k in children[key] if k not in seen]
        if not kids:
            x = next_leaf[0]
            next_leaf[0] += 1
        else:
            xs = [place(k, depth + 1) for k in kids]
            x = (xs[0] + xs[-1]) / 2
        pos[key] = (x, depth)
        return x

    place("root", 0)
    return pos, parent, nodes


def _tree_node(ax: Axes, t: Trial, x: float, y: float, crowded: bool, job: str) -> None:
    """One trial's node: filled once it ran, a star for the winner, its edit and outcome beneath."""
    color = COLORS["approved"] if t.winner else COLORS.get(t.status, "#111827")
    size = 90 + 650 * (t.reward or 0.0)
    radius = size**0.5 / 2  # marker radius in points
    ax.scatter([x], [-y], s=size * (2.2 if t.winner else 1.0), zorder=3, marker="*" if t.winner else "o",
               color="white" if not t.ran else color, edgecolors=color, linewidths=1.5)
    ax.annotate(f"#{t.number}", (x, -y), xytext=(radius + 3, radius - 2), textcoords="offset points",
                fontsize=8, color="#111827", zorder=4,
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
    if t.status == Status.PASSED and job == QUALITY:
        outcome = f"{t.value:.3f}" if t.value is not None else Status.PASSED
    elif t.status == Status.PASSED:
        outcome = f"{t.speedup:.2f}x" if t.speedup is not None else Status.PASSED
    else:
        outcome = t.run_status if t.status == Status.FAILED and t.run_status else t.status
    label = outcome if crowded and not t.on_path else f"{_short(t.edit, 24)}\n{outcome}"
    ax.annotate(label, (x, -y), xytext=(0, -radius - 4), textcoords="offset points", ha="center", va="top",
                fontsize=7.5, color="#374151", fontweight="bold" if t.on_path else "normal", zorder=4,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})


def _tree_legend(ax: Axes) -> None:
    """The key to the colours and marks, beside the tree so it hides no node."""
    handles = [Line2D([], [], color=COLORS[s], marker="o", ls="", ms=8, label=s) for s in
               (Status.BASELINE, Status.PASSED, Status.REJECTED, Status.FAILED)]
    handles += [Line2D([], [], color=COLORS["approved"], marker="*", ls="-", lw=3, ms=12, label="path to the winner"),
                Line2D([], [], color="#6b7280", marker="o", mfc="white", ls="", ms=8, label="not run (static check)")]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def tree_plot(report: Report) -> bytes | None:
    """The search tree: nodes coloured by verdict, sized by reward; the path to the winner drawn bold."""
    pos, parent, nodes = _layout(report)
    if len(pos) < 2:
        return None
    width = max(p[0] for p in pos.values()) + 1
    depth = max(p[1] for p in pos.values())
    fig = _figure(min(max(7.0, 1.35 * width + 2.5), 15.0), 1.25 * depth + 1.8)
    ax = fig.add_subplot()
    for key, (x, y) in pos.items():
        p = parent.get(key)
        if p is None or p not in pos:
            continue
        px, py = pos[p]
        on_path = nodes[key].on_path
        ax.plot([px, x], [-py, -y], color=COLORS["approved"] if on_path else "#cbd5e1", lw=3.5 if on_path else 1.2,
                zorder=1)
    rx, ry = pos["root"]
    ax.scatter([rx], [-ry], s=520, color=COLORS["baseline"], zorder=3, edgecolors="white", linewidths=1.5)
    ax.annotate("baseline", (rx, -ry), xytext=(0, 16), textcoords="offset points", ha="center", fontsize=9,
                fontweight="bold")
    crowded = width > 10
    for key, t in nodes.items():
        _tree_node(ax, t, *pos[key], crowded, report.job)
    _tree_legend(ax)
    ax.set_xlim(-0.7, width - 0.3)
    ax.set_ylim(-depth - 0.75, 0.45)
    ax.axis("off")
    ax.set_title("Search tree: each edge one experiment; node size = reward", loc="left", fontsize=11)
    return png(fig)


def breakdown_plot(report: Report) -> bytes | None:
    """Mean step time split into data wait, compute and optimizer, for the baseline and each run."""
    rows: list[tuple[str, dict[str, float], bool]] = []
    if report.baseline.breakdown_s:
        rows.append(("baseline", report.baseline.breakdown_s, False))
    rows += [(f"#{t.number} {_short(t.change, 34)}", t.breakdown_s, t.winner) for t in report.trials
             if t.breakdown_s and t.status in (Status.PASSED, Status.REJECTED)]
    if not rows:
        return None
    rows = rows[:1] + rows[1:][-24:]  # the page stays readable on long campaigns; report.json has them all
    fig = _figure(12, 0.32 * len(rows) + 1.3)
    ax = fig.add_subplot()
    ys = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for part, (label, color) in PARTS.items():
        vals = np.array([1000 * r[1].get(part, 0.0) for r in rows])
        if not vals.any():
            continue
        ax.barh(ys, vals, left=left, color=color, label=label, height=0.7)
        left += vals
    for y, total in zip(ys, left, strict=True):
        ax.annotate(f"{total:.1f} ms", (total, y), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize=7.5)
    ax.set_yticks(ys, [r[0] for r in rows], fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), rows, strict=True):
        if r[2]:
            tick.set_fontweight("bold")
            tick.set_color(COLORS["approved"])
    ax.set_xlim(0, left.max() * 1.15)
    ax.set_xlabel("mean step time (ms), warm-up excluded")
    ax.set_title("Where the step time goes", loc="left", fontsize=11)
    ax.legend(fontsize=8, loc="lower right")
    _style(ax)
    return png(fig)


# -- the quality job ------------------------------------------------------------------------------


def validation_plot(report: Report) -> bytes | None:
    """The validation metric of every experiment in the order they ran, the best so far, and the baseline's."""
    ran = [t for t in report.trials if t.ran]
    if not ran:
        return None
    fig = _figure(12, 3.8)
    ax = fig.add_subplot()
    base = report.baseline.value
    if base is not None:
        ax.axhline(base, color=COLORS["baseline"], lw=1.5, ls="--", label=f"baseline ({base:.3f})")
    best: list[tuple[int, float]] = []
    for t in ran:
        if t.value is None:  # a failed experiment has no metric: mark where it ran
            ax.scatter([t.number], [0], marker="x", s=60, color=COLORS.get(t.status, "red"), zorder=3)
            ax.annotate(t.run_status or t.status, (t.number, 0), xytext=(0, 7), textcoords="offset points",
                        ha="center", fontsize=7.5, color=COLORS.get(t.status, "red"))
            continue
        color = COLORS["approved"] if t.winner else COLORS.get(t.status, "#111827")
        ax.scatter([t.number], [t.value], marker="*" if t.winner else "o", s=160 if t.winner else 45, color=color,
                   zorder=3)
        if t.status == Status.PASSED and (not best or t.value > best[-1][1]):
            best.append((t.number, t.value))
    if best:
        xs = [x for x, _ in best] + [ran[-1].number]
        ys = [y for _, y in best] + [best[-1][1]]
        ax.step(xs, ys, where="post", color=COLORS["approved"], lw=1.6, alpha=0.8, label="best so far")
    handles = [Line2D([], [], color=COLORS[s], marker=m, ls="", label=lab) for s, m, lab in (
        ("approved", "*", "approved"), (Status.PASSED, "o", "passed"), (Status.FAILED, "x", "failed run"))]
    existing, _ = ax.get_legend_handles_labels()
    ax.legend(handles=existing + handles, fontsize=8, loc="upper left", ncol=3)
    ax.set_xlabel("trial (in the order they ran)")
    ax.set_ylabel(f"validation {report.metric}")
    ax.set_xlim(ran[0].number - 0.7, ran[-1].number + 0.7)
    ax.set_xticks([t.number for t in ran][:: max(1, len(ran) // 30)])  # trial numbers only, at most ~30 labels
    ax.set_title(f"Validation {report.metric} of every experiment", loc="left", fontsize=11)
    _style(ax)
    return png(fig)


def seeds_plot(report: Report) -> bytes | None:
    """The test split, seed by seed: baseline and candidate, each pair joined, with their means."""
    ev = report.comparison
    if ev is None or not ev.seeds:
        return None
    fig = _figure(7, 3.8)
    ax = fig.add_subplot()
    xs = np.arange(len(ev.seeds))
    color = COLORS["approved"] if ev.decision == Decision.APPROVED else COLORS["rejected"]
    for x, b, c in zip(xs, ev.baseline, ev.candidate, strict=False):
        if b is not None and c is not None:
            ax.plot([x - 0.12, x + 0.12], [b, c], color="#cbd5e1", lw=1.2, zorder=1)
    for values, shift, col, label, mean in ((ev.baseline, -0.12, COLORS["baseline"], "baseline", ev.baseline_mean),
                                            (ev.candidate, 0.12, color, _short(ev.change, 30), ev.candidate_mean)):
        pts = [(x + shift, v) for x, v in zip(xs, values, strict=False) if v is not None]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=55, color=col, zorder=3, label=label)
        if mean is not None:
            ax.axhline(mean, color=col, lw=1.2, ls="--", alpha=0.8)
    ax.set_xticks(xs, [f"seed {s}" for s in ev.seeds])
    ax.set_ylabel(f"test {ev.metric}")
    ci = "" if ev.ci_low is None or ev.ci_high is None else f", CI [{ev.ci_low:+.3f}, {ev.ci_high:+.3f}]"
    gain = "" if ev.gain is None else f": gain {ev.gain:+.3f}{ci}"
    ax.set_title(f"Test split per seed (dashed: means){gain}", loc="left", fontsize=11)
    ax.legend(fontsize=8, loc="best")
    _style(ax)
    return png(fig)


PLOTS = {"speed": speed_plot, "loss": loss_plot, "throughput": throughput_plot, "tree": tree_plot,
         "breakdown": breakdown_plot}
# Throughput, speed-up and loss parity mean nothing for fine-tuning experiments judged on a task metric.
QUALITY_PLOTS = {"seeds": seeds_plot, "validation": validation_plot, "tree": tree_plot}


def all_plots(report: Report) -> dict[str, bytes]:
    out = {}
    for name, draw in (QUALITY_PLOTS if report.job == QUALITY else PLOTS).items():
        image = draw(report)
        if image is not None:
            out[name] = image
    return out
