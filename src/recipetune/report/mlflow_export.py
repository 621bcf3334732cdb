"""Export a campaign to MLflow, for teams that already track runs there (optional: the mlflow extra).

One experiment per campaign folder; a parent run holds the decision and its evidence, with one
nested run per trial (and per baseline repeat): the recipe as parameters, the figures as metrics,
every step's loss and timings as metric history, the run's files as artifacts. Exporting again
adds only the trials not exported yet, so a resumed campaign can be exported as it goes.

    recipetune report campaigns/tiny --mlflow sqlite:///mlflow.db
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recipetune.core.filenames import BASELINE_REPORT, CAMPAIGN, EXPERIMENT_REPORT, FINALISTS, PROFILE, RESULT, VERDICT
from recipetune.core.measure import RunResult
from recipetune.engine.status import Status
from recipetune.report import sources as src
from recipetune.report.build import build_report
from recipetune.report.model import Report, Trial

BATCH = 1000  # MLflow's limit of metrics per log_batch call
STATE = {Status.PASSED: "FINISHED", Status.REJECTED: "FINISHED", Status.FAILED: "FAILED", Status.PRUNED: "KILLED",
         Status.INTERRUPTED: "KILLED"}
STEP_METRICS = ("loss", "step_time_s", "grad_norm", "lr", "data_s", "compute_s", "optim_s", "peak_mem_bytes")


class MlflowUnavailable(RuntimeError):
    """mlflow is not installed."""


def _chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _artifact_location(tracking_uri: str, folder: Path) -> str | None:
    # With a SQLite tracking URI, MLflow would put artifacts under ./mlruns of wherever it runs: keep them by the db.
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///")).resolve()
        return (db.parent / "mlartifacts" / folder.resolve().name).as_uri()
    return None


class _Exporter:
    def __init__(self, client: Any, experiment_id: str, campaign: str):
        from mlflow.entities import Metric, Param, RunTag

        self.client, self.experiment_id, self.campaign = client, experiment_id, campaign
        self.Metric, self.Param, self.RunTag = Metric, Param, RunTag

    def run(self, name: str, tags: dict[str, str], params: dict[str, Any], metrics: dict[str, float | None],
            result: RunResult | None, files: list[Path], state: str, parent: str | None = None) -> str:
        all_tags = {"recipetune.campaign": self.campaign, **tags}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name[:250])
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        batch = [self.Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None]
        for s in result.steps if result is not None else []:
            values = {k: getattr(s, k) for k in STEP_METRICS}
            if s.step_time_s > 0:
                values["tokens_per_s"] = s.tokens / s.step_time_s
            batch += [self.Metric(f"step/{k}", float(v), now, s.step) for k, v in values.items() if v is not None]
        plist = [self.Param(k, str(v)[:6000]) for k, v in params.items()]
        for i, chunk in enumerate(_chunks(batch, BATCH) if batch else iter([[]])):
            self.client.log_batch(run_id, metrics=chunk, params=plist if i == 0 else [])
        for path in files:
            if path.is_file():
                self.client.log_artifact(run_id, str(path))
        self.client.set_terminated(run_id, status=state)
        return run_id

    def exported(self) -> dict[str, str]:
        """Runs of this campaign already exported: their recipetune.key tag -> run id."""
        out = {}
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.`recipetune.campaign` = '{self.campaign}'",
                                           page_token=token)
            out.update({r.data.tags.get("recipetune.key", ""): r.info.run_id for r in page})
            token = page.token
            if not token:
                return out


def require_mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise MlflowUnavailable("--mlflow needs MLflow: pip install 'recipetune[mlflow]'") from None
    return mlflow


def _campaign_figures(report: Report) -> dict[str, Any]:
    """The campaign run's figures: the verdict's evidence, the quality job's test split, the baseline's."""
    ev = report.evidence
    figures = {"speedup": ev.speedup, "ci_low": ev.ci_low, "ci_high": ev.ci_high, "noise_margin": ev.noise_margin,
               "loss_gap": ev.loss_gap, "loss_tolerance": ev.loss_tolerance} if ev else {}
    figures["baseline_tokens_per_s"] = report.baseline.tokens_per_s
    q = report.comparison  # the quality job's test split; its figures, where the speed job has none
    figures |= {"test_baseline": q.baseline_mean, "test_candidate": q.candidate_mean, "test_gain": q.gain,
                "test_ci_low": q.ci_low, "test_ci_high": q.ci_high} if q else {}
    figures["baseline_validation"] = report.baseline.value
    return figures


def _export_baselines(ex: _Exporter, files: src.CampaignFiles, done: dict[str, str], parent: str) -> None:
    """One child run per baseline profile run not exported yet."""
    for i, run in enumerate(files.profile_runs):
        key = f"baseline-{i}"
        if key not in done:
            s = run.summary() if run.steps else None
            ex.run(f"baseline run {i + 1}", {"recipetune.key": key, "role": "baseline"}, run.recipe,
                   {"tokens_per_s": s.tokens_per_s_per_device if s else None, "mfu": s.mfu if s else None},
                   run, [], "FINISHED" if run.ok else "FAILED", parent)


def _export_trial(ex: _Exporter, folder: Path, files: src.CampaignFiles, t: Trial, parent: str) -> None:
    """One child run for a finished trial: its verdict as tags, its figures as metrics, its files as artifacts."""
    key = f"trial-{t.number}"
    rec = next(r for r in files.records if r.number == t.number)
    tags = {"recipetune.key": key, "role": "trial", "trial": str(t.number), "status": t.status,
            "cause": t.cause[:5000], "run_status": t.run_status or "", "recipe_id": t.recipe_id,
            "parent_recipe": t.parent or "", "proposer": t.proposer, "rationale": t.rationale[:5000],
            "change": t.change[:5000], "final": t.final or "", "winner": str(t.winner).lower()}
    figures = {"tokens_per_s": t.tokens_per_s, "speedup": t.speedup, "reward": t.reward, "mfu": t.mfu,
               "peak_mem_bytes": t.peak_mem_bytes, "step_time_s": t.step_time_s, "validation": t.value,
               "gain": t.gain, "time_s": t.time_s}
    run_dir = src.trial_dir(folder, rec)
    names = (RESULT, "metrics.jsonl", "recipe.json", "error.txt", EXPERIMENT_REPORT, "predictions.jsonl")
    paths = [run_dir / n for n in names] if run_dir else []
    ex.run(f"#{t.number} {t.change}", tags, rec.attrs.get(src.A_RECIPE) or {}, figures,
           files.results.get(t.number), paths, STATE[t.status], parent)


def export(folder: Path, tracking_uri: str, experiment: str | None = None) -> int:
    """Export the campaign in ``folder``; returns the number of trial runs newly exported."""
    mlflow = require_mlflow()
    files = src.read_campaign(folder)
    report = build_report(files)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    name = experiment or f"recipetune/{folder.resolve().name}"
    found = client.get_experiment_by_name(name)
    exp_id = found.experiment_id if found else client.create_experiment(name, _artifact_location(tracking_uri,
                                                                                                  folder))
    ex = _Exporter(client, exp_id, str(folder.resolve()))
    done = ex.exported()

    parent = done.get("campaign")
    if parent is None:
        parent = ex.run(f"campaign {folder.resolve().name}: {report.decision}",
                        {"recipetune.key": "campaign", "decision": report.decision, "headline": report.headline[:5000]},
                        {"baseline." + k: v for k, v in report.baseline.recipe.items()}, _campaign_figures(report),
                        None, [folder / n for n in (VERDICT, FINALISTS, PROFILE, CAMPAIGN,
                                                    BASELINE_REPORT)], "FINISHED")
    _export_baselines(ex, files, done, parent)
    new = 0
    for t in report.trials:
        if f"trial-{t.number}" in done or t.status not in STATE:
            continue  # exported already, or still running
        _export_trial(ex, folder, files, t, parent)
        new += 1
    return new
