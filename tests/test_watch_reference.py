"""`recipetune watch` on the reference trainer's real runs (slow: five nano runs of 600 steps).

The late drift is made without touching the trainer: the baseline recipe warms up for 100 steps and
then decays its learning rate slowly (cosine to 10% at step 1000); the drifting run is the same recipe
and seed with a decay horizon of 200 steps, to zero: its learning rate equals the baseline's through
the warm-up (the two runs are identical there, bit for bit: the same batches), then falls, and the
run stops learning while the baseline goes on (a stand-in for a change whose cost grows late). The
equivalent is another seed (other batches, another initialisation). The spike is a real run's stream
with five losses raised by 2 nats (the trainer has no knob that makes a loss spike on cue).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_watch import watch

pytestmark = pytest.mark.slow
STEPS, WARMUP = 600, 100


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    folder = tmp_path_factory.mktemp("reference")
    file = folder / "nano.yaml"
    file.write_text(f"""workload: {{kind: reference}}
baseline: {{model: nano, data: stdlib, seq_len: 64, global_batch_size: 8, micro_batch_size: 8, lr: 0.003,
  warmup_steps: {WARMUP}, lr_decay_steps: 1000, min_lr_ratio: 0.1, num_threads: 1}}
guard: {{parity: {{steps: 60}}}}
""")
    plan = {"base-0": ["seed=0"], "base-1": ["seed=1"], "base-2": ["seed=2"], "other": ["seed=7"],
            "drift": ["seed=0", "lr_decay_steps=200", "min_lr_ratio=0.0"]}
    out = {}
    for name, edits in plan.items():
        out[name] = folder / name
        subprocess.run([sys.executable, "-m", "recipetune", "run", str(file), *edits, "--out", str(out[name]),
                        "--steps", str(STEPS)], check=True, stdout=subprocess.DEVNULL)
    return file, out


def baselines(out: dict[str, Path], names: tuple[str, ...] = ("base-0", "base-1", "base-2")) -> list[str]:
    return [a for n in names for a in ("--baseline", str(out[n]))]


def test_the_equivalent_on_other_batches_gives_no_alarm(runs: tuple[Path, dict[str, Path]]) -> None:
    file, out = runs
    code, found, text = watch(file, out["other"], *baselines(out))
    assert code == 0, text
    assert found["alarm"] is None and found["blocks_judged"] == found["design"]["blocks"]


def test_a_late_drift_alarms_after_it_begins(runs: tuple[Path, dict[str, Path]]) -> None:
    file, out = runs
    same = [json.loads(x)["loss"] for x in (out["drift"] / "metrics.jsonl").read_text().splitlines()[:WARMUP]]
    base = [json.loads(x)["loss"] for x in (out["base-0"] / "metrics.jsonl").read_text().splitlines()[:WARMUP]]
    assert same == base  # equal for the first K steps: the drift begins after the guard's window
    code, found, text = watch(file, out["drift"], *baselines(out))
    assert code == 5, text
    assert found["alarm"]["crossed_at_step"] > WARMUP


def test_a_spike_that_recovers_gives_no_alarm(runs: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    file, out = runs
    spiked = tmp_path / "spiked"
    spiked.mkdir()
    rows = [json.loads(x) for x in (out["other"] / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if "loss" in r and 400 <= r["step"] < 405:
            r["loss"] += 2.0
    (spiked / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, found, text = watch(file, spiked, *baselines(out))
    assert code == 0, text
    assert found["alarm"] is None and found["warnings"] and found["warnings"][0]["cleared_at"] is not None
