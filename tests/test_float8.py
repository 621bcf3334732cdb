"""float8 (torchao): a semantic knob, refused before anything runs where it cannot run, converted where it can.

The refusals name the knob, the device and its compute capability (float8 tensor cores need >= 8.9), and,
on a capable GPU without torchao, the extra to install. The conversion itself runs on CPU (torch 2.13 has
CPU float8 matmuls): which layers it converts, and that the converted model trains close to the original.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest
import torch

from recipetune.core.recipe import SPEED
from recipetune.trainer.knobs import check_recipe, reference_knobs
from recipetune.trainer.layout import check_float8

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
BASE = {"model": "nano", "seq_len": 32, "global_batch_size": 8, "micro_batch_size": 8, "num_threads": 1,
        "eval_batches": 1}


def resolve(**knobs) -> dict:
    return dict(reference_knobs().resolve({**BASE, **knobs}))


def gpu(monkeypatch, capability: tuple[int, int], name: str, torchao: bool = True) -> None:
    """Pretend this machine has one CUDA GPU of ``capability`` (and torchao installed, or not)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: (real(n, *a) if torchao else None) if n == "torchao" else real(n, *a))


def test_float8_is_a_semantic_knob_with_its_recipes():
    knob = reference_knobs()["float8"]
    assert knob.role != SPEED  # it changes the matmuls' rounding: the guard judges the loss
    assert knob.choices == ("none", "tensorwise", "rowwise")


def test_refused_on_cpu_naming_the_knob_the_device_and_the_capability():
    problems = check_recipe(resolve(float8="tensorwise", device="cpu"))
    assert len(problems) == 1
    p = problems[0]
    assert "float8='tensorwise'" in p and "device='cpu'" in p and "compute capability >= 8.9" in p
    assert "compute capability: none" in p


def test_refused_where_no_cuda_device_is_seen(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    [p] = check_float8(resolve(float8="rowwise"))
    assert "float8='rowwise'" in p and "no CUDA device" in p


@pytest.mark.parametrize("capability, name", [((8, 0), "NVIDIA A100-SXM4-80GB"), ((8, 6), "NVIDIA RTX A6000"),
                                              ((7, 0), "Tesla V100-SXM2-16GB")])
def test_refused_below_compute_capability_8_9_naming_the_gpu(monkeypatch, capability, name):
    gpu(monkeypatch, capability, name)
    [p] = check_float8(resolve(float8="tensorwise", device="cuda"))
    assert "float8='tensorwise'" in p and name in p and f"compute capability {capability[0]}.{capability[1]}" in p


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_accepted_from_8_9_up_and_without_torchao_names_the_extra(monkeypatch, capability):
    gpu(monkeypatch, capability, "NVIDIA H200", torchao=True)
    assert check_float8(resolve(float8="tensorwise", device="cuda")) == []
    gpu(monkeypatch, capability, "NVIDIA H200", torchao=False)
    [p] = check_float8(resolve(float8="tensorwise", device="cuda"))
    assert "torchao" in p and "pip install 'recipetune[float8]'" in p
    assert check_float8(resolve(float8="none", device="cuda")) == []


def test_the_trainer_exits_2_and_writes_nothing_else(tmp_path):
    from recipetune.trainer.__main__ import main

    (tmp_path / "r.json").write_text(json.dumps(resolve(float8="tensorwise", device="cpu")))
    assert main(["--recipe", str(tmp_path / "r.json"), "--steps", "2", "--out", str(tmp_path)]) == 2
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "invalid" and "float8='tensorwise'" in status["cause"]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_cli_exits_2_with_the_message(tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from recipetune.cli import app

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    res = CliRunner().invoke(app, ["run", str(tiny), "float8=rowwise", "device=cpu", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "float8='rowwise'" in out and "compute capability" in out and "Traceback" not in out
    assert not (tmp_path / "x").exists()


def test_eligible_layers_skip_the_head_the_router_and_dims_not_multiple_of_16():
    from recipetune.trainer.model import Transformer
    from recipetune.trainer.parallel import float8_eligible
    from recipetune.trainer.presets import PRESETS

    model = Transformer(PRESETS["nano-moe"])
    picked = {n for n, m in model.named_modules() if float8_eligible(m, n)}
    assert "lm_head" not in picked and not any(n.endswith("router") for n in picked)
    assert {"layers.0.attn.wq", "layers.0.attn.wk", "layers.1.attn.wo"} <= picked
    odd = Transformer(replace(PRESETS["nano"], ffn_hidden=88))  # 88 = 16 * 5.5
    picked = {n for n, m in odd.named_modules() if float8_eligible(m, n)}
    assert "layers.0.ffn.w1" not in picked and "layers.0.attn.wq" in picked


@pytest.mark.skipif(not HAS_TORCHAO, reason="the conversion needs torchao: pip install 'recipetune[float8]'")
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_conversion_runs_on_cpu_and_stays_close_to_the_original(recipe):
    import copy

    from recipetune.trainer.model import Transformer
    from recipetune.trainer.parallel import apply_float8, float8_eligible
    from recipetune.trainer.presets import PRESETS

    cfg = PRESETS["nano"]
    torch.manual_seed(0)
    model = Transformer(cfg)
    fp8 = copy.deepcopy(model)
    apply_float8(fp8, recipe)
    kinds = {n: type(m).__name__ for n, m in fp8.named_modules()}
    assert kinds["lm_head"] == "Linear" and kinds["layers.0.ffn.w1"] == "Float8Linear"
    assert sum(k == "Float8Linear" for k in kinds.values()) == sum(
        float8_eligible(m, n) for n, m in model.named_modules())
    idx = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for m in (model, fp8):
        logits, _ = m(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        losses.append(loss.item())
    # float8 e4m3 keeps ~2 significant digits per value: close, not equal (what the guard then judges)
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fp8.parameters())
