"""Static checks: what a candidate may change, decided before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

from recipetune.core.recipe import SEMANTIC, SPEED, Knob, KnobSet, Recipe
from recipetune.guard.static import static_check, static_report
from recipetune.workloads.base import Invariant, Workload
from recipetune.workloads.reference import ReferenceWorkload

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from faulty_workload import FaultyWorkload  # noqa: E402

REF = ReferenceWorkload()
BASE = REF.resolve({"model": "nano", "seq_len": 64, "global_batch_size": 16, "micro_batch_size": 4})


def rules(violations) -> dict[str, str]:
    return {v.knob: v.rule for v in violations}


def test_speed_knobs_may_change():
    cand = BASE.with_(micro_batch_size=16, optimizer_impl="foreach", num_threads=2, activation_checkpointing="full")
    report = static_report(REF, BASE, cand)
    assert report.passed, report.violations
    assert any("global batch in tokens" in line for line in report.checked)


def test_unknown_knob_and_out_of_domain_value_are_named():
    cand = Recipe({**BASE, "micro_batchsize": 8, "dtype": "fp8"})
    assert rules(static_check(REF, BASE, cand)) == {"micro_batchsize": "unknown-knob", "dtype": "out-of-domain"}
    msg = static_check(REF, BASE, Recipe({**BASE, "dtype": "fp8"}))[0].message
    assert "fp32" in msg and "bf16" in msg  # says what is allowed


def test_semantic_knob_needs_the_campaigns_permission():
    cand = BASE.with_(lr=0.01)
    [v] = static_check(REF, BASE, cand)
    assert (v.knob, v.rule) == ("lr", "semantic-not-allowed") and "allow_semantic" in v.message
    report = static_report(REF, BASE, cand, allow_semantic=["lr"])
    assert report.passed and report.allowed_semantic == ["lr"]


def test_allowed_global_batch_waives_the_tokens_invariant():
    cand = BASE.with_(global_batch_size=32)
    assert rules(static_check(REF, BASE, cand)) == {
        "global_batch_size": "semantic-not-allowed", "global batch in tokens": "invariant"}
    report = static_report(REF, BASE, cand, allow_semantic=["global_batch_size"])
    assert report.passed and any("waived" in line for line in report.checked)


def test_invariant_knobs_never_change_even_when_listed():
    got = rules(static_check(REF, BASE, BASE.with_(seed=1, model="tiny"), allow_semantic=["seed", "model"]))
    assert got == {"seed": "invariant", "model": "invariant"}  # one violation per knob, no duplicate


def test_reference_batch_split_is_a_relation_reported_once():
    # nproc x micro x accumulation = global batch: the relation, not again as the trainer's own check.
    [v] = static_check(REF, BASE, BASE.with_(micro_batch_size=3))
    assert v.rule == "relation" and "micro_batch_size=3" in v.message and "global_batch_size=16" in v.message


class Relations(Workload):
    """An outside trainer's knobs with relations declared in the campaign file."""

    kind = "command"

    def knobs(self) -> KnobSet:
        return KnobSet([Knob("micro_batch", 8, SPEED, low=1, high=512, integer=True),
                        Knob("grad_accum", 4, SPEED, low=1, high=512, integer=True),
                        Knob("zero_stage", 1, SPEED, choices=(0, 1, 2, 3)),
                        Knob("lr", 1e-3, SEMANTIC, low=0.0, high=1.0)])

    def invariants(self) -> list[Invariant]:
        return [Invariant("micro_batch * grad_accum == 32", "micro_batch * grad_accum == 32", "holds"),
                Invariant("zero_stage", "zero_stage", "unchanged")]

    def command(self, recipe, steps, out_dir):  # pragma: no cover - never run here
        return []

    def run(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError


def test_command_workload_relations_hold_or_are_reported():
    w = Relations()
    base = w.resolve({})
    assert static_check(w, base, base.with_(micro_batch=16, grad_accum=2)) == []
    [v] = static_check(w, base, base.with_(micro_batch=16))
    assert (v.knob, v.rule) == ("micro_batch * grad_accum == 32", "relation")
    assert "micro_batch=16" in v.message and "grad_accum=4" in v.message
    [v] = static_check(w, base, base.with_(zero_stage=2))
    assert v.rule == "invariant" and "must stay 1" in v.message


def test_a_fault_disguised_as_a_speed_knob_passes_the_static_check():
    w = FaultyWorkload()
    base = w.resolve(dict(BASE))
    assert static_check(w, base, base.with_(fault="sample-order")) == []
