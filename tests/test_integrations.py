"""Integrations: the Megatron-LM log preset, and an HF Trainer script made a workload by one callback."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipetune.config import load_campaign
from recipetune.workloads.presets import get_preset, read_logs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

MEGATRON = """\
 [2025-04-13 23:41:12] iteration        1/      20 | consumed samples:           16 | elapsed time per iteration (ms): 1147.6 | learning rate: 1.000000E-04 | global batch size:    16 | lm loss: 1.083512E+01 | loss scale: 1.0 | grad norm: 2.918 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2025-04-13 23:41:13] iteration        2/      20 | consumed samples:           32 | elapsed time per iteration (ms): 402.3 | learning rate: 1.000000E-04 | global batch size:    16 | lm loss: 1.012000E+01 | loss scale: 1.0 | grad norm: 2.100 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2025-04-13 23:41:13] iteration        3/      20 | consumed samples:           48 | elapsed time per iteration (ms): 400.0 | learning rate: 0.000000E+00 | global batch size:    16 | loss scale: 8388608.0 | number of skipped iterations:   1 | number of nan iterations:   0 |
 validation loss at iteration 2 on validation set | lm loss value: 9.950000E+00 | lm loss PPL: 2.09E+04 |
"""  # noqa: E501


def test_megatron_preset_reads_steps_and_validation(tmp_path):
    log = tmp_path / "stdout.log"
    log.write_text(MEGATRON)
    steps, evals = read_logs([log], get_preset("megatron"), tokens_per_step=16 * 1024, n_devices=1)
    assert [s.step for s in steps] == [1, 2]  # a skipped iteration prints no loss: no record
    assert steps[0].loss == pytest.approx(10.83512) and steps[1].step_time_s == pytest.approx(0.4023)
    assert steps[0].grad_norm == pytest.approx(2.918) and steps[0].tokens == 16 * 1024
    assert [(e.step, e.val_loss) for e in evals] == [(2, pytest.approx(9.95))]


@pytest.mark.slow
def test_hf_trainer_with_the_callback_is_a_workload(tmp_path):
    c = load_campaign(EXAMPLES / "hf-campaign.yaml")
    run = c.workload.run(c.baseline, 3, tmp_path / "base", timeout_s=300)
    assert run.ok, (run.cause, run.stderr_tail)
    assert [s.step for s in run.steps] == [1, 2, 3] and all(s.tokens == 32 * 64 for s in run.steps)
    assert all(s.step_time_s > 0 and s.lr is not None and s.grad_norm is not None for s in run.steps)
    assert run.summary().tokens_per_s > 0
