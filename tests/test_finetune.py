"""Fine-tuning experiments on the reference route: metrics, the closed test split, `ft run` end to end,
the final evaluation, and bad input (exit 2, a message naming file and field, nothing written)."""

from __future__ import annotations

import json
import re

import pytest
from ft_fixtures import experiment_file, write_jsonl
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.core.errors import ConfigError
from recipetune.finetune import metrics as M
from recipetune.finetune.experiment import load_experiment
from recipetune.finetune.task import TestSplitClosed

runner = CliRunner()


def test_metrics_and_error_kinds():
    assert M.score("exact_match", ["12", " 7 "], ["12", "8"]) == 0.5
    assert M.score("macro_f1", ["a", "a", "b", "b"], ["a", "b", "b", "b"]) == pytest.approx((2 / 3 + 0.8) / 2)
    assert M.score("rouge_l", ["get item"], ["get_item"]) == 1.0
    assert 0 < M.score("rouge_l", ["get value"], ["get_item"]) < 1
    pat = re.compile(r"-?\d+")
    assert M.error_kind("12", "12", False, pat, None) is None
    assert M.error_kind("", "12", False, pat, None) == "empty"
    assert M.error_kind("1111", "12", True, pat, None) == "truncated"
    assert M.error_kind("x2", "12", False, pat, None) == "wrong_format"
    assert M.error_kind("13", "12", False, pat, None) == "near_miss"
    assert M.error_kind("9876", "12", False, pat, None) == "wrong_number"
    assert M.error_kind("json", "re", False, None, {"re", "os", "json"}) == "wrong_label"
    assert M.error_kind("zzz", "re", False, None, {"re", "os", "json"}) == "wrong_format"


def test_the_test_split_is_closed(tiny_ft):
    tmp_path, files, model = tiny_ft
    exp = load_experiment(experiment_file(tmp_path, files, model))
    with pytest.raises(TestSplitClosed):
        exp.splits.test  # noqa: B018
    with pytest.raises(TestSplitClosed):
        exp.splits.open_test(object())
    assert len(exp.splits.train) == 40 and len(exp.splits.validation) == 4


def test_ft_run_end_to_end_and_final_evaluation(tiny_ft):
    tmp_path, files, model = tiny_ft
    out = tmp_path / "run"
    res = runner.invoke(app, ["ft", "run", str(experiment_file(tmp_path, files, model)), "lr=2e-3",
                              "--out", str(out), "--final", "--seeds", "0,1"])
    assert res.exit_code == 0, res.output
    for label in ("validation exact_match", "train loss", "peak memory", "worst validation cases", "dedup_exact",
                  "test exact_match"):
        assert label in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "ok" and report["validation"]["split"] == "validation"
    assert report["validation"]["n_examples"] == 4 and report["loss"]["steps"] == 3
    assert report["experiment"]["recipe"]["lr"] == 2e-3
    assert report["data"]["operators"][-1]["op"] == "decontaminate"
    assert {e["kind"] for e in report["validation"]["errors"]} <= set(M.ERROR_KINDS)
    preds = (out / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == 4
    for name in ("recipe.json", "data_version.json", "train_log.jsonl"):
        assert (out / name).is_file()
    # nothing of the test split reached the experiment's own files: its words appear nowhere
    test_words = [json.loads(line)["word"] for line in files["test"].read_text().splitlines()]
    blob = " ".join(p.read_text() for p in out.iterdir() if p.is_file())
    assert not any(w in blob for w in test_words)
    # the final evaluation is the one place that scores test, over the seeds asked for
    result = json.loads((out / "final" / "final.json").read_text())
    assert result["seeds"] == [0, 1] and len(result["values"]) == 2 and len(result["validation_values"]) == 2
    assert len((out / "final" / "seed-1" / "test_predictions.jsonl").read_text().splitlines()) == 4


def test_lora_on_the_reference_model(tiny_ft):
    tmp_path, files, model = tiny_ft
    from recipetune.finetune.experiment import run_experiment

    exp = load_experiment(experiment_file(tmp_path, files, model), ["method=lora", "lora_rank=2", "packing=true"])
    report = run_experiment(exp, tmp_path / "lora")
    assert report.status == "ok"
    assert 0 < report.params["trainable"] < report.params["total"] / 10
    with pytest.raises(ConfigError) as e:
        run_experiment(load_experiment(experiment_file(tmp_path, files, model),
                                       ["method=lora", "lora_targets=nothing_here"]), tmp_path / "never")
    assert e.value.field == "recipe.lora_targets" and not (tmp_path / "never").exists()


def test_derive_changes_recipe_or_chain_only(tiny_ft):
    tmp_path, files, model = tiny_ft
    exp = load_experiment(experiment_file(tmp_path, files, model))
    child = exp.derive(recipe={"lr": 5e-4}, data=[{"op": "sample", "n": 10}])
    assert child.spec.recipe.lr == 5e-4 and child.id != exp.id and child.spec.task == exp.spec.task
    with pytest.raises(ConfigError) as e:
        exp.derive(recipe={"lr": -1})
    assert e.value.field == "recipe.lr"


def _bad_cases(tmp_path, files, model):
    same = dict(files, test=files["validation"])
    overlap = dict(files, test=write_jsonl(tmp_path / "t2.jsonl", [{"word": "alpha", "answer": "ahpla"}]))
    notmodel = tmp_path / "not_a_model"
    notmodel.mkdir()
    return {
        "overlapping splits": (dict(files=same), "task.files.validation"),
        "validation/test overlap": (dict(files=overlap), "task.files.validation"),
        "missing field": (dict(target="nope"), "task.target"),
        "unknown metric": (dict(metric="bleu"), "task.metric"),
        "unknown operator": (dict(data=[{"op": "shuffle_words"}]), "data.0"),
        "empty chain": (dict(data=[{"op": "filter_length", "min_chars": 999}]), "data.0.op"),
        "hf folder not a model": (dict(model={"kind": "hf", "path": str(notmodel)}), "model.path"),
        "reference file not a checkpoint": (dict(model={"kind": "reference", "path": str(files["train"])}),
                                            "model.path"),
        "bad knob": (dict(recipe={"batch_size": 0}), "recipe.batch_size"),
    }


def test_bad_input_exits_2_names_file_and_field_and_writes_nothing(tiny_ft):
    tmp_path, files, model = tiny_ft
    for name, (change, field) in _bad_cases(tmp_path, files, model).items():
        task_change = {k: v for k, v in change.items() if k in ("files", "target", "metric")}
        sections = {k: v for k, v in change.items() if k not in task_change}
        path = experiment_file(tmp_path, task_change.pop("files", files), sections.pop("model", model), **sections)
        if task_change:
            import yaml

            spec = yaml.safe_load(path.read_text())
            spec["task"].update(task_change)
            path.write_text(yaml.safe_dump(spec))
        for cmd in ("ft", "data"):
            out = tmp_path / f"never-{cmd}"
            res = runner.invoke(app, [cmd, "run", str(path), "--out", str(out)])
            assert res.exit_code == 2, (name, res.output)
            text = " ".join(res.output.split())
            assert str(path) in text.replace(" ", "") or "exp.yaml" in text, (name, res.output)
            assert field in text, (name, field, res.output)
            assert not out.exists() and "Traceback" not in res.output, name


def test_data_run_prints_the_chain_and_writes_the_version(tiny_ft):
    tmp_path, files, model = tiny_ft
    chain = [{"op": "dedup_exact", "fields": ["word"]}, {"op": "augment", "rules": ["uppercase"]},
             {"op": "export", "path": "augmented.jsonl"}]
    out = tmp_path / "data"
    res = runner.invoke(app, ["data", "run", str(experiment_file(tmp_path, files, model, data=chain)),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "dedup_exact" in res.output and "decontaminate" in res.output and "always" in res.output
    version = json.loads((out / "data_version.json").read_text())
    assert version["operators"][2]["implicit"]
    assert [s["op"] for s in version["operators"]] == ["dedup_exact", "augment", "decontaminate", "export"]
    assert version["operators"][0]["rows_out"] == 18 and version["rows_out"] == 36
    assert len((out / "train.jsonl").read_text().splitlines()) == 36
    assert len((out / "augmented.jsonl").read_text().splitlines()) == 36


def test_module_entry_point_runs_a_child_experiment(tiny_ft):
    from recipetune.finetune.__main__ import main

    tmp_path, files, model = tiny_ft
    path = experiment_file(tmp_path, files, model)
    child = tmp_path / "child.json"
    child.write_text(json.dumps({"recipe": {"lr": 5e-4, "max_steps": 2}, "data": [{"op": "sample", "n": 12}]}))
    assert main([str(path), "--out", str(tmp_path / "child"), "--child", str(child)]) == 0
    report = json.loads((tmp_path / "child" / "report.json").read_text())
    assert report["experiment"]["recipe"]["lr"] == 5e-4 and report["data"]["operators"][0]["rows_out"] == 12
    child.write_text(json.dumps({"recipe": {"method": "qlora"}}))
    assert main([str(path), "--out", str(tmp_path / "never"), "--child", str(child)]) == 2
    assert not (tmp_path / "never").exists()
