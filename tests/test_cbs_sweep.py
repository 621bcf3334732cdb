"""CBS sweep, scale and local: planning, best-per-B, resume, points.csv, config errors, branch bookkeeping.

Most tests run on a synthetic workload whose steps to a target are known in closed form; two run the real
reference trainer (nano model, a handful of steps) to check what the synthetic one cannot: the trainer
stops at the target, and a branch loaded from a checkpoint trains with its own, scaled learning rate.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recipetune.cbs.cli import cbs_app
from recipetune.cbs.fit import critical_batch_size
from recipetune.cbs.local import epsilon_rule, load_local, run_local
from recipetune.cbs.run import TrialRecord, best_per_batch, run_sweep
from recipetune.cbs.scale import load_scale, run_scale
from recipetune.cbs.sweep import geometric_grid, load_sweep, micro_batch
from recipetune.core.batch import cbs_bound, scale_lr
from recipetune.core.errors import ConfigError
from recipetune.core.measure import EvalRecord, RunResult, StepRecord
from recipetune.workloads.reference import ReferenceWorkload

runner = CliRunner()
A, C = 20.0, 400.0  # the synthetic S(B) = K (A + C / B) at the best lr
PARAMS = {"nano": 1000, "tiny": 8000}


def best_lr(batch: int) -> float:
    return 0.004 * math.sqrt(batch / 2)


class FakeWorkload(ReferenceWorkload):
    """Validation loss 1 + 4 / (1 + step * rate): rate = 1 / (A + C/B), halved per factor 2 away from the
    best lr. A batch size in `hopeless` learns 1000x slower and never reaches a target."""

    calls: list[tuple[int, float, float]] = []
    hopeless: set[int] = set()

    def run(self, recipe, steps, out_dir, timeout_s=None, progress=None, extra_args=None):
        batch, lr = int(recipe["global_batch_size"]), float(recipe["lr"])
        FakeWorkload.calls.append((batch, lr, float(recipe["beta2"])))
        args = list(extra_args or [])
        target = float(args[args.index("--stop-at-val-loss") + 1]) if "--stop-at-val-loss" in args else None
        c = C * (PARAMS[str(recipe["model"])] / 1000) ** 0.2  # bigger models: a larger B*, here
        rate = 1.0 / (A + c / batch) / (1.0 + 2.0 * abs(math.log2(lr / best_lr(batch))))
        rate *= 1e-3 if batch in FakeWorkload.hopeless else 1.0
        interval = int(recipe["eval_interval"]) or steps
        records, evals = [], []
        for step in range(1, steps + 1):
            loss = 1.0 + 4.0 / (1.0 + step * rate)
            records.append(StepRecord(step=step, loss=loss, tokens=batch * 8, step_time_s=0.01))
            if step % interval == 0 or step == steps:
                evals.append(EvalRecord(step=step, val_loss=loss))
                if target is not None and loss <= target:
                    break
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "run.json").write_text(json.dumps({"params": PARAMS[str(recipe["model"])]}))
        result = RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=records, evals=evals,
                           wall_s=0.01, out_dir=str(out_dir))
        result.save(out_dir / "result.json")
        return result


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeWorkload]:
    FakeWorkload.calls, FakeWorkload.hopeless = [], set()
    for mod in ("recipetune.cbs.sweep", "recipetune.cbs.scale"):
        monkeypatch.setattr(f"{mod}.ReferenceWorkload", FakeWorkload)
    return FakeWorkload


def write(tmp_path: Path, doc: dict, name: str = "cbs.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def sweep_doc(**edits: object) -> dict:
    doc = {
        "base": {"model": "nano", "seq_len": 8, "warmup_steps": 0},
        "batch_sizes": {"start": 2, "factor": 2, "count": 5},
        "micro_batch_cap": 4,
        "lr": {"values": [0.002, 0.004, 0.008], "scaling": "sqrt"},
        "target": {"loss": 2.0},
        "max_steps": 1000,
        "eval_interval": 1,
    }
    doc.update(edits)
    return doc


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------------------------------------- helpers


def test_grid_lr_and_micro_batch_rules() -> None:
    assert geometric_grid(4, 2, 5) == [4, 8, 16, 32, 64]
    assert geometric_grid(3, 1.5, 3) == [3, 4, 7]  # 3, 4.5 -> 4, 6.75 -> 7
    assert scale_lr(0.01, 4, "sqrt") == pytest.approx(0.02)
    assert scale_lr(0.01, 4, "linear") == pytest.approx(0.04)
    assert scale_lr(0.01, 4, "none") == 0.01
    assert micro_batch(64, 16) == 16
    assert micro_batch(24, 16) == 12  # the largest divisor under the cap
    assert micro_batch(3, 16) == 3


def test_plan_sets_batch_lr_ewa_and_constant_schedule(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, sweep_doc(beta2=[0.95, 0.99])))
    assert len(spec.trials) == 5 * 3 * 2
    for t in spec.trials:
        r = t.recipe
        assert r["global_batch_size"] == t.batch_size
        assert r["micro_batch_size"] == min(t.batch_size, 4)
        assert r["lr_schedule"] == "constant"
        assert r["ewa_decay"] == t.ewa_decay > 0
    lrs = sorted({t.lr for t in spec.trials if t.batch_size == 8})
    assert lrs == pytest.approx([0.004, 0.008, 0.016])  # the grid at B=2, times sqrt(8/2)
    decays = [spec.ewa_decay(b) for b in (2, 4, 8, 16, 32)]
    # horizon B/(1-t) constant: 1-t doubles with B, clipped at min=0.9
    assert decays == pytest.approx([0.99, 0.98, 0.96, 0.92, 0.9])


# ---------------------------------------------------------------------------------------------- sweep


def test_sweep_picks_best_lr_per_batch_and_writes_fit_ready_points(tmp_path: Path, fake: type) -> None:
    spec = load_sweep(write(tmp_path, sweep_doc()))
    result = run_sweep(spec, tmp_path / "out")
    assert [r.batch_size for r in result.best] == [2, 4, 8, 16, 32]
    for r in result.best:
        assert r.lr == pytest.approx(best_lr(r.batch_size))
        # loss 2.0 needs step * rate >= 3: S(B) = ceil(3 (A + C/B))
        assert r.steps_to_target == math.ceil(3 * (A + C / r.batch_size) - 1e-9)
        assert r.tokens_to_target == r.steps_to_target * r.batch_size * 8
    rows = read_csv(tmp_path / "out" / "points.csv")
    assert [int(row["batch_size"]) for row in rows] == [2, 4, 8, 16, 32]
    assert len(read_csv(tmp_path / "out" / "runs.csv")) == 15

    fit = runner.invoke(cbs_app, ["fit", str(tmp_path / "out" / "points.csv"), "--out", str(tmp_path / "fit")])
    assert fit.exit_code == 0, fit.output
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    group = summary["groups"][0]
    assert group["a"] == pytest.approx(3 * A, rel=0.02)
    assert group["b"] == pytest.approx(3 * C, rel=0.02)
    assert group["b_star"] == pytest.approx(critical_batch_size(3 * A, 3 * C, 2), rel=0.05)


def test_resume_skips_finished_runs_and_reruns_changed_or_crashed(tmp_path: Path, fake: type) -> None:
    path = write(tmp_path, sweep_doc(batch_sizes=[2, 4, 8]))
    out = tmp_path / "out"
    first = run_sweep(load_sweep(path), out)
    assert len(fake.calls) == 9
    fake.calls.clear()
    again = run_sweep(load_sweep(path), out)
    assert fake.calls == []
    assert all(r.resumed for r in again.trials)
    assert [r.steps_to_target for r in again.best] == [r.steps_to_target for r in first.best]

    # A crashed run is the machine's fault: run it again. A new target invalidates every run.
    point = next(out.glob("runs/B000004/*/point.json"))
    rec = TrialRecord.model_validate_json(point.read_text())
    point.write_text(rec.model_copy(update={"status": "crash"}).model_dump_json())
    run_sweep(load_sweep(path), out)
    assert fake.calls == [(4, rec.lr, 0.95)]
    fake.calls.clear()
    run_sweep(load_sweep(path, ["target.loss=2.5"]), out)
    assert len(fake.calls) == 9


def test_batch_that_never_reaches_target_is_recorded_as_missed(tmp_path: Path, fake: type) -> None:
    fake.hopeless = {16}
    result = run_sweep(load_sweep(write(tmp_path, sweep_doc(max_steps=700))), tmp_path / "out")
    assert result.missed == [16]
    rows = {int(r["batch_size"]): r for r in read_csv(tmp_path / "out" / "points.csv")}
    assert rows[16]["steps"] == "" and rows[16]["status"] == "missed"
    assert rows[8]["steps"] != "" and rows[8]["status"] == "ok"
    # `cbs fit` reads the missed row as excluded, not as an error.
    fit = runner.invoke(cbs_app, ["fit", str(tmp_path / "out" / "points.csv"), "--out", str(tmp_path / "fit")])
    assert fit.exit_code == 0, fit.output
    assert json.loads((tmp_path / "fit" / "summary.json").read_text())["excluded_rows"][0]["batch_size"] == 16


def test_reference_rule_sets_target_from_best_reference_loss(tmp_path: Path, fake: type) -> None:
    doc = sweep_doc(batch_sizes=[2, 4, 8], target={"reference": {"tokens": 2 * 8 * 300}, "epsilon": 0.0})
    spec = load_sweep(write(tmp_path, doc))
    assert spec.data_tokens == 2 * 8 * 300 and spec.reference_steps() == 300
    result = run_sweep(spec, tmp_path / "out")
    rate = 1.0 / (A + C / 2)  # the best lr at B = 2
    assert result.target == pytest.approx(1.0 + 4.0 / (1.0 + 300 * rate))
    # the reference batch size reaches its own best loss exactly at D tokens; that sweep run is the best
    # reference run stopped at the target, so it is read from it, not trained again
    assert result.best[0].steps_to_target == 300
    assert "read from reference" in result.best[0].cause
    assert len(fake.calls) == 3 + 9 - 1


def test_sweep_cli_end_to_end_and_cbs_bound(tmp_path: Path, fake: type) -> None:
    path = write(tmp_path, sweep_doc())
    res = runner.invoke(cbs_app, ["sweep", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    for name in ("points.csv", "runs.csv", "sweep.json", "sweep.md", "summary.json", "steps_vs_batch.png"):
        assert (tmp_path / "out" / name).is_file(), name
    summary = tmp_path / "out" / "summary.json"
    g = json.loads(summary.read_text())["groups"][0]
    assert cbs_bound(summary, conservative=False) == math.floor(g["b_star"])
    assert cbs_bound(summary) == math.floor(g["b_star_ci95"][0]) <= cbs_bound(summary, conservative=False)
    with pytest.raises(ValueError, match="pick one group"):
        cbs_bound(summary, group="D=1")


def test_too_few_batch_sizes_reached_exits_1_with_points_kept(tmp_path: Path, fake: type) -> None:
    fake.hopeless = {4, 8}
    path = write(tmp_path, sweep_doc(batch_sizes=[2, 4, 8], max_steps=800))
    res = runner.invoke(cbs_app, ["sweep", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert "no fit" in res.output
    assert len(read_csv(tmp_path / "out" / "points.csv")) == 3


# ---------------------------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"batch_size": 4}, "batch_size"),  # unknown top-level field
        ({"base": {"model": "nano", "lr": 0.1}}, "base.lr"),  # the sweep sets lr itself
        ({"base": {"model": "nano", "colour": 1}}, "base.colour"),
        ({"batch_sizes": {"start": 2, "factor": 1}}, "batch_sizes"),
        ({"batch_sizes": [4, 4]}, "batch_sizes"),
        ({"base": {"model": "nano", "nproc": 3}}, "batch_sizes[2]"),  # 3 processes cannot split B=2
        ({"target": {"loss": 2.0, "reference": {"tokens": 10}}}, "target"),
        ({"target": {"reference": {}}}, "target.reference.tokens"),
        ({"ewa": {"min": 0.99, "max": 0.9}}, "ewa"),
    ],
)
def test_config_errors_exit_2_and_write_nothing(tmp_path: Path, edit: dict, field: str) -> None:
    path = write(tmp_path, sweep_doc(**{"batch_sizes": [2, 4, 8], **edit}))
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert info.value.field == field and info.value.file == str(path)
    out = tmp_path / "out"
    res = runner.invoke(cbs_app, ["sweep", str(path), "--out", str(out)])
    assert res.exit_code == 2
    assert str(path) in res.output and field in res.output
    assert not out.exists()


def test_override_errors_and_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, sweep_doc())
    spec = load_sweep(path, ["seq_len=16", "lr.values=[0.001]", "batch_sizes=[2,4,8]"])
    assert spec.base["seq_len"] == 16 and len(spec.trials) == 3
    res = runner.invoke(cbs_app, ["sweep", str(path), "nonsense", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "key=value" in res.output
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- scale


def test_scale_runs_each_group_once_and_fits_both_exponents(tmp_path: Path, fake: type) -> None:
    doc = sweep_doc(target={"reference": {"batch_size": 2}})
    doc["batch_sizes"] = [2, 4, 8, 16]
    doc["lr"] = {"values": [0.004]}
    doc["data_sizes"] = {"tokens": [2 * 8 * 200, 2 * 8 * 400]}
    doc["model_sizes"] = {"models": ["nano", "tiny"], "tokens": 2 * 8 * 200}
    spec = load_scale(write(tmp_path, doc))
    assert [(g.model, g.tokens) for g in spec.groups] == [("nano", 3200), ("nano", 6400), ("tiny", 3200)]
    result = run_scale(spec, tmp_path / "out")
    assert len(result.groups) == 3
    rows = read_csv(tmp_path / "out" / "points.csv")
    assert {(r["model_size"], r["data_size"]) for r in rows} == {("1000", "3200"), ("1000", "6400"), ("8000", "3200")}
    # each group's token cap is max_tokens_factor x D
    assert all(t.max_steps == min(1000, 16 * g.tokens // (t.batch_size * 8)) for g in spec.groups
               for t in g.spec.trials)
    res = runner.invoke(cbs_app, ["fit", str(tmp_path / "out" / "points.csv"), "--out", str(tmp_path / "fit")])
    assert res.exit_code == 0, res.output
    scaling = {s["variable"]: s for s in json.loads((tmp_path / "fit" / "summary.json").read_text())["scaling"]}
    assert set(scaling) == {"data_size", "model_size"}
    assert scaling["model_size"]["exponent"] > 0.05 and scaling["model_size"]["x"] == [1000, 8000]


def test_scale_config_errors(tmp_path: Path) -> None:
    doc = sweep_doc(data_sizes={"tokens": [100, 200]})
    with pytest.raises(ConfigError, match="target.reference") as info:
        load_scale(write(tmp_path, doc))  # a fixed target loss cannot serve several data sizes
    assert info.value.field == "target"
    doc = sweep_doc(target={"reference": {}}, model_sizes={"models": ["nano", "huge"], "tokens": 100})
    with pytest.raises(ConfigError) as info:
        load_scale(write(tmp_path, doc))
    assert info.value.field == "model_sizes.model" and "huge" in str(info.value)
    res = runner.invoke(cbs_app, ["scale", str(write(tmp_path, sweep_doc(target={"reference": {}})))])
    assert res.exit_code == 2 and "data_sizes" in res.output


# ---------------------------------------------------------------------------------------------- local


def test_epsilon_rule_takes_largest_contiguous_k() -> None:
    assert epsilon_rule({1: 3.00, 2: 3.005, 4: 3.02, 8: 3.009}, 0.01) == (2, {1: True, 2: True, 4: False, 8: True})
    assert epsilon_rule({1: 3.0, 2: 2.9, 4: 3.01}, 0.01)[0] == 4
    assert epsilon_rule({1: None, 2: 3.0}, 0.01)[0] is None
    assert epsilon_rule({1: 3.0, 2: None}, 0.01)[0] == 1  # a failed branch is not within epsilon


def local_doc(**edits: object) -> dict:
    doc = {
        "base": {"model": "nano", "seq_len": 16, "warmup_steps": 1, "eval_batches": 1, "num_threads": 1},
        "batch_size": 2, "lr": 0.004, "branch_at": [3], "window_steps": 4, "multipliers": [2],
        "epsilon": 0.05, "micro_batch_cap": 4,
    }
    doc.update(edits)
    return doc


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"window_steps": 3}, "window_steps"),  # 3 is not divisible by 2: unequal tokens
        ({"branch_at": [5, 3]}, "branch_at"),
        ({"base": {"model": "nano", "global_batch_size": 8}}, "base.global_batch_size"),
        ({"base": {"model": "nano", "warmup_steps": 10}}, "branch_at"),  # branching inside the warm-up
        ({"branch_ewa": 0.98, "base": {"model": "nano", "ewa_decay": 0.9}}, "base.ewa_decay"),
    ],
)
def test_local_config_errors(tmp_path: Path, edit: dict, field: str) -> None:
    path = write(tmp_path, local_doc(**edit))
    with pytest.raises(ConfigError) as info:
        load_local(path)
    assert info.value.field == field
    res = runner.invoke(cbs_app, ["local", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and not (tmp_path / "out").exists()


def test_branch_ewa_averages_the_same_tokens_at_every_k(tmp_path: Path) -> None:
    spec = load_local(write(tmp_path, local_doc(branch_ewa=0.9, multipliers=[2, 4, 8], window_steps=8)))
    assert [t.recipe["ewa_decay"] for t in spec.trunk(tmp_path)] == [0.0]  # the trunk carries no average
    decays = {t.batch_size // 2: t.recipe["ewa_decay"] for t in spec.branches(tmp_path, 3)}
    assert decays == pytest.approx({1: 0.9, 2: 0.8, 4: 0.6, 8: 0.5})  # 1 - t = 0.1 k, at least 0.5


def test_local_branches_scale_lr_keep_tokens_and_resume(tmp_path: Path) -> None:
    """Real trainer: trunk to step 3, branches k = 1, 2 from its checkpoint for 4 steps' worth of tokens at B."""
    spec = load_local(write(tmp_path, local_doc()))
    out = tmp_path / "out"
    result = run_local(spec, out)
    assert (out / "trunk" / "step0000003.pt").is_file()
    point = result.points[0]
    assert sorted(point.records) == [1, 2]
    tokens = set()
    for k, rec in point.records.items():
        assert rec.status == "ok", rec.cause
        assert rec.lr == pytest.approx(0.004 * math.sqrt(k))
        assert rec.steps_run == 4 // k
        metrics = [json.loads(x) for x in (Path(rec.folder) / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "loss" in m]
        # continues from the checkpoint's step, at the branch's own LR despite the loaded optimizer state
        assert [m["step"] for m in steps] == list(range(4, 4 + 4 // k))
        assert all(m["lr"] == pytest.approx(0.004 * math.sqrt(k)) for m in steps)
        tokens.add(sum(m["tokens"] for m in steps))
    assert tokens == {4 * 2 * 16}
    assert point.local_cbs == 2 * point.k_max
    rows = read_csv(out / "local.csv")
    assert {int(r["tokens"]) for r in rows} == {4 * 2 * 16}
    again = run_local(load_local(write(tmp_path, local_doc())), out)
    assert all(r.resumed for r in again.trunk + list(again.points[0].records.values()))


# ---------------------------------------------------------------------------------------------- real trainer


def test_real_sweep_stops_at_target_and_records_steps(tmp_path: Path) -> None:
    doc = {
        "base": {"model": "nano", "seq_len": 16, "warmup_steps": 2, "eval_batches": 1, "num_threads": 1},
        "batch_sizes": [2, 4], "micro_batch_cap": 2, "lr": {"values": [0.006]},
        "target": {"loss": 4.5}, "max_steps": 30, "eval_interval": 2,
    }
    result = run_sweep(load_sweep(write(tmp_path, doc)), tmp_path / "out")
    for r in result.best:
        assert r.status == "ok", r.cause
        assert r.reached and r.steps_to_target % 2 == 0
        assert r.steps_run == r.steps_to_target < 30  # the trainer stopped at the first validation <= target
        assert r.best_val_loss <= 4.5
        assert r.params is not None
    assert best_per_batch(result.trials) == result.best
