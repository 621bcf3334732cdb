"""A short real campaign: the reference trainer (nano model), the real guard, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.config import load_campaign
from recipetune.engine.store import CampaignStore

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = ["model=nano", "seq_len=32", "eval_batches=1", "num_threads=1", "search.steps_per_trial=6",
         "guard.parity.steps=6", "guard.parity.seeds=2", "guard.speed.pairs=2", "guard.speed.steps=4",
         "search.finalists=1", "search.knobs.num_threads=[1, 2]"]


@pytest.mark.slow
def test_tiny_campaign_smoke(tmp_path):
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(EXAMPLES / "tiny-campaign.yaml"), *SMALL, "--budget", "3",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    recs = [r for r in CampaignStore(out).records() if r.status in ("passed", "rejected", "failed", "pruned")]
    assert len(recs) == 3 and len({r.attrs["recipe_id"] for r in recs}) == 3
    assert all(r.attrs["proposer"] == "analyst" for r in recs)
    # From micro-batches of 1 with memory to spare, the analyst's first idea is to stop accumulating.
    assert recs[0].attrs["edits"] == {"micro_batch_size": 16}
    assert recs[0].attrs["rationale"].startswith("no-accumulation [accum_steps=16")
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["decision"] in ("APPROVED", "KEEP BASELINE")
    assert verdict["decision"] in " ".join(res.output.split())
    if verdict["decision"] == "APPROVED":
        approved = load_campaign(out / "approved.yaml")
        assert approved.baseline.id == verdict["recipe_id"]
        assert yaml.safe_load((out / "approved.yaml").read_text())["workload"] == {"kind": "reference"}
