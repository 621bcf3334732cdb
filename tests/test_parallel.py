"""Parallel layouts of the reference trainer: same maths in every layout, bad layouts refused early.

Each layout trains for real under torchrun over gloo (CPU). A launch costs ~5-10 s of start-up, so
each run also switches on the knobs that must not change the maths in that layout (accumulation,
activation checkpointing, optimizer implementations, EWA with evaluation in the middle).
"""

from __future__ import annotations

import json

import pytest

from recipetune.core.recipe import KnobError
from recipetune.speed.facts import PLAYBOOK
from recipetune.trainer.knobs import check_recipe, reference_knobs
from recipetune.trainer.layout import LAYOUT_RELATION, Layout
from recipetune.workloads.reference import ReferenceWorkload

BASE = {
    "model": "nano", "seq_len": 32, "global_batch_size": 16, "micro_batch_size": 8, "lr": 3e-3,
    "warmup_steps": 2, "num_threads": 1, "eval_batches": 1, "ewa_decay": 0.9, "eval_interval": 3,
}
STEPS = 6
# A guard against a hung launch, not a budget: on a loaded 2-core machine these runs get a small share
# of the CPU, and bf16 is ~30x slower than fp32 there (the mixed-precision run took 145 s under two hogs).
RUN_GUARD_S = 3600


def run(tmp_path, name: str, **knobs):
    w = ReferenceWorkload()
    result = w.run(w.resolve({**BASE, **knobs}), STEPS, tmp_path / name, timeout_s=RUN_GUARD_S)
    assert result.status == "ok", (name, result.cause, result.stderr_tail[-2000:])
    return result


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return run(tmp_path_factory.mktemp("single"), "single")


def test_every_layout_trains_the_same_curve(tmp_path, single):
    layouts = {
        # FSDP2 with accumulation (gradient sync only on the last micro-batch), no reshard, full AC,
        # fused optimizer; the evaluation at step 3 swaps EWA weights into sharded parameters
        "fsdp": dict(nproc=2, dp_shard=2, micro_batch_size=2, reshard_after_forward=False,
                     activation_checkpointing="full", optimizer_impl="fused"),
        # TP with sequence parallelism, every other block recomputed, foreach optimizer
        "tp-sp": dict(nproc=2, tp=2, sequence_parallel=True, activation_checkpointing="selective",
                      optimizer_impl="foreach"),
        # 2-D: FSDP2 x TP over 4 processes, plain TP (replicated norms)
        "fsdp-x-tp": dict(nproc=4, dp_shard=2, tp=2, micro_batch_size=4),
    }
    for name, knobs in layouts.items():
        result = run(tmp_path, name, **knobs)
        assert result.n_devices == knobs["nproc"]
        assert json.loads((tmp_path / name / "run.json").read_text())["layout"] == Layout.of(
            reference_knobs().resolve({**BASE, **knobs})).describe()
        assert result.losses() == pytest.approx(single.losses(), rel=1e-4, abs=1e-5), name
        assert [e.val_loss for e in result.evals] == pytest.approx([e.val_loss for e in single.evals], rel=1e-4), name
    assert single.losses()[-1] < single.losses()[0] - 0.5  # it learned: not two flat lines


def test_fsdp_mixed_precision_runs_close_to_fp32(tmp_path, single):
    # bf16 compute and gradient reduction: may change learning (semantic knobs), but only a little
    mixed = run(tmp_path, "bf16", nproc=2, dp_shard=2, fsdp_param_dtype="bf16", fsdp_reduce_dtype="bf16")
    assert mixed.losses() == pytest.approx(single.losses(), rel=1e-2)
    assert mixed.losses() != single.losses()  # the policy took effect


def resolve(**knobs) -> dict:
    return dict(reference_knobs().resolve({**BASE, **knobs}))


@pytest.mark.parametrize(("knobs", "expected"), [
    (dict(nproc=2, dp_shard=2, dp_replicate=2), "must equal nproc=2"),
    (dict(nproc=3, dp_shard=2), "does not divide nproc=3"),
    (dict(nproc=4, tp=4, model="small"), "tp=4 does not divide the model's n_head=6"),
    (dict(nproc=4, tp=4), "tp=4 does not divide the model's n_kv_head=2"),
    (dict(nproc=2, tp=2, model="tiny-moe"), "not implemented for mixture-of-experts"),
    (dict(sequence_parallel=True), "needs tp > 1"),
    (dict(reshard_after_forward=False), "no effect without FSDP"),
    (dict(fsdp_param_dtype="bf16", nproc=2), "no effect without FSDP"),
    (dict(nproc=2, dp_shard=2, dtype="fp16"), "dtype=fp16"),
    (dict(nproc=2, tp=2, noise_scale=True), "noise_scale"),
    (dict(nproc=2, dp_shard=2, compile="model"), "use compile='regional'"),
    (dict(nproc=2, tp=2, compile="regional"), "compile='none' with tensor parallelism"),
    (dict(nproc=2, tp=2, global_batch_size=12, micro_batch_size=8), "per-process batch 12"),
])
def test_bad_layouts_are_named(knobs, expected):
    problems = " | ".join(check_recipe(resolve(**knobs)))
    assert expected in problems


def test_good_layouts_pass_and_split_the_batch_over_data_parallel_ranks():
    for knobs in (dict(nproc=2), dict(nproc=2, dp_shard=2), dict(nproc=2, tp=2, sequence_parallel=True),
                  dict(nproc=4, dp_shard=2, tp=2), dict(nproc=4, dp_replicate=2, dp_shard=2),
                  dict(nproc=2, dp_replicate=2)):
        assert check_recipe(resolve(micro_batch_size=2, **knobs)) == [], knobs
    layout = Layout.of(resolve(nproc=4, dp_shard=2, tp=2))
    assert (layout.dp_replicate, layout.dp, [layout.dp_rank(r) for r in range(4)]) == (1, 2, [0, 0, 1, 1])
    assert Layout.of(resolve(nproc=2)).describe() == "dp_replicate=2"  # 0 = what nproc leaves: DDP


def test_layout_relation_is_declared_for_the_search():
    from recipetune.core import expr

    w = ReferenceWorkload()
    assert any(i.kind == "holds" and i.expr == LAYOUT_RELATION for i in w.invariants())
    assert expr.evaluate(LAYOUT_RELATION, resolve(nproc=4, dp_shard=2, tp=2))
    assert not expr.evaluate(LAYOUT_RELATION, resolve(nproc=2, dp_shard=2, tp=2))


def test_bad_layout_exits_2_before_anything_runs(tmp_path):
    from recipetune.trainer.__main__ import main

    (tmp_path / "r.json").write_text(json.dumps({**BASE, "nproc": 2, "tp": 2, "dp_shard": 2}))
    assert main(["--recipe", str(tmp_path / "r.json"), "--steps", "2", "--out", str(tmp_path)]) == 2
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "invalid" and "does not divide nproc=2" in status["cause"]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_cli_refuses_a_layout_that_does_not_fit_the_heads(tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from recipetune.cli import app

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    res = CliRunner().invoke(app, ["run", str(tiny), "model=small", "nproc=4", "tp=4", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    assert "tp=4 does not divide" in " ".join(res.output.split())
    assert not (tmp_path / "x").exists()


def test_old_compile_values_still_load_and_new_ones_are_named():
    knobs = reference_knobs()
    assert knobs.resolve({"compile": "off"})["compile"] == "none"
    assert knobs.resolve({"compile": "default"})["compile"] == "model"
    with pytest.raises(KnobError, match='"none", "model", "regional"'):
        knobs.resolve({"compile": "max-autotune"})
    # every knob declares whether it may change learning: the mixed-precision ones may
    assert knobs["fsdp_param_dtype"].may_change_learning and knobs["float8"].may_change_learning
    assert not any(knobs[k].may_change_learning for k in ("dp_shard", "dp_replicate", "tp", "sequence_parallel",
                                                            "reshard_after_forward", "compile", "compile_mode"))


def test_float8_is_refused_clearly_without_torchao_or_gpu():
    problems = check_recipe(resolve(float8="tensorwise"))
    assert len(problems) == 1 and "float8='tensorwise'" in problems[0]
    assert "torchao" in problems[0] or "GPU" in problems[0]


def test_playbook_rules_for_the_layout_knobs():
    from recipetune.engine.researcher import AnalystProposer, load_playbook

    analyst = AnalystProposer(load_playbook(builtin=PLAYBOOK))
    recipe = resolve(nproc=4, dp_shard=2, tp=2, micro_batch_size=4)
    common = dict(recipe, n_devices=4, device="cuda", accum_steps=1, data_share=0.0, optim_share=0.0)

    def fired(**facts) -> set[str]:
        return {rule.name for rule in analyst.fired({**common, **facts})}

    memory_bound = fired(mem_headroom=0.02, mfu=0.4, compute_share=0.5)
    assert {"shard-more", "sequence-parallel", "checkpoint-activations"} <= memory_bound
    assert not {"less-tensor-parallel", "keep-gathered-parameters"} & memory_bound
    assert "reshard-after-forward" in fired(mem_headroom=0.02, mfu=0.4, compute_share=0.5,
                                            reshard_after_forward=False)
    communication_bound = fired(mem_headroom=0.6, mfu=0.1, compute_share=0.5)
    assert {"less-tensor-parallel", "keep-gathered-parameters"} <= communication_bound
    assert "shard-more" not in communication_bound
    compute_bound = fired(mem_headroom=0.4, mfu=0.5, compute_share=0.9)
    assert "compile-regional" in compute_bound and "less-tensor-parallel" not in compute_bound
    assert "compile-model" in fired(mem_headroom=0.4, mfu=0.5, compute_share=0.9, compile="regional")


def test_layout_campaign_example_refuses_broken_layouts_statically():
    from pathlib import Path

    from recipetune.config import load_campaign
    from recipetune.guard.static import static_check

    c = load_campaign(Path(__file__).resolve().parents[1] / "examples" / "layouts-campaign.yaml")
    assert static_check(c.workload, c.baseline, c.baseline.with_(dp_shard=2)) == []
    assert static_check(c.workload, c.baseline, c.baseline.with_(tp=2, sequence_parallel=True)) == []
    (broken,) = static_check(c.workload, c.baseline, c.baseline.with_(dp_shard=2, tp=2))
    assert broken.rule == "relation" and broken.knob == "parallel layout"
