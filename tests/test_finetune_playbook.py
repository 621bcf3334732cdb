"""The fine-tuning playbook (finetune/playbook.yaml): each rule fires on the facts docs/finetune.md says
it reads, tested at its edge (the value at the threshold does not fire, the next one does), and the
overfitting rules on the tree shapes the issue found them firing on (the root, a child that improved
on its parent). Every rule of the file has a case here and a row in the docs' table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_finetune_search import campaign_file, fake_report

from recipetune.engine.plan import make_proposer
from recipetune.engine.playbook import load_playbook
from recipetune.engine.proposers import AnalystProposer
from recipetune.engine.researcher import SearchContext
from recipetune.engine.tree import Tree
from recipetune.finetune import plan as ftp
from recipetune.finetune.analyst import experiment_facts

RULES = load_playbook(builtin=ftp.PLAYBOOK)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "finetune.md"

# A child that fires nothing but `explore`: its figures sit away from every threshold.
QUIET = dict(value=0.5, baseline_value=0.4, parent_value=0.45, gain=0.1, gain_on_parent=0.05, is_baseline=False,
             depth=1, loss_first=2.0, loss_last=0.5, loss_drop=0.75, steps=100, rows=1000, rows_in=1000,
             dup_share=0.0, contaminated=0, truncated_train_share=0.0, pred_concentration=0.2, metric="exact_match",
             err_empty=0.0, err_truncated=0.0, err_wrong_format=0.0, err_near_miss=0.0, err_wrong_label=0.0,
             err_wrong_number=0.0, err_wrong=0.4, err_format=0.0, method="full", lr=1e-3, epochs=3)

# rule -> (the facts at its edge, where it must not fire; the nearest facts where it must)
EDGES: dict[str, tuple[dict, dict]] = {
    "diverged": (dict(loss_first=2.0, loss_last=2.0, loss_drop=0.0), dict(loss_first=2.0, loss_last=2.02,
                                                                          loss_drop=-0.01)),
    "underfitting": (dict(loss_drop=0.5, loss_last=1.0), dict(loss_drop=0.49, loss_last=1.02)),
    "underfitting-lr": (dict(loss_drop=0.5, loss_last=1.0), dict(loss_drop=0.49, loss_last=1.02)),
    "truncated-training-examples": (dict(truncated_train_share=0.02), dict(truncated_train_share=0.021)),
    "format-errors": (dict(err_format=0.1, err_empty=0.1), dict(err_format=0.11, err_empty=0.11)),
    "format-errors-more-steps": (dict(err_format=0.1, err_empty=0.1), dict(err_format=0.11, err_empty=0.11)),
    "one-answer-for-all": (dict(pred_concentration=0.5, err_wrong_label=0.3),
                           dict(pred_concentration=0.51, err_wrong_label=0.3)),
    "one-answer-for-all-data": (dict(pred_concentration=0.8, err_wrong_label=0.2),
                                dict(pred_concentration=0.8, err_wrong_label=0.21)),
    "duplicates-found": (dict(dup_share=0.05), dict(dup_share=0.051)),
    "overfitting": (dict(loss_last=0.05, gain_on_parent=0.0), dict(loss_last=0.05, gain_on_parent=-0.005)),
    "overfitting-regularise": (dict(loss_last=0.1, gain_on_parent=-0.05),
                               dict(loss_last=0.099, gain_on_parent=-0.05)),
    "overfitting-lora": (dict(loss_last=0.05, gain_on_parent=0.005), dict(loss_last=0.05, gain_on_parent=-0.005)),
    "lora-capacity": (dict(method="lora", loss_drop=0.7), dict(method="lora", loss_drop=0.69)),
    "near-misses": (dict(err_near_miss=0.1), dict(err_near_miss=0.11)),
    "weak-data-mix": (dict(gain_on_parent=0.001), dict(gain_on_parent=0.0)),
}
ALWAYS = {"combine-what-helped", "explore"}  # `when: True`: what they propose is tested where they are built


def fired(facts: dict) -> set[str]:
    return {r.name for r in AnalystProposer(RULES).fired(facts)}


def test_every_rule_of_the_playbook_has_its_edge_case_here_and_its_row_in_the_docs():
    names = [r.name for r in RULES]
    assert set(names) == set(EDGES) | ALWAYS, set(names) ^ (set(EDGES) | ALWAYS)
    table = DOCS.read_text()
    for rule in RULES:  # docs/finetune.md's playbook table: the rule's name and its condition as written
        assert re.search(rf"^ *\| `{re.escape(rule.name)}` \| `{re.escape(rule.when)}` \|", table, re.M), rule.name


def test_a_report_far_from_every_threshold_fires_only_the_undirected_rules():
    assert fired(QUIET) == ALWAYS


@pytest.mark.parametrize("rule", sorted(EDGES))
def test_each_rule_fires_past_its_edge_and_not_at_it(rule: str):
    at, past = EDGES[rule]
    assert rule not in fired(QUIET | at), (rule, at)
    assert rule in fired(QUIET | past), (rule, past)


def test_the_lora_rules_read_the_method():
    assert "overfitting-lora" not in fired(QUIET | dict(loss_last=0.05, gain_on_parent=-0.1, method="lora"))
    assert "lora-capacity" not in fired(QUIET | dict(loss_drop=0.2, method="full"))


def test_overfitting_lora_never_fires_at_the_root_nor_on_a_child_that_improved(tiny_ft, tmp_path):
    """The issue's two cases, through the facts the analyst computes from a tree: a root whose training
    loss is near zero (it has no parent to be worse than) and a child near zero that improved on its
    parent; beside them the child that got worse, where the rule is meant to fire."""
    knobs = {"lr": [0.001, 0.003, 0.01], "method": ["full", "lora"]}
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft, knobs=knobs))
    p = ftp.plan(c, tmp_path / "camp")
    low = (2.0, 0.05)
    tree = Tree(c.baseline, fake_report(tmp_path / "r0", {"wrong": 0.5}, loss=low, value=0.5), score=0.5)
    ctx = SearchContext(c.space, c.baseline, p.space, tree, facts=experiment_facts)
    better = tree.add(c.baseline.with_(lr=0.003), tree.root, "passed", 0.55, score=0.52,
                      result=fake_report(tmp_path / "r1", {"wrong": 0.48}, loss=low, value=0.52))
    worse = tree.add(c.baseline.with_(lr=0.01), tree.root, "passed", 0.45, score=0.49,
                     result=fake_report(tmp_path / "r2", {"wrong": 0.51}, loss=low, value=0.49))
    analyst = make_proposer("analyst", builtin=ftp.PLAYBOOK)
    rules = lambda node: {pr.rationale.split(" ")[0].split("[")[0].rstrip(":")  # noqa: E731
                          for pr in analyst.propose(node, ctx, 12)}
    facts = {n: experiment_facts(n, ctx) for n in (tree.root, better, worse)}
    assert facts[tree.root]["is_baseline"] and facts[tree.root]["gain_on_parent"] == 0
    assert "overfitting-lora" not in fired(facts[tree.root]) | rules(tree.root)
    assert "overfitting-lora" not in fired(facts[better]) | rules(better)
    assert {"overfitting", "overfitting-regularise", "overfitting-lora"} <= fired(facts[worse])
    assert "overfitting-lora" in rules(worse)
