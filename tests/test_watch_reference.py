"""`recipetune watch` on the reference trainer's real runs (slow: six nano runs of 600 steps).

The late drift is made without touching the trainer: the baseline recipe warms up for 100 steps and
then decays its learning rate slowly (cosine to 10% at step 1000); the drifting run is the same recipe
and seed with a decay horizon of 200 steps, to zero: its learning rate equals the baseline's through
the warm-up (the two runs are identical there, bit for bit: the same batches), then falls, and the
run stops learning while the baseline goes on (a stand-in for a change whose cost grows late). The
equivalent is another seed (other batches, another initialisation). The spike is a real run's stream
with five losses raised by 2 nats (the trainer has no knob that makes a loss spike on cue). Data
repetition (issue 50) is the same recipe and seed whose loader, from step 200, cycles a cached set of
16 batches (tests/fixtures/repeating_trainer.py patches the sampler in its own process): identical
before, then its training loss falls below the baseline's and its validation loss rises. Every run
validates every 20 steps: the watch judges both losses by default (each at alpha / 2), one with
``--measure loss`` or ``val_loss``; each case is held in each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_watch import beyond_after, watch

pytestmark = pytest.mark.slow
STEPS, WARMUP, REPEAT_FROM = 600, 100, 200
REPEATING = Path(__file__).parent / "fixtures" / "repeating_trainer.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    folder = tmp_path_factory.mktemp("reference")
    file = folder / "nano.yaml"
    file.write_text(f"""workload: {{kind: reference}}
baseline: {{model: nano, data: stdlib, seq_len: 64, global_batch_size: 8, micro_batch_size: 8, lr: 0.003,
  warmup_steps: {WARMUP}, lr_decay_steps: 1000, min_lr_ratio: 0.1, num_threads: 1, eval_interval: 20}}
guard: {{parity: {{steps: 60}}}}
""")
    plan = {"base-0": ["seed=0"], "base-1": ["seed=1"], "base-2": ["seed=2"], "other": ["seed=7"],
            "drift": ["seed=0", "lr_decay_steps=200", "min_lr_ratio=0.0"]}
    out = {}
    for name, edits in plan.items():
        out[name] = folder / name
        subprocess.run([sys.executable, "-m", "recipetune", "run", str(file), *edits, "--out", str(out[name]),
                        "--steps", str(STEPS)], check=True, stdout=subprocess.DEVNULL)
    out["repeat"] = folder / "repeat"
    out["repeat"].mkdir()
    (out["repeat"] / "recipe.json").write_text((out["base-0"] / "recipe.json").read_text())
    subprocess.run([sys.executable, str(REPEATING), "--repeat-from", str(REPEAT_FROM), "--", "--recipe",
                    str(out["repeat"] / "recipe.json"), "--steps", str(STEPS), "--out", str(out["repeat"])],
                   check=True, stdout=subprocess.DEVNULL)
    return file, out


def baselines(out: dict[str, Path], names: tuple[str, ...] = ("base-0", "base-1", "base-2")) -> list[str]:
    return [a for n in names for a in ("--baseline", str(out[n]))]


def losses(run: Path, key: str = "loss") -> list[float]:
    return [r[key] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if key in r]


@pytest.mark.parametrize("measure", ["auto", "val_loss", "loss"])
def test_the_equivalent_on_other_batches_gives_no_alarm(runs: tuple[Path, dict[str, Path]], measure: str) -> None:
    file, out = runs
    code, found, text = watch(file, out["other"], *baselines(out), "--measure", measure)
    assert code == 0, text
    assert found["measures"] == (["loss", "val_loss"] if measure == "auto" else [measure])
    for judged in [found, *found["also_judged"]]:
        assert judged["alarm"] is None and judged["blocks_judged"] == judged["design"]["blocks"]


def test_data_repetition_from_a_late_step_alarms_both_ways(runs: tuple[Path, dict[str, Path]]) -> None:
    """The issue-50 trainer: identical to seed 0 until step 200, then 16 cached batches cycled. On the
    validation loss alone (``--measure val_loss``) it alarms above; on the training loss alone, below;
    neither before the repetition begins. Judged on both (the default), the alarm is the earlier of
    the two at alpha / 2 each: the training loss's, below, before the validation loss alone alarms."""
    file, out = runs
    assert losses(out["repeat"])[:REPEAT_FROM] == losses(out["base-0"])[:REPEAT_FROM]
    code, val, text = watch(file, out["repeat"], *baselines(out), "--measure", "val_loss")
    assert code == 5 and val["measure"] == "val_loss", text
    assert val["alarm"]["direction"] == "above" and beyond_after(val, REPEAT_FROM)
    code, loss, text = watch(file, out["repeat"], *baselines(out), "--measure", "loss")
    assert code == 5, text
    assert loss["alarm"]["direction"] == "below" and beyond_after(loss, REPEAT_FROM)
    code, both, text = watch(file, out["repeat"], *baselines(out))
    assert code == 5 and both["measures"] == ["loss", "val_loss"], text
    assert both["measure"] == "loss" and both["alarm"]["direction"] == "below" and beyond_after(both, REPEAT_FROM)
    assert both["alarm"]["step"] < val["alarm"]["step"], (both["alarm"]["step"], val["alarm"]["step"])


@pytest.mark.parametrize("measure", ["val_loss", "loss"])
def test_a_late_drift_alarms_after_it_begins(runs: tuple[Path, dict[str, Path]], measure: str) -> None:
    file, out = runs
    assert losses(out["drift"])[:WARMUP] == losses(out["base-0"])[:WARMUP]  # equal for the first K steps
    code, found, text = watch(file, out["drift"], *baselines(out), "--measure", measure)
    assert code == 5, text
    assert found["alarm"]["direction"] == "above" and beyond_after(found, WARMUP)


def test_a_spike_that_recovers_gives_no_alarm(runs: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    file, out = runs
    spiked = tmp_path / "spiked"
    spiked.mkdir()
    rows = [json.loads(x) for x in (out["other"] / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if "loss" in r and 400 <= r["step"] < 405:
            r["loss"] += 2.0
    (spiked / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, found, text = watch(file, spiked, *baselines(out), "--measure", "loss")  # a training loss spike
    assert code == 0, text
    assert found["alarm"] is None and found["warnings"] and found["warnings"][0]["cleared_at"] is not None
