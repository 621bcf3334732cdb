"""The analyst's MoE rules at their edges: the measured expert imbalance just above and just below each threshold.

``segmented-experts`` (imbalance > 1.5, bf16 compute: grouped GEMMs over the unpadded groups) and
``cap-expert-load`` (imbalance > 2, no capacity yet: a semantic change, the guard judges the loss).
"""

from __future__ import annotations

import pytest

from recipetune.core.recipe import SEMANTIC
from recipetune.engine.playbook import load_playbook
from recipetune.engine.proposers import AnalystProposer
from recipetune.speed.facts import PLAYBOOK
from recipetune.trainer.knobs import reference_knobs

ANALYST = AnalystProposer(load_playbook(builtin=PLAYBOOK))


def facts(**over) -> dict:
    """One GPU running an MoE, as speed/facts.py gives them; ``over`` sets knobs and facts."""
    knobs = {k: over.pop(k) for k in list(over) if k in reference_knobs()}
    recipe = dict(reference_knobs().resolve({"model": "nano-moe", "dtype": "bf16", "expert_impl": "grouped",
                                             **knobs}))
    return {**recipe, "n_devices": 1, "n_experts": 4, "device": "cuda", "accum_steps": 1, "data_share": 0.0,
            "optim_share": 0.0, "compute_share": 0.5, "mem_headroom": 0.5, "mfu": 0.2, "expert_drop": 0.0,
            "expert_imbalance": 1.0, **over}


def fired(**over) -> set[str]:
    return {rule.name for rule in ANALYST.fired(facts(**over))}


@pytest.mark.parametrize("start", ["grouped", "loop"])
def test_segmented_experts_fires_just_above_1_5_in_bf16(start):
    assert "segmented-experts" in fired(expert_impl=start, expert_imbalance=1.51)
    assert "segmented-experts" not in fired(expert_impl=start, expert_imbalance=1.49)
    # bf16 by FSDP2's policy counts as bf16 compute too
    assert "segmented-experts" in fired(expert_impl=start, dtype="fp32", fsdp_param_dtype="bf16",
                                        expert_imbalance=1.51)


def test_segmented_experts_stays_quiet_where_it_would_change_nothing():
    # fp32 (TF32 on a GPU): segmented runs the loop's matmuls, no faster than the loop
    assert "segmented-experts" not in fired(dtype="fp32", expert_imbalance=4.0)
    assert "segmented-experts" not in fired(expert_impl="segmented", expert_imbalance=4.0)
    assert "segmented-experts" not in fired(model="nano", n_experts=0, expert_impl="loop", expert_imbalance=4.0)
    unmeasured = facts(expert_imbalance=4.0)
    del unmeasured["expert_imbalance"]  # a trainer that does not report it: the rule does not guess
    assert "segmented-experts" not in {r.name for r in ANALYST.fired(unmeasured)}


def test_cap_expert_load_fires_just_above_imbalance_2_and_once():
    assert "cap-expert-load" in fired(expert_imbalance=2.01)
    assert "cap-expert-load" not in fired(expert_imbalance=1.99)
    assert "cap-expert-load" not in fired(expert_imbalance=4.0, capacity_factor=1.25)  # a capacity is set


def test_the_h200_moe_layer_fires_both_in_bf16():
    # the recorded H200 run (docs/benchmarks.md, 2026-12-04): moe-8x, one layer at imbalance 4.00, padded experts
    rules = fired(model="moe-8x", n_experts=8, expert_imbalance=4.0)
    assert {"segmented-experts", "cap-expert-load"} <= rules
    # the capacity rule changes what is learned: only a campaign that searches capacity_factor gets it, and
    # the knob is semantic, so the guard judges the loss of whatever it proposes
    assert reference_knobs()["capacity_factor"].role == SEMANTIC
