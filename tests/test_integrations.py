"""Integrations: the Megatron-LM log preset, and an HF Trainer script made a workload by one callback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recipetune.config import load_campaign
from recipetune.workloads.log_formats import get_preset, read_logs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# run_clm.py's own arguments (ModelArguments, DataTrainingArguments), which TrainingArguments does not know
RUN_CLM_FLAGS = {"--model_name_or_path", "--dataset_name", "--dataset_config_name", "--block_size", "--config_name"}

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
    assert [e.step for e in run.evals] == [3]  # --do_eval after training: the last step's val_loss
    # The callback fingerprints the sampler's indices: 32 x 1 replays 8 x 4's global batches (the
    # guard then compares them on the same batches); another seed draws other ones.
    fp = [s.batch_fp for s in run.steps]
    assert all(fp) and len(set(fp)) == 3
    split = c.workload.run(c.workload.resolve({**c.baseline, "micro_batch": 32, "grad_accum": 1}), 3,
                           tmp_path / "split", timeout_s=300)
    seed = c.workload.run(c.workload.resolve({**c.baseline, "seed": 1}), 3, tmp_path / "seed", timeout_s=300)
    assert split.ok and seed.ok, (split.stderr_tail, seed.stderr_tail)
    assert [s.batch_fp for s in split.steps] == fp
    assert not set(fp) & {s.batch_fp for s in seed.steps}


def _hf_section() -> str:
    page = (Path(__file__).resolve().parents[1] / "docs" / "own-trainer.md").read_text()
    return page.split("## Hugging Face `Trainer`", 1)[1].split("\n## ", 1)[0]


def _snippets(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def test_the_hf_sections_yaml_runs_as_written(tmp_path):
    # Every YAML snippet of docs/own-trainer.md's HF section loads through the campaign loader, every
    # knob says what it is, and the TrainingArguments flags, filled with the baseline's values, parse
    # as an HfArgumentParser script parses them (run_clm.py's own flags are left to it).
    from transformers import HfArgumentParser, TrainingArguments

    section = _hf_section()
    yamls = _snippets(section, "yaml")
    assert yamls
    for i, text in enumerate(yamls):
        (tmp_path / f"snippet{i}.yaml").write_text(text)
        c = load_campaign(tmp_path / f"snippet{i}.yaml")
        assert all(spec.means for spec in c.config.workload.knobs.values()), text
        fill = {**dict(c.baseline), "steps": 30, "out_dir": str(tmp_path / "out")}
        flags = [a.format(**fill) for a in c.config.workload.argv[2:]]
        args, rest = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses(
            args=flags, return_remaining_strings=True)
        assert args.logging_steps == 1 and args.include_num_input_tokens_seen in (True, "all"), flags
        assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 32
        assert all(r.split("=")[0] in RUN_CLM_FLAGS for r in rest), rest
    for text in _snippets(section, "python"):
        exec(compile(text.split("\n", 1)[0], "own-trainer.md", "exec"), {})  # the import works
        compile(text, "own-trainer.md", "exec")  # and the callback line is Python


def test_the_hf_example_says_what_every_knob_is():
    c = load_campaign(EXAMPLES / "hf-campaign.yaml")
    assert all(spec.means for spec in c.config.workload.knobs.values())
