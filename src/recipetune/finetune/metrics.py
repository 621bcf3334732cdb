"""Task metrics (offline: scikit-learn, rouge_score) and the kinds of error a Researcher reads.

Every metric is in [0, 1], higher is better. Answers are compared after stripping surrounding
whitespace. ``numeric`` is the share of answers that read as a number within the task's tolerance
of the target: ``|answer - target| <= max(rel_tol * |target|, abs_tol)`` (``TaskConfig.rel_tol``,
``abs_tol``; both 0 by default: numerically equal, so ``3.0`` is ``3``), inclusive at the edge;
an answer that is not a finite number is wrong. ``exec_output`` runs code: the answer is a Python
program, run in a sandbox (finetune/sandbox.py: its own process, a hard timeout, capped output, never
in this process), and it is right when it finishes and prints what the reference answer, run the same
way, prints (the whitespace around the output and at each line's end ignored; ``print(2+3)`` and
``print(5)`` are both right for ``print(3+2)``). Each wrong prediction gets one error kind, checked
in this order:

- ``empty``: nothing generated;
- ``truncated``: generation hit ``max_new_tokens`` before its stop string or end token;
- ``exec_output`` only: ``timeout``, ``crash`` (an exception, a syntax error, a refused system call,
  memory) or ``output_limit`` as the program's run ended; ``non_finite`` when it printed ``nan`` or
  ``inf``; ``bad_reference`` when the reference answer itself did not run (a data error); then the
  kinds below compare the two outputs;
- ``wrong_format``: the task's ``answer_pattern`` does not match (classification: not a label);
- ``near_miss``: within an edit distance of max(1, 20% of the target's length);
- ``wrong_label`` (classification: another label), ``wrong_number`` (the target is a number), or
  ``wrong``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from recipetune.finetune.sandbox import Run, run_programs

METRICS = ("exact_match", "accuracy", "macro_f1", "rouge_l", "numeric", "exec_output")
ERROR_KINDS = ("empty", "truncated", "timeout", "crash", "output_limit", "non_finite", "bad_reference",
               "wrong_format", "near_miss", "wrong_label", "wrong_number", "wrong")
EXEC = "exec_output"
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


# -- exec_output: answers that are programs, scored by running them -------------------------------------

_REFERENCE_RUNS: dict[str, Run] = {}  # reference answers are the same every evaluation: run each once


@dataclass(frozen=True)
class Executed:
    """One answer run beside its reference (``execute``)."""

    got: Run  # the prediction's run
    want: Run  # the reference answer's run

    @property
    def fault(self) -> str | None:
        """Why the answer is wrong before its output is compared, or None."""
        if not self.want.ok:
            return "bad_reference"
        if not self.got.ok:
            return self.got.fault
        return "non_finite" if _NON_FINITE.search(self.got.stdout) and not _NON_FINITE.search(self.want.stdout) \
            else None

    @property
    def right(self) -> bool:
        return self.fault is None and output_text(self.got.stdout) == output_text(self.want.stdout)


_NON_FINITE = re.compile(r"(?<![A-Za-z_])-?(nan|inf|infinity)(?![A-Za-z_])", re.IGNORECASE)


def output_text(stdout: str) -> str:
    """A program's output as compared: the whitespace around it and at each line's end dropped."""
    return "\n".join(line.rstrip() for line in stdout.strip("\n").splitlines()).strip()


def execute(preds: Sequence[str], targets: Sequence[str]) -> list[Executed]:
    """Run every prediction and (once per process) every reference answer in the sandbox."""
    todo = list(dict.fromkeys(t for t in targets if t not in _REFERENCE_RUNS))
    fresh = dict(zip(todo, run_programs(todo), strict=True))
    _REFERENCE_RUNS.update((t, r) for t, r in fresh.items() if r.ok)  # a failed one is tried again next time
    got = run_programs([p.strip() for p in preds])
    return [Executed(g, _REFERENCE_RUNS.get(t) or fresh[t]) for g, t in zip(got, targets, strict=True)]


def score(metric: str, preds: Sequence[str], targets: Sequence[str], tol: Tolerance = (0.0, 0.0),
          runs: Sequence[Executed] | None = None) -> float:
    """``tol`` is the task's (rel_tol, abs_tol); only ``numeric`` reads it. ``runs``: ``execute``'s
    result for these answers, which ``exec_output`` reads (run here when not given)."""
    if metric == EXEC:
        runs = execute(preds, targets) if runs is None else runs
        return sum(r.right for r in runs) / max(1, len(targets))
    if metric in ("exact_match", "accuracy"):  # accuracy is exact match on labels
        return exact_match(preds, targets)
    if metric == "macro_f1":
        return macro_f1(preds, targets)
    if metric == "rouge_l":
        return rouge_l(preds, targets)
    if metric == "numeric":
        return numeric(preds, targets, tol)
    raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")


def example_score(metric: str, pred: str, target: str, tol: Tolerance = (0.0, 0.0),
                  run: Executed | None = None) -> float:
    """One example's contribution, to rank the worst cases (macro-F1 ranks by correctness)."""
    if metric == EXEC:
        return float((run or execute([pred], [target])[0]).right)
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
               labels: set[str] | None, tol: Tolerance | None = None, run: Executed | None = None) -> str | None:
    """The kind of a wrong answer (see the module docstring); None when it is right. ``tol``: the
    tolerance when the optimised metric is ``numeric``, so an answer within it is right; ``run``: the
    answer's execution when the optimised metric is ``exec_output`` (its outputs are then compared)."""
    if run is not None:
        if run.right:
            return None
        if not pred.strip():
            return "empty"
        if truncated:
            return "truncated"
        if run.fault is not None:
            return run.fault
        pred, target, pattern = output_text(run.got.stdout), output_text(run.want.stdout), None
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
