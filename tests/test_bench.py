"""`recipetune bench`: the measured table's format and build, strategies replayed against a table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipetune.bench.figures import markdown, summarize
from recipetune.bench.replay import STRATEGIES, Trajectory, Trial, replay
from recipetune.bench.table import FORMAT, Entry, Measurement, Table, build_table
from recipetune.cli import app
from recipetune.config import load_campaign
from recipetune.store import distributions
from recipetune.workloads.reference import ReferenceWorkload

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

SPACE = {"micro_batch_size": [1, 2, 4, 8, 16], "optimizer_impl": ["for-loop", "foreach"], "num_threads": [1, 2]}


def synthetic_table(infeasible: set[tuple] = frozenset()) -> Table:
    """A reference-workload space with a made-up but profile-consistent speed: larger micro-batches,
    the foreach optimizer and two threads are faster; the optimizer's share of the step shows the
    for-loop's cost, accumulation follows the micro-batch. Three repeats at +-3%; one recipe fails once."""
    w = ReferenceWorkload()
    base = w.resolve({"model": "nano", "global_batch_size": 16, "micro_batch_size": 1, "num_threads": 1,
                      "device": "cpu"})
    from recipetune.recipe import SearchSpace

    dists = distributions(SearchSpace.from_lists(w.knobs(), SPACE), base)
    entries = []
    for mb in dists["micro_batch_size"].choices:
        for opt in dists["optimizer_impl"].choices:
            for th in dists["num_threads"].choices:
                values = {"micro_batch_size": mb, "optimizer_impl": opt, "num_threads": th}
                compute = 0.2 / mb**0.5 * (0.8 if th == 2 else 1.0)
                optim = 0.05 if opt == "for-loop" else 0.01
                runs = []
                for r, noise in enumerate((0.97, 1.0, 1.03)):
                    step = (compute + optim + 0.002) * noise
                    failed = mb == 1 and th == 2 and r == 1
                    runs.append(Measurement(
                        repeat=r, status="oom" if failed else "ok", cause="out of memory" * failed,
                        wall_s=2.0 + 20 * step, tokens_per_s=None if failed else 2048 / step, step_s=step,
                        data_s=0.002 * noise, compute_s=compute * noise, optim_s=optim * noise,
                        peak_mem_bytes=2**27 * mb, tokens_per_step=2048, measured_steps=18,
                        accumulation_steps=16 // mb, device="cpu"))
                feasible = (mb, opt, th) not in infeasible
                entries.append(Entry(id=base.with_(**values).id, values=values, feasible=feasible,
                                     runs=runs if feasible else []))
    return Table(name="synthetic", workload="reference", campaign="(test)", baseline=dict(base),
                 baseline_id=base.id, space=SPACE, steps=20, repeats=3, environment={"cpu": "test"},
                 entries=entries)


def test_table_round_trip_and_format(tmp_path):
    table = synthetic_table()
    path = tmp_path / "t.json"
    table.save(path)
    back = Table.load(path)
    assert back == table and back.format == FORMAT
    assert back.best().values == {"micro_batch_size": 16, "optimizer_impl": "foreach", "num_threads": 2}
    raw = json.loads(path.read_text())
    raw["format"] = "something-else/9"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="format"):
        Table.load(path)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_replays_deterministically_within_budget(strategy):
    table = synthetic_table(infeasible={(2, "foreach", 2), (8, "for-loop", 1)})
    infeasible = {e.id for e in table.entries if not e.feasible}
    a = replay(table, strategy, 12, seed=3)
    b = replay(table, strategy, 12, seed=3)
    assert [(t.recipe_id, t.observed) for t in a.trials] == [(t.recipe_id, t.observed) for t in b.trials]
    ids = [t.recipe_id for t in a.trials]
    assert 0 < len(ids) <= 12
    assert len(set(ids)) == len(ids), "a recipe ran twice"
    assert not set(ids) & infeasible, "an infeasible recipe was run"
    assert table.baseline_id not in ids
    assert all(t.cost_s > 2.0 for t in a.trials)


def test_noise_is_drawn_from_the_repeats_and_failures_cost_time():
    table = synthetic_table()
    trials = [t for seed in range(12) for t in replay(table, "optuna-random", 20, seed).trials]
    observed = {}
    for t in trials:
        observed.setdefault(t.recipe_id, set()).add(t.observed)
    assert any(len(v) > 1 for v in observed.values()), "repeats were never drawn"
    failed = [t for t in trials if t.status == "failed"]
    assert failed and all(t.observed is None and t.cost_s > 0 for t in failed)


def test_mcts_analyst_reads_the_profile_and_finds_the_best_early():
    table = synthetic_table()
    best = table.best().tokens_per_s() / table.baseline_entry().tokens_per_s()
    traj = replay(table, "mcts-analyst", 20, seed=0)
    n, wall = traj.to_reach(0.98 * best)
    # Accumulation (16 micro-batches, memory to spare) fires `no-accumulation` first; the for-loop
    # optimizer's share and the thread count fire their rules further down the tree.
    first = next(e for e in table.entries if e.id == traj.trials[0].recipe_id)
    assert first.values == {"micro_batch_size": 16, "optimizer_impl": "for-loop", "num_threads": 1}
    assert n is not None and n <= 13, [t.recipe_id for t in traj.trials]
    assert wall == pytest.approx(sum(t.cost_s for t in traj.trials[:n]))


def test_summary_counts_trials_and_censors_the_unreached():
    def traj(seed, trues):
        return Trajectory("s", seed, [Trial(str(i), "passed", x, x, 10.0) for i, x in enumerate(trues)])

    runs = [traj(0, [1.2, 2.0]), traj(1, [1.1, 1.5, 1.99]), traj(2, [1.1, 1.2, 1.3])]
    s = summarize(runs, best=2.0, budget=3)["s"]
    assert s["reached"] == 2
    assert s["trials_to_2pct"][0] == 3.0  # median of 2, 3, never
    assert math.isinf(s["trials_to_2pct"][2])
    assert s["wall_s_to_2pct"][0] == 30.0
    assert runs[1].incumbent(2) == 1.5 and runs[0].found(1) == 1.2
    assert "never" in markdown("t", summarize(runs[2:], 2.0, 3), 2.0, 10, 3)


def test_build_table_interleaves_repeats_and_skips_infeasible(tmp_path):
    # The command workload's relation (micro_batch * grad_accum == 32) rules out 4x4 and 8x8.
    campaign_file = tmp_path / "c.yaml"
    text = (ROOT / "benchmarks" / "tables" / "command-fake.yaml").read_text()
    text = text.replace("../../tests/fixtures/fake_trainer.py", str(ROOT / "tests" / "fixtures" / "fake_trainer.py"))
    text = text.replace("micro_batch: [1, 2, 4, 8, 16, 32]", "micro_batch: [4, 8]")
    text = text.replace("grad_accum: [1, 2, 4, 8, 16, 32]", "grad_accum: [4, 8]")
    text = text.replace("num_threads: [1, 2]\n  steps", "num_threads: [1]\n  steps")
    campaign_file.write_text(text)
    campaign = load_campaign(campaign_file)
    out, lines = tmp_path / "table.json", []
    table = build_table(campaign, out, "t", repeats=2, steps=5, timeout_s=60, log=lines.append)
    feasible = {(e.values["micro_batch"], e.values["grad_accum"]) for e in table.entries if e.feasible}
    assert feasible == {(4, 8), (8, 4), (2, 16)}  # the baseline's 2 x 16 is a point of the space too
    assert all(not e.runs and "32" in e.cause for e in table.entries if not e.feasible)
    assert all([m.repeat for m in e.runs] == [0, 1] and all(m.status == "ok" for m in e.runs)
               for e in table.entries if e.feasible)
    order = [line.split()[1] for line in lines if line.startswith("repeat")]
    assert order == ["1/2"] * 3 + ["2/2"] * 3  # every recipe once before any twice
    m = table.baseline_entry().runs[0]
    assert m.tokens_per_s and m.step_s and m.wall_s > 0 and m.tokens_per_step == 32 * 512
    # Resuming a finished table runs nothing more.
    again = build_table(campaign, out, "t", repeats=2, steps=5, timeout_s=60, log=lines.append)
    assert again == Table.load(out) and not [x for x in lines[len(order) + 1:] if x.startswith("repeat")]


def test_replay_command_writes_figures_and_refuses_bad_tables(tmp_path):
    path = tmp_path / "t.json"
    synthetic_table().save(path)
    out = tmp_path / "replay.json"
    res = runner.invoke(app, ["bench", "replay", str(path), "--seeds", "2", "--budget", "6",
                              "--strategies", "mcts-analyst,tpe", "--out", str(out),
                              "--markdown", str(tmp_path / "r.md")])
    assert res.exit_code == 0, res.output
    summary = json.loads(out.read_text())["tables"]["synthetic"]["summary"]
    assert set(summary) == {"mcts-analyst", "tpe"} and summary["tpe"]["seeds"] == 2
    assert "| mcts-analyst |" in (tmp_path / "r.md").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = runner.invoke(app, ["bench", "replay", str(bad)])
    assert res.exit_code == 2 and "not a bench table" in res.output
    res = runner.invoke(app, ["bench", "replay", str(path), "--strategies", "hillclimb"])
    assert res.exit_code == 2 and "hillclimb" in res.output


def test_run_and_trainer_do_not_import_what_they_do_not_use():
    # `recipetune run` and the trainer subprocess pay for every import on every trial.
    code = ("import sys; sys.argv = ['recipetune', 'run', 'x.yaml']; import recipetune.cli; "
            "import recipetune.trainer.__main__; "
            "print(sorted(m for m in ('matplotlib', 'scipy', 'optuna', 'jinja2', 'recipetune.report.plots') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_table_command_refuses_bad_input_and_writes_nothing(tmp_path):
    out = tmp_path / "t.json"
    res = runner.invoke(app, ["bench", "table", str(tmp_path / "missing.yaml"), "--out", str(out)])
    assert res.exit_code == 2 and "no such file" in res.output
    res = runner.invoke(app, ["bench", "table", str(ROOT / "examples" / "tiny.yaml"), "--out", str(out)])
    assert res.exit_code == 2 and "search.knobs" in res.output  # a campaign without a space
    assert not out.exists()
