"""The Hugging Face route: a tiny Llama built from a config with a locally trained tokenizer, fine-tuned
by TRL's SFTTrainer (full and LoRA), evaluated like the reference route. Nothing is downloaded."""

from __future__ import annotations

import json

from ft_fixtures import experiment_file, reverse_task, tiny_llama
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.finetune.experiment import load_experiment, run_experiment

runner = CliRunner()


def test_hf_route_full_and_lora(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = reverse_task(tmp_path)
    model = {"kind": "hf", "path": str(tiny_llama(tmp_path / "llama", files))}
    path = experiment_file(tmp_path, files, model)
    out = tmp_path / "full"
    res = runner.invoke(app, ["ft", "run", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["route"] == "hf" and report["status"] == "ok" and report["loss"]["steps"] == 3
    assert report["validation"]["n_examples"] == 4 and report["loss"]["first"] > 0

    lora = run_experiment(load_experiment(path, ["method=lora", "lora_rank=2", "packing=true"]), tmp_path / "lora")
    assert lora.status == "ok", lora.cause
    assert lora.loss.steps == 3 and lora.validation is not None
