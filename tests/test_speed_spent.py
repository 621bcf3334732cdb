"""What a speed campaign spent (speed/spent.py): every run once, by the folder it ran in."""

from __future__ import annotations

import json
from pathlib import Path

from recipetune.speed.spent import spent


def result(folder: Path, wall_s: float, out_dir: Path | None = None) -> None:
    folder.mkdir(parents=True)
    where = {"out_dir": str(out_dir)} if out_dir else {}
    (folder / "result.json").write_text(json.dumps({"wall_s": wall_s, **where}))


def test_each_run_counts_once_where_it_ran_and_the_proof_share_is_the_guards(tmp_path):
    trial = tmp_path / "trials" / "0001-abc"
    result(trial, 10.0)
    result(tmp_path / "trials" / "0002-def", 30.0)
    result(tmp_path / "baseline" / "run-0", 5.0)
    result(tmp_path / "guard-runs" / "abc-seed1", 10.0, out_dir=trial)  # the trial kept as a parity run: trained once
    result(tmp_path / "guard-runs" / "xyz-seed2", 7.0)
    result(tmp_path / "final" / "abc" / "speed" / "pair-0", 2.0)
    (tmp_path / "final" / "abc" / "parity" / "torn").mkdir(parents=True)
    (tmp_path / "final" / "abc" / "parity" / "torn" / "result.json").write_text("{")  # cut off: not counted
    cost = spent(tmp_path)
    assert {k: (p.runs, p.seconds) for k, p in cost.parts.items()} == {
        "search": (2, 40.0), "profile": (1, 5.0), "parity": (1, 7.0), "speed": (1, 2.0)}
    assert cost.share == 14 / 54
    assert cost.text().startswith("proof took 26% of the campaign's run compute: profile 1 run, ")
    assert cost.record()["proof_share"] == round(14 / 54, 4)


def test_a_campaign_that_ran_nothing_spent_nothing(tmp_path):
    cost = spent(tmp_path)
    assert cost.share == 0.0 and all(p.runs == 0 for p in cost.parts.values())
