"""Whole campaigns on a fast fake workload and a fake guard: the loop, the store, crash/hang/NaN,
static rejections, Optuna strategies, Ctrl-C and kill -9 with --resume, and bad input.

The fake workload is a real subprocess writing a metrics stream in a few milliseconds; its
``speed`` and ``impl`` knobs set the step time it reports, ``mode`` makes it crash, hang or
produce NaN. The fake guard implements the agreed guard API in a few lines. This file is also
the driver the kill -9 test launches: ``python tests/test_search_campaign.py tune ...``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from recipetune.config import Campaign, CampaignConfig, load_campaign
from recipetune.core.errors import ConfigError
from recipetune.core.measure import RunResult
from recipetune.core.process import kill_orphans, run_process
from recipetune.core.recipe import INVARIANT, SEMANTIC, SPEED, Knob, KnobSet, Recipe
from recipetune.engine.job import Reporter, Row
from recipetune.engine.store import CampaignStore
from recipetune.execute.executor import LocalExecutor
from recipetune.guard.baseline import GuardError
from recipetune.speed import job as campaign_mod
from recipetune.speed.job import Guard, run
from recipetune.speed.plan import plan
from recipetune.workloads.base import Workload, build_result

CHILD = r"""
import json, math, os, sys, time
out, steps, speed, mode, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
if mode == "crash":
    print("RuntimeError: simulated crash in the trainer", file=sys.stderr)
    sys.exit(1)
if mode == "hang":
    time.sleep(3600)
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for s in range(1, steps + 1):
        time.sleep(delay)
        loss = float("nan") if mode == "nan" and s > steps // 2 else 5.0 / s
        f.write(json.dumps({"step": s, "loss": loss, "tokens": 1000, "step_time_s": 0.01 / speed}) + "\n")
        f.flush()
"""
IMPL_FACTOR = {"a": 1.0, "b": 1.25, "c": 0.8}
# A wait on another process (a driver to start, a trial to open, a gate to open) ends when what it
# waits for happens; this bound only stops a test whose process hung, so it is generous: a loaded
# machine is slow, not hung, and no test's outcome depends on it.
PATIENCE_S = 300.0


def wait_for(condition: Any, proc: subprocess.Popen, what: str, timeout: float = PATIENCE_S) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` (with ``proc``'s stderr) if ``proc``
    ends first or it hangs past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what}: {proc.stderr.read().decode()[-3000:] if proc.stderr else ''}")
        time.sleep(0.05)  # polling the campaign, not standing in for work


def records(out: Path, url: str | None = None) -> list:
    """The campaign's trials in its study (none before the study exists), read without keeping it open."""
    store = CampaignStore(out, url)
    try:
        return store.records() if store.exists() else []
    finally:
        store.storage.engine.dispose()


class FakeWorkload(Workload):
    kind = "fake"

    def knobs(self) -> KnobSet:
        return KnobSet([
            Knob("speed", 1, SPEED, choices=(1, 2, 3, 4)),
            Knob("impl", "a", SPEED, choices=tuple(IMPL_FACTOR)),
            Knob("mode", "ok", SPEED, choices=("ok", "crash", "hang", "nan")),
            Knob("lr", 0.1, SEMANTIC, low=0.0, high=1.0),
            Knob("seed", 0, INVARIANT, low=0, high=100, integer=True),
        ])

    def command(self, recipe: Recipe, steps: int, out_dir: Path) -> list[str]:
        speed = float(recipe["speed"]) * IMPL_FACTOR[str(recipe["impl"])]
        delay = os.environ.get("FAKE_STEP_DELAY", "0")
        return [sys.executable, "-c", CHILD, str(out_dir), str(steps), str(speed), str(recipe["mode"]), delay]

    def run(self, recipe, steps, out_dir, timeout_s=None, progress=None) -> RunResult:  # type: ignore[override]
        out_dir.mkdir(parents=True, exist_ok=True)
        # A test holds every trial but the baseline's (or those from trial FAKE_GATE_FROM on: a run
        # folder is NNNN-<recipe id>) at a gate until it opens: the order of two processes is then
        # the test's, not the machine's load.
        gate, held_from = os.environ.get("FAKE_GATE"), int(os.environ.get("FAKE_GATE_FROM", "0"))
        number = out_dir.name.split("-", 1)[0]
        baseline = all(recipe[k] == v for k, v in BASELINE.items())
        held = not baseline and (not number.isdigit() or int(number) >= held_from)
        deadline = time.monotonic() + PATIENCE_S
        while gate and held and not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting on the test, not standing in for work
        # Only a hanging run needs the campaign's timeout (a tiny one in the tests that hang): one that
        # ends by itself is never cut, so a loaded machine cannot turn a slow run into a "timeout".
        outcome = run_process(self.command(recipe, steps, out_dir), log_dir=out_dir,
                              timeout_s=timeout_s if recipe["mode"] == "hang" else None)
        return build_result(recipe, outcome, out_dir, steps, out_dir / "metrics.jsonl",
                            {"environment": {"python": sys.version.split()[0]}})


# -- a fake guard with the agreed API -------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    knob: str
    rule: str
    message: str


class Profile(BaseModel):
    recipe: dict
    runs: list[RunResult]
    tokens_per_s: float
    throughput_noise: float = 0.02
    loss_tolerance: float = 0.5


class Screening(BaseModel):
    passed: bool
    reasons: list[str]
    speedup: float | None
    loss_gap: float | None
    loss_tolerance: float | None


class Verdict(BaseModel):
    decision: Literal["APPROVED", "REJECTED", "KEEP BASELINE"]
    reasons: list[str]
    speedup: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    noise_margin: float | None = 0.05
    parity: dict = {}
    invariants_checked: list[str] = []
    pairs: list[dict] = []
    baseline: dict = {}
    candidate: dict = {}
    cost: dict = {}
    stop: str = "decided"  # why the parity looks ended (the guard's Verdict.stop)


CALLS: dict[str, int] = {"profile": 0, "final": 0}


def fake_static_check(workload, baseline, candidate, allow_semantic=()) -> list[Violation]:
    out = []
    for name, (_, _) in candidate.diff(baseline).items():
        role = workload.knobs()[name].role
        if role != SPEED and name not in allow_semantic:
            out.append(Violation(name, "semantic-not-allowed", f"'{name}' may change what is learned"))
    if candidate.get("impl") == "c" and os.environ.get("FAKE_REJECT_IMPL_C"):
        out.append(Violation("impl", "relation", "impl c is not allowed with this trainer"))
    return out


def fake_profile_baseline(workload, recipe, steps, settings, out_dir, progress=None, runs_folder=None) -> Profile:
    CALLS["profile"] += 1
    result = workload.run(recipe, steps, out_dir / "run-0", timeout_s=30)
    if not result.ok:
        raise GuardError(f"baseline run failed ({result.status}: {result.cause}); see {out_dir}")
    return Profile(recipe=dict(recipe), runs=[result], tokens_per_s=result.summary().tokens_per_s_per_device)


def fake_screen(profile: Profile, candidate: RunResult, settings) -> Screening:
    speedup = candidate.summary().tokens_per_s_per_device / profile.tokens_per_s
    gap = (candidate.summary().loss_last or 0) - (profile.runs[0].summary().loss_last or 0)
    passed = abs(gap) <= profile.loss_tolerance
    return Screening(passed=passed, reasons=[] if passed else ["loss gap"], speedup=speedup, loss_gap=gap,
                     loss_tolerance=profile.loss_tolerance)


def fake_final_verdict(workload, baseline, candidate, settings, out_dir, allow_semantic=(), profile=None,
                       progress=None, executor=None, runs_folder=None) -> Verdict:
    CALLS["final"] += 1
    result = workload.run(candidate, 4, out_dir, timeout_s=30)
    speedup = result.summary().tokens_per_s_per_device / profile.tokens_per_s
    decision = "APPROVED" if speedup > 1.05 else "KEEP BASELINE"
    return Verdict(decision=decision, reasons=[f"measured {speedup:.2f}x"], speedup=speedup,
                   ci_low=speedup * 0.97, ci_high=speedup * 1.03, parity={"gap": 0.0, "tolerance": 0.5},
                   baseline=dict(baseline), candidate=dict(candidate),
                   cost={"parity_runs": 5.0, "parity_reused": 1.0, "parity_s": 62.2, "speed_runs": 6.0,
                         "speed_s": 26.1})


class FakeGuard:
    """The guard's boundary (speed/job.py: Guard) over the fakes above."""

    static_check = staticmethod(fake_static_check)
    profile_baseline = staticmethod(fake_profile_baseline)
    screen = staticmethod(fake_screen)
    final_verdict = staticmethod(fake_final_verdict)
    keep_run = staticmethod(lambda workload, recipe, steps, result, runs_folder: False)
    load_profile = staticmethod(Profile.model_validate_json)
    load_verdict = staticmethod(Verdict.model_validate)


def fake_guard() -> Guard:
    return FakeGuard()


# -- helpers ------------------------------------------------------------------------------------------

BASELINE = {"speed": 1, "impl": "a", "mode": "ok"}


def make_campaign(tmp_path: Path, knobs: dict[str, list], **search: Any) -> Campaign:
    config = CampaignConfig.model_validate({
        "baseline": BASELINE, "run": {"steps": 4, "timeout_s": 20}, "guard": {"parity": {"steps": 4}},
        "search": {"knobs": knobs, "steps_per_trial": 4, "budget": {"trials": 6}, **search},
    })
    workload = FakeWorkload()
    return Campaign(tmp_path / "fake.yaml", config, workload, workload.resolve(BASELINE))


class Recorder(Reporter):
    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.phases: list[str] = []

    def phase(self, text: str) -> None:
        self.phases.append(text)

    def row(self, row: Row) -> None:
        self.rows[row.key] = row


def finished(store: CampaignStore) -> list:
    return [r for r in store.records() if r.status in ("passed", "rejected", "failed")]


def run_campaign(tmp_path: Path, knobs: dict[str, list], resume: bool = False, **search: Any):
    camp = make_campaign(tmp_path, knobs, **search)
    p = plan(camp, tmp_path / "campaign", resume)
    reporter = Recorder()
    outcome = run(p, guard=fake_guard(), reporter=reporter)
    return outcome, p.store, reporter


# -- tests ------------------------------------------------------------------------------------------


def test_mcts_campaign_searches_stores_and_approves(tmp_path, monkeypatch):
    outcome, store, reporter = run_campaign(tmp_path, {"speed": [1, 2, 3, 4], "impl": ["a", "b", "c"]})
    recs = finished(store)
    assert outcome.runs == 6 and len(recs) == 6
    ids = [r.attrs["recipe_id"] for r in recs]
    assert len(set(ids)) == len(ids) and Recipe(BASELINE | {"lr": 0.1, "seed": 0}).id not in ids
    for r in recs:
        a = r.attrs
        assert {"recipe", "parent", "proposer", "rationale", "status", "reward", "tokens_per_s"} <= a.keys()
        assert a["proposer"] == "analyst" and a["rationale"]
        assert (Path(a["run_dir"]) / "metrics.jsonl").exists() and (Path(a["run_dir"]) / "stdout.log").exists()
        assert r.state == ("COMPLETE" if a["status"] == "passed" else "FAIL")
    # The tree grew below the root: some trial's parent is another trial's recipe.
    assert any(r.attrs["parent"] in ids for r in recs)
    assert outcome.decision == "APPROVED" and outcome.winner is not None and outcome.winner.score > 1
    # what the decision spent is part of it: the final verdict's runs and seconds
    assert "the final verdict's cost: parity 5 run(s) trained, 1 reused, 62 s; speed 6 runs, 26 s" in outcome.reasons
    assert outcome.winner is outcome.tree.best() or outcome.winner.score <= outcome.tree.best().score
    verdict = json.loads((store.folder / "verdict.json").read_text())
    assert verdict["decision"] == "APPROVED" and verdict["recipe_id"] == outcome.winner.id
    # and the campaign's: the share of its run compute the proof took, by part (speed/spent.py)
    assert verdict["compute"]["search"]["runs"] == 6 and 0 < verdict["compute"]["proof_share"] < 1
    assert any(r.startswith("proof took ") and "the search 6 runs" in r for r in outcome.reasons)
    assert (store.folder / "baseline_profile.json").exists() and (store.folder / "verdicts.json").exists()
    approved = yaml.safe_load(outcome.approved_file.read_text())
    assert approved["baseline"] == dict(outcome.winner.recipe)
    install_fakes_for(monkeypatch)
    assert load_campaign(outcome.approved_file).baseline == outcome.winner.recipe  # `recipetune run` can launch it
    assert outcome.launch[0] == f"recipetune run {outcome.approved_file}"
    # The study is a plain Optuna RDB study: anything Optuna reads (optuna-dashboard) can open it.
    study = optuna.load_study(study_name="recipetune", storage=f"sqlite:///{store.folder / 'study.db'}")
    assert study.best_trial.user_attrs["recipe_id"] in ids and set(study.best_trial.params) == {"speed", "impl"}
    assert any(r.status == "passed" for r in reporter.rows.values())


def test_crash_hang_and_nan_are_recorded_and_the_campaign_finishes(tmp_path):
    camp = make_campaign(tmp_path, {"mode": ["ok", "crash", "hang", "nan"]}, strategy="grid", budget={"trials": 20})
    camp.config.run.timeout_s = 1.5
    p = plan(camp, tmp_path / "campaign")
    outcome = run(p, guard=fake_guard(), reporter=Recorder())
    causes = {r.attrs["recipe"]["mode"]: r.attrs["cause"] for r in finished(p.store) if r.attrs["status"] == "failed"}
    assert causes["crash"].startswith("crash:") and "simulated crash" in causes["crash"]
    assert causes["hang"].startswith("timeout:")
    assert causes["nan"].startswith("nan:") and "non-finite loss" in causes["nan"]
    assert outcome.decision == "KEEP BASELINE" and (p.store.folder / "verdict.json").exists()
    # The grid covered the whole space (the three modes besides the baseline's) and then stopped on its own.
    assert outcome.runs == 3


def test_no_gain_space_keeps_the_baseline(tmp_path):
    outcome, store, _ = run_campaign(tmp_path, {"impl": ["a", "c"]})  # c is slower, nothing else to try
    assert outcome.decision == "KEEP BASELINE" and outcome.winner is None
    assert outcome.runs == 1 and "no candidate passed screening" in outcome.reasons[0]
    assert not (store.folder / "approved.yaml").exists()
    assert json.loads((store.folder / "verdict.json").read_text())["decision"] == "KEEP BASELINE"


def test_static_violations_are_rejected_trials_without_a_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_REJECT_IMPL_C", "1")
    outcome, store, _ = run_campaign(tmp_path, {"impl": ["a", "b", "c"], "speed": [1, 2, 3]}, budget={"trials": 4})
    rejected = [r for r in store.records() if r.attrs.get("recipe", {}).get("impl") == "c"]
    assert rejected and all(r.status == "rejected" and not r.attrs["ran"] for r in rejected)
    assert all("static check: impl" in r.attrs["cause"] and "run_dir" not in r.attrs for r in rejected)
    assert outcome.runs == 4  # rejections before running cost none of the budget


def test_semantic_knobs_need_opt_in(tmp_path):
    with pytest.raises(ConfigError, match="allow_semantic"):
        plan(make_campaign(tmp_path, {"lr": [0.1, 0.2]}), tmp_path / "c")
    with pytest.raises(ConfigError, match="invariant"):
        plan(make_campaign(tmp_path, {"seed": [1, 2]}), tmp_path / "c")
    plan(make_campaign(tmp_path, {"lr": [0.1, 0.2]}, allow_semantic=["lr"]), tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("strategy", ["tpe", "random", "grid"])
def test_optuna_strategies_ask_and_tell(tmp_path, strategy):
    outcome, store, _ = run_campaign(tmp_path, {"speed": [1, 2, 3], "impl": ["a", "b"]}, strategy=strategy,
                                     budget={"trials": 4})
    recs = finished(store)
    assert outcome.runs == 4 and len(recs) == 4
    assert len({r.attrs["recipe_id"] for r in recs}) == 4  # a repeated draw is told, never re-run
    assert all(r.attrs["proposer"] == strategy and r.attrs["parent"] == outcome.tree.root.id for r in recs)
    for r in store.records():
        assert Recipe(r.attrs["recipe"]) == outcome.tree.root.recipe.with_(**store.study.trials[r.number].params)
    dupes = [r for r in store.records() if r.status == "duplicate"]
    assert all(not r.attrs["ran"] and "same recipe as" in r.attrs["cause"] for r in dupes)


def test_wall_time_budget_stops_the_search(tmp_path):
    outcome, store, _ = run_campaign(tmp_path, {"speed": [1, 2, 3, 4]}, budget={"trials": 10, "wall_time_s": 1e-9})
    assert outcome.runs == 0 and outcome.decision == "KEEP BASELINE"  # no trial starts once the clock has run out
    assert store.study.user_attrs["search_elapsed_s"] > 1e-9
    assert (store.folder / "baseline_profile.json").exists()  # the baseline profile is not search time


def test_llm_proposer_in_a_campaign_records_rejections(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
    from fake_llm_server import FakeLLMServer

    good = {"edits": {"speed": 3}, "rationale": "faster"}
    bad = [{"edits": {"speed": "3; reboot"}, "rationale": "x"}, {"edits": {"gpu_turbo": True}, "rationale": "x"}]
    replies = [json.dumps({"proposals": [good, *bad]}), "no JSON today", json.dumps({"proposals": []})]
    with FakeLLMServer(replies) as server:
        outcome, store, reporter = run_campaign(tmp_path, {"speed": [1, 2, 3, 4]}, proposer="llm",
                                                llm={"base_url": server.base_url, "api_key": "sk-secret",
                                                     "fallback": "none"},  # the LLM's proposals alone
                                                budget={"trials": 3})
    assert server.headers[0]["authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in (store.folder / "campaign.json").read_text()  # never written to the folder
    recs = finished(store)
    assert [r.attrs["edits"] for r in recs] == [{"speed": 3}]  # only the valid proposal ever ran
    assert recs[0].attrs["proposer"] == "llm" and recs[0].attrs["rationale"] == "faster"
    reasons = [json.loads(x)["reason"] for x in (store.folder / "rejected_proposals.jsonl").read_text().splitlines()]
    assert any("shell metacharacters" in r for r in reasons)
    assert any("unknown knob 'gpu_turbo'" in r for r in reasons)
    assert any(r.startswith("malformed JSON") for r in reasons)
    assert sum(row.status == "invalid" for row in reporter.rows.values()) == len(reasons)
    assert outcome.decision in ("APPROVED", "KEEP BASELINE")


class InterruptingExecutor(LocalExecutor):
    """Runs trials like the local executor; raises KeyboardInterrupt during the n-th (Ctrl-C)."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.calls = n, 0

    def submit(self, workload, recipe, steps, out_dir, timeout_s, progress=None, measured=True):
        self.calls += 1
        if self.calls == self.n:
            out_dir.mkdir(parents=True, exist_ok=True)
            raise KeyboardInterrupt
        return super().submit(workload, recipe, steps, out_dir, timeout_s, progress, measured)


def test_ctrl_c_stops_cleanly_and_resume_finishes_without_repeating(tmp_path):
    knobs = {"speed": [1, 2, 3, 4], "impl": ["a", "b", "c"]}
    camp = make_campaign(tmp_path, knobs)
    p = plan(camp, tmp_path / "campaign")
    with pytest.raises(KeyboardInterrupt):
        run(p, guard=fake_guard(), executor=InterruptingExecutor(3), reporter=Recorder())
    first = {r.number: r for r in finished(p.store)}
    interrupted = [r for r in p.store.records() if r.status == "interrupted"]
    assert len(first) == 2 and len(interrupted) == 1 and interrupted[0].state == "FAIL"

    CALLS["profile"] = 0
    p2 = plan(make_campaign(tmp_path, knobs), tmp_path / "campaign", resume=True)
    outcome = run(p2, guard=fake_guard(), reporter=Recorder())
    assert CALLS["profile"] == 0  # the baseline profile is reused, not measured again
    recs = finished(p2.store)
    assert outcome.runs == 6 and len(recs) == 6
    ids = [r.attrs["recipe_id"] for r in recs]
    assert len(set(ids)) == 6
    for number, rec in first.items():  # the finished trials are kept as they were
        assert p2.store.records()[number].attrs["recipe_id"] == rec.attrs["recipe_id"]
    # The interrupted recipe was not "finished": it may run again (and the analyst proposes it again).
    assert interrupted[0].attrs["recipe_id"] in ids


def test_resume_refuses_a_changed_campaign(tmp_path):
    run_campaign(tmp_path, {"impl": ["a", "b"]}, budget={"trials": 1})
    with pytest.raises(ConfigError, match="space"):
        plan(make_campaign(tmp_path, {"impl": ["a", "b", "c"]}), tmp_path / "campaign", resume=True)
    with pytest.raises(ConfigError, match="--resume"):
        plan(make_campaign(tmp_path, {"impl": ["a", "b"]}), tmp_path / "campaign")
    with pytest.raises(ConfigError, match="no campaign to resume"):
        plan(make_campaign(tmp_path, {"impl": ["a", "b"]}), tmp_path / "elsewhere", resume=True)
    with pytest.raises(ConfigError, match="backup"):  # what the tree's statistics mean changes the search
        plan(make_campaign(tmp_path, {"impl": ["a", "b"]}, backup="max"), tmp_path / "campaign", resume=True)
    # A campaign stored before the setting was recorded ran with the default: it resumes.
    store = CampaignStore(tmp_path / "campaign")
    meta = dict(store.study.user_attrs["campaign"])
    del meta["backup"]
    store.set_meta("campaign", meta)
    plan(make_campaign(tmp_path, {"impl": ["a", "b"]}), tmp_path / "campaign", resume=True)
    with pytest.raises(ConfigError, match="backup"):
        plan(make_campaign(tmp_path, {"impl": ["a", "b"]}, backup="max"), tmp_path / "campaign", resume=True)


# -- through the command line ---------------------------------------------------------------------------


def write_campaign_file(tmp_path: Path, budget: int = 5, **search: Any) -> Path:
    f = tmp_path / "fake-campaign.yaml"
    f.write_text(yaml.safe_dump({
        "workload": {"kind": "command", "argv": ["unused"]},
        "baseline": BASELINE, "run": {"steps": 4, "timeout_s": 20}, "guard": {"parity": {"steps": 4}},
        "search": {"knobs": {"speed": [1, 2, 3, 4], "impl": ["a", "b", "c"]}, "steps_per_trial": 4,
                   "budget": {"trials": budget}, **search},
    }))
    return f


def install_fakes() -> None:
    """Route the campaign file's workload to FakeWorkload and the guard to the fakes."""
    import recipetune.config as config_mod

    config_mod.build_workload = lambda *args, **kwargs: FakeWorkload()
    campaign_mod.real_guard = fake_guard


@pytest.mark.parametrize(("args", "expected"), [
    (["search.knobs.speed=[1, 7]"], "search.knobs.speed"),
    (["search.knobs.lr=[0.1, 0.3]"], "allow_semantic"),
    (["--strategy", "annealing"], "search.strategy"),
    (["--budget", "0"], "search.budget.trials"),
    (["search.playbook=missing.yaml"], "missing.yaml"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, args, expected):
    from recipetune.cli import app

    install_fakes_for(monkeypatch)
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path)), *args, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.output.split()) and not out.exists()


def install_fakes_for(monkeypatch) -> None:
    import recipetune.config as config_mod

    monkeypatch.setattr(config_mod, "build_workload", lambda *args, **kwargs: FakeWorkload())
    monkeypatch.setattr(campaign_mod, "real_guard", fake_guard)


def test_tune_command_prints_table_and_verdict(tmp_path, monkeypatch):
    from recipetune.cli import app

    install_fakes_for(monkeypatch)
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path)), "--budget", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    # CliRunner's terminal is 80 columns: the table keeps the change, status and score and drops the
    # proposer's rationale (tests/test_live_table.py), so the proposer's name is not asserted here
    assert "trials" in text and "speed-up" in text and "APPROVED" in text and "recipetune run" in text
    # not a terminal (CliRunner, as a log or CI): each trial as it starts and lands and the campaign's
    # pace as lines, in order, as they happen (the redrawn table reaches a log only once, at the end)
    lines = [text.index(f"trial {n} {s}: ") for n in range(3) for s in ("running", "passed")]
    lines.append(text.index("3/3 runs, "))
    assert lines == sorted(lines) and lines[-1] < text.index("┏"), res.output
    assert text.count("trial 1 running: ") == 1  # once, when it starts, not at every redraw
    assert "trial 1 passed: speed=4; speed-up 4.00x; tok/s/dev 400,000; ok" in text and "1/3 runs, " in text
    assert (out / "approved.yaml").exists()
    again = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path)), "--out", str(out)])
    assert again.exit_code == 2 and "--resume" in again.output


def test_failing_baseline_exits_1_with_the_guard_message(tmp_path, monkeypatch):
    from recipetune.cli import app

    install_fakes_for(monkeypatch)
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path)), "mode=crash", "--out", str(out)])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "baseline run failed (crash" in text and "--resume" in text
    assert "Traceback" not in res.output  # a guard error is a message, not a bug


def test_kill_9_mid_trial_then_resume(tmp_path):
    """kill -9 the `recipetune tune` process while a trial runs; --resume finishes the budget and
    every finished trial is in the study exactly once."""
    f = write_campaign_file(tmp_path, budget=5)
    out = tmp_path / "campaign"
    cmd = [sys.executable, __file__, "tune", str(f), "--out", str(out)]
    # the third trial waits at a gate that never opens: it is running when the kill comes, however slow the machine
    env = {**os.environ, "FAKE_GATE": str(tmp_path / "gate"), "FAKE_GATE_FROM": "2"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: any(r.number == 2 and "run_dir" in r.attrs for r in records(out)), proc, "trial 2 never started")
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    store = CampaignStore(out)
    before = {r.number: r.attrs["recipe_id"] for r in finished(store)}
    assert len(before) == 2 and [r.state for r in store.records()][2] == "RUNNING"

    res = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=PATIENCE_S)  # no gate now
    assert res.returncode == 0, res.stdout + res.stderr
    store = CampaignStore(out)
    recs = finished(store)
    ids = [r.attrs["recipe_id"] for r in recs]
    assert len(recs) == 5 and len(set(ids)) == 5  # the budget, each recipe once
    assert {r.number: r.attrs["recipe_id"] for r in recs if r.number in before} == before
    killed = store.records()[2]
    assert killed.status == "interrupted" and killed.state == "FAIL"
    assert json.loads((out / "verdict.json").read_text())["decision"] in ("APPROVED", "KEEP BASELINE")


def test_orphaned_trainer_of_a_killed_campaign_is_stopped(tmp_path):
    run_dir = tmp_path / "trials" / "0002-abc"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir)])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / "other")])
    try:
        cmdline = Path(f"/proc/{orphan.pid}/cmdline")
        while str(run_dir).encode() not in cmdline.read_bytes():  # Popen may return before exec shows
            time.sleep(0.01)
        kill_orphans(str(run_dir))
        code = orphan.wait(timeout=10)
        assert code == -signal.SIGKILL, code
        assert bystander.poll() is None, bystander.returncode
    finally:
        for p in (orphan, bystander):
            p.kill()
            p.wait()


if __name__ == "__main__":  # the driver of test_kill_9_mid_trial_then_resume
    install_fakes()
    from recipetune.cli import app

    app(sys.argv[1:])
