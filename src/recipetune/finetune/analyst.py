"""What the Researcher knows of a fine-tuning experiment: the facts its playbook's rules test.

``experiment_facts`` reads a node's ``ExperimentReport`` (the Experimenter's report) and its place in
the tree; ``worst_cases`` gives the LLM Researcher the grouped worst validation cases. The rules
themselves are data: finetune/playbook.yaml.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from recipetune.engine.researcher import SearchContext
from recipetune.engine.tree import Node
from recipetune.finetune.metrics import ERROR_KINDS
from recipetune.finetune.results import ExperimentReport

GOAL = ("raise the task's primary metric on the validation split (the test split is never shown); each "
        "experiment is a training recipe plus data steps (knobs data_<name>: true adds that step)")
PROFILE = ("metric", "value", "baseline_value", "gain_on_parent", "loss_first", "loss_last", "loss_drop", "steps",
           "rows", "dup_share", "contaminated", "truncated_train_share", "pred_concentration",
           *(f"err_{k}" for k in ERROR_KINDS))


def _prediction_concentration(run_dir: str) -> float | None:
    """Share of validation answers that are the single most common answer (1.0: one answer for all)."""
    try:
        lines = (Path(run_dir) / "predictions.jsonl").read_text().splitlines()
    except OSError:
        return None
    preds = Counter(json.loads(line)["prediction"] for line in lines if line.strip())
    total = sum(preds.values())
    return max(preds.values()) / total if total else None


def experiment_facts(node: Node, context: SearchContext) -> dict[str, Any]:
    """Knob values (and the baseline's as baseline_<knob>), scores in the tree, and the report's figures."""
    facts: dict[str, Any] = {f"baseline_{k}": v for k, v in context.baseline.items()}
    facts.update(node.recipe)
    root = context.tree.root.score
    parent = node.parent.score if node.parent is not None and node.parent.score is not None else root
    facts.update(value=node.score, baseline_value=root, parent_value=parent, is_baseline=node.parent is None,
                 depth=node.depth())
    if node.score is not None and parent is not None:
        facts["gain_on_parent"] = node.score - parent
    if node.score is not None and root is not None:
        facts["gain"] = node.score - root
    report = node.result
    if not isinstance(report, ExperimentReport):
        return facts
    loss = report.loss
    facts.update(loss_first=loss.first, loss_last=loss.last, steps=loss.steps,
                 rows=report.data.rows_out, rows_in=report.data.rows_in)
    if loss.first and loss.last is not None:
        facts["loss_drop"] = (loss.first - loss.last) / loss.first
    removed = Counter[str]()
    for step in report.data.operators:
        removed[step.op] += sum(step.removed.values())
    rows_in = max(1, report.data.rows_in)
    facts["dup_share"] = (removed["dedup_exact"] + removed["dedup_near"]) / rows_in
    facts["contaminated"] = removed["decontaminate"]
    facts["truncated_train_share"] = report.truncated_train_examples / max(1, report.data.rows_out)
    if report.validation is not None:
        facts["metric"] = report.validation.metric
        shares = {g.kind: g.share for g in report.validation.errors}
        facts.update({f"err_{k}": shares.get(k, 0.0) for k in ERROR_KINDS})
        facts["err_format"] = shares.get("empty", 0.0) + shares.get("wrong_format", 0.0)
    facts["pred_concentration"] = _prediction_concentration(report.run_dir)
    return facts


def worst_cases(node: Node, per_kind: int = 2) -> dict[str, Any]:
    """The Experimenter's grouped worst validation cases of a node, for the LLM Researcher."""
    report = node.result
    if not isinstance(report, ExperimentReport) or report.validation is None:
        return {}
    return {"worst_cases": [
        {"kind": g.kind, "share": round(g.share, 3),
         "examples": [{"prompt": p.prompt[-120:], "target": p.target[:60], "prediction": p.prediction[:60]}
                      for p in g.examples[:per_kind]]}
        for g in report.validation.errors]}
