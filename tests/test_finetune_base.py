"""The reference route's base model: the shipped one is used only where it is what was asked for, here."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from recipetune.finetune import base_model
from recipetune.finetune.base_model import (
    BUILD_ENV,
    base_checkpoint,
    base_recipe,
    base_settings,
    base_to_build,
    shipped_refusal,
    stdlib_fingerprint,
)
from recipetune.finetune.cli import ensure_base
from recipetune.finetune.recipe import ModelSpec
from recipetune.trainer.knobs import reference_knobs

SMALL = ModelSpec(kind="reference", path="base", preset="nano", pretrain_steps=2, pretrain_seq_len=32)


def test_the_shipped_base_is_what_base_json_says(tmp_path):
    """Its full sha256, and the recipe and step the code would build it with now: a change to the build
    recipe that leaves the shipped file stale fails here, not in a user's first experiment."""
    meta = json.loads((base_model.SHIPPED / "base.json").read_text())
    spec = ModelSpec()  # the default experiment's base: base.json (tracked) describes it in every checkout
    assert (meta["preset"], meta["pretrain_seq_len"], meta["pretrain_steps"], meta["settings"]) == (
        spec.preset, spec.pretrain_seq_len, spec.pretrain_steps, base_settings(spec))
    path = base_model.SHIPPED / meta["file"]
    if not path.is_file():  # a binary is not tracked in git: a clone builds its base (the test below)
        pytest.skip(f"{path} is not in this checkout (placed there by a release or a local build)")
    assert len(meta["sha256"]) == 64 and hashlib.sha256(path.read_bytes()).hexdigest() == meta["sha256"]
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    # Knobs added to the reference trainer after the build (the layouts' ep, pp, cp ...) are absent from
    # the file: they must sit at their defaults, which train one process as before; every other knob
    # must be what the build would set now.
    now = base_recipe(spec)
    assert {k: now[k] for k in ckpt["recipe"]} == ckpt["recipe"] and ckpt["step"] == spec.pretrain_steps
    defaults = dict(reference_knobs().resolve({}))
    assert {k: now[k] for k in now if k not in ckpt["recipe"]} == {k: defaults[k] for k in now
                                                                    if k not in ckpt["recipe"]}
    if stdlib_fingerprint() == meta["corpus_fingerprint"]:  # this Python's stdlib is the text it learned
        assert shipped_refusal(spec) is None and base_to_build(spec, cache=tmp_path) is None
        assert base_checkpoint(spec, cache=tmp_path) == path
        assert not (tmp_path / "base").exists()  # nothing built
    else:
        assert "stdlib corpus" in shipped_refusal(spec)


def _ship(folder: Path, spec: ModelSpec, **meta) -> Path:
    """A shipped-base folder holding a small checkpoint and a base.json that matches ``spec`` here."""
    from ft_fixtures import nano_checkpoint

    folder.mkdir()
    ckpt = nano_checkpoint(folder / "base.pt")
    (folder / "base.json").write_text(json.dumps({
        "file": "base.pt", "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest(), "preset": spec.preset,
        "pretrain_seq_len": spec.pretrain_seq_len, "pretrain_steps": spec.pretrain_steps,
        "corpus_fingerprint": stdlib_fingerprint(), "corpus": "this Python's stdlib",
        "settings": base_settings(spec)} | meta))
    return folder


def test_a_matching_shipped_base_is_used_and_one_that_does_not_match_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(BUILD_ENV, raising=False)
    cache = tmp_path / "cache"
    good = _ship(tmp_path / "good", SMALL)
    assert shipped_refusal(SMALL, good) is None and base_to_build(SMALL, cache, good) is None
    assert base_checkpoint(SMALL, cache, shipped=good) == good / "base.pt"

    # each way of not being the model asked for, beside the match above
    other = ModelSpec(kind="reference", path="base", preset="nano", pretrain_steps=3, pretrain_seq_len=32)
    assert "asks for ('nano', 32, 3)" in shipped_refusal(other, good)
    older = _ship(tmp_path / "older", SMALL, settings=base_settings(SMALL) | {"lr": 1e-3})  # an earlier recipe
    assert f"built with lr=0.001; this version builds with lr={base_model.LR}" in shipped_refusal(SMALL, older)
    cached_now = base_model._cached(SMALL, cache)
    with monkeypatch.context() as m:  # nor is a build cached with other settings reused: its name differs
        m.setattr(base_model, "LR", 1e-3)
        assert base_model._cached(SMALL, cache) != cached_now
    foreign = _ship(tmp_path / "foreign", SMALL, corpus_fingerprint="0" * 16)
    assert f"fingerprint {'0' * 16}" in shipped_refusal(SMALL, foreign)
    prefix = _ship(tmp_path / "prefix", SMALL)  # a truncated digest is no digest
    meta = json.loads((prefix / "base.json").read_text())
    (prefix / "base.json").write_text(json.dumps(meta | {"sha256": meta["sha256"][:16]}))
    assert "sha256" in shipped_refusal(SMALL, prefix)
    monkeypatch.setenv(BUILD_ENV, "1")
    assert base_to_build(SMALL, cache, good) == (base_model._cached(SMALL, cache), f"{BUILD_ENV}=1")
    monkeypatch.delenv(BUILD_ENV)

    # one byte changed: refused, and built here for real (2 steps of nano), with the reason and progress shown
    bad = _ship(tmp_path / "bad", SMALL)
    raw = bytearray((bad / "base.pt").read_bytes())
    raw[-100] ^= 1
    (bad / "base.pt").write_bytes(bytes(raw))
    why = shipped_refusal(SMALL, bad)
    assert "not the one that was built" in why and hashlib.sha256(raw).hexdigest() in why
    monkeypatch.setattr(base_model, "SHIPPED", bad)
    monkeypatch.setenv("RECIPETUNE_CACHE", str(cache))
    from recipetune.finetune import cli

    printed: list[str] = []
    monkeypatch.setattr(cli.console, "print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    ensure_base(SMALL)
    built = base_model._cached(SMALL, cache)
    assert built.is_file() and any("the shipped base is not used" in p and "sha256" in p for p in printed)
    assert torch.load(built, map_location="cpu", weights_only=False)["recipe"] == base_recipe(SMALL)
    assert base_checkpoint(SMALL) == built and base_to_build(SMALL) is None  # cached from now on
    shutil.rmtree(cache)
