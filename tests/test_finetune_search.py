"""`recipetune finetune`: the quality job on the shared engine. The experiment space, the Researcher's
facts and playbook, the LLM's compressed context, integrity (test split, refused proposals), the
decision over seeds, bad input, and a whole tiny campaign killed with -9 and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ft_fixtures import experiment_file
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.config import SearchConfig
from recipetune.core.errors import ConfigError
from recipetune.engine.job import Finished, Reporter, Services
from recipetune.engine.llm import check_edits, compress_context
from recipetune.engine.plan import make_proposer
from recipetune.engine.researcher import SearchContext
from recipetune.engine.store import CampaignStore
from recipetune.engine.tree import Tree
from recipetune.execute.executor import LocalExecutor
from recipetune.finetune import decide as decide_mod
from recipetune.finetune import job as ft
from recipetune.finetune import looks as looks_mod
from recipetune.finetune import plan as ftp
from recipetune.finetune.analyst import experiment_facts
from recipetune.finetune.decide import metric_reward, normalised_gain
from recipetune.finetune.results import ErrorGroup, Evaluation, ExperimentReport, FinalResult, LossCurve, Prediction

runner = CliRunner()
SEARCH = {"knobs": {"lr": [0.001, 0.003, 0.01], "max_steps": [3, 6]},
          "data": {"near_dedup": {"op": "dedup_near", "threshold": 0.9}}, "budget": {"trials": 4}, "seeds": [1, 2]}


def campaign_file(tiny_ft, **search) -> Path:
    tmp_path, files, model = tiny_ft
    return experiment_file(tmp_path, files, model, search={**SEARCH, **search})


# -- rewards and selection ---------------------------------------------------------------------------


def test_reward_is_the_normalised_gain_of_the_metric():
    assert normalised_gain(0.75, 0.5) == pytest.approx(0.5) == pytest.approx(normalised_gain(0.95, 0.9))
    assert normalised_gain(0.25, 0.5) == pytest.approx(-0.5) and normalised_gain(0.0, 0.4) == -1.0
    assert metric_reward(0.5, 0.5, True) == 0.5 and metric_reward(1.0, 0.5, True) == 1.0
    assert metric_reward(0.0, 0.5, True) == 0.0 and metric_reward(0.9, 0.5, False, penalty=0.1) == 0.1
    assert metric_reward(float("nan"), 0.5, True) == 0.0


def test_greedy_and_sequential_selection_for_the_ablation(tiny_ft):
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft))
    base = c.baseline
    tree = Tree(base, score=0.5)
    good = tree.add(base.with_(lr=0.01), tree.root, "passed", 0.8, score=0.8)
    late = tree.add(base.with_(lr=0.003), tree.root, "passed", 0.6, score=0.6)
    tree.add(base.with_(max_steps=6), tree.root, "failed", 0.0)
    assert tree.select("greedy") is good and tree.select("sequential") is late
    good.exhausted = late.exhausted = tree.root.exhausted = True
    assert tree.select("greedy") is None and tree.select("sequential") is None


def test_a_finetune_campaign_asks_the_model_where_no_rule_fires(tiny_ft, tmp_path):
    """The quality job's default ``search.explore`` is the model (the ablation in docs/benchmarks.md:
    MCTS best on 6 of 8 task-seeds with it, 4 without); the seeded choice stays one setting away, and
    the speed job keeps the engine's default."""
    file = campaign_file(tiny_ft)
    for overrides, want in (([], "model"), (["search.explore=random"], "random")):
        p = ftp.plan(ftp.load_finetune_campaign(file, overrides), tmp_path / want)
        assert p.proposer.explore == want  # type: ignore[union-attr]
    assert SearchConfig().explore == "random"


# -- the space ---------------------------------------------------------------------------------------


def test_space_maps_recipes_to_experiments_and_refuses_leaks(tiny_ft, tmp_path):
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft))
    knobs = c.space.knobs()
    assert knobs["lr"].low == 0.0 and knobs["method"].choices == ("full", "lora") and knobs["seed"].role == "invariant"
    child = c.baseline.with_(data_near_dedup=True, lr=0.01)
    assert c.space.describe(child, c.baseline) == "+near_dedup, lr=0.01"
    ops = [s["op"] for s in c.space.chain(child)]
    assert ops == ["dedup_exact", "dedup_near"]  # decontamination is appended after it by the chain
    exp = c.space.experiment_of(child)
    assert exp.spec.recipe.lr == 0.01 and exp.spec.task == c.experiment.spec.task
    # a data step that reads an evaluation split is refused before it runs
    leak = ftp.load_finetune_campaign(campaign_file(
        tiny_ft, data={"more": {"op": "load", "path": str(tiny_ft[1]["validation"])}}))
    p = ftp.plan(leak, tmp_path / "leak")
    cause = ft.QualityJob(p).check(leak.baseline.with_(data_more=True)).refusal
    assert cause.startswith("integrity: data step load reads") and "evaluation split" in cause


def test_proposals_outside_the_recipe_are_refused_as_data(tiny_ft, tmp_path):
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft))
    p = ftp.plan(c, tmp_path / "camp")
    ctx = SearchContext(c.space, c.baseline, p.space, Tree(c.baseline, score=0.0))
    for edits in ({"metric": "rouge_l"}, {"task.files.validation": "train.jsonl"}, {"seed": 3}, {"lr": 0.5}):
        assert check_edits(edits, ctx, "llm") is None
    reasons = [r.reason for r in ctx.drain()]
    assert "unknown knob 'metric'" in reasons[0] and "unknown knob 'task.files.validation'" in reasons[1]
    assert "not searched" in reasons[2] and "not in the space" in reasons[3]


# -- the Researcher ------------------------------------------------------------------------------------


def fake_report(run_dir: Path, errors: dict[str, float], loss=(2.0, 1.6), value=0.3) -> ExperimentReport:
    from recipetune.data.chain import DataVersion

    groups = [ErrorGroup(kind=k, count=int(100 * v), share=v, examples=[
        Prediction(index=0, prompt=f"prompt of {k}", target="cba", prediction="", score=0.0, error=k)])
        for k, v in errors.items()]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "predictions.jsonl").write_text("".join(json.dumps({"prediction": p}) + "\n" for p in "aaab"))
    return ExperimentReport(
        id="x", status="ok", task="reverse", route="reference",
        validation=Evaluation(split="validation", metric="exact_match", value=value, metrics={}, n_examples=100,
                              errors=groups),
        loss=LossCurve(steps=10, first=loss[0], last=loss[1], min=loss[1]),
        data=DataVersion(id="d", sources={}, rows_in=100, rows_out=80, operators=[]), experiment={},
        run_dir=str(run_dir))


def test_analyst_reads_the_executor_report(tiny_ft, tmp_path):
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft, knobs={"lr": [0.001, 0.003], "max_steps": [3, 6],
                                                              "completion_only": [False, True]}))
    base = c.baseline.with_(completion_only=False)
    p = ftp.plan(c, tmp_path / "camp")
    report = fake_report(tmp_path / "run", {"empty": 0.3, "wrong_format": 0.1})
    tree = Tree(base, report, score=0.3)
    ctx = SearchContext(c.space, base, p.space, tree, facts=experiment_facts)
    facts = experiment_facts(tree.root, ctx)
    assert facts["err_format"] == pytest.approx(0.4) and facts["loss_drop"] == pytest.approx(0.2)
    assert facts["pred_concentration"] == 0.75 and facts["rows"] == 80
    analyst = make_proposer("analyst", builtin=ftp.PLAYBOOK)
    proposals = analyst.propose(tree.root, ctx, 4)
    rules = [pr.rationale.split(" ")[0].split("[")[0] for pr in proposals]
    # underfitting (the loss fell by 20%) moves epochs/max_steps and lr; format errors set completion_only
    assert rules[:2] == ["underfitting-lr", "format-errors"], rules
    edits = [pr.edits for pr in proposals]
    assert {"lr": 0.003} in edits and {"completion_only": True} in edits
    # a child that did not help turns to the data side: every data step of the campaign
    worse = tree.add(base.with_(lr=0.003), tree.root, "passed", 0.4, score=0.2,
                     result=fake_report(tmp_path / "run2", {"wrong": 0.8}, loss=(2.0, 0.5), value=0.2))
    edits = [pr.edits for pr in analyst.propose(worse, ctx, 8)]
    assert {"data_near_dedup": True} in edits



def test_two_moves_that_each_helped_are_one_child_apart(tiny_ft, tmp_path):
    """The shape of stdlib-module at seed 1 (docs/benchmarks.md, "MCTS against the other arms"): lr and a
    data step each beat the baseline; expanding the lr node, the built-in playbook's first child adds
    the data step, ahead of the report's own rules. A data step that hurt is not carried over."""
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft, data={
        "near_dedup": {"op": "dedup_near", "threshold": 0.9}, "exact": {"op": "dedup_exact"}}))
    p = ftp.plan(c, tmp_path / "camp")
    tree = Tree(c.baseline, fake_report(tmp_path / "r0", {"wrong": 0.6}), score=0.417)
    ctx = SearchContext(c.space, c.baseline, p.space, tree, facts=experiment_facts)
    lr = tree.add(c.baseline.with_(lr=0.003), tree.root, "passed", 0.55, score=0.464,
                  result=fake_report(tmp_path / "r1", {"wrong": 0.5}, loss=(2.0, 1.6), value=0.464))
    tree.add(c.baseline.with_(data_near_dedup=True), tree.root, "passed", 0.52, score=0.437)
    tree.add(c.baseline.with_(data_exact=True), tree.root, "passed", 0.4, score=0.384)
    proposals = make_proposer("analyst", builtin=ftp.PLAYBOOK).propose(lr, ctx, 4)
    assert proposals[0].edits == {"data_near_dedup": True}, [pr.rationale for pr in proposals]
    assert proposals[0].rationale.startswith("combine-what-helped: data_near_dedup=true raised the baseline "
                                             "0.417 -> 0.437 (+0.02); made here on [lr=0.003]")
    assert {"data_exact": True} not in [pr.edits for pr in proposals[:1]]

def test_llm_context_is_compressed_within_its_size(tiny_ft, tmp_path):
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft))
    p = ftp.plan(c, tmp_path / "camp")
    tree = Tree(c.baseline, fake_report(tmp_path / "r0", {"empty": 0.5}), score=0.3)
    node = tree.root
    for i, lr in enumerate([0.003, 0.01]):
        node = tree.add(c.baseline.with_(lr=lr), node, "passed", 0.6, score=0.4 + i / 10,
                        result=fake_report(tmp_path / f"r{i + 1}", {"near_miss": 0.2, "wrong": 0.3}))
    options = dict(ft.QualityJob(p).briefing)
    big = compress_context(node, SearchContext(c.space, c.baseline, p.space, tree, **options), 3)
    assert big["node"]["validation_exact_match"] == 0.5 and big["node"]["worst_cases"][0]["kind"] == "near_miss"
    assert [n["changes"] for n in big["path"]] == [{}, {"lr": 0.003}] and big["gains"]
    options["max_chars"] = 900
    small = compress_context(node, SearchContext(c.space, c.baseline, p.space, tree, **options), 3)
    assert len(json.dumps(small, separators=(",", ":"))) <= 900 and len(small["path"]) < 2


# -- the decision ------------------------------------------------------------------------------------


BASE = {1: 0.50, 2: 0.58, 3: 0.55, 4: 0.52, 5: 0.57, 6: 0.54, 7: 0.51, 8: 0.56}  # the baseline's test metric by seed
GAIN = {1: 0.12, 2: 0.13, 3: 0.11, 4: 0.12, 5: 0.125, 6: 0.115, 7: 0.12, 8: 0.13}  # lr=0.01's gain by seed


def fake_final_of(seen: list):
    """final_evaluation, faked: each seed's test metric from BASE (+ GAIN for the lr=0.01 node); it keeps
    final.json as the real one does."""
    import statistics

    def fake_final(exp, seeds, out_dir, log=None):
        seen.append((exp.spec.recipe.lr, list(seeds)))
        values = [BASE[s] + (GAIN[s] if exp.spec.recipe.lr == 0.01 else 0.0) for s in seeds]
        result = FinalResult(experiment_id=exp.id, metric="exact_match", seeds=list(seeds), values=values,
                             mean=statistics.fmean(values), std=statistics.stdev(values), validation_values=values,
                             runs=[str(out_dir / f"seed-{s}") for s in seeds])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "final.json").write_text(result.model_dump_json())
        return result

    return fake_final


def searched(tiny_ft, tmp_path):
    """A quality campaign whose search found one node better on validation than the baseline (0.7 vs 0.5)."""
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft))
    p = ftp.plan(c, tmp_path / "camp")
    job = ft.QualityJob(p)
    job.services = Services(p.store, LocalExecutor(), Reporter())
    p.store.create(p.meta)
    tree = Tree(c.baseline, score=0.5)
    best = tree.add(c.baseline.with_(lr=0.01), tree.root, "passed", 0.8, score=0.7, trial=3)
    return p, job, Finished(tree, 1), best


def test_decide_runs_the_test_split_for_the_best_node_and_the_baseline(tiny_ft, tmp_path, monkeypatch):
    # seeds [1, 2]: a steady gain (+0.12, +0.13) is not shown on 1 degree of freedom at the first look's
    # level (t = 25); the design plans a third seed, and the second look shows it
    p, job, search, best = searched(tiny_ft, tmp_path)
    seen: list = []
    monkeypatch.setattr(looks_mod, "final_evaluation", fake_final_of(seen))
    outcome = job.decide(search)
    assert seen == [(0.001, [1, 2]), (0.01, [1, 2]), (0.001, [1, 2, 3]), (0.01, [1, 2, 3])]
    assert outcome.decision == "APPROVED" and outcome.winner is best
    verdict = json.loads((p.store.folder / "verdict.json").read_text())
    assert verdict["job"] == "quality" and verdict["change"] == "lr=0.01" and verdict["verdict"]["ci_low"] > 0
    looks = verdict["verdict"]["looks"]
    assert [x["outcome"] for x in looks] == ["continue", "shown"] and verdict["verdict"]["decided_at"] == 2
    assert verdict["verdict"]["runs_trained"] == 6 and verdict["verdict"]["competed"] == 1
    approved = outcome.approved_file.read_text()
    assert "lr: 0.01" in approved and str(tiny_ft[1]["validation"]) in approved  # paths made absolute
    # a resumed decision replays its looks on the kept test evaluations: nothing runs again
    seen.clear()
    again = job.decide(search)
    assert seen == [] and again.decision == "APPROVED"
    assert json.loads((p.store.folder / "verdict.json").read_text())["verdict"]["runs_trained"] == 0


def test_the_final_evaluation_says_its_time_at_the_pace_of_the_two_recipes(tiny_ft, tmp_path, monkeypatch):
    # the best node trains twice as long as the baseline (chat-recall's epochs=4): the time ahead is
    # each recipe's own pace, not the baseline's twice; a resume with both kept has nothing ahead
    from types import SimpleNamespace

    p, job, search, best = searched(tiny_ft, tmp_path)
    search.tree.root.result = SimpleNamespace(timings_s={"total": 80.0, "eval": 10.0})
    best.result = SimpleNamespace(timings_s={"total": 160.0, "eval": 10.0})
    phases: list[str] = []

    class Told(Reporter):
        def phase(self, text: str) -> None:
            phases.append(text)

    job.services = Services(p.store, LocalExecutor(), Told())
    monkeypatch.setattr(looks_mod, "final_evaluation", fake_final_of([]))
    job.decide(search)
    # the plan before the first seed: 2 seeds x (90 + 170 s) ~ 9 min; at most 8 seeds ~35 min
    plan = next(x for x in phases if x.startswith("the decision:"))
    assert "first look: seeds [1, 2] (4 runs, 4 to train, ~9 min at the two recipes' pace)" in plan
    assert "at most 8 seeds (16 runs, 16 to train, ~35 min" in plan
    assert "look 1: seeds [1, 2] on the test split, 4 run(s) to train, ~8.7 min at the two recipes' pace, 0 reused" \
        in phases
    phases.clear()
    job.decide(search)
    assert not any(text.startswith("look 1: seeds") for text in phases), phases
    assert decide_mod.final_eta([SimpleNamespace(timings_s={})], 3) is None  # an unknown time: no guess
    assert decide_mod.final_eta([None], 3) is None


def test_a_failed_final_evaluation_keeps_the_baseline_and_approves_nothing(tiny_ft, tmp_path, monkeypatch):
    p, job, search, best = searched(tiny_ft, tmp_path)

    def broken(exp, seeds, out_dir, log=None):
        raise RuntimeError("seed 2: the experiment failed (nan: loss is nan)")

    monkeypatch.setattr(looks_mod, "final_evaluation", broken)
    outcome = job.decide(search)
    assert outcome.decision == "KEEP BASELINE" and outcome.winner is None and outcome.approved_file is None
    verdict = json.loads((p.store.folder / "verdict.json").read_text())
    assert verdict["best"]["trial"] == best.trial and verdict["change"] == "(baseline)"
    assert "final evaluation failed" in verdict["reasons"][0] and not (p.store.folder / "approved.yaml").exists()


# -- headroom: a baseline at the metric's ceiling ------------------------------------------------------


def test_the_ceiling_rule_at_its_edge():
    # n = 100, z = 2: the most any experiment could gain (1 - v) against 2 standard errors sqrt(v(1-v)/n)
    assert ft.ceiling("exact_match", 0.96, 100, 2.0) == ""  # 4 errors: 0.04 > 2 x 0.0196, one could show
    assert "within 2 standard errors" in ft.ceiling("exact_match", 0.97, 100, 2.0)  # 3 errors: 0.03 <= 0.0341
    # exactly at the edge (n = 196, v = 0.98: 1 - v = 0.02 = 2 x 0.01) stops; a hair below it searches
    assert ft.ceiling("accuracy", 0.98, 196, 2.0) != "" and ft.ceiling("accuracy", 0.9799, 196, 2.0) == ""
    # the baseline, 0.975 on 200 examples (5 errors), is 2.26 standard errors below: it searches
    assert ft.ceiling("accuracy", 0.975, 200, 2.0) == ""
    # a perfect baseline leaves nothing to gain, whatever z; z = 0 stops nothing else
    assert ft.ceiling("rouge_l", 1.0, 50, 0.0) != "" and ft.ceiling("rouge_l", 0.999, 50, 0.0) == ""


def ceiling_campaign(tiny_ft, tmp_path, value: float):
    """A planned campaign (budget 4 runs) whose baseline already ran: ``value`` on 100 validation examples."""
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft))
    p = ftp.plan(c, tmp_path / "camp")
    report = fake_report(tmp_path / "run", {"wrong": 1 - value}, value=value)
    (p.store.folder / "baseline").mkdir(parents=True)
    (p.store.folder / "baseline" / "report.json").write_text(
        report.model_copy(update={"timings_s": {"total": 90.0}}).model_dump_json())
    return p


class Phases(Reporter):
    def __init__(self) -> None:
        self.phases: list[str] = []

    def phase(self, text: str) -> None:
        self.phases.append(text)


def test_a_baseline_at_the_ceiling_stops_the_campaign_and_the_decision_says_so(tiny_ft, tmp_path):
    reporter = Phases()
    p = ceiling_campaign(tiny_ft, tmp_path, 0.97)  # 3 errors in 100: within 2 standard errors of 1.0
    outcome = ft.run(p, executor=LocalExecutor(), reporter=reporter)
    assert outcome.runs == 0 and outcome.decision == "KEEP BASELINE"  # no experiment, no final evaluation
    said = "stopped: the baseline's validation exact_match 0.9700 is within 2"
    assert any(x.startswith(said) for x in reporter.phases)
    verdict = json.loads((p.store.folder / "verdict.json").read_text())
    assert verdict["reasons"][0].startswith("the search stopped after 0 of 4 runs: the baseline's validation "
                                            "exact_match 0.9700 is within 2 standard errors")
    assert not (p.store.folder / "final").exists()


def test_a_baseline_just_below_the_ceiling_searches_and_is_told_the_time_ahead(tiny_ft, tmp_path):
    reporter = Phases()
    p = ceiling_campaign(tiny_ft, tmp_path, 0.96)  # 4 errors in 100: a gain could show
    job = ft.QualityJob(p)
    p.store.create(p.meta)
    root = job.start(Services(p.store, LocalExecutor(), reporter))
    assert root.stop == "" and root.score == 0.96
    # 1.5 min an experiment: 4 search runs ~6 min, then the decision's 2 x 2 seeds, at most 2 x 8 ~6-24 min
    assert ("(1.5 min an experiment): 4 search runs ~6 min, then the decision's 4 to at most 16 runs on the test "
            "split ~6-24 min") in reporter.phases[-1]


def test_final_evaluation_reuses_the_seeds_already_evaluated(tiny_ft):
    from recipetune.finetune.experiment import load_experiment
    from recipetune.finetune.final import final_evaluation

    tmp_path, files, model = tiny_ft
    exp, out = load_experiment(experiment_file(tmp_path, files, model)), tmp_path / "final"
    first = final_evaluation(exp, [1, 2], out)
    stamp = (out / "seed-1" / "test.json").stat().st_mtime_ns
    second = final_evaluation(exp, [1, 2, 3], out)
    assert (out / "seed-1" / "test.json").stat().st_mtime_ns == stamp
    assert second.values[:2] == first.values and len(second.values) == 3 and (out / "seed-3" / "test.json").exists()


# -- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("search", "field"), [
    ({"knobs": {"seed": [0, 1]}}, "search.knobs.seed"),
    ({"knobs": {"metric": ["rouge_l"]}}, "search.knobs.metric"),
    ({"knobs": {"lr": [0.001, 5.0]}}, "search.knobs.lr"),
    ({"data": {"bad": {"op": "dedup_near", "threshold": 2}}}, "search.data.bad.threshold"),
    ({"data": {"out": {"op": "export"}}}, "search.data.out"),
    ({"seeds": [1]}, "search.seeds"),
    ({"seeds": [1, 2, 3], "max_test_seeds": 2}, "search.max_test_seeds"),  # fewer than the first look's
    ({"min_gain": -0.1}, "search.min_gain"),
    ({"selection": "beam"}, "search.selection"),
])
def test_bad_search_section_exits_2_and_writes_nothing(tiny_ft, search, field):
    out = tiny_ft[0] / "never"
    res = runner.invoke(app, ["finetune", str(campaign_file(tiny_ft, **search)), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert field in " ".join(res.output.split()) and not out.exists()
    with pytest.raises(ConfigError):
        ftp.plan(ftp.load_finetune_campaign(campaign_file(tiny_ft, **search)), out)


# -- end to end --------------------------------------------------------------------------------------------


def finished(store: CampaignStore) -> list:
    return [r for r in store.records() if r.status in ("passed", "rejected", "failed")]


@pytest.mark.slow  # a quality campaign end to end, killed and resumed: 1-2 min
def test_finetune_campaign_end_to_end_resumed_after_kill(tiny_ft):
    tmp_path, files, _ = tiny_ft
    file, out = campaign_file(tiny_ft), tmp_path / "camp"
    cmd = [sys.executable, "-m", "recipetune", "finetune", str(file), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:  # kill -9 while the second experiment runs
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if not (out / "study.db").exists():
                continue
            try:
                recs = CampaignStore(out).records()
            except KeyError:  # the file is there, the study not yet
                continue
            # one experiment finished and told (its result could be written while its trial still
            # reads RUNNING: killed there, resume would rightly run it again), another one running
            done = [r for r in recs if r.status == "passed" and r.state != "RUNNING"]
            if done and any(r.state == "RUNNING" for r in recs):
                break
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = {r.number: r.attrs["recipe_id"] for r in finished(CampaignStore(out)) if r.state != "RUNNING"}

    res = runner.invoke(app, ["finetune", str(file), "--out", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    assert "baseline experiment loaded from the previous session" in res.output
    store = CampaignStore(out)
    recs = finished(store)
    ids = [r.attrs["recipe_id"] for r in recs]
    assert len(recs) == 4 and len(set(ids)) == 4  # the budget, each experiment once
    assert {r.number: r.attrs["recipe_id"] for r in recs if r.number in before} == before
    assert any(r.status == "interrupted" for r in store.records())
    for r in recs:  # every node keeps its recipe, data version, metrics and diagnosis
        a = r.attrs
        assert a["status"] == "passed" and a["metric"] == "exact_match" and a["data_version"]
        assert "value" in a and "diagnosis" in a and Path(a["run_dir"], "report.json").is_file()
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["decision"] in ("APPROVED", "KEEP BASELINE") and verdict["job"] == "quality"
    # the search never saw the test split: its words appear in no file outside final/
    test_words = [json.loads(line)["word"] for line in files["test"].read_text().splitlines()]
    for path in out.rglob("*"):
        if path.is_file() and "final" not in path.relative_to(out).parts and path.suffix in (".json", ".jsonl",
                                                                                             ".log", ".txt"):
            text = path.read_text(errors="replace")
            assert not any(w in text for w in test_words), path
    show = runner.invoke(app, ["show", str(out)])
    assert show.exit_code == 0, show.output


def test_llm_researcher_in_a_campaign_is_held_to_the_recipe(tiny_ft):
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
    from fake_llm_server import FakeLLMServer

    reply = json.dumps({"proposals": [
        {"edits": {"metric": "rouge_l"}, "rationale": "an easier metric"},
        {"edits": {"task.files.train": "val.jsonl"}, "rationale": "train on what is scored"},
        {"edits": {"lr": 0.01, "data_near_dedup": True}, "rationale": "empty answers: bigger steps, fewer copies"}]})
    out = tiny_ft[0] / "camp"
    with FakeLLMServer([reply, json.dumps({"proposals": []})]) as server:
        res = runner.invoke(app, ["finetune", str(campaign_file(tiny_ft)), "--out", str(out), "--budget", "2",
                                  "--proposer", "llm", f"search.llm.base_url={server.base_url}",
                                  "search.llm.fallback=none"])  # the LLM alone: its one usable edit
    assert res.exit_code == 0, res.output
    system, user = server.requests[0]["messages"]
    assert "primary metric on the validation split" in system["content"]
    view = json.loads(user["content"])
    assert view["node"]["validation_exact_match"] == 0.0 and view["node"]["worst_cases"][0]["kind"] == "empty"
    rejected = [json.loads(line)["reason"] for line in (out / "rejected_proposals.jsonl").read_text().splitlines()]
    assert any("unknown knob 'metric'" in r for r in rejected)
    assert any("unknown knob 'task.files.train'" in r for r in rejected)
    [trial] = finished(CampaignStore(out))
    assert trial.attrs["edits"] == {"lr": 0.01, "data_near_dedup": True} and trial.attrs["proposer"] == "llm"


def test_a_hanging_or_broken_experiment_is_recorded_not_fatal(tiny_ft, tmp_path):
    c = ftp.load_finetune_campaign(campaign_file(tiny_ft))
    job = ft.QualityJob(ftp.plan(c, tmp_path / "camp"))
    child = c.space.child_file(c.baseline)
    hung = ft.run_child(str(c.path), [], child, str(tmp_path / "hung"), timeout_s=0.2)
    assert isinstance(hung, ft.Failed) and hung.status == "timeout"
    landing = job.land(hung, c.baseline, tmp_path / "hung")
    assert landing.status == "failed" and landing.reward == 0.0 and landing.cause.startswith("timeout")
    broken = ft.run_child(str(c.path), ["recipe.lr=-1"], child | {"recipe": {"lr": -1}}, str(tmp_path / "bad"),
                          timeout_s=120)
    assert isinstance(broken, ft.Failed) and broken.status == "invalid" and "recipe.lr" in broken.cause
