"""Tiny fine-tuning tasks and base models for the tests: written to a temporary folder, nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from recipetune.trainer.model import Transformer, get_model_config

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
         "whiskey", "xray", "yankee", "zulu"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reverse_task(folder: Path, n_train: int = 40) -> dict[str, Path]:
    """word -> reversed word; validation and test are disjoint words, train cycles through the rest."""
    val_words, test_words, train_words = WORDS[:4], WORDS[4:8], WORDS[8:]
    rows = lambda words: [{"word": w, "answer": w[::-1]} for w in words]  # noqa: E731
    train = [rows(train_words)[i % len(train_words)] | {"id": str(i)} for i in range(n_train)]
    return {
        "train": write_jsonl(folder / "train.jsonl", train),
        "validation": write_jsonl(folder / "val.jsonl", rows(val_words)),
        "test": write_jsonl(folder / "test.jsonl", rows(test_words)),
    }


SYSTEM = "Reverse the word."


def shaped_rows(words: list[str], shape: str) -> list[dict]:
    """The reverse task's rows in one of the task formats (finetune/task.py)."""
    if shape == "instruction":
        return [{"instruction": SYSTEM, "input": w, "output": w[::-1]} for w in words]
    if shape == "completion":
        return [{"prompt": f"reverse {w}: ", "completion": w[::-1]} for w in words]
    if shape == "chat":
        return [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": w},
                              {"role": "assistant", "content": w[::-1]}]} for w in words]
    return [{"word": w, "answer": w[::-1]} for w in words]


def shaped_task(folder: Path, shape: str, n_train: int = 24) -> dict[str, Path]:
    """``reverse_task`` in another shape: validation and test disjoint words, train cycling through the rest."""
    train = [shaped_rows(WORDS[8:], shape)[i % len(WORDS[8:])] for i in range(n_train)]
    return {"train": write_jsonl(folder / "train.jsonl", train),
            "validation": write_jsonl(folder / "val.jsonl", shaped_rows(WORDS[:4], shape)),
            "test": write_jsonl(folder / "test.jsonl", shaped_rows(WORDS[4:8], shape))}


def nano_checkpoint(path: Path) -> Path:
    """A reference-trainer checkpoint of the nano preset (random weights: the tests check plumbing)."""
    torch.manual_seed(0)
    model = Transformer(get_model_config("nano", vocab_size=256))
    torch.save({"model": model.state_dict(), "recipe": {"model": "nano", "seq_len": 64}, "step": 0}, path)
    return path


def experiment_file(folder: Path, files: dict[str, Path], model: dict, **sections) -> Path:
    spec = {
        "task": {"name": "reverse", "files": {k: str(v) for k, v in files.items()}, "prompt": "reverse {word}: ",
                 "target": "answer", "metric": "exact_match", "metrics": ["rouge_l"],
                 "generation": {"max_new_tokens": 4}},
        "data": [{"op": "dedup_exact", "fields": ["word", "id"]}],
        "model": model,
        "recipe": {"max_steps": 3, "batch_size": 4, "max_seq_len": 32, "lr": 1e-3, "threads": 1},
    }
    for key, value in sections.items():
        spec[key] = value
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def tiny_llama(folder: Path, files: dict[str, Path], **kwargs) -> Path:
    """A 1-layer Llama of width 32 with its tokenizer (and the small chat template, unless chat_template=None)."""
    from recipetune.finetune.hf import build_tiny_llama

    texts = [line for p in files.values() for line in p.read_text().splitlines()] + WORDS
    return build_tiny_llama(folder, texts, vocab_size=300, hidden=32, layers=1, **kwargs)


@pytest.fixture
def tiny_ft(tmp_path, monkeypatch):
    """A tiny task and a nano reference checkpoint in ``tmp_path``, with the cache there too."""
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    files = reverse_task(tmp_path)
    model = {"kind": "reference", "path": str(nano_checkpoint(tmp_path / "nano.pt"))}
    return tmp_path, files, model
