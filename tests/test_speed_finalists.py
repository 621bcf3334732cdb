"""The finalists of a speed campaign (speed/decide.py), judged best first: a slower finalist only when the
faster ones were not approved, and never one whose proof would repeat a failed one's (the same knobs
changed, as many tokens a step, and the runs could not tell parity). Beside each skip, the case it must not
skip: a faster finalist rejected for a difference shown (another recipe may train right), and a finalist
that changes other knobs."""

from __future__ import annotations

import test_search_campaign as t

from recipetune.guard.verdict import Verdict

# the fake workload's screening orders these by speed: impl "b" is the fastest implementation
KNOBS = {"speed": [1, 2, 3, 4], "impl": ["a", "b"]}


def scripted(outcomes: dict[tuple[int, str], tuple[str, str]]) -> tuple[t.FakeGuard, list[tuple[int, str]]]:
    """A guard whose final verdict on (speed, impl) is ``outcomes``' (decision, stop); the calls in order."""
    calls: list[tuple[int, str]] = []

    def final_verdict(workload, baseline, candidate, settings, out_dir, **_):
        key = (int(candidate["speed"]), str(candidate["impl"]))
        calls.append(key)
        decision, stop = outcomes.get(key, ("APPROVED", "decided"))
        return Verdict(decision=decision, reasons=[f"scripted {decision} ({stop})"], stop=stop, speedup=2.0,
                       baseline=dict(baseline), candidate=dict(candidate))

    guard = t.FakeGuard()
    guard.final_verdict = final_verdict  # type: ignore[method-assign]
    return guard, calls


def campaign(tmp_path, guard):
    camp = t.make_campaign(tmp_path, KNOBS, strategy="grid", budget={"trials": 8}, finalists=3)
    p = t.plan(camp, tmp_path / "campaign", False)
    reporter = t.Recorder()
    return t.run(p, guard=guard, reporter=reporter), reporter


def test_an_approved_fastest_finalist_is_the_decision_and_no_slower_one_is_judged(tmp_path):
    guard, calls = scripted({})
    outcome, reporter = campaign(tmp_path, guard)
    assert outcome.decision == "APPROVED" and len(calls) == 1
    assert calls[0] == (int(outcome.winner.recipe["speed"]), str(outcome.winner.recipe["impl"]))
    assert sum("not judged, the faster" in p for p in reporter.phases) == 2


def test_a_finalist_whose_proof_repeats_an_unresolved_one_is_not_run_again(tmp_path):
    # every finalist "could not tell": the first is judged; one changing the same knobs is not; one
    # changing other knobs is judged
    guard, calls = scripted({(s, i): ("KEEP BASELINE", "plan") for s in (1, 2, 3, 4) for i in ("a", "b")})
    outcome, _ = campaign(tmp_path, guard)
    assert outcome.decision == "KEEP BASELINE"
    judged = [r for r in outcome.reasons if "scripted" in r]
    skipped = [r for r in outcome.reasons if "not judged, the same proof as" in r]
    assert len(judged) + len(skipped) == 3 and len(calls) == len(judged) >= 1 and skipped
    changed = [frozenset(k for k, v in zip(("speed", "impl"), c, strict=True) if v != {"speed": 1, "impl": "a"}[k])
               for c in calls]
    assert len(set(changed)) == len(changed)  # no two judged finalists changed the same knobs


def test_a_faster_finalist_shown_different_does_not_spare_the_next(tmp_path):
    # REJECTED: a difference shown for that recipe, not a proof the trainer cannot give; the next is judged
    guard, calls = scripted({(s, i): ("REJECTED", "decided") for s in (1, 2, 3, 4) for i in ("a", "b")})
    outcome, _ = campaign(tmp_path, guard)
    assert outcome.decision == "KEEP BASELINE" and len(calls) == 3
