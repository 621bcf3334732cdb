"""The command workload: an outside trainer's knobs into argv/env, its metrics back from JSONL or
log lines, its failures classified, and nothing a knob value says ever executed."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError
from recipetune.workloads import log_formats
from recipetune.workloads.command import CommandSpec, CommandWorkload

FAKE = Path(__file__).resolve().parent / "fixtures" / "fake_trainer.py"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SEQ = 32


def spec(log_format: str = "jsonl", **overrides) -> CommandSpec:
    fields = {
        "argv": ["{python}", str(FAKE), "--micro-batch={micro_batch}", "--grad-accum", "{grad_accum}",
                 "--iters", "{steps}", "--out", "{out_dir}", "--tag", "{tag}",
                 "--log-format", log_format, "--fail", "{fail}"],
        "knobs": {
            "micro_batch": {"default": 4, "choices": [1, 2, 4, 8]},
            "grad_accum": {"default": 2, "low": 1, "high": 16},
            "tag": {"default": "plain", "role": "invariant"},
            "fail": {"default": "none", "choices": ["none", "crash", "nan", "hang"]},
        },
        "invariants": ["micro_batch * grad_accum == 8", "tag"],
    }
    if log_format == "nanogpt":
        fields |= {"metrics": {"regex_preset": "nanogpt"}, "tokens_per_step": f"micro_batch * grad_accum * {SEQ}"}
    return CommandSpec.model_validate(fields | overrides)


def workload(log_format: str = "jsonl", **overrides) -> CommandWorkload:
    return CommandWorkload(spec(log_format, **overrides), FAKE.parent)


def test_jsonl_stream_gives_steps_losses_and_tokens(tmp_path):
    w = workload()
    recipe = w.resolve({"micro_batch": 2, "grad_accum": 4})
    seen = []
    result = w.run(recipe, 12, tmp_path, timeout_s=60, progress=seen.append)
    assert result.status == "ok", result.cause
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in written if "val_loss" not in r]
    assert [s.step for s in result.steps] == list(range(1, 13))
    assert result.losses() == [s["loss"] for s in steps]
    assert {s.tokens for s in result.steps} == {2 * 4 * SEQ}
    assert [e.step for e in result.evals] == [5, 10]
    assert seen and seen[-1] == 12
    assert result.summary().tokens_per_s > 0
    assert json.loads((tmp_path / "recipe.json").read_text())["micro_batch"] == 2
    assert (tmp_path / "result.json").exists()


def test_nanogpt_preset_parses_stdout_with_tokens_from_the_expression(tmp_path):
    w = workload("nanogpt")
    recipe = w.resolve({"micro_batch": 8, "grad_accum": 1})
    seen = []
    result = w.run(recipe, 10, tmp_path, timeout_s=60, progress=seen.append)
    assert result.status == "ok", result.cause
    assert seen[-1] == 10  # the last iteration printed, read while the log grows
    printed = [ln for ln in (tmp_path / "stdout.log").read_text().splitlines() if ln.startswith("iter ")]
    assert len(result.steps) == len(printed) == 11  # nanoGPT runs iterations 0..max_iters
    assert result.losses() == [float(ln.split("loss ")[1].split(",")[0]) for ln in printed]
    assert {s.tokens for s in result.steps} == {8 * SEQ}
    assert all(s.step_time_s > 0 for s in result.steps)
    assert [e.step for e in result.evals] == [0, 5, 10]


def test_a_knob_value_is_one_argv_element_and_never_runs(tmp_path):
    sentinel = tmp_path / "pwned"
    evil = f'x"; touch {sentinel}; echo $(touch {sentinel}) `touch {sentinel}` {{steps}} \' && rm -rf /tmp/x'
    w = workload()
    recipe = w.resolve({"tag": evil})
    out = tmp_path / "run"
    result = w.run(recipe, 3, out, timeout_s=60)
    assert result.status == "ok", result.cause
    argv = json.loads((out / "argv.json").read_text())
    assert argv[argv.index("--tag") + 1] == evil  # verbatim, braces included, one element
    assert not sentinel.exists()
    # The copyable shell line quotes it back to the very same argv.
    line = w.shell_command(recipe, 3, out)
    assert shlex.split(line)[3:] == w.command(recipe, 3, out)


@pytest.mark.parametrize(("fail", "status", "timeout_s"), [("crash", "crash", 60), ("nan", "nan", 60),
                                                            ("hang", "timeout", 4)])
def test_failures_are_classified(tmp_path, fail, status, timeout_s):
    w = workload()
    result = w.run(w.resolve({"fail": fail}), 10, tmp_path, timeout_s=timeout_s)
    assert result.status == status
    if fail == "crash":
        assert "simulated failure" in result.cause + result.stderr_tail


def test_clean_exit_without_step_lines_says_where_it_looked(tmp_path):
    w = workload("jsonl", metrics={"regex_preset": "torchtitan"}, tokens_per_step="micro_batch")
    result = w.run(w.resolve({}), 3, tmp_path, timeout_s=60)
    assert result.status == "crash" and "torchtitan" in result.cause


def test_holds_invariants_are_checked_and_unchanged_ones_kept_for_the_guard():
    w = workload()
    kinds = {inv.expr: inv.kind for inv in w.invariants()}
    assert kinds == {"micro_batch * grad_accum == 8": "holds", "tag": "unchanged"}
    assert w.check(w.resolve({"micro_batch": 4, "grad_accum": 2})) == []
    problems = w.check(w.resolve({"micro_batch": 4, "grad_accum": 4}))
    assert len(problems) == 1 and "micro_batch * grad_accum == 8" in problems[0] and "grad_accum=4" in problems[0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"invariants": ["micro_batch * nproc == 8"]}, "nproc"),
        ({"argv": ["{python}", "--batch={micro_bach}"]}, "{micro_bach}"),
        ({"argv": ["{micro_batch.__class__}"]}, "plain {name}"),
        ({"argv": ["{micro_batch:>10}"]}, "plain {name}"),
        ({"env": {"X": "{oops}"}}, "{oops}"),
        ({"knobs": {"micro_batch": {"default": 3, "choices": [1, 2]}}}, "default"),
        ({"metrics": {"regex_preset": "lightning"}}, "megatron, nanogpt, torchtitan"),
        ({"metrics": {"regex_preset": "nanogpt"}}, "does not report tokens; set workload.tokens_per_step"),
        ({"tokens_per_step": "micro_batch * __import__('os')"}, "not allowed"),
        ({"devices": "gpus"}, "gpus"),
        ({"metrics": {"step_regex": r"it (?P<step>\d+) loss (?P<loss>\S+)"}}, "no step time"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem(overrides, message):
    with pytest.raises(ValueError) as err:
        workload(**overrides)
    assert message in str(err.value)


def test_values_render_for_command_lines(tmp_path):
    w = workload(argv=["prog", "--lr={lr}", "--compile={compile}", "{{literal}}", "{steps}"],
                 knobs={"lr": {"default": 0.0003}, "compile": {"default": False}}, invariants=[])
    argv = w.command(w.resolve({"compile": True}), 7, tmp_path)
    assert argv == ["prog", "--lr=0.0003", "--compile=true", "{literal}", "7"]


def test_a_custom_regex_reads_an_unknown_trainer():
    w = workload(metrics={"step_regex": r"it (?P<step>\d+) loss (?P<loss>\S+) (?P<tokens_per_s>[\d,]+) tok/s"},
                 tokens_per_step="micro_batch * 100")
    steps, _ = log_formats.parse_lines(["it 3 loss 2.5 1,000 tok/s"], w.preset, 400, 1)
    assert steps[0].step == 3 and steps[0].loss == 2.5 and steps[0].step_time_s == pytest.approx(0.4)


TITAN = [
    "\x1b[31mstep:  1  \x1b[32mloss: 12.2345  \x1b[38;2;54;234;195mmemory: 20.51GiB(21.57%)  "
    "\x1b[34mtps: 512  \x1b[36mtflops: 10.20  \x1b[35mmfu: 1.03%\x1b[39m",
    "[rank0]:[titan] 2025-06-01 10:00:00,000 - root - INFO - step: 10  loss:  7.1234  grad_norm:  1.5000  "
    "memory: 12.34GiB(13.05%)  tps: 1,234  tflops: 56.78  mfu: 5.74%",
    "[rank1]:[titan] 2025-06-01 10:00:00,000 - root - INFO - step: 10  loss:  7.1234  grad_norm:  1.5000  "
    "memory: 12.34GiB(13.05%)  tps: 1,230  tflops: 56.78  mfu: 5.74%",
    "[titan] validate step: 10  loss:  7.5000  memory: 12.34GiB(13.05%)  tps: 9,999",
    "step: 20  loss:  6.9  memory: 12.00GiB(12.00%)  wps: 2,000  mfu: 6.00%",  # older releases
]


def test_torchtitan_lines_parse_with_per_device_throughput():
    steps, evals = log_formats.parse_lines(TITAN, log_formats.get_preset("torchtitan"), tokens_per_step=8192,
                                           n_devices=2)
    assert [s.step for s in steps] == [1, 10, 20]  # rank 1's copy of step 10 counts once
    assert [s.loss for s in steps] == [12.2345, 7.1234, 6.9]
    assert steps[1].grad_norm == 1.5 and steps[0].grad_norm is None
    # tps is per device: a 2-device step of 8192 tokens at 1,234 tokens/s per device.
    assert steps[1].step_time_s == pytest.approx(8192 / (1234 * 2))
    assert steps[1].peak_mem_bytes == int(12.34 * 2**30)
    assert [(e.step, e.val_loss) for e in evals] == [(10, 7.5)]


def test_nanogpt_lines_and_nan():
    lines = ["iter 0: loss 10.9832, time 5123.45ms, mfu -100.00%", "step 0: train loss 10.9, val loss 10.95",
             "iter 1: loss nan, time 120.00ms, mfu 12.34%", "number of parameters: 10.65M"]
    steps, evals = log_formats.parse_lines(lines, log_formats.get_preset("nanogpt"), tokens_per_step=1024, n_devices=1)
    assert [s.step for s in steps] == [0, 1] and steps[0].step_time_s == pytest.approx(5.12345)
    assert math.isnan(steps[1].loss)
    assert [(e.step, e.val_loss) for e in evals] == [(0, 10.95)]


def test_campaign_file_with_a_command_workload(tmp_path):
    campaign = tmp_path / "c.yaml"
    campaign.write_text(f"""
workload:
  kind: command
  argv: ["{{python}}", "{FAKE}", "--micro-batch={{micro_batch}}", "--iters={{steps}}", "--out={{out_dir}}"]
  knobs:
    micro_batch: {{default: 4, choices: [2, 4, 8]}}
baseline:
  micro_batch: 8
""")
    loaded = load_campaign(campaign)
    assert loaded.workload.kind == "command" and loaded.baseline["micro_batch"] == 8
    with pytest.raises(ConfigError) as err:
        load_campaign(campaign, ["micro_batch=3"])
    assert err.value.field == "baseline.micro_batch" and str(campaign) in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_campaign(campaign, ["bogus=1"])
    assert err.value.field == "baseline.bogus"
    campaign.write_text(campaign.read_text().replace("{micro_batch}", "{micro_bach}"))
    with pytest.raises(ConfigError) as err:
        load_campaign(campaign)
    assert err.value.field == "workload.argv.2" and "micro_bach" in err.value.message


def test_the_example_campaign_loads_and_checks_its_invariant():
    campaign = load_campaign(EXAMPLES / "command-fake.yaml")
    assert campaign.workload.check(campaign.baseline) == []
    with pytest.raises(ConfigError) as err:
        load_campaign(EXAMPLES / "command-fake.yaml", ["micro_batch=16"])
    assert err.value.field == "baseline"
