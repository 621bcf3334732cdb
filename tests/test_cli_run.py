"""`recipetune run`: a measured run, and bad input refused with exit code 2 and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()
FAST = ["model=nano", "seq_len=32", "num_threads=1", "eval_batches=1"]


def test_run_prints_the_measurements(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", str(EXAMPLES / "tiny.yaml"), "micro_batch_size=16", *FAST,
                              "--steps", "5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    for label in ("tokens/s", "tokens/s per device", "MFU", "peak memory", "loss"):
        assert label in res.output
    assert (out / "metrics.jsonl").exists() and (out / "recipe.json").exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("bogus_knob=1", "valid knobs are"),
        ("dtype=fp8", 'one of "fp32", "bf16", "fp16"'),
        ("micro_batch_size=0", "outside the domain"),
        ("data=/no/such/corpus", "baseline.data"),
        ("micro_batch_size=5", "does not divide"),
        ("run.steps=zero", "run.steps"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, override, expected):
    out = tmp_path / "never"
    res = runner.invoke(app, ["run", str(EXAMPLES / "tiny.yaml"), override, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.output.split())
    assert not out.exists()


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("baseline:\n  model: tiny\n   seq_len: [1\n")
    with pytest.raises(ConfigError) as err:
        load_campaign(bad)
    assert str(bad) in str(err.value) and "line" in str(err.value)


def test_unknown_section_is_named(tmp_path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("baseline: {model: tiny}\nserach: {}\n")
    with pytest.raises(ConfigError) as err:
        load_campaign(bad)
    assert err.value.field == "serach"


def test_relative_corpus_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "corpus.txt").write_text("hello world\n" * 2000)
    f = tmp_path / "c.yaml"
    f.write_text("baseline: {model: nano, data: corpus.txt, seq_len: 32}\n")
    assert load_campaign(f).baseline["data"] == str(tmp_path / "corpus.txt")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"baseline: {model: nano, lr: .nan}\n", "baseline.lr: knob 'lr': nan is not a finite number"),
        (b"baseline: {model: nano, lr: .inf}\n", "baseline.lr: knob 'lr': inf is not a finite number"),
        (bytes(range(256)) * 4, "not a text file: byte 128 is not UTF-8"),
        (b"baseline: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
        (b"baseline:\n" + b"".join(b"  " * i + b"k%d:\n" % i for i in range(1, 600)) + b"  " * 600 + b"x: 1\n",
         "nested too deeply"),
    ],
    ids=["nan", "inf", "binary", "deep-flow", "deep-block"],
)
@pytest.mark.parametrize("command", ["run", "tune"])
def test_bad_files_exit_2_name_the_file_and_write_nothing(tmp_path, content, expected, command):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    out = tmp_path / "never"
    res = runner.invoke(app, [command, str(bad), "--out", str(out)])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert str(bad) in text.replace(" ", "") or str(bad) in text
    assert expected in text and "Traceback" not in res.output
    assert not out.exists()


def test_a_nan_knob_value_is_refused_for_an_outside_trainer(tmp_path):
    # A command workload's number knob without bounds: any finite number, never nan or inf.
    camp = tmp_path / "c.yaml"
    camp.write_text((EXAMPLES / "command-fake.yaml").read_text().replace("../tests", str(EXAMPLES.parent / "tests"))
                    .replace("  grad_accum: 4\n", "  grad_accum: 4\n  lr: .nan\n")
                    .replace("  knobs:\n", "  knobs:\n    lr: {default: 0.01}\n"))
    with pytest.raises(ConfigError, match=r"baseline\.lr.*not a finite number"):
        load_campaign(camp)
