"""A campaign folder -> its ``Report``: the speed job's (speed.py) or the quality job's (quality.py)."""

from __future__ import annotations

from pathlib import Path

from recipetune.report import sources as src
from recipetune.report.model import Report
from recipetune.report.quality import build_quality
from recipetune.report.sources import CampaignFiles
from recipetune.report.speed import build_speed


def build_report(files: CampaignFiles) -> Report:
    return build_quality(files) if files.job == src.QUALITY else build_speed(files)


def load_report(folder: Path) -> Report:
    """Read a campaign folder into a Report (raises sources.NotACampaign)."""
    return build_report(src.read_campaign(folder))
