"""What `recipetune watch` reads as its baseline (speed/watch_read.py): copies count once, the profile's law is typed.

Copies: baseline runs whose training loss is identical to another's, or equal up to float noise, at whatever
seed they were given (a seed knob the trainer does not read gives them), are one sample: kept as curves they
would read as a spread of levels of 0 and a block noise of 0 (guard/drift.py measures it on the differences
of consecutive curves). The law: the offset's sd is Student's t on seeds - 1 where the profile measured it on
seeds, with ``guard.parity.margin`` set too (the margin states T; it does not make 3 seeds' spread known), and
a profile written before the kind was typed (its words) reads the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_watch import TRAINER, campaign, train, watch

from recipetune.config import load_campaign
from recipetune.guard import drift
from recipetune.guard.baseline import build_profile, seeds_for, with_seed
from recipetune.speed.watch_read import stored_baseline


def float_noise_copy(src: Path, out: Path, size: float = 1e-6) -> Path:
    """``src``'s metrics with every loss moved by ``size`` x a normal draw: a GPU's nondeterministic kernels."""
    out.mkdir()
    rng = np.random.default_rng(3)
    lines = [json.loads(x) for x in (src / "metrics.jsonl").read_text().splitlines()]
    for x in lines:
        if "loss" in x:
            x["loss"] += size * rng.standard_normal()
    (out / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def test_block_noise_on_copies_reads_zero_so_copies_are_left_out_before_the_design():
    x = np.asarray(train_curve(), dtype=float)
    tau = drift.curve_tau([x])
    assert drift.block_scatter([x, x, x], 20, tau) == 0.0 < drift.block_scatter([x], 20, tau)


def test_the_logging_interval_is_the_smallest_step_between_the_first_points():
    assert drift.logging_interval(np.array([10, 20, 25, 35])) == 5 and drift.logging_interval(np.array([7])) == 1


def train_curve() -> list[float]:
    rng = np.random.default_rng(1)
    t = np.arange(1, 801)
    return list(2 + 3 / np.sqrt(t) + rng.normal(0, 0.03, len(t)))


def test_baseline_copies_at_other_seeds_count_once(tmp_path: Path) -> None:
    file = campaign(tmp_path)
    base = [train(tmp_path / f"base-{s}", seed=s) for s in range(3)]
    copy = train(tmp_path / "copy", seed=0)  # base-0 again: what a deaf seed knob gives at "seed 1"
    noisy = float_noise_copy(base[0], tmp_path / "noisy")
    run = train(tmp_path / "run", seed=9)
    plain = watch(file, run, *[a for b in base for a in ("--baseline", str(b))])
    code, found, out = watch(file, run, *[a for b in (base[0], copy, noisy, base[1], base[2])
                                          for a in ("--baseline", str(b))])
    assert code == plain[0] == 0, out
    assert found["baseline"] == [str(b) for b in base]
    assert [x.split(":")[0] for x in found["baseline_left_out"]] == [str(copy), str(noisy)]
    assert "identical to" in found["baseline_left_out"][0] and "float noise" in found["baseline_left_out"][1]
    assert all(f"baseline {x}" in out for x in found["baseline_left_out"])
    keys = ("h", "blocks", "block_points", "alarm_gap_nats", "block_noise_nats")
    assert {k: found["design"][k] for k in keys} == {k: plain[1]["design"][k] for k in keys}  # the same design
    # copies alone, and no profile to measure a spread: one sample, bad input (not a spread of 0)
    (run.parent / f"finding-{run.name}.json").unlink()
    code, found, out = watch(file, run, "--baseline", str(base[0]), "--baseline", str(copy), "--baseline", str(noisy),
                             "--folder", str(tmp_path / "none"))
    assert code == 2 and found is None and "are one sample" in out and str(copy) in out, out


DEAF = """workload:
  kind: command
  argv: ["{{python}}", "{trainer}", "--steps", "{{steps}}", "--out", "{{out_dir}}"]
  env: {{TRAINER_SEED: "{{seed}}"}}
  knobs:
    seed: {{default: 0, means: seed}}
  metrics: {{jsonl: "{{out_dir}}/metrics.jsonl"}}
baseline: {{seed: 0}}
guard:
  parity: {{steps: 100{parity}}}
"""


def profiled(tmp_path: Path, file: Path, steps: int = 400) -> tuple[Path, object]:
    c = load_campaign(file)
    seeds = seeds_for(c.workload, c.baseline, 3)
    runs = [c.workload.run(with_seed(c.baseline, s), steps, tmp_path / f"p{s}") for s in seeds]
    profile = build_profile(c.workload, c.baseline, runs, seeds, steps, c.config.guard)
    folder = tmp_path / "campaign"
    folder.mkdir()
    profile.save(folder / "baseline_profile.json")
    return folder, profile


def test_a_deaf_seed_knobs_profile_is_one_curve_with_the_noise_within_it(tmp_path: Path) -> None:
    file = tmp_path / "deaf.yaml"
    file.write_text(DEAF.format(trainer=TRAINER, parity=""))
    folder, profile = profiled(tmp_path, file)
    assert profile.loss_reference_kind == "within-run"  # 3 identical "seeds": no spread of seeds
    b = stored_baseline(load_campaign(file), folder)
    assert len(b.curves) == 1 and b.sigma_dof is None and len(b.replicas) == 2 and "(seed 1)" in b.replicas[0]
    code, found, out = watch(file, train(tmp_path / "run", steps=400, seed=9), "--folder", str(folder))
    assert code == 0 and found["design"]["block_noise_nats"] > 0.005, out  # one curve's own noise, not 0


@pytest.mark.parametrize(("kind", "dof"), [
    ("seeds", 2), ("within-run", None),
    # profiles written before the kind was typed hold its words
    ("seed-to-seed std of the baseline's training-loss measure (3 seeds)", 2),
    ("within-run standard error of the baseline's training-loss measure (its 3 seeds' std is 0.0012)", None),
    ("guard.parity.margin", 2),  # the words hid how sigma was measured: the wider law
])
def test_the_offsets_law_follows_the_profiles_kind_margin_or_not(tmp_path: Path, kind: str, dof: int | None) -> None:
    file = campaign(tmp_path, parity=", margin: 0.02")
    folder, profile = profiled(tmp_path, file)
    # a margin states T; the spread is still the 3 seeds' (the typed kind says so): t on 2, not a known sd
    assert profile.loss_tolerance == 0.02 and profile.loss_reference_kind == "seeds"
    assert stored_baseline(load_campaign(file), folder).sigma_dof == 2
    profile_file = folder / "baseline_profile.json"
    doc = json.loads(profile_file.read_text())
    profile_file.write_text(json.dumps({**doc, "loss_reference_kind": kind}))
    assert stored_baseline(load_campaign(file), folder).sigma_dof == dof
    profile_file.write_text(json.dumps({**doc, "loss_reference_kind": "measured somehow"}))
    code, found, out = watch(file, train(tmp_path / "run", steps=400, seed=9), "--folder", str(folder))
    assert code == 2 and found is None and "loss_reference_kind" in out and "allowed are seeds" in out, out
