"""`recipetune verify`: bad input exits 2 with nothing written, a static rejection 4; an A/A comparison is
never approved (KEEP BASELINE, 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recipetune.cli import app

runner = CliRunner()
RECIPE = {"model": "nano", "seq_len": 64, "global_batch_size": 16, "micro_batch_size": 4, "warmup_steps": 5,
          "num_threads": 1, "eval_batches": 1}
GUARD = {"parity": {"steps": 12, "seeds": 1, "window": 5}, "speed": {"pairs": 3, "steps": 6}, "timeout_s": 600}


def write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def files(tmp_path):
    base = write(tmp_path / "base.yaml", {"baseline": RECIPE, "guard": GUARD})
    cand = write(tmp_path / "cand.yaml", {"baseline": {**RECIPE, "micro_batch_size": 16}})
    return base, cand


def test_mismatched_workloads_exit_2(tmp_path, files):
    base, _ = files
    other = write(tmp_path / "cmd.yaml", {"workload": {"kind": "command", "argv": ["python", "train.py"]}})
    res = runner.invoke(app, ["verify", str(base), str(other), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "another workload" in res.output and "kind" in res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("override", "expected", "code"), [
    # a knob edits the candidate: one the static checks refuse is REJECTED (4) before anything runs
    ("seed=5", "seed", 4),
    ("lr=0.1", "allow_semantic", 4),
    ("bogus=1", "valid knobs are", 2),
    ("guard.speed.pairs=1", "guard.speed.pairs", 2),  # a section field edits the settings (the baseline file)
    # an edit that leaves a knob's domain or breaks a relation is the candidate's: refused as such (4),
    # named as the candidate's, not as the file's "baseline:" section
    ("micro_batch_size=0", "micro_batch_size", 4),
    ("micro_batch_size=3", "micro_batch_size", 4),
])
def test_bad_input_exits_2_a_static_rejection_4_and_nothing_is_written(tmp_path, files, override, expected, code):
    base, cand = files
    res = runner.invoke(app, ["verify", str(base), str(cand), override, "--out", str(tmp_path / "out")])
    assert res.exit_code == code, res.output
    assert expected in res.output
    assert code != 4 or ("candidate breaks" in res.output and f"with {override}" in res.output)
    assert not (tmp_path / "out").exists()


def test_static_rejection_as_json(tmp_path, files):
    base, cand = files
    res = runner.invoke(app, ["verify", str(base), str(cand), "seq_len=128", "--json"])
    assert res.exit_code == 4  # REJECTED, distinct from bad input (2) and KEEP BASELINE (3)
    doc = json.loads(res.stdout)
    assert doc["decision"] == "REJECTED" and doc["violations"][0]["knob"] == "seq_len"


def test_aa_candidate_is_never_approved(tmp_path, files):
    base, _ = files
    out = tmp_path / "out"
    res = runner.invoke(app, ["verify", str(base), str(base), "--out", str(out), "--json"])
    assert res.exit_code == 3, res.output  # KEEP BASELINE: a CI job gating on 0 does not ship it
    doc = json.loads(res.stdout)
    assert doc["decision"] == "KEEP BASELINE", doc["reasons"]
    assert doc["parity"]["passed"] and doc["parity"]["gap"] == 0.0  # same seed, same recipe: same curve
    assert len(doc["pairs"]) == 3 and doc["ci_low"] <= 1 + doc["noise_margin"]
    assert json.loads((out / "verdict.json").read_text())["decision"] == "KEEP BASELINE"
    for run_dir in ("baseline/seed-0", "parity/seed-0", "speed/pair-1/baseline", "speed/pair-3/candidate"):
        assert (out / run_dir / "result.json").exists(), run_dir
