"""`recipetune watch`: a run of the approved recipe against the baseline's curve (docs/guard.md, "After approval").

The cases built to fool it, on a command trainer (tests/fixtures/watch_trainer.py: a JSONL stream with
a seed offset, batch noise, optional EMA smoothing, a late drift, a spike that recovers, data
repetition from a late step, validation lines): a drift that begins after the guard's window, up or
down, is caught within the delay the design states and on its side; data repetition (the training
loss falls below the baseline's, the validation loss rises) is caught on the training loss, on the
validation loss where the runs record one, finished and followed, against --baseline runs and the
campaign's profile, with persist 3 and 1; an equivalent on other batches and a spike that recovers
(either way) are not alarmed; the false-alarm rate over simulated long runs, both sides together.
The reference trainer's cases are in tests/test_watch_reference.py (slow: real runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.signal import lfilter
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.core.stats import proportion_ci
from recipetune.guard import drift
from recipetune.guard.monitor import Measure, Monitor, Outcome, direction

runner = CliRunner()
TRAINER = Path(__file__).parent / "fixtures" / "watch_trainer.py"
HORIZON = 100  # the campaign's guard.parity.steps: the verdict's horizon


def campaign(folder: Path, metrics: str = 'jsonl: "{out_dir}/metrics.jsonl"', extra: str = "",
             parity: str = "") -> Path:
    file = folder / "camp.yaml"
    file.write_text(f"""workload:
  kind: command
  argv: ["{{python}}", "{TRAINER}", "--steps", "{{steps}}", "--out", "{{out_dir}}", "--seed", "{{seed}}"]
  knobs:
    seed: {{default: 0, role: invariant}}
  metrics: {{{metrics}}}
{extra}baseline: {{seed: 0}}
guard:
  parity: {{steps: {HORIZON}{parity}}}
""")
    return file


def train(out: Path, steps: int = 800, **options: float) -> Path:
    args = [sys.executable, str(TRAINER), "--steps", str(steps), "--out", str(out)]
    for k, v in options.items():
        args.append(f"--{k.replace('_', '-')}={v}")  # = : a negative value in e-notation is no option
    subprocess.run(args, check=True)
    return out


def baselines(folder: Path, n: int = 3, **options: float) -> list[str]:
    args = []
    for s in range(n):
        args += ["--baseline", str(train(folder / f"base-{s}", seed=s, **options))]
    return args


def watch(file: Path, run: Path, *args: str) -> tuple[int, dict | None, str]:
    out = run.parent / f"finding-{run.name}.json"
    res = runner.invoke(app, ["watch", str(file), str(run), "--out", str(out), *args])
    return res.exit_code, json.loads(out.read_text()) if out.exists() else None, res.output


def follow(file: Path, whole: Path, live: Path, *args: str, chunk: int, pause_s: float,
           poll_s: str) -> tuple[int, dict | None, str]:
    """``watch --follow`` on ``live`` while a trainer appends ``whole``'s lines there, ``chunk`` at a time,
    then writes its status file."""
    lines = (whole / "metrics.jsonl").read_text().splitlines(keepends=True)
    live.mkdir()

    def write() -> None:
        with (live / "metrics.jsonl").open("w") as f:
            for i in range(0, len(lines), chunk):
                f.writelines(lines[i:i + chunk])
                f.flush()
                time.sleep(pause_s)
        (live / "status.json").write_text('{"status": "ok"}')

    writer = threading.Thread(target=write)
    writer.start()
    try:
        return watch(file, live, *args, "--follow", "--poll-s", poll_s)
    finally:
        writer.join()


# ---------------------------------------------------------------------------------- the boundary


@pytest.mark.parametrize("rho, dof, persist", [(0.0, None, 3), (0.6, None, 3), (0.95, None, 3), (0.9, 2, 3),
                                               (0.6, None, 1), (0.3, None, 2)])
def test_boundary_gives_its_false_alarm_rate(rho: float, dof: int | None, persist: int) -> None:
    """The boundary's chance (an integral over the offset, a chain over the streak and its side) is the
    rate of equicorrelated block gaps with the offset drawn from its law, ``persist`` blocks in a row
    beyond h on one side, above or below. The one-sided boundary mirrored spends more: the case that
    tells a two-sided law from a mirror: each side alone spends half, so a one-sided boundary used on
    both sides would spend twice ``alpha``."""
    k, n = 60, 20000
    h = drift.boundary(0.05, [rho] * k, persist, dof)
    rng = np.random.default_rng(7)
    u = rng.standard_normal((n, 1)) if dof is None else rng.standard_t(dof, (n, 1))
    z = np.sqrt(rho) * u + np.sqrt(1 - rho) * rng.standard_normal((n, k))

    def streak(beyond: np.ndarray) -> np.ndarray:  # per run: `persist` blocks in a row beyond, somewhere
        run = np.ones((n, k - persist + 1), dtype=bool)
        for j in range(persist):
            run &= beyond[:, j:k - persist + 1 + j]
        return run.any(axis=1)

    up, down = streak(z > h), streak(z < -h)
    assert abs(float((up | down).mean()) - 0.05) < 0.008, (h, (up | down).mean())
    assert abs(float(up.mean()) - 0.025) < 0.008 and abs(float(down.mean()) - 0.025) < 0.008  # half each side


def simulate(rng: np.random.Generator, steps: int, offset_sd: float, noise: float, ema: float) -> np.ndarray:
    """The fixture trainer's curve, in numpy: trend, the seed's offset, batch noise, EMA-smoothed."""
    t = np.arange(1, steps + 1)
    raw = 2 + 3 / np.sqrt(t) + rng.normal(0, offset_sd) + rng.normal(0, noise, steps)
    return lfilter([1 - ema], [1, -ema], raw, zi=[ema * raw[0]])[0] if ema else raw


@pytest.mark.slow
@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_false_alarms_over_simulated_long_runs(ema: float) -> None:
    """200 simulated long runs of an equivalent (another seed: its own offset and batches) against 3
    baseline seeds, raw and EMA-smoothed (consecutive points strongly correlated): false alarms at the
    design's 5%, within what 200 runs can tell (the exact interval of the rate reaches below 5%, and the
    rate is under 7.5%). The noise is the fixture trainer's (offset sd 0.01 nats, batch noise 0.03 per
    step). More runs, and the reference trainer's noise: benchmarks/watch_false_alarms.py."""
    rng = np.random.default_rng(2026)
    steps, alarms, blocks = 2000, 0, set()
    t = np.arange(1, steps + 1)
    for _ in range(200):
        base = [drift.Curve.of(t, simulate(rng, steps, 0.01, 0.03, ema), "b") for _ in range(3)]
        run = drift.Curve.of(t, simulate(rng, steps, 0.01, 0.03, ema), "run")
        plan = drift.plan(base, t[:50], 50, drift.Design(10, rate=0.01 / HORIZON))  # tuned for 1 T per horizon
        blocks.add(plan.noise.block_points)
        monitor = Monitor(plan, 0.01)
        monitor.feed(run)
        alarms += monitor.alarm is not None
    rate, low, _ = proportion_ci(alarms, 200)
    assert low < 0.05 and rate <= 0.075, alarms
    if ema:  # blocks span the smoothing's memory (2 x tau, tau = 19 steps), as estimated from 3 curves
        assert min(blocks) >= 20


# ----------------------------------------------------------------------------- the command trainer


def test_equivalent_on_other_batches_gives_no_alarm(tmp_path: Path) -> None:
    file = campaign(tmp_path)
    base = baselines(tmp_path)
    for seed in (7, 8, 9):
        code, found, out = watch(file, train(tmp_path / f"other-{seed}", seed=seed), *base)
        assert code == 0, out
        assert found["decision"] == "NO ALARM" and found["alarm"] is None
        assert found["blocks_judged"] == found["design"]["blocks"] > 20


@pytest.mark.parametrize("per_horizon", [1.0, 2.0, -1.0, -2.0])
def test_late_drift_alarms_within_the_stated_delay(tmp_path: Path, per_horizon: float) -> None:
    """Equal for its first 300 steps (after the guard's 100-step window), then drifting by 1 or 2 T per
    100 steps, up or down: alarmed after it begins, on its side, within the delay the design states
    (the gap's own level before the drift counted: a run that sits below the baseline by chance needs
    longer to rise, less to fall)."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=2000)
    code, calm, _ = watch(file, train(tmp_path / "calm", steps=2000, seed=9), *base)
    assert code == 0
    T, start = calm["tolerance_T"], 300
    rate = per_horizon * T / HORIZON
    drifting = train(tmp_path / "drift", steps=2000, seed=9, drift=rate, drift_from=start)
    code, found, out = watch(file, drifting, *base)
    assert code == 5, out
    alarm = found["alarm"]
    side = "above" if rate > 0 else "below"
    assert alarm["crossed_at_step"] > start and alarm["gap_in_T"] * np.sign(rate) > 1 and alarm["direction"] == side
    level = np.mean([g["gap"] for g in calm["gaps"] if g["step"] < start])
    design = found["design"]
    slack = (design["persist"] + 1) * design["block_points"] * design["interval_steps"]
    stated = (design["alarm_gap_nats"][1] + design["block_noise_nats"] - np.sign(rate) * level) / abs(rate) + slack
    assert alarm["step"] - start <= stated, (alarm, stated)
    assert f"training loss is {side} the baseline's" in out
    assert f"crossed the boundary at step {alarm['crossed_at_step']}" in out


@pytest.mark.parametrize("ema, spike", [(0.0, 1.0), (0.9, 1.0), (0.0, -1.0)])
def test_a_spike_that_recovers_is_a_warning_that_clears(tmp_path: Path, ema: float, spike: float) -> None:
    file = campaign(tmp_path)
    base = baselines(tmp_path, ema=ema)
    run = train(tmp_path / "spike", seed=9, ema=ema, spike=spike, spike_at=400, spike_len=5)
    code, found, out = watch(file, run, *base)
    assert code == 0, out
    assert found["alarm"] is None
    (warning,) = found["warnings"]
    assert warning["cleared_at"] is not None and warning["from_step"] <= 404 <= warning["cleared_at"]
    assert warning["direction"] == ("above" if spike > 0 else "below")
    assert "WARNING" in out and "CLEARED" in out


# ------------------------------------------------------------------- data repetition from a late step

REPEAT_FROM = 300


def repeating(folder: Path, name: str, per_horizon: float, T: float, seed: int = 9, steps: int = 1200,
              val_rate: float | None = None, **options: float) -> Path:
    """From step 300 the loader cycles 16 cached batches: the training loss falls ``per_horizon`` T per
    100 steps below its curve, the validation loss (where logged) rises as much, or ``val_rate`` nats
    per step."""
    rate = per_horizon * T / HORIZON
    return train(folder / name, steps=steps, seed=seed, repeat_from=REPEAT_FROM, repeat_rate=rate,
                 repeat_val_rate=rate if val_rate is None else val_rate, **options)


def beyond_after(found: dict, step: int) -> bool:
    """The first block beyond the boundary (either side) ends after ``step``: nothing before the bug."""
    first = next(g for g in found["gaps"] if abs(g["gap"]) > g["bound"])
    return first["step"] > step


@pytest.mark.parametrize("per_horizon", [1.0, 2.0])
def test_data_repetition_lowers_the_training_loss_and_alarms_below(tmp_path: Path, per_horizon: float) -> None:
    """The issue-50 case on the training loss: from a late step the run trains on 16 cached batches
    and its loss falls below the baseline's (1 or 2 T per 100 steps: an effect at the edge). Alarmed
    below, after the repetition begins; the equivalent (seed 9 without the bug, the same batches until
    step 300) stays quiet. (The stated delay is a drift's from a known level; the cached batches add
    their own mean noise, sd 0.03 / 4 nats ~ 1 T, to the run's level: the delay checks are the drift's.)"""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=1200)
    code, calm, out = watch(file, train(tmp_path / "calm", steps=1200, seed=9), *base)
    assert code == 0 and calm["measure"] == "loss", out
    T = calm["tolerance_T"]
    code, found, out = watch(file, repeating(tmp_path, "repeat", per_horizon, T), *base)
    assert code == 5, out
    alarm = found["alarm"]
    assert alarm["direction"] == "below" and alarm["gap_nats"] < -alarm["bound_nats"] and beyond_after(found, 300)
    assert "training loss is below the baseline's" in out


def test_both_losses_where_the_runs_record_a_validation_loss(tmp_path: Path) -> None:
    """Where the run and its baselines log validation lines, both losses are judged, each at alpha / 2
    (the finding's ``measures``; each design's ``alpha``): the equivalent with validation lines stays
    quiet on both; a run without validation lines against baselines with them is judged on the
    training loss alone, at the whole alpha, and says why; ``--measure val_loss`` where the run has
    none is bad input."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=1200, val_every=10)
    code, calm, out = watch(file, train(tmp_path / "calm", steps=1200, seed=9, val_every=10), *base)
    assert code == 0 and calm["measures"] == ["loss", "val_loss"] and calm["measure"] == "loss", out
    (val,) = calm["also_judged"]
    assert val["measure"] == "val_loss" and val["alarm"] is None and val["design"]["interval_steps"] == 10
    assert calm["design"]["alpha"] == val["design"]["alpha"] == 0.025 and calm["alpha"] == 0.05
    assert val["blocks_judged"] == val["design"]["blocks"] and calm["blocks_judged"] == calm["design"]["blocks"]
    assert "both losses" in calm["measure_why"] and "and on the validation loss over" in out
    code, found, out = watch(file, train(tmp_path / "no-val", steps=1200, seed=9), *base)
    assert code == 0 and found["measures"] == ["loss"] and found["design"]["alpha"] == 0.05, out
    assert "no validation loss" in found["measure_why"]
    code, _, out = watch(file, train(tmp_path / "no-val-2", steps=1200, seed=8), *base, "--measure", "val_loss")
    assert code == 2 and "--measure val_loss" in out


def val_T(found: dict) -> float:
    return next(x for x in [found, *found["also_judged"]] if x["measure"] == "val_loss")["tolerance_T"]


@pytest.mark.parametrize("per_horizon", [1.0, 2.0])
def test_a_drift_seen_only_on_the_training_loss(tmp_path: Path, per_horizon: float) -> None:
    """What judging the validation loss alone missed: the cached batches lower the training loss (1 or
    2 T per 100 steps from step 300) and leave the validation loss where it was. Judged on both losses
    (the default with validation lines), the training loss alarms below, never from a block before
    step 300; judged on the validation loss alone (``--measure val_loss``, the default before) the same
    run gives no alarm."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=1200, val_every=10)
    code, calm, out = watch(file, train(tmp_path / "calm", steps=1200, seed=9, val_every=10), *base)
    assert code == 0, out
    run = repeating(tmp_path, "repeat", per_horizon, calm["tolerance_T"], val_rate=0.0, val_every=10)
    code, found, out = watch(file, run, *base)
    assert code == 5 and found["measure"] == "loss" and found["measures"] == ["loss", "val_loss"], out
    assert found["alarm"]["direction"] == "below" and beyond_after(found, REPEAT_FROM)
    assert found["also_judged"][0]["alarm"] is None
    assert "training loss is below the baseline's" in out
    code, alone, out = watch(file, run, *base, "--measure", "val_loss")
    assert code == 0 and alone["measures"] == ["val_loss"], out


@pytest.mark.parametrize("per_horizon", [2.0, 3.0])
def test_a_drift_seen_only_on_the_validation_loss(tmp_path: Path, per_horizon: float) -> None:
    """The other way: the loader cycles 16 cached batches from step 300 and the validation loss rises
    (2 or 3 of its own T per 100 steps) while the training loss keeps its curve (the cached batches'
    own noise only). Judged on both losses, the validation loss alarms above, never from a block
    before step 300; the training loss alone (``--measure loss``) gives no alarm."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=1200, val_every=10)
    code, calm, out = watch(file, train(tmp_path / "calm", steps=1200, seed=9, val_every=10), *base)
    assert code == 0, out
    run = repeating(tmp_path, "repeat", 0.0, 0.0, val_rate=per_horizon * val_T(calm) / HORIZON, val_every=10)
    code, found, out = watch(file, run, *base)
    assert code == 5 and found["measure"] == "val_loss" and found["alarm"]["direction"] == "above", out
    assert beyond_after(found, REPEAT_FROM) and found["also_judged"][0]["measure"] == "loss"
    assert "validation loss is above the baseline's" in out
    code, alone, out = watch(file, run, *base, "--measure", "loss")
    assert code == 0 and alone["measures"] == ["loss"], out


def test_both_losses_alarm_at_the_earlier_of_the_two(tmp_path: Path) -> None:
    """The issue-50 repetition where the runs log validation lines: the training loss falls below its
    curve, the validation loss rises above it. Judged on both, the alarm is exactly the earlier of
    what each loss alone gives at alpha / 2 (``--measure loss --alpha 0.025``, ``--measure val_loss
    --alpha 0.025``: the same plans), with its loss and side; each alone alarms on its own side. The
    training loss falling 2 T per 100 steps alarms first (step 593 against 910); falling 1 T while the
    validation loss rises 3 of its T, the validation loss does (670 against 831)."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=1200, val_every=10)
    code, calm, _ = watch(file, train(tmp_path / "calm", steps=1200, seed=9, val_every=10), *base)
    assert code == 0
    deciders = []
    for loss_rate, val_rate in ((2.0, 2.0), (1.0, 3.0)):  # T per 100 steps, each loss's own T
        run = repeating(tmp_path, f"repeat-{loss_rate}-{val_rate}", loss_rate, calm["tolerance_T"], val_every=10,
                        val_rate=val_rate * val_T(calm) / HORIZON)
        code, both, out = watch(file, run, *base)
        assert code == 5, out
        code_l, loss, _ = watch(file, run, *base, "--measure", "loss", "--alpha", "0.025")
        code_v, val, _ = watch(file, run, *base, "--measure", "val_loss", "--alpha", "0.025")
        assert code_l == 5 and code_v == 5
        assert loss["alarm"]["direction"] == "below" and val["alarm"]["direction"] == "above"
        first = min((loss, val), key=lambda f: f["alarm"]["step"])
        assert both["measure"] == first["measure"] and both["alarm"] == first["alarm"], both["alarm"]
        assert beyond_after(both, REPEAT_FROM)
        deciders.append(both["measure"])
    assert deciders == ["loss", "val_loss"]  # each loss decides once: its drift is the faster


@pytest.mark.parametrize("val_every", [0, 10])
def test_data_repetition_followed_live(tmp_path: Path, val_every: int) -> None:
    """--follow on a growing stream: the repetition alarms while the run is still writing (the watch
    waits for the run's first validation lines before it decides which loss it judges)."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=1200, val_every=val_every)
    code, calm, _ = watch(file, train(tmp_path / "calm", steps=1200, seed=9, val_every=val_every), *base)
    assert code == 0
    whole = repeating(tmp_path, "whole", 3.0, calm["tolerance_T"], val_every=val_every)
    code, finished, _ = watch(file, whole, *base)
    assert code == 5
    code, found, out = follow(file, whole, tmp_path / "live", *base, chunk=50, pause_s=0.02, poll_s="0.01")
    assert code == 5, out
    assert found["measures"] == (["loss", "val_loss"] if val_every else ["loss"])
    assert found["measure"] == finished["measure"] and found["alarm"] == finished["alarm"]  # the same block
    assert beyond_after(found, REPEAT_FROM)


def test_data_repetition_with_persist_1(tmp_path: Path) -> None:
    """The persistence rule at 1 (every block beyond alarms; the boundary is higher for it): the
    repetition alarms below; the equivalent stays quiet."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=1200)
    code, calm, out = watch(file, train(tmp_path / "calm", steps=1200, seed=9), *base, "--persist", "1")
    assert code == 0 and calm["design"]["persist"] == 1, out
    code, found, out = watch(file, repeating(tmp_path, "repeat", 2.0, calm["tolerance_T"]), *base, "--persist", "1")
    assert code == 5 and found["alarm"]["direction"] == "below" and beyond_after(found, REPEAT_FROM), out


def test_persist_1_with_both_losses_judged(tmp_path: Path) -> None:
    """Both losses at --persist 1: a monitor whose curve ends is taken off the list by identity (comparing two
    monitors field by field reached the numpy arrays of their plans and crashed the watch)."""
    file = campaign(tmp_path)
    base = baselines(tmp_path, val_every=20, ema=0.9)
    code, calm, out = watch(file, train(tmp_path / "calm", seed=11, val_every=20, ema=0.9), *base, "--persist", "1")
    assert code == 0 and calm["measures"] == ["loss", "val_loss"] and calm["design"]["persist"] == 1, out


def test_a_run_that_diverges_alarms_at_once(tmp_path: Path) -> None:
    file = campaign(tmp_path)
    base = baselines(tmp_path)
    run = train(tmp_path / "nan", seed=9)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[599] = json.dumps({"step": 600, "loss": float("nan"), "tokens": 512, "step_time_s": 0.01})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, found, _ = watch(file, run, *base)
    assert code == 5 and found["alarm"]["step"] == 600 and "non-finite" in found["alarm"]["message"]


def test_log_lines_through_a_regex_preset(tmp_path: Path) -> None:
    """A command workload that prints nanoGPT's log lines: the campaign's preset reads them."""
    file = campaign(tmp_path, "regex_preset: nanogpt", '  tokens_per_step: "512"\n')

    def as_log(src: Path, out: Path) -> Path:
        out.mkdir()
        rows = [json.loads(x) for x in (src / "metrics.jsonl").read_text().splitlines()]
        (out / "stdout.log").write_text("".join(f"iter {r['step']}: loss {r['loss']:.6f}, time 10.0ms, mfu 1.0%\n"
                                                for r in rows))
        return out

    base = []
    for s in range(3):
        base += ["--baseline", str(as_log(train(tmp_path / f"b{s}", seed=s), tmp_path / f"log-b{s}"))]
    drifted = as_log(train(tmp_path / "d", seed=9, drift=0.0004, drift_from=300), tmp_path / "log-d")
    code, found, out = watch(file, drifted, *base)
    assert code == 5, out
    assert found["alarm"]["crossed_at_step"] > 300


# ------------------------------------------------------------------------------ follow, the profile


def test_follow_a_growing_file_until_the_run_ends(tmp_path: Path) -> None:
    file = campaign(tmp_path)
    base = baselines(tmp_path)
    code, found, out = follow(file, train(tmp_path / "whole", seed=9), tmp_path / "live", *base, chunk=100,
                              pause_s=0.05, poll_s="0.02")
    assert code == 0, out
    design = found["design"]
    assert found["blocks_judged"] == design["blocks"] and found["last_judged_step"] == design["last_step"]
    assert design["last_step"] > 800 - design["block_points"] * design["interval_steps"]


def test_without_baseline_files_the_campaign_folders_profile(tmp_path: Path) -> None:
    """No --baseline: the profile the guard stored in the campaign folder (its runs and sigma_M)."""
    from recipetune.config import load_campaign
    from recipetune.guard.baseline import build_profile, seeds_for, with_seed

    file = campaign(tmp_path)
    c = load_campaign(file)
    seeds = seeds_for(c.workload, c.baseline, 3)
    runs = [c.workload.run(with_seed(c.baseline, s), 400, tmp_path / f"p{s}") for s in seeds]
    profile = build_profile(c.workload, c.baseline, runs, seeds, 400, c.config.guard)
    folder = tmp_path / "campaign"
    folder.mkdir()
    profile.save(folder / "baseline_profile.json")
    code, found, out = watch(file, train(tmp_path / "run", steps=400, seed=9), "--folder", str(folder))
    assert code == 0, out
    assert found["tolerance_T"] == profile.loss_tolerance
    assert "covers more" in found["covered"]
    drifted = train(tmp_path / "drift", steps=400, seed=9, drift=0.001, drift_from=150)
    assert watch(file, drifted, "--folder", str(folder))[0] == 5
    rate = 2 * profile.loss_tolerance / HORIZON  # data repetition from step 150: 2 T per 100 steps, down
    repeated = train(tmp_path / "repeat", steps=400, seed=9, repeat_from=150, repeat_rate=rate)
    code, found, out = watch(file, repeated, "--folder", str(folder))
    assert code == 5 and found["alarm"]["direction"] == "below" and beyond_after(found, 150), out
    # longer runs of the baseline recipe stored by a verdict (guard-runs/) extend what is covered
    for s in (0, 1):
        c.workload.run(with_seed(c.baseline, s), 800, folder / "guard-runs" / f"long-{s}")
    code, found, out = watch(file, train(tmp_path / "long", steps=800, seed=9), "--folder", str(folder))
    assert code == 0, out
    # each long run replays its seed's profile run (the same batches): one sample, the longer kept, and a run
    # stored twice is no news (not said); p2 has no longer copy
    assert found["last_judged_step"] > 700 and [Path(b).name for b in found["baseline"]] == ["long-0", "long-1", "p2"]
    assert found["baseline_left_out"] == []


def test_without_a_profile_T_is_the_verdicts_rule_parity_margin_included(tmp_path: Path) -> None:
    """No profile: T is derived from the noise measured on the baselines through the verdict's own rule
    (guard/loss.py's tolerance_of), so a campaign that states ``parity.margin`` gets that T, as its
    verdict did (watch once computed tolerance x sigma and ignored the margin); without it, T is
    ``parity.tolerance`` x that sigma, the same as before."""
    base = baselines(tmp_path)
    run = train(tmp_path / "run", seed=9)
    code, stated, out = watch(campaign(tmp_path, parity=", margin: 0.05"), run, *base)
    assert code == 0, out
    assert stated["tolerance_T"] == 0.05 and "T = 0.0500" in out
    code, derived, out = watch(campaign(tmp_path, parity=", tolerance: 2.0"), run, *base)
    assert code == 0, out
    code, single, _ = watch(campaign(tmp_path), run, *base)
    assert derived["tolerance_T"] == pytest.approx(2 * single["tolerance_T"]) and single["tolerance_T"] != 0.05


def test_the_decision_is_a_typed_word_with_its_strings_on_disk() -> None:
    assert [o.value for o in Outcome] == ["ALARM", "NO ALARM"]
    assert json.dumps({"decision": Outcome.NO_ALARM}) == '{"decision": "NO ALARM"}'
    assert f"{Outcome.ALARM} at step 3" == "ALARM at step 3"
    assert direction(-0.1) == "below" and Measure("val_loss").said == "validation loss"
    with pytest.raises(AttributeError):
        Outcome.ALARMED  # noqa: B018 (a misspelt outcome is an error, not a string)


# ------------------------------------------------------------------------------------- bad input


def test_bad_input_exits_2_names_the_file_and_writes_nothing(tmp_path: Path) -> None:
    file = campaign(tmp_path)
    base = baselines(tmp_path, steps=300)
    cases: list[tuple[list[str], str]] = []  # (arguments after the campaign file, what the message says)
    cases.append(([str(tmp_path / "absent")] + base, "no such file"))
    lossless = tmp_path / "lossless"
    lossless.mkdir()
    (lossless / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "tokens": 512}) + "\n"
                                                    for s in range(1, 100)))
    cases.append(([str(lossless)] + base, "no training loss"))
    other = train(tmp_path / "other-wl", steps=300, seed=5)
    (other / "recipe.json").write_text(json.dumps({"model": "nano", "micro_batch_size": 8}))
    cases.append(([str(train(tmp_path / "r", steps=300, seed=9)), "--baseline", str(other)] + base[:2],
                  "another workload"))
    wide = train(tmp_path / "wide", steps=300, seed=9, tokens=1024)
    cases.append(([str(wide)] + base, "tokens per step"))
    shifted = train(tmp_path / "shifted", steps=300, seed=9, every=10)
    rows = (shifted / "metrics.jsonl").read_text().replace('"step": ', '"step": 1').splitlines()
    (shifted / "metrics.jsonl").write_text("\n".join(rows) + "\n")  # steps 110, 120, ... vs 1, 2, 3 ...
    every10 = [train(tmp_path / f"e{s}", steps=300, seed=s, every=10) for s in range(2)]
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0, "tokens": 512, "step_time_s": 0.1})
                                               + "\n" for s in range(5, 300, 10)))
    cases.append(([str(odd), "--baseline", str(every10[0]), "--baseline", str(every10[1])], "do not line up"))
    cases.append(([str(shifted)] + base, "do not line up"))
    cases.append(([str(train(tmp_path / "one", steps=300, seed=9)), base[0], base[1]], "seed-to-seed spread"))
    cases.append(([str(wide)], "no baseline to compare with"))
    broken = tmp_path / "broken.yaml"
    broken.write_text(file.read_text().replace("baseline: {seed: 0}", "baseline: {seed: 0, bogus: 1}"))
    runs = [(file, args, says) for args, says in cases] + [(broken, [str(wide), *base], "bogus")]
    for campaign_file, args, says in runs:
        out = tmp_path / "finding.json"
        res = runner.invoke(app, ["watch", str(campaign_file), *args, "--out", str(out),
                                  "--folder", str(tmp_path / "none")])
        assert res.exit_code == 2, (args, res.output)
        assert says in res.output and "Traceback" not in res.output, (says, res.output)
        assert not out.exists()
