"""MLflow while a campaign runs: each trial is exported as it lands (``tune --mlflow URI``,
``finetune --mlflow URI``), through the same exporter as ``report --mlflow``, which adds only the
trials not exported yet; the decision goes in when the campaign ends. An export that fails is said
once and the campaign goes on: MLflow is a view of the study, never a part of it."""

from __future__ import annotations

import sys
from pathlib import Path

from recipetune.engine.job import Reporter, Row
from recipetune.engine.status import FINISHED
from recipetune.report.mlflow_export import export, require_mlflow


class MlflowLive(Reporter):
    def __init__(self, folder: Path, tracking_uri: str):
        require_mlflow()  # refused before anything runs (MlflowUnavailable) when the extra is missing
        self.folder, self.uri = folder, tracking_uri
        self.exported = 0
        self.failed = ""

    def _export(self) -> None:
        if self.failed:
            return
        try:
            self.exported += export(self.folder, self.uri)
        except Exception as e:  # the campaign goes on; the study still holds everything
            self.failed = f"{type(e).__name__}: {e}"
            print(f"warning: MLflow export to {self.uri} failed, not tried again in this session ({self.failed}); "
                  f"`recipetune report {self.folder} --mlflow {self.uri}` exports it later", file=sys.stderr)

    def row(self, row: Row) -> None:
        if row.number is not None and row.status in FINISHED:
            self._export()

    def close(self) -> None:
        self._export()  # the decision, and any trial the last export missed
