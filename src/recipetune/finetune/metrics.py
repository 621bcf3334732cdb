"""Task metrics (offline: scikit-learn, rouge_score) and the kinds of error a Researcher reads.

Every metric is in [0, 1], higher is better. Answers are compared after stripping surrounding
whitespace. ``numeric`` is the share of answers that read as a number within the task's tolerance
of the target: ``|answer - target| <= max(rel_tol * |target|, abs_tol)`` (``TaskConfig.rel_tol``,
``abs_tol``; both 0 by default: numerically equal, so ``3.0`` is ``3``), inclusive at the edge;
an answer that is not a finite number is wrong. Each wrong prediction gets one error kind, checked
in this order:

- ``empty``: nothing generated;
- ``truncated``: generation hit ``max_new_tokens`` before its stop string or end token;
- ``wrong_format``: the task's ``answer_pattern`` does not match (classification: not a label);
- ``near_miss``: within an edit distance of max(1, 20% of the target's length);
- ``wrong_label`` (classification: another label), ``wrong_number`` (the target is a number), or
  ``wrong``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

METRICS = ("exact_match", "accuracy", "macro_f1", "rouge_l", "numeric")
ERROR_KINDS = ("empty", "truncated", "wrong_format", "near_miss", "wrong_label", "wrong_number", "wrong")
_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def exact_match(preds: Sequence[str], targets: Sequence[str]) -> float:
    return sum(p.strip() == t.strip() for p, t in zip(preds, targets, strict=True)) / max(1, len(targets))


def macro_f1(preds: Sequence[str], targets: Sequence[str]) -> float:
    """Macro-F1 over the labels present in the targets (an invented label scores against them all)."""
    from sklearn.metrics import f1_score

    labels = sorted({t.strip() for t in targets})
    return float(f1_score([t.strip() for t in targets], [p.strip() for p in preds], labels=labels,
                          average="macro", zero_division=0))


def rouge_l(preds: Sequence[str], targets: Sequence[str]) -> float:
    """Mean ROUGE-L F-measure (rouge_score's tokenizer: lower-case alphanumeric words, so
    ``get_item`` and ``get item`` are the same two words)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    total = sum(scorer.score(t, p)["rougeL"].fmeasure for p, t in zip(preds, targets, strict=True))
    return total / max(1, len(targets))


Tolerance = tuple[float, float]  # (rel_tol, abs_tol) of the numeric metric


def within_tolerance(pred: str, target: str, tol: Tolerance = (0.0, 0.0)) -> bool:
    """Whether ``pred`` reads as a finite number within ``max(rel_tol * |target|, abs_tol)`` of
    ``target`` (inclusive; a relative slack of 1e-9 absorbs binary rounding, so ``105`` is within
    5% of ``100``)."""
    try:
        p, t = float(pred.strip()), float(target.strip())
    except ValueError:
        return False
    if not (math.isfinite(p) and math.isfinite(t)):
        return False
    rel_tol, abs_tol = tol
    return abs(p - t) <= max(rel_tol * abs(t), abs_tol) * (1 + 1e-9) + 1e-12


def numeric(preds: Sequence[str], targets: Sequence[str], tol: Tolerance = (0.0, 0.0)) -> float:
    """Share of answers within the tolerance of their target (see ``within_tolerance``)."""
    return sum(within_tolerance(p, t, tol) for p, t in zip(preds, targets, strict=True)) / max(1, len(targets))


def score(metric: str, preds: Sequence[str], targets: Sequence[str], tol: Tolerance = (0.0, 0.0)) -> float:
    """``tol`` is the task's (rel_tol, abs_tol); only ``numeric`` reads it."""
    if metric in ("exact_match", "accuracy"):  # accuracy is exact match on labels
        return exact_match(preds, targets)
    if metric == "macro_f1":
        return macro_f1(preds, targets)
    if metric == "rouge_l":
        return rouge_l(preds, targets)
    if metric == "numeric":
        return numeric(preds, targets, tol)
    raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")


def example_score(metric: str, pred: str, target: str, tol: Tolerance = (0.0, 0.0)) -> float:
    """One example's contribution, to rank the worst cases (macro-F1 ranks by correctness)."""
    if metric == "rouge_l":
        return rouge_l([pred], [target])
    if metric == "numeric":
        return float(within_tolerance(pred, target, tol))
    return float(pred.strip() == target.strip())


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (rapidfuzz: C++, where a Python double loop took ~1 ms per long answer)."""
    from rapidfuzz.distance import Levenshtein

    return Levenshtein.distance(a, b)


def error_kind(pred: str, target: str, truncated: bool, pattern: re.Pattern | None,
               labels: set[str] | None, tol: Tolerance | None = None) -> str | None:
    """The kind of a wrong answer (see the module docstring); None when it is right. ``tol``: the
    tolerance when the optimised metric is ``numeric``, so an answer within it is right."""
    p, t = pred.strip(), target.strip()
    if p == t or (tol is not None and within_tolerance(p, t, tol)):
        return None
    if not p:
        return "empty"
    if truncated:
        return "truncated"
    if labels is not None and p not in labels:
        return "wrong_format"
    if pattern is not None and not pattern.fullmatch(p):
        return "wrong_format"
    if edit_distance(p, t) <= max(1, round(0.2 * len(t))):
        return "near_miss"
    if labels is not None:
        return "wrong_label"
    if _NUMBER.fullmatch(t) and _NUMBER.fullmatch(p):
        return "wrong_number"
    return "wrong"
