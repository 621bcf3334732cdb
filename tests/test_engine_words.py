"""The words the product decides in, defined once (core/words.py: Decision, engine/status.py: Status),
and the engine's own switches: each written the way it always was, on disk and on screen."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from recipetune.config import SearchConfig
from recipetune.core.recipe import Knob, KnobSet, SearchSpace
from recipetune.core.words import Decision, EquivalenceOutcome, LookOutcome, LooksStop, ParityOutcome, TrendOutcome
from recipetune.engine.config import Pruning
from recipetune.engine.samplers import distributions
from recipetune.engine.status import FINISHED, Refusal, Status
from recipetune.engine.store import CampaignStore
from recipetune.finetune.looks import LookRecord
from recipetune.finetune.plan import FinetuneSearchConfig
from recipetune.guard.evidence import Measured

SRC = Path(__file__).resolve().parents[1] / "src" / "recipetune"


OUTCOMES = [*EquivalenceOutcome, *ParityOutcome, *LookOutcome, *TrendOutcome, *LooksStop, *Refusal]


@pytest.mark.parametrize("word", [*Status, *Decision, *OUTCOMES], ids=str)
def test_a_word_is_its_string_everywhere_it_is_written(word):
    value = word.value
    assert word == value and hash(word) == hash(value) and {value: 1}[word] == 1
    assert str(word) == f"{word}" == format(word) == f"{word:<14}".rstrip() == value  # Python 3.11 prints the name
    assert json.dumps({word: word}) == json.dumps({value: value})

    class Record(BaseModel):
        word: str

    assert Record(word=word).model_dump_json() == json.dumps({"word": value}, separators=(",", ":"))


def test_the_words_are_the_strings_campaigns_have_always_written():
    assert [d.value for d in Decision] == ["APPROVED", "KEEP BASELINE", "REJECTED"]
    assert {s.value for s in FINISHED} == {"passed", "rejected", "failed", "pruned"}
    assert Decision("KEEP BASELINE") is Decision.KEEP_BASELINE and Status("passed") is Status.PASSED


def test_the_outcomes_are_the_strings_verdicts_have_always_written():
    assert [w.value for w in EquivalenceOutcome] == ["equivalent", "different", "inconclusive"]
    assert [w.value for w in ParityOutcome] == ["holds", "fails", "inconclusive"]
    assert [w.value for w in LookOutcome] == ["shown", "continue", "futility", "budget", "plan"]
    assert [w.value for w in TrendOutcome] == ["flat", "grows"]
    assert [w.value for w in Refusal] == ["claimed", "rejected", "budget"]  # why a recipe gets no run
    # why the looks ended (verdict.json: stop), the speed verdict's and the quality verdict's
    assert [w.value for w in LooksStop] == ["decided", "trend", "futility", "budget", "plan", "time", "too short",
                                            "failed"]
    # a look's outcome that ends the looks is written as the stop it names: the two families agree
    assert {LooksStop(o) for o in (LookOutcome.FUTILITY, LookOutcome.BUDGET, LookOutcome.PLAN)} == {
        LooksStop.FUTILITY, LooksStop.BUDGET, LooksStop.PLAN}


LOOK = {"look": 1, "seeds": [0, 1, 2], "level": 0.0125, "gain": 0.05, "low": 0.01, "high": 0.09, "planned": 5,
        "next": 5, "needed": 5, "chance": None, "trained": 6, "seconds": 1.0}


def test_a_misspelt_outcome_is_an_error_not_a_silent_look_again():
    # the quality job's look record once took any string: "contiune" was a look that neither went on nor
    # decided, and look_line's lookup failed only when the terminal said it
    assert LookRecord(**LOOK, outcome="continue").outcome is LookOutcome.CONTINUE
    assert json.loads(LookRecord(**LOOK, outcome="shown").model_dump_json())["outcome"] == "shown"
    with pytest.raises(ValidationError):
        LookRecord(**LOOK, outcome="contiune")
    fields = {"measure": "training loss", "baseline_finals": [], "candidate_finals": [], "mean_diff": 0.0, "se": None,
              "low": None, "high": None, "tolerance": 0.1, "detectable": None, "reference": 0.1,
              "reference_kind": "", "se_source": ""}
    assert Measured(**fields, outcome="holds").outcome is ParityOutcome.HOLDS
    with pytest.raises(ValidationError):
        Measured(**fields, outcome="hold")
    with pytest.raises(AttributeError):
        _ = LookOutcome.SHOW  # a misspelt member in the code fails where it is read


def test_a_status_stored_through_the_study_reads_back_as_the_plain_string(tmp_path):
    knobs = KnobSet([Knob("mbs", 1, choices=(1, 2))])
    base = knobs.resolve({})
    store = CampaignStore(tmp_path / "c")
    store.create({})
    n = store.begin(base.with_(mbs=2), distributions(SearchSpace.from_lists(knobs, {"mbs": [2]}), base), {})
    rec = store.finish(n, 1.5, {"status": Status.PASSED})
    assert type(rec.attrs["status"]) is str and rec.attrs["status"] == "passed" and rec.finished
    store.storage.engine.dispose()


def test_a_trial_is_a_node_only_once_closed_with_a_finished_status(tmp_path):
    from recipetune.engine.record import TrialRecord

    assert TrialRecord(0, "COMPLETE", 1.0, {"status": "passed"}).finished
    assert TrialRecord(0, "PRUNED", None, {"status": "pruned"}).finished
    assert not TrialRecord(0, "RUNNING", None, {"status": "running"}).finished
    for status in ("interrupted", "duplicate", "unrun"):  # closed, but no node: nothing ran to its end
        assert not TrialRecord(0, "FAIL", None, {"status": status}).finished


def test_one_pruning_switch():
    assert not Pruning().on and Pruning().reports == 0
    assert Pruning(pruner="median").on and Pruning(pruner="median", checkpoints=5).reports == 5


def test_eval_examples_is_the_quality_jobs_field_where_users_write_it():
    search = FinetuneSearchConfig.model_validate({"pruning": {"pruner": "median", "eval_examples": 10}})
    assert search.pruning.eval_examples == 10 and search.pruning.on
    assert FinetuneSearchConfig().pruning.eval_examples == 64
    with pytest.raises(ValidationError, match="pruning.eval_examples"):  # the speed job never read it
        SearchConfig.model_validate({"pruning": {"eval_examples": 10}})


def test_the_engine_holds_no_command_line_code():
    for path in sorted((SRC / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] in ("typer", "click") for n in names), path.name
