"""The final evaluation: the one entry point that opens the test split.

It trains the experiment once per seed, scores each trained model on validation (as usual) and on
test, and writes ``final.json``: the test metric per seed, its mean and spread. Call it for the
baseline and for the chosen experiment after a search, never during one.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from recipetune.core.filenames import EXPERIMENT_REPORT
from recipetune.finetune.experiment import Experiment, class_labels, evaluate, prepare_data, train_and_validate
from recipetune.finetune.results import Evaluation, ExperimentReport, FinalResult
from recipetune.finetune.task import TEST_KEY


def _finished(run_dir: Path, experiment_id: str) -> tuple[ExperimentReport, Evaluation] | None:
    """A seed evaluated before (the same experiment): its report and test evaluation."""
    try:
        report = ExperimentReport.model_validate_json((run_dir / EXPERIMENT_REPORT).read_text())
        test = Evaluation.model_validate_json((run_dir / "test.json").read_text())
    except (OSError, ValueError):
        return None
    return (report, test) if report.id == experiment_id and report.validation is not None else None


def evaluated(exp: Experiment, seeds: list[int], out_dir: Path) -> list[int]:
    """The seeds among ``seeds`` whose test evaluation of ``exp`` is already in ``out_dir`` (reused, not run)."""
    return [s for s in seeds if _finished(out_dir / f"seed-{s}", exp.derive(recipe={"seed": s}).id) is not None]


def final_evaluation(exp: Experiment, seeds: list[int], out_dir: Path, log=lambda text: None) -> FinalResult:
    rows, version = prepare_data(exp)
    test_rows = list(exp.splits.open_test(TEST_KEY))
    values, val_values, runs, all_metrics = [], [], [], []
    for seed in seeds:
        child = exp.derive(recipe={"seed": seed})
        run_dir = out_dir / f"seed-{seed}"
        done = _finished(run_dir, child.id)
        if done is not None:  # a resumed campaign keeps the seeds already evaluated
            report, test = done
        else:
            report, route = train_and_validate(child, run_dir, rows, version, log)
            if route is None or report.validation is None:
                raise RuntimeError(f"seed {seed}: the experiment failed ({report.status}: {report.cause})")
            log(f"seed {seed}: evaluating on {len(test_rows)} test examples ...")
            test, predictions = evaluate(route, exp.spec.task, test_rows, "test", class_labels(exp.spec.task, rows))
            with (run_dir / "test_predictions.jsonl").open("w") as f:
                for p in predictions:
                    f.write(p.model_dump_json() + "\n")
            (run_dir / "test.json").write_text(test.model_dump_json(indent=2))  # last: marks the seed done
        assert report.validation is not None
        values.append(test.value)
        all_metrics.append(test.metrics)
        val_values.append(report.validation.value)
        runs.append(str(run_dir))
    result = FinalResult(
        experiment_id=exp.id, metric=exp.spec.task.metric, seeds=list(seeds), values=values,
        mean=statistics.fmean(values), std=statistics.stdev(values) if len(values) > 1 else 0.0,
        validation_values=val_values, test_metrics=all_metrics, runs=runs,
    )
    (out_dir / "final.json").write_text(result.model_dump_json(indent=2))
    return result
