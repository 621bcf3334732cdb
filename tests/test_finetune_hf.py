"""The Hugging Face route: a tiny Llama built from a config with a locally trained tokenizer, fine-tuned
by TRL's SFTTrainer (full and LoRA), evaluated like the reference route; a chat task through every
command. Nothing is downloaded."""

from __future__ import annotations

import json

import pytest
from ft_fixtures import SYSTEM, experiment_file, reverse_task, shaped_task, tiny_llama
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.engine.store import CampaignStore
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


@pytest.mark.slow
def test_a_chat_task_end_to_end_on_the_hf_route(tmp_path, monkeypatch):
    """data run, ft run, a finetune campaign of 3 experiments and its report, on conversations rendered
    by the tiny Llama's chat template."""
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    files = shaped_task(tmp_path, "chat", n_train=24)
    model = {"kind": "hf", "path": str(tiny_llama(tmp_path / "llama", files))}
    task = {"name": "reverse-chat", "format": "chat", "files": {k: str(v) for k, v in files.items()},
            "generation": {"max_new_tokens": 4}}
    search = {"knobs": {"lr": [1e-3, 3e-3], "gradient_checkpointing": [False, True]}, "budget": {"trials": 3},
              "seeds": [1, 2]}
    recipe = {"max_steps": 2, "batch_size": 4, "max_seq_len": 64, "lr": 1e-3, "threads": 1}
    path = experiment_file(tmp_path, files, model, task=task, data=[{"op": "dedup_exact"}], recipe=recipe,
                           search=search)

    res = runner.invoke(app, ["data", "run", str(path), "--out", str(tmp_path / "data")])
    assert res.exit_code == 0 and "dedup_exact" in res.output, res.output
    assert json.loads((tmp_path / "data" / "data_version.json").read_text())["rows_out"] == 18  # 18 distinct words

    res = runner.invoke(app, ["ft", "run", str(path), "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["route"] == "hf" and report["status"] == "ok" and report["validation"]["n_examples"] == 4
    first = json.loads((tmp_path / "run" / "predictions.jsonl").read_text().splitlines()[0])
    assert first["prompt"] == f"System: {SYSTEM}\nUser: alpha\nAssistant: " and first["target"] == "ahpla"

    camp = tmp_path / "camp"
    res = runner.invoke(app, ["finetune", str(path), "--budget", "3", "--out", str(camp)])
    assert res.exit_code == 0, res.output
    recs = [r for r in CampaignStore(camp).records() if r.state == "COMPLETE"]
    assert len(recs) == 3 and all(r.attrs["status"] == "passed" for r in recs), [r.attrs for r in recs]
    assert json.loads((camp / "verdict.json").read_text())["decision"] in ("APPROVED", "KEEP BASELINE")
    test_words = [w for line in files["test"].read_text().splitlines()
                  for w in (json.loads(line)["messages"][1]["content"],)]
    for p in camp.rglob("*"):  # the search never saw the test split
        if p.is_file() and "final" not in p.relative_to(camp).parts and p.suffix in (".json", ".jsonl"):
            assert not any(w in p.read_text(errors="replace") for w in test_words), p
    res = runner.invoke(app, ["report", str(camp)])
    assert res.exit_code == 0 and (camp / "report.html").is_file(), res.output
