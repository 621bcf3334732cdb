"""`recipetune report` and `recipetune show` on quality campaigns (`recipetune finetune`): the figures that
job decides on (validation metric, gain, diagnosis, the test split over seeds), none of the speed job's."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from ft_fixtures import experiment_file, nano_checkpoint, reverse_task
from rich.console import Console
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.report.build import load_report
from recipetune.report.plots import all_plots
from recipetune.report.terminal import render as render_terminal

runner = CliRunner()
SPEED_ONLY = ("tok/s", "tokens/s", "speed-up", "MFU", "noise margin", "loss parity")


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    """A real tiny quality campaign (two experiments on the nano model): nothing beats the baseline."""
    tmp = tmp_path_factory.mktemp("quality")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECIPETUNE_CACHE", str(tmp / "cache"))
        files = reverse_task(tmp)
        model = {"kind": "reference", "path": str(nano_checkpoint(tmp / "nano.pt"))}
        exp = experiment_file(tmp, files, model, search={"knobs": {"lr": [0.001, 0.003]}, "seeds": [1, 2]})
        res = runner.invoke(app, ["finetune", str(exp), "--out", str(tmp / "kept"), "--budget", "2"])
    assert res.exit_code == 0, res.output
    return tmp / "kept"


@pytest.fixture(scope="module")
def approved(kept: Path) -> Path:
    """The same campaign with the verdict decide.py writes when a candidate wins on the test split."""
    folder = kept.parent / "approved"
    shutil.copytree(kept, folder)
    verdict = json.loads((folder / "verdict.json").read_text())
    trial = load_report(kept).trials[0]
    test = {"decision": "APPROVED", "reasons": ["test exact_match gain +0.062 with its 95% CI above zero"],
            "metric": "exact_match", "seeds": [1, 2, 3], "baseline": [0.66, 0.68, 0.70],
            "candidate": [0.73, 0.74, 0.756], "baseline_mean": 0.68, "candidate_mean": 0.742, "gain": 0.062,
            "ci_low": 0.021, "ci_high": 0.103, "confidence": 0.95, "normalised_gain": 0.19,
            "validation_baseline": 0.5, "validation_candidate": 0.75}
    verdict.update(decision="APPROVED", reasons=test["reasons"], recipe_id=trial.recipe_id, trial=trial.number,
                   change=trial.change, verdict=test, approved_file=str(folder / "approved.yaml"),
                   launch=[f"recipetune ft run {folder / 'approved.yaml'}"])
    (folder / "verdict.json").write_text(json.dumps(verdict))
    return folder


def shown(folder: Path) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(render_terminal(load_report(folder), 200))
    return console.export_text()


def test_model_of_a_kept_baseline(kept):
    r = load_report(kept)
    assert r.job == "quality" and r.metric == "exact_match" and r.decision == "KEEP BASELINE"
    assert r.headline.startswith("KEEP BASELINE: no experiment beat the baseline's validation exact_match")
    assert r.comparison is None and r.evidence is None and r.winner is None
    assert r.baseline.metric == "exact_match" and r.baseline.value is not None
    assert r.baseline.data_version and r.baseline.rows == 40
    t = r.trials[0]
    assert t.change == "lr=0.003" and t.status == "passed" and t.run_status == "ok"
    assert t.value is not None and t.gain is not None and t.diagnosis and t.data_version and t.rows == 40
    assert t.tokens_per_s is None and t.speedup is None
    assert r.commands["baseline"][0].startswith("recipetune ft run ")
    assert set(all_plots(r)) == {"validation", "tree"}  # no test runs: no per-seed plot; nothing of throughput


def test_show_and_report_of_a_kept_baseline(kept):
    text = shown(kept)
    for col in ("change", "status", "val exact_match", "gain", "diagnosis / cause"):
        assert col in text
    assert "KEEP BASELINE" in text and "lr=0.003" in text and "validation exact_match" in text
    assert not [w for w in SPEED_ONLY if w in text]
    res = runner.invoke(app, ["report", str(kept)])
    assert res.exit_code == 0, res.output
    page = (kept / "report.html").read_text()
    assert "val exact_match" in page and "diagnosis / cause" in page and "No experiment went to the test split" in page
    assert not [w for w in SPEED_ONLY if w in page]
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 2
    data = json.loads((kept / "report.json").read_text())
    assert data["job"] == "quality" and data["trials"][0]["diagnosis"]


def test_approved_shows_the_test_comparison(approved):
    r = load_report(approved)
    assert r.decision == "APPROVED" and r.winner is not None and r.winner.change == "lr=0.003"
    assert r.headline == ("APPROVED: lr=0.003: test exact_match 0.742 vs 0.680 (gain +0.062, 95% CI [+0.02, +0.10]) "
                          "over seeds [1, 2, 3]")
    assert r.comparison is not None and r.comparison.trial == r.winner.number
    assert set(all_plots(r)) == {"seeds", "validation", "tree"}
    text = shown(approved)
    assert "test exact_match: candidate 0.7420 vs baseline 0.6800, gain +0.0620" in text
    assert "seed 3: 0.700 -> 0.756" in text and "★ approved" in text
    assert "approved: recipetune ft run" in text
    assert not [w for w in SPEED_ONLY if w in text]
    res = runner.invoke(app, ["report", str(approved)])
    assert res.exit_code == 0, res.output
    page = (approved / "report.html").read_text()
    assert "test exact_match" in page and "above zero" in page and 'class="winner"' in page
    assert "+0.0560" in page  # seed 3's paired difference in the per-seed table
    assert not [w for w in SPEED_ONLY if w in page]
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 3


def test_mlflow_exports_the_quality_figures(approved, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = runner.invoke(app, ["report", str(approved), "--out", str(tmp_path / "r.html"), "--mlflow", uri])
    assert res.exit_code == 0, res.output
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("recipetune/approved").experiment_id])
    by_key = {r.data.tags["recipetune.key"]: r.data.metrics for r in runs}
    assert by_key["campaign"]["test_gain"] == pytest.approx(0.062)
    assert "validation" in by_key["trial-0"] and "gain" in by_key["trial-0"]
