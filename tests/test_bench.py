"""`recipetune bench`: the measured table's format and build, strategies replayed against a table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipetune.bench.figures import markdown, summarize
from recipetune.bench.replay import STRATEGIES, Trajectory, Trial, replay
from recipetune.bench.table import FORMAT, Entry, Measurement, Table, build_table
from recipetune.cli import app
from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError
from recipetune.engine.samplers import distributions
from recipetune.finetune import bench_tasks as ftbench
from recipetune.finetune import metrics as ftm
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
    from recipetune.core.recipe import SearchSpace

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
    with pytest.raises(ConfigError, match="format"):
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


@pytest.mark.slow  # 240 replayed trials of a random search (12 seeds) drawing noise from the repeats: ~1 min
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


# ---- the small fine-tuning benchmark's tasks (finetune/bench_tasks.py) ----------------------------------

NEW_TASKS = {  # builtin -> (example file, the field splits are keyed by, target field)
    "argcount": ("ft-argcount.yaml", "signature", "count"),
    "default-value": ("ft-default.yaml", "signature", "default"),
    "product": ("ft-product.yaml", "question", "answer"),
    "exception": ("ft-exception.yaml", "message", "exception"),
    "chat-rename": ("ft-chat-rename.yaml", "name", "messages"),
}


def _example_task(name: str):
    from recipetune.core.files import read_yaml
    from recipetune.finetune.task import TaskConfig

    return TaskConfig.model_validate(read_yaml(ROOT / "examples" / NEW_TASKS[name][0])["task"])


def test_new_tasks_are_deterministic():
    first = {name: ftbench.GENERATORS[name]() for name in NEW_TASKS}
    ftbench.stdlib_code_facts.cache_clear()  # read the standard library again
    assert {name: ftbench.GENERATORS[name]() for name in NEW_TASKS} == first


@pytest.mark.parametrize("name", NEW_TASKS)
def test_new_tasks_are_disjoint_and_sized(name):
    first = ftbench.GENERATORS[name]()
    _, key, target = NEW_TASKS[name]
    if name == "chat-rename":  # the name is the user's message
        keys = {s: {r["messages"][1]["content"] for r in rows} for s, rows in first.items()}
    else:
        keys = {s: {r[key] for r in rows} for s, rows in first.items()}
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    assert 150 <= len(first["validation"]) <= 200 and 150 <= len(first["test"]) <= 200
    assert 1200 <= len(first["train"]) <= 3000
    task = _example_task(name)
    assert task.builtin == name and task.target == target
    assert all(task.answer(r) for rows in first.values() for r in rows)


def test_argcount_shares_a_long_instruction_and_counts_every_parameter():
    import ast

    task, rows = _example_task("argcount"), ftbench.argcount_rows()
    prompts = [task.render(r) for r in rows["train"][:200]]
    instruction = task.prompt.split("{")[0]
    assert len(instruction) >= 150 and instruction.count(". ") >= 2  # several sentences, every prompt
    assert all(p.startswith(instruction) for p in prompts)
    assert task.input_parts(rows["train"][0]) == [rows["train"][0]["signature"]]  # what decontamination compares
    for r in rows["validation"]:
        a = ast.parse(r["signature"] + " pass").body[0].args
        n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
        assert r["count"] == str(n) and len(r["count"]) <= 2


def test_default_value_answer_is_a_span_of_the_prompt():
    import ast

    task, rows = _example_task("default-value"), ftbench.default_rows()
    for r in rows["validation"] + rows["test"]:
        assert task.answer(r) in task.render(r)
        a = ast.parse(r["signature"] + " pass").body[0].args
        pos = a.posonlyargs + a.args
        defaults = dict(zip([p.arg for p in pos[len(pos) - len(a.defaults):]], a.defaults, strict=True))
        defaults |= {p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None}
        assert ast.unparse(defaults[r["param"]]) == r["default"]
    answers = Counter(r["default"] for r in rows["train"])
    assert answers.most_common(1)[0][1] < 0.2 * len(rows["train"])  # no single answer dominates


def test_product_rows_and_the_numeric_metric_at_the_example_tolerance():
    task, rows = _example_task("product"), ftbench.product_rows()
    assert task.metric == "numeric" and task.rel_tol > 0
    pairs = {r["question"] for rs in rows.values() for r in rs}
    assert sum(len(rs) for rs in rows.values()) == len(pairs)  # every pair once
    for r in rows["test"]:
        a, b = map(int, r["question"].rstrip("=").split("*"))
        assert a <= b and r["answer"] == str(a * b)
    target = rows["validation"][0]["answer"]
    edge = int(target) * task.rel_tol
    assert ftm.score("numeric", [str(int(target) + int(edge))], [target], (task.rel_tol, task.abs_tol)) == 1.0
    assert ftm.score("numeric", [str(int(target) + edge + 1)], [target], (task.rel_tol, task.abs_tol)) == 0.0


def test_exception_labels_are_multi_token_and_imbalanced():
    task, rows = _example_task("exception"), ftbench.exception_rows()
    counts = Counter(r["exception"] for r in rows["train"])
    assert len(counts) >= 6 and task.metric == "macro_f1"
    assert all(len(label) >= 7 and label.endswith("Error") for label in counts)
    assert counts.most_common()[0][1] >= 10 * counts.most_common()[-1][1]  # imbalanced
    assert {r["exception"] for r in rows["validation"]} <= set(counts)
    majority = counts.most_common(1)[0][0]  # the majority answer: fair accuracy, poor macro-F1
    targets = [r["exception"] for r in rows["validation"]]
    assert ftm.score("macro_f1", [majority] * len(targets), targets) < 0.5 * ftm.score(
        "accuracy", [majority] * len(targets), targets)


@pytest.mark.parametrize("pred,target,tol,inside", [
    ("105", "100", (0.05, 0.0), True),         # relative: exactly at the edge is inside
    ("105.01", "100", (0.05, 0.0), False),     # just outside
    ("94.99", "100", (0.05, 0.0), False),
    ("-105", "-100", (0.05, 0.0), True),       # relative to |target|
    ("3.3", "3", (0.1, 0.0), True),            # 0.1 * 3 is 0.30000000000000004 in binary
    ("2.5", "3", (0.0, 0.5), True),            # absolute
    ("2.49", "3", (0.0, 0.5), False),
    ("0.5", "0", (0.5, 0.5), True),            # the larger of the two (relative is 0 at 0)
    ("0.51", "0", (0.5, 0.0), False),
    ("3.0", "3", (0.0, 0.0), True),            # no tolerance: numerically equal
    ("3.01", "3", (0.0, 0.0), False),
    ("nan", "3", (1.0, 10.0), False), ("inf", "3", (1.0, 10.0), False), ("three", "3", (1.0, 1.0), False),
    ("", "3", (1.0, 1.0), False),
])
def test_numeric_tolerance_edges(pred, target, tol, inside):
    assert ftm.within_tolerance(pred, target, tol) is inside
    assert ftm.score("numeric", [pred], [target], tol) == float(inside)
    assert ftm.example_score("numeric", pred, target, tol) == float(inside)
    assert (ftm.error_kind(pred, target, False, None, None, tol) is None) is inside
    assert (ftm.error_kind(pred, target, False, None, None) is None) is (pred == target)  # no tolerance: exact


def test_numeric_metric_through_the_task_and_evaluate():
    from recipetune.finetune.experiment import evaluate
    from recipetune.finetune.task import TaskConfig

    class Echo:  # a route that answers what the row's prompt says
        def prompt(self, task, row):
            return task.render(row)

        def generate(self, prompts, settings):
            from types import SimpleNamespace

            return [SimpleNamespace(text=p.split("=")[1], truncated=False) for p in prompts]

    files = {"train": "a.jsonl", "validation": "b.jsonl", "test": "c.jsonl"}
    task = TaskConfig(files=files, prompt="{q}", target="a", metric="numeric", metrics=["exact_match"], rel_tol=0.05)
    rows = [{"q": "x=105", "a": "100"}, {"q": "x=106", "a": "100"}, {"q": "x=100", "a": "100"}]
    ev, preds = evaluate(Echo(), task, rows, "validation", None)
    assert ev.metrics == {"numeric": pytest.approx(2 / 3), "exact_match": pytest.approx(1 / 3)}
    assert [p.error for p in preds] == [None, "near_miss", None] and [p.score for p in preds] == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        TaskConfig(files=files, prompt="{q}", target="a", metric="numeric", rel_tol=-0.1)


@pytest.mark.parametrize("name", NEW_TASKS)
def test_new_example_files_parse_with_their_search_section(name):
    from recipetune.core.files import read_yaml
    from recipetune.finetune.experiment import ExperimentSpec

    raw = read_yaml(ROOT / "examples" / NEW_TASKS[name][0])
    search = raw.pop("search")
    spec = ExperimentSpec.model_validate(raw)
    assert spec.task.builtin == name and spec.recipe.threads == 1 and spec.model.path == "base"
    assert set(search["knobs"]) <= set(type(spec.recipe).model_fields) and len(search["data"]) >= 1
    assert search["seeds"] == [1, 2, 3]


def test_chat_rename_needs_the_system_prompt():
    task, rows = _example_task("chat-rename"), ftbench.rename_rows()
    assert task.format == "chat"
    for r in rows["validation"]:
        system, user, assistant = r["messages"]
        assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant"]
        style = next(k for k, (label, _, _) in ftbench.STYLES.items() if f" in {label} (" in system["content"])
        assert assistant["content"] == ftbench.STYLES[style][2](user["content"].split("_"))
        assert task.answer(r) == assistant["content"] and task.render(r).startswith("System: Rewrite the user's")
        assert assistant["content"] not in task.render(r)
    # the same user message gets different answers under different system prompts
    by_name: dict[str, set[str]] = {}
    for r in rows["train"]:
        by_name.setdefault(r["messages"][1]["content"], set()).add(r["messages"][2]["content"])
    assert sum(len(v) == 2 for v in by_name.values()) > 0.9 * len(by_name)
    styles = Counter(r["messages"][0]["content"] for r in rows["validation"])
    assert len(styles) == 4 and min(styles.values()) >= 30


def test_edit_distance_decides_a_near_miss():
    from recipetune.finetune.metrics import edit_distance, error_kind

    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3
    # max(1, 20% of the target): one edit in 5 characters is a near miss, two are not
    assert error_kind("12346", "12345", False, None, None) == "near_miss"
    assert error_kind("12366", "12345", False, None, None) != "near_miss"
