"""Export of a campaign to MLflow (SQLite tracking): runs, parameters, step metrics, artifacts, idempotence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipetune.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from make_campaign import make_campaign  # noqa: E402

runner = CliRunner()


def test_without_mlflow_the_option_is_refused_with_exit_2(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    res = runner.invoke(app, ["report", str(tmp_path), "--mlflow", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert res.exit_code == 2 and "recipetune[mlflow]" in res.output  # said before anything else is read
    assert not list(tmp_path.iterdir())


def test_every_trial_becomes_an_mlflow_run(tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from recipetune.report.mlflow_export import export

    folder = make_campaign(tmp_path / "c", "crashed")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = runner.invoke(app, ["report", str(folder), "--mlflow", uri])
    assert res.exit_code == 0, res.output
    assert "exported 7 trials" in res.output  # failed and interrupted ones too: they are part of the audit
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("recipetune/c")
    runs = {r.data.tags["recipetune.key"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"campaign", "baseline-0", "baseline-1", "baseline-2"} | {f"trial-{i}" for i in range(7)}
    campaign = runs["campaign"]
    assert campaign.data.tags["decision"] == "KEEP BASELINE"
    # the verdict's own figure, exported as it is (its value moves with the synthetic runs' noise)
    from recipetune.report import sources as src
    from recipetune.report.build import build_report

    evidence = build_report(src.read_campaign(folder)).evidence
    assert campaign.data.metrics["speedup"] == pytest.approx(evidence.speedup) and 1.0 < evidence.speedup < 1.1
    oom = runs["trial-1"]
    assert oom.info.status == "FAILED" and oom.data.tags["run_status"] == "oom"
    assert oom.data.tags["mlflow.parentRunId"] == campaign.info.run_id
    ok = runs["trial-0"]
    assert ok.info.status == "FINISHED" and ok.data.params["micro_batch_size"] == "8"
    assert "<script>" in ok.data.tags["rationale"]  # stored as written; MLflow's UI escapes it
    assert ok.data.metrics["speedup"] == pytest.approx(1.03, abs=0.015)
    history = client.get_metric_history(ok.info.run_id, "step/loss")
    assert sorted(m.step for m in history) == list(range(30))
    assert runs["trial-5"].info.status == "KILLED"
    artifacts = {a.path for a in client.list_artifacts(ok.info.run_id)}
    assert {"result.json", "metrics.jsonl"} <= artifacts
    assert (tmp_path / "mlartifacts" / "c").is_dir()  # beside the database, not in the working directory
    assert export(folder, uri) == 0  # again: nothing new, no duplicates
    assert len(client.search_runs([exp.experiment_id])) == len(runs)


def test_tune_logs_each_trial_to_mlflow_as_it_lands(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_search_campaign import install_fakes_for, write_campaign_file

    from recipetune.report import mlflow_live

    install_fakes_for(monkeypatch)
    seen: list[int] = []  # trials in MLflow each time the live view exported
    real_export = mlflow_live.export

    def counting_export(folder, uri, experiment=None):  # type: ignore[no-untyped-def]
        n = real_export(folder, uri, experiment)
        client = mlflow.MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(f"recipetune/{Path(folder).resolve().name}")
        seen.append(len(client.search_runs([exp.experiment_id], "tags.role = 'trial'")) if exp else 0)
        return n

    monkeypatch.setattr(mlflow_live, "export", counting_export)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path)), "--budget", "3", "--out", str(out),
                                   "--mlflow", uri])
    assert res.exit_code == 0, res.output
    assert len(seen) >= 4 and seen == sorted(seen) and seen[0] < seen[-1]  # one export per landed trial, growing


def test_tune_with_mlflow_but_without_the_extra_is_refused_before_anything_runs(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_search_campaign import install_fakes_for, write_campaign_file

    install_fakes_for(monkeypatch)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path)), "--out", str(out),
                                   "--mlflow", "sqlite:///x.db"])
    assert res.exit_code == 2 and "pip install 'recipetune[mlflow]'" in res.output and not out.exists()
