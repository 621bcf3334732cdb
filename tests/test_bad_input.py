"""Bad input still found by a new user (issue 22): each refused with a message naming what is wrong
and what is allowed, exit code 2, nothing written, no traceback; beside each, the valid case the
check must not catch."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import recipetune
from recipetune.cli import app
from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError, missing_extra
from recipetune.speed.plan import check_space
from recipetune.speed.verify import EXIT

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()
FAST = ["model=nano", "seq_len=32", "num_threads=1", "eval_batches=1", "micro_batch_size=16"]


def _text(res) -> str:
    return " ".join(res.output.split())


def _refused(res, *words: str) -> str:
    text = _text(res)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and not isinstance(res.exception, ImportError | ValueError)
    for word in words:
        assert word in text, text
    return text


# -- numeric options -----------------------------------------------------------------------------


@pytest.mark.parametrize("steps", ["-1", "0"])
def test_run_refuses_steps_below_one_and_writes_nothing(tmp_path: Path, steps: str):
    out = tmp_path / "never"
    res = runner.invoke(app, ["run", str(EXAMPLES / "tiny.yaml"), *FAST, "--steps", steps, "--out", str(out)])
    _refused(res, "--steps", "greater than or equal to 1")
    assert not out.exists()


def test_run_takes_one_step(tmp_path: Path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", str(EXAMPLES / "tiny.yaml"), *FAST, "warmup_steps=0", "--steps", "1",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert ": 1 steps" in _text(res) and (out / "metrics.jsonl").exists()


@pytest.mark.parametrize(("option", "field"), [("--budget", "search.budget.trials"),
                                               ("--parallel", "execute.parallel")])
def test_tune_options_are_bounded_through_the_file(tmp_path: Path, option: str, field: str):
    out = tmp_path / "never"
    res = runner.invoke(app, ["tune", str(EXAMPLES / "tiny-campaign.yaml"), option, "0", "--out", str(out)])
    _refused(res, field, "must be >= 1 (got 0)")
    assert not out.exists()


def test_finetune_budget_is_bounded(tmp_path: Path):
    out = tmp_path / "never"
    res = runner.invoke(app, ["finetune", str(EXAMPLES / "ft-arith.yaml"), "--budget", "0", "--out", str(out)])
    _refused(res, "search.budget.trials", "must be >= 1 (got 0)")
    assert not out.exists()


@pytest.mark.parametrize("command", [["tune", "tiny-campaign.yaml"], ["finetune", "ft-arith.yaml"]])
@pytest.mark.parametrize(("option", "value", "words"), [
    ("--budget-s", "0", ("search.budget.trial_s", "must be > 0 (got 0.0)")),
    ("--pruner", "fastest", ("search.pruning.pruner", "'median'", "(got 'fastest')")),
])
def test_the_compute_budget_and_the_pruner_are_checked_through_the_file(tmp_path: Path, command, option, value,
                                                                         words):
    out = tmp_path / "never"
    res = runner.invoke(app, [command[0], str(EXAMPLES / command[1]), option, value, "--out", str(out)])
    _refused(res, *words)
    assert not out.exists()


def _points(tmp_path: Path) -> Path:
    table = tmp_path / "points.csv"
    table.write_text("batch_size,steps\n4,1000\n8,520\n16,280\n32,160\n64,100\n")
    return table


def test_cbs_fit_refuses_a_negative_seed(tmp_path: Path):
    out = tmp_path / "never"
    res = runner.invoke(app, ["cbs", "fit", str(_points(tmp_path)), "--seed", "-1", "--out", str(out)])
    _refused(res, "--seed", "greater than or equal to 0")
    assert not out.exists()


def test_cbs_fit_takes_seed_zero(tmp_path: Path):
    out = tmp_path / "fit"
    res = runner.invoke(app, ["cbs", "fit", str(_points(tmp_path)), "--seed", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.exists()


def test_ft_run_final_needs_a_seed(tmp_path: Path):
    out = tmp_path / "never"
    res = runner.invoke(app, ["ft", "run", str(EXAMPLES / "ft-arith.yaml"), "--final", "--seeds", " ,",
                              "--out", str(out)])
    _refused(res, "--seeds", "at least one seed")
    assert not out.exists()


# -- a missing optional extra ----------------------------------------------------------------------


def test_tune_on_ray_without_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "recipetune.execute.ray", raising=False)
    out = tmp_path / "never"
    res = runner.invoke(app, ["tune", str(EXAMPLES / "tiny-campaign.yaml"), "--executor", "ray", "--out", str(out)])
    _refused(res, "--executor", "pip install 'recipetune[ray]'")
    assert not out.exists()


def test_report_to_mlflow_without_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    folder = tmp_path / "campaign"
    res = runner.invoke(app, ["report", str(folder), "--mlflow", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    _refused(res, "--mlflow", "pip install 'recipetune[mlflow]'")
    assert not folder.exists() and not (tmp_path / "mlflow.db").exists()


def test_a_postgres_study_without_its_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # optuna wraps the driver's ModuleNotFoundError in its own ImportError: the hint is found under it
    monkeypatch.setitem(sys.modules, "psycopg", None)
    out = tmp_path / "never"
    res = runner.invoke(app, ["tune", str(EXAMPLES / "tiny-campaign.yaml"),
                              "search.storage=postgresql://u:p@127.0.0.1:9/db", "--out", str(out)])
    _refused(res, " tune: a PostgreSQL study", "needs psycopg, an optional extra: pip install 'recipetune[postgres]'")
    assert not out.exists()


@pytest.mark.parametrize("command", [["ft", "run"], ["finetune"]])
def test_the_hf_route_without_trl_is_refused_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   command: list[str]):
    monkeypatch.setitem(sys.modules, "trl", None)
    out = tmp_path / "never"
    res = runner.invoke(app, [*command, str(EXAMPLES / "ft-arith-hf.yaml"), "--out", str(out)])
    text = _refused(res, "the Hugging Face route (model.kind: hf) needs trl",
                    "pip install 'recipetune[finetune]'")
    assert "data version" not in text  # refused before the data chain ran
    assert not out.exists()


def test_an_import_failing_inside_a_command_is_the_pip_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The one place for every command (cli.py's group): transformers failing where the route imports it."""
    real = builtins.__import__

    def no_transformers(name, globals=None, locals=None, fromlist=(), level=0):
        # only recipetune's own imports fail: datasets probes for transformers and must still work
        if level == 0 and name.split(".")[0] == "transformers" and (globals or {}).get("__name__", "").startswith(
                "recipetune"):
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    out = tmp_path / "run"
    res = runner.invoke(app, ["ft", "run", str(EXAMPLES / "ft-arith-hf.yaml"), "--out", str(out)])
    _refused(res, "ft run: the Hugging Face route (model.kind: hf) needs transformers",
             "pip install 'recipetune[finetune]'")


def test_only_a_missing_package_of_an_extra_is_turned_into_a_hint():
    assert missing_extra(ModuleNotFoundError("x", name="ray")) is not None
    wrapped = ImportError("Failed to import DB access module")
    wrapped.__cause__ = ModuleNotFoundError("x", name="psycopg")
    assert "recipetune[postgres]" in (missing_extra(wrapped) or "")
    # a submodule missing from an installed package, or a module of no extra: a bug, not a hint
    assert missing_extra(ModuleNotFoundError("x", name="transformers.models.nope")) is None
    assert missing_extra(ModuleNotFoundError("x", name="no_such_module")) is None


# -- several invalid fields, per file kind -----------------------------------------------------------


def _bad_experiment(tmp_path: Path) -> Path:
    doc = yaml.safe_load((EXAMPLES / "ft-arith.yaml").read_text())
    doc["recipe"].update(lr=-1, scheduler="nope", warmup_ratio=2)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _bad_sweep(tmp_path: Path) -> Path:
    doc = yaml.safe_load((EXAMPLES / "cbs-tiny.yaml").read_text())
    doc.update(max_steps=0, timeout_s=-3, eval_scaling="bad")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("command", "make", "fields"), [
    (["data", "run"], _bad_experiment, ("recipe.lr: must be > 0", "recipe.scheduler: must be one of",
                                        "recipe.warmup_ratio")),
    (["ft", "run"], _bad_experiment, ("recipe.lr: must be > 0", "recipe.scheduler: must be one of",
                                      "recipe.warmup_ratio")),
    (["finetune"], _bad_experiment, ("recipe.lr: must be > 0", "recipe.scheduler: must be one of",
                                     "recipe.warmup_ratio")),
    (["cbs", "sweep"], _bad_sweep, ("max_steps: must be >= 1 (got 0)", "timeout_s: must be > 0 (got -3)",
                                    "eval_scaling: must be one of 'fixed', 'tokens' (got 'bad')")),
])
def test_three_bad_fields_of_each_file_kind_are_all_named(tmp_path: Path, command, make, fields):
    out = tmp_path / "never"
    res = runner.invoke(app, [*command, str(make(tmp_path)), "--out", str(out)])
    _refused(res, *fields)
    assert not out.exists()


def test_bad_fields_of_the_experiment_and_of_its_search_are_named_together(tmp_path: Path):
    doc = yaml.safe_load((EXAMPLES / "ft-arith.yaml").read_text())
    doc["recipe"]["lr"] = -1
    doc["search"].update(selection="best", budget={"trials": 0})
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "never"
    res = runner.invoke(app, ["finetune", str(path), "--out", str(out)])
    _refused(res, "recipe.lr: must be > 0", "search.selection: must be one of", "search.budget.trials: must be >= 1")
    assert not out.exists()


def test_three_bad_fields_of_a_campaign_through_tune(tmp_path: Path):
    # run and verify: tests/test_errors.py; tune reads the same file through the same function
    bad = tmp_path / "c.yaml"
    bad.write_text("baseline: {model: nano}\nsearch: {strategy: foo, budget: {trials: 0}}\nrun: {steps: -1}\n")
    out = tmp_path / "never"
    res = runner.invoke(app, ["tune", str(bad), "--out", str(out)])
    _refused(res, "search.strategy: must be one of", "search.budget.trials: must be >= 1", "run.steps: must be >= 1")
    assert not out.exists()


# -- a space that can never keep its relations ---------------------------------------------------------


NANOGPT = EXAMPLES / "nanogpt-campaign.yaml"


def test_a_knob_searched_alone_under_a_product_relation_is_refused():
    campaign = load_campaign(NANOGPT, ["search.knobs={batch_size: [1, 2, 4, 8, 16, 32]}"])
    with pytest.raises(ConfigError) as err:
        check_space(campaign)
    assert err.value.field == "search.knobs"
    assert "'batch_size * grad_accum == 32'" in str(err.value)
    assert "search batch_size together with grad_accum" in str(err.value)


def test_tune_refuses_it_before_anything_runs(tmp_path: Path):
    out = tmp_path / "never"
    res = runner.invoke(app, ["tune", str(NANOGPT), "search.knobs={batch_size: [1, 2, 4, 8, 16, 32]}",
                              "--out", str(out)])
    _refused(res, "batch_size * grad_accum == 32", "together with grad_accum")
    assert not out.exists()


@pytest.mark.parametrize("knobs", [
    "{batch_size: [1, 2, 4, 8, 16, 32], grad_accum: [1, 2, 4, 8, 16, 32]}",  # searched together
    "{poison: [none, drop]}",  # alone, but no relation holds it: every move is feasible
])
def test_a_space_with_a_feasible_move_is_accepted(knobs: str):
    space = check_space(load_campaign(NANOGPT, [f"search.knobs={knobs}"]))
    assert space.values


# -- verify's verdicts, --version --------------------------------------------------------------------


def test_verify_gives_each_verdict_its_own_exit_code():
    assert EXIT == {"APPROVED": 0, "KEEP BASELINE": 3, "REJECTED": 4}
    assert 2 not in EXIT.values() and 1 not in EXIT.values()  # bad input; no verdict


def test_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0
    assert res.output.strip() == f"recipetune {recipetune.__version__}"


# -- an empty data file (issue 36) ------------------------------------------------------------------


def _empty_file(folder: Path, kind: str) -> Path:
    """A training file of one kind that holds no rows."""
    import datasets

    columns = {"word": [], "answer": []}
    path = folder / {"save_to_disk folder": "train_ds", "empty JSON array": "train.json"}.get(
        kind, f"train.{kind.split()[0]}")
    if kind == "jsonl":
        path.write_text("")
    elif kind == "jsonl blank lines":
        path.write_text("\n  \n\n")
    elif kind == "empty JSON array":
        path.write_text("[ ]\n")
    elif kind == "csv":
        path.write_text("")
    elif kind == "csv header only":
        path.write_text("word,answer\n")
    elif kind == "parquet":
        path.write_bytes(b"")
    elif kind == "parquet of 0 rows":
        datasets.Dataset.from_dict(columns).to_parquet(str(path))
    else:
        datasets.Dataset.from_dict(columns).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "jsonl blank lines", "empty JSON array", "csv", "csv header only",
                                  "parquet", "parquet of 0 rows", "save_to_disk folder"])
def test_an_empty_data_file_of_any_kind_exits_2_naming_it(tmp_path: Path, kind: str):
    """`data run` on a task whose train file holds no rows: exit 2 naming the field and the file (it was an
    IndexError traceback for an empty .jsonl); beside it, the same kind of file with one row loads."""
    from ft_fixtures import experiment_file, reverse_task

    files = reverse_task(tmp_path)
    empty = _empty_file(tmp_path, kind)
    out = tmp_path / "never"
    path = experiment_file(tmp_path, {**files, "train": empty}, {"kind": "reference", "path": "base"}, data=[])
    res = runner.invoke(app, ["data", "run", str(path), "--out", str(out)])
    _refused(res, "task.files.train", str(empty), "holds no rows")
    assert not out.exists()


def test_a_data_file_with_one_row_is_not_empty(tmp_path: Path):
    from ft_fixtures import experiment_file, reverse_task

    files = reverse_task(tmp_path)
    one = tmp_path / "one.csv"
    one.write_text("word,answer\nkilo,olik\n")
    path = experiment_file(tmp_path, {**files, "train": one}, {"kind": "reference", "path": "base"}, data=[])
    res = runner.invoke(app, ["data", "run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "train.jsonl").read_text().count("\n") == 1
