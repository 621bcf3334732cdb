"""The presets read the trainers' formats as they are today: lines printed with each trainer's own format
expression (tests/fixtures/trainer_formats.py, copied from the commit it names), read back through the preset,
must give the values printed; lines that look alike but mean something else must not be read as them.
Also the CSV route: Lightning's CSVLogger file as litgpt writes it, and a real litgpt 0.5.13 run's output."""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import pytest

from recipetune.workloads import csv_metrics, log_formats
from recipetune.workloads.command import CommandSpec, CommandWorkload, SpecError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import trainer_formats as tf  # noqa: E402

REAL = FIXTURES / "litgpt-0.5.13"


def parse(lines, preset, tokens_per_step=1024, n_devices=1):
    return log_formats.parse_lines(lines, log_formats.get_preset(preset), tokens_per_step, n_devices)


def test_every_preset_names_a_checked_source():
    assert set(log_formats.PRESETS) <= set(tf.SOURCES)
    assert set(csv_metrics.PRESETS) <= set(tf.SOURCES)


# ------------------------------------------------------------------------------------------ nanoGPT


def test_nanogpt_lines_as_train_py_prints_them():
    lines = [
        tf.nanogpt_eval(0, {"train": 10.98765, "val": 10.95432}),
        tf.nanogpt_iter(0, 10.98321, 5.12345, -1.0),  # running_mfu starts at -1: "mfu -100.00%"
        tf.nanogpt_iter(1, 9.87654321, 0.1234567, 0.1234),
        tf.nanogpt_iter(123456, float("nan"), 12.5, 0.5),
    ]
    steps, evals = parse(lines, "nanogpt")
    assert [(s.step, s.loss) for s in steps[:2]] == [(0, 10.9832), (1, 9.8765)]
    assert steps[1].step_time_s == pytest.approx(0.12346)
    assert steps[2].step == 123456 and math.isnan(steps[2].loss)
    assert [(e.step, e.val_loss) for e in evals] == [(0, 10.9543)]  # the val loss, not the train loss


# --------------------------------------------------------------------------------------- torchtitan


def test_torchtitan_lines_as_metrics_processor_prints_them():
    mem = tf.MemStats(max_reserved_gib=12.345, max_reserved_pct=13.0512)
    lines = [
        tf.torchtitan_step(1, 12.123456, 5.5, mem, 512.4, 10.2, 1.03),
        tf.torchtitan_step(10, 7.1234567, float("nan"), mem, 1234567.8, 1234.5, None),  # mfu "N/A", tps "1,234,568"
        tf.torchtitan_validate(10, 7.56789, mem, 9999.0),
    ]
    assert "validate step" in lines[2] and "\x1b[" in lines[0]
    steps, evals = parse(lines, "torchtitan", tokens_per_step=8192, n_devices=2)
    assert [(s.step, s.loss) for s in steps] == [(1, 12.12346), (10, 7.12346)]
    assert steps[0].grad_norm == 5.5 and steps[1].grad_norm is not None and math.isnan(steps[1].grad_norm)
    assert steps[0].peak_mem_bytes == int(12.35 * 2**30)  # printed to 2 decimals
    # tps is per device: 8192 tokens over 2 devices at 1,234,568 tokens/s each
    assert steps[1].step_time_s == pytest.approx(8192 / (1234568 * 2))
    assert [(e.step, e.val_loss) for e in evals] == [(10, 7.5679)]  # the validate line is no step


# ----------------------------------------------------------------------------------------- Megatron


def megatron_line(iteration, loss, **kw):
    args = {
        "train_iters": 1000,
        "consumed_train_samples": iteration * 16,
        "elapsed_time_per_iteration": 1.14756,
        "learning_rate": 1e-4,
        "batch_size": 16,
        "losses": {"lm loss": loss},
        "loss_scale": 1.0,
        "grad_norm": 2.9184,
    }
    return tf.megatron_step(iteration, **(args | kw))


def test_megatron_lines_as_training_log_prints_them():
    lines = [
        megatron_line(1, 10.123456789, throughput=123.4),
        megatron_line(2, 7.399415, grad_norm=None, learning_rate=None),
        tf.megatron_validation("iteration 2", {"lm loss": 7.1234567}),
    ]
    steps, evals = parse(lines, "megatron", tokens_per_step=16 * 4096)
    assert [(s.step, s.loss) for s in steps] == [(1, 10.12346), (2, 7.399415)]
    assert steps[0].step_time_s == pytest.approx(1.1476) and steps[0].grad_norm == 2.918
    assert steps[1].grad_norm is None
    assert [(e.step, e.val_loss) for e in evals] == [(2, 7.123457)]


def test_megatron_test_set_loss_is_no_validation():
    """After training Megatron prints the validation set's loss and then the test set's, both "at iteration N":
    the test loss (here far lower) must not stand for the validation loss."""
    end = [
        megatron_line(1000, 3.2),
        tf.megatron_validation("iteration 1000 on validation set", {"lm loss": 3.3}),
        tf.megatron_validation("iteration 1000 on test set", {"lm loss": 2.1}),
    ]
    assert [(e.step, e.val_loss) for e in parse(end, "megatron")[1]] == [(1000, 3.3)]
    assert parse([end[0], end[2]], "megatron")[1] == []  # --do-test without validation: nothing to read


# ------------------------------------------------------------------------------------------- litgpt


def litgpt_sample(accum=4, steps=7):
    return tf.litgpt_run(
        accum=accum,
        micro=2,
        seq=32,
        steps=steps,
        eval_interval=3,
        losses=[4.28174 - 0.01 * k for k in range(steps)],
        iter_times=[0.05] * steps,  # the last micro-batch and the optimizer step
        step_times=[0.05 * accum + 0.01] * steps,  # the whole step
        val_losses=[4.275317, 4.233382],
        final_val=4.221312,
    )


def test_litgpt_step_and_validation_lines():
    lines, _ = litgpt_sample()
    assert lines[0].startswith("Epoch 1 | iter 4 step 1 | loss train: 4.282, val: n/a | iter time: 50.00 ms (step)")
    steps, evals = parse(lines, "litgpt", tokens_per_step=8 * 32)
    assert [s.step for s in steps] == list(range(1, 8))
    assert [s.loss for s in steps] == [round(4.28174 - 0.01 * k, 3) for k in range(7)]  # 3 decimals
    assert {s.step_time_s for s in steps} == {0.05}  # what the line says: the last micro-batch's time
    # validations are printed as "iter 12: ..." and "iter 24: ...": steps 3 and 6, not 12 and 24; the step
    # lines' "val: 4.275" repeats the last one and is not read; the final evaluation belongs to the last step
    assert [(e.step, e.val_loss) for e in evals] == [(3, 4.2753), (6, 4.2334), (7, 4.221)]


def test_litgpt_validation_at_an_unprinted_iteration_is_bad_input():
    lines, _ = litgpt_sample()
    with pytest.raises(log_formats.MetricsError, match="iteration 12, where no step line was printed"):
        parse([line for line in lines if "iter 12 step" not in line], "litgpt", tokens_per_step=256)


def test_litgpt_real_run_output():
    """stdout of a real litgpt 0.5.13 pretrain run (tests/fixtures/litgpt-0.5.13/make.py)."""
    steps, evals = parse(REAL.joinpath("stdout.txt").read_text().splitlines(), "litgpt", tokens_per_step=8 * 32)
    assert [s.step for s in steps] == list(range(1, 11))
    assert steps[0].loss == 4.282 and steps[-1].loss == 4.26
    assert [(e.step, e.val_loss) for e in evals] == [(4, 4.2753), (8, 4.2334), (10, 4.221)]


def test_a_custom_val_regex_by_iteration_needs_the_iteration_on_step_lines():
    with pytest.raises(ValueError, match="needs an iter group"):
        log_formats.make_preset(
            "x",
            r"step (?P<step>\d+) loss (?P<loss>\S+) (?P<step_time_s>\S+)",
            r"iter (?P<iter>\d+) val (?P<val_loss>\S+)",
        )
    with pytest.raises(ValueError, match="not both"):
        log_formats.make_preset(
            "x",
            r"it (?P<iter>\d+) step (?P<step>\d+) loss (?P<loss>\S+) (?P<step_time_s>\S+)",
            r"it (?P<iter>\d+) step (?P<step>\d+) val (?P<val_loss>\S+)",
        )


# ----------------------------------------------------------------------------------------- CSV route


def write_csv(path: Path, logged) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = tf.ExperimentWriter(path)
    for metrics, step in logged:
        writer.log_metrics(metrics, step)
    return path


def read(path, columns="litgpt", tokens_per_step=256):
    cols = csv_metrics.columns_of(columns) if columns is not None else None
    return csv_metrics.read_csv(path, cols, tokens_per_step, 1)


def test_litgpt_csv_gives_steps_whole_step_times_and_validations(tmp_path):
    _, logged = litgpt_sample(accum=4)
    path = write_csv(tmp_path / "logs/csv/version_0/metrics.csv", logged)
    header = path.read_text().splitlines()[0]
    assert "val_loss" in header  # Lightning rewrote the file when the validation's columns came
    steps, evals = read(tmp_path / "logs/csv/version_*/metrics.csv")
    assert [s.step for s in steps] == list(range(1, 8))
    assert steps[0].loss == pytest.approx(4.28174)  # full precision, not the 3 decimals printed
    # the whole step (4 micro-batches), from the time column, not the iter time (the last micro-batch)
    assert [s.step_time_s for s in steps] == pytest.approx([0.21] * 7)
    assert [(e.step, e.val_loss) for e in evals] == [(3, 4.275317), (6, 4.233382), (7, 4.221312)]
    assert {s.tokens for s in steps} == {256} and steps[0].lr == 1e-3


def test_litgpt_csv_of_a_real_run():
    steps, evals = read(REAL / "metrics.csv")
    assert [s.step for s in steps] == list(range(1, 11))
    assert [(e.step, round(e.val_loss, 4)) for e in evals] == [(4, 4.2753), (8, 4.2334), (10, 4.2213)]
    assert sum(s.step_time_s for s in steps) == pytest.approx(12.181391283000266)  # the last row's time


def test_csv_with_another_global_batch_is_refused(tmp_path):
    """tokens_per_step that is not the run's global batch: the steps would be miscounted."""
    _, logged = litgpt_sample(accum=4)
    path = write_csv(tmp_path / "m.csv", logged)
    with pytest.raises(log_formats.MetricsError, match="not a whole number of steps of 384 tokens"):
        read(path, tokens_per_step=384)
    assert [s.step for s in read(path, tokens_per_step=128)[0]][:2] == [2, 4]  # half: caught by the steps count


def test_csv_missing_file_and_column_name_the_field(tmp_path):
    with pytest.raises(log_formats.MetricsError, match=r"no such file \(workload.metrics.csv"):
        read(tmp_path / "logs/csv/version_*/metrics.csv")
    _, logged = litgpt_sample()
    no_time = [({k: v for k, v in m.items() if k != "time"}, s) for m, s in logged]
    with pytest.raises(log_formats.MetricsError, match=r"no column 'time' \(workload.metrics.columns: elapsed_s\)"):
        read(write_csv(tmp_path / "a.csv", no_time))
    with pytest.raises(log_formats.MetricsError, match=r"map exactly one of step_time_s or elapsed_s"):
        read(write_csv(tmp_path / "b.csv", [({"step": 1, "loss": 2.0}, 0)]), columns=None)


def test_csv_own_names_and_a_torn_last_row(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("step,loss,step_time_s,tokens,val_loss\n1,2.5,0.1,64,\n2,2.4,0.1,64,\n2,,,,2.6\n3,2.3,0.1")
    steps, evals = read(path, columns=None, tokens_per_step=None)
    assert [s.step for s in steps] == [1, 2] and [(e.step, e.val_loss) for e in evals] == [(2, 2.6)]


def test_column_maps_are_vetted():
    with pytest.raises(ValueError, match="unknown CSV column preset 'lit'"):
        csv_metrics.columns_of("lit")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['wall'\]"):
        csv_metrics.columns_of({"wall": "time"})
    with pytest.raises(ValueError, match="exactly one of step or tokens_seen"):
        csv_metrics.columns_of({"loss": "loss", "elapsed_s": "time"})


# ---------------------------------------------------------------------- the routes in a command workload

TRAINER = FIXTURES / "litgpt_like_trainer.py"


def litgpt_workload(metrics: dict, **extra) -> CommandWorkload:
    spec = {
        "argv": ["{python}", str(TRAINER), "--micro={micro}", "--global-batch=8", "--steps={steps}", "--out={out_dir}"],
        "knobs": {"micro": {"default": 2, "choices": [1, 2, 4, 8], "means": "micro_batch"}},
        "metrics": metrics,
        "tokens_per_step": "8 * 16",
    }
    return CommandWorkload(CommandSpec.model_validate(spec | extra), FIXTURES)


def test_both_litgpt_routes_through_a_command_workload(tmp_path):
    """Micro-batch 1 of 8: the log line's iter time is one of 8 micro-batches; the CSV's time is the step."""
    csv_route = litgpt_workload({"csv": "{out_dir}/logs/csv/version_*/metrics.csv", "columns": "litgpt"})
    recipe = csv_route.resolve({"micro": 1})
    stale = tmp_path / "logs/csv/version_0/metrics.csv"
    write_csv(stale, [({"loss": 9.0, "total_tokens": 128, "time": 1.0, "learning_rate": 1.0}, 0)])
    seen: list[int] = []
    by_csv = csv_route.run(recipe, 6, tmp_path, timeout_s=60, progress=seen.append)
    assert by_csv.status == "ok", by_csv.cause
    assert not stale.exists() and (tmp_path / "logs/csv/version_1/metrics.csv").is_file()  # Lightning's next
    by_log = litgpt_workload({"regex_preset": "litgpt"}).run(recipe, 6, tmp_path / "log", timeout_s=60)
    assert by_log.status == "ok", by_log.cause
    assert [s.step for s in by_csv.steps] == [s.step for s in by_log.steps] == list(range(1, 7))
    assert [round(s.loss, 3) for s in by_csv.steps] == [s.loss for s in by_log.steps]
    assert [e.step for e in by_csv.evals] == [e.step for e in by_log.evals] == [3, 6]
    whole = sorted(s.step_time_s for s in by_csv.steps)[3]
    last_micro = sorted(s.step_time_s for s in by_log.steps)[3]
    assert whole > 4 * last_micro  # 8 sleeps of 10 ms against one
    assert seen and seen[-1] == 6


def test_csv_route_spec_errors():
    with pytest.raises(SpecError, match="only used together with csv") as e:
        litgpt_workload({"regex_preset": "litgpt", "columns": "litgpt"})
    assert e.value.field == "metrics.columns"
    with pytest.raises(SpecError, match="unknown CSV column preset") as e:
        litgpt_workload({"csv": "{out_dir}/m.csv", "columns": "nope"})
    with pytest.raises(SpecError, match="counts steps in tokens") as e:
        litgpt_workload({"csv": "{out_dir}/m.csv", "columns": "litgpt"}, tokens_per_step=None)
    assert e.value.field == "tokens_per_step"
    with pytest.raises(SpecError, match="placeholder {run} names no knob") as e:
        litgpt_workload({"csv": "{out_dir}/{run}/m.csv", "columns": "litgpt"})
    assert e.value.field == "metrics.csv"


def test_watch_reads_a_csv_route_run_folder(tmp_path):
    """`recipetune watch` finds the CSV file under a run folder (the newest version_N) and reads its curves."""
    from recipetune.config import load_campaign
    from recipetune.speed.watch_read import metrics_files, read_curves

    file = tmp_path / "c.yaml"
    file.write_text(f"""workload:
  kind: command
  argv: ["{{python}}", "{TRAINER}", "--micro={{micro}}", "--global-batch=8", "--steps={{steps}}", "--out={{out_dir}}"]
  knobs:
    micro: {{default: 2, choices: [1, 2, 4, 8]}}
  metrics: {{csv: "{{out_dir}}/logs/csv/version_*/metrics.csv", columns: litgpt}}
  tokens_per_step: "8 * 32"
baseline: {{micro: 2}}
""")
    c = load_campaign(file)
    run = tmp_path / "run"
    _, logged = litgpt_sample(accum=4)
    old = write_csv(run / "logs/csv/version_0/metrics.csv", [({"loss": 9.0, "total_tokens": 256, "time": 1.0}, 0)])
    os.utime(old, (1e9, 1e9))  # an earlier run's file
    write_csv(run / "logs/csv/version_1/metrics.csv", logged)
    files = metrics_files(c, run)
    stream = read_curves(c, run, files)
    assert len(stream.loss.steps) == 7 and len(stream.val.steps) == 3  # version_1's, not the older file's


def _section_yamls(title: str) -> list[str]:
    page = (Path(__file__).resolve().parents[1] / "docs" / "own-trainer.md").read_text()
    section = page.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```yaml\n(.*?)```", section, flags=re.S)


# torchtitan's command-line options at b5bcd76 that the torchtitan section uses
# (tests/unit_tests/test_no_new_cli_options.py there lists every frozen option)
TITAN_OPTIONS = {
    "--module",
    "--config",
    "--training.num_tokens_per_microbatch_per_dp_rank",
    "--training.num_tokens_per_train_step",
    "--training.max_context_length",
    "--training.steps",
    "--metrics.log_freq",
    "--debug.seed",
    "--compile.enable",
    "--compile.no-enable",
}


def test_the_torchtitan_and_litgpt_sections_yaml_loads_as_written(tmp_path):
    from recipetune.config import load_campaign

    (titan,) = _section_yamls("torchtitan")
    (tmp_path / "titan.yaml").write_text(titan)
    w = load_campaign(tmp_path / "titan.yaml").workload
    for values in ({"micro": 2, "compile": True, "ac": "full"}, {"micro": 8, "compile": False, "ac": "none"}):
        argv = w.command(w.resolve(values), 10, tmp_path)
        flags = {a.split("=")[0] for a in argv[4:] if a.startswith("--")}
        assert flags <= TITAN_OPTIONS, flags - TITAN_OPTIONS
        assert f"--training.num_tokens_per_microbatch_per_dp_rank={values['micro'] * 8192}" in argv
        assert ("--compile.enable" in argv) is values["compile"] and argv[-1] == f"activation-checkpoint:{values['ac']}"
    assert not [a for a in argv if "local_batch_size" in a or "config_file" in a or "activation_checkpoint." in a]

    (lit,) = _section_yamls("litgpt")
    (tmp_path / "lit.yaml").write_text(lit)
    c = load_campaign(tmp_path / "lit.yaml")
    assert c.workload.csv_columns == csv_metrics.PRESETS["litgpt"]
    assert all(spec.means for spec in c.config.workload.knobs.values())


def test_the_litgpt_example_campaign_loads():
    from recipetune.config import load_campaign

    c = load_campaign(Path(__file__).resolve().parents[1] / "examples" / "litgpt" / "campaign.yaml")
    assert c.workload.csv_columns == csv_metrics.PRESETS["litgpt"] and c.workload.tokens_per_step(c.baseline) == 256
