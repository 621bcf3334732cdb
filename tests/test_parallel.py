"""Parallel layouts of the reference trainer: same maths in every layout, bad layouts refused early.

Each layout trains for real under torchrun over gloo (CPU). A launch costs ~5-10 s of start-up, so
each run also switches on the knobs that must not change the maths in that layout (accumulation,
activation checkpointing, optimizer implementations, EWA with evaluation in the middle).
"""

from __future__ import annotations

import json

import pytest

from recipetune.core.recipe import SPEED, KnobError
from recipetune.speed.facts import PLAYBOOK
from recipetune.trainer.knobs import check_recipe, reference_knobs
from recipetune.trainer.layout import LAYOUT_RELATION, RELATIONS, Layout
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
    # RUN_GUARD_S catches a hang, not slowness: 6 steps took over 300 s under a load average of 10 here
    result = w.run(w.resolve({**BASE, **knobs}), STEPS, tmp_path / name, timeout_s=RUN_GUARD_S)
    assert result.status == "ok", (name, result.cause, result.stderr_tail[-2000:])
    return result


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return run(tmp_path_factory.mktemp("single"), "single")


@pytest.mark.slow  # real multi-process layouts (FSDP2, TP, 2-D over 4 processes): 1-2 min
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
    # experts, pipelines and long sequences
    (dict(nproc=2, dp_shard=2, ep=2), "ep=2 has no effect on the dense model 'nano'"),
    (dict(capacity_factor=1.25), "capacity_factor=1.25 has no effect on the dense model"),
    (dict(nproc=2, ep=2, model="nano-moe"), "ep=2 must divide dp_shard=1"),
    (dict(nproc=3, dp_shard=3, ep=3, model="nano-moe", global_batch_size=12, micro_batch_size=4),
     "ep=3 does not divide the model's n_experts=4"),
    (dict(nproc=2, pp=2, pp_microbatches=2, pp_schedule="Interleaved1F1B"), "4 pipeline stages (2 per rank"),
    (dict(nproc=2, pp=2), "pp_microbatches=1 must be at least pp=2"),
    (dict(nproc=2, pp=2, pp_microbatches=3), "divide micro_batch_size=8"),
    (dict(pp_microbatches=2), "pp_microbatches=2 has no effect without pipeline parallelism"),
    (dict(nproc=2, pp=2, pp_microbatches=2, dtype="bf16"), "autocast does not belong"),
    (dict(nproc=2, cp=2, device="cpu"), "cp=2 needs CUDA"),
    (dict(nproc=2, cp=2, device="cpu", model="nano-moe"), "context parallelism is for the dense models"),
    (dict(nproc=2, cp=2, device="cpu", attention="math"), "needs attention='sdpa'"),
    (dict(nproc=2, dp_shard=2, ep=2, model="nano-moe", compile="regional"), "not combined with pp, cp or ep"),
    (dict(nproc=4, pp=2, dp_shard=4, pp_microbatches=2), "pp=2 * dp_shard=4 * cp=1 * tp=1 = 8 does not divide"),
])
def test_bad_layouts_are_named(knobs, expected):
    problems = " | ".join(check_recipe(resolve(**knobs)))
    assert expected in problems


def test_good_layouts_pass_and_split_the_batch_over_data_parallel_ranks():
    for knobs in (dict(nproc=2), dict(nproc=2, dp_shard=2), dict(nproc=2, tp=2, sequence_parallel=True),
                  dict(nproc=4, dp_shard=2, tp=2), dict(nproc=4, dp_replicate=2, dp_shard=2),
                  dict(nproc=2, dp_replicate=2), dict(nproc=2, pp=2, pp_microbatches=2),
                  dict(nproc=2, dp_shard=2, ep=2, model="nano-moe", expert_impl="grouped", capacity_factor=1.5),
                  dict(nproc=4, pp=2, dp_shard=2, ep=2, pp_microbatches=2, model="nano-moe"),
                  dict(nproc=4, pp=2, pp_schedule="ZBVZeroBubble", pp_microbatches=2, model="tiny", tp=2)):
        assert check_recipe(resolve(micro_batch_size=2, **knobs)) == [], knobs
    layout = Layout.of(resolve(nproc=4, dp_shard=2, tp=2))
    assert (layout.dp_replicate, layout.dp, [layout.dp_rank(r) for r in range(4)]) == (1, 2, [0, 0, 1, 1])
    assert Layout.of(resolve(nproc=2)).describe() == "dp_replicate=2"  # 0 = what nproc leaves: DDP
    # mesh order (pp, dp_replicate, dp_shard, cp, tp): the two pipeline ranks of a data-parallel rank
    # share its batch, and the ep ranks are dp_shard ranks (other batches)
    layout = Layout.of(resolve(nproc=4, pp=2, dp_shard=2, ep=2, model="nano-moe"))
    assert [layout.dp_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert [layout.pp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert layout.describe() == "pp=2 x dp_shard=2 (experts over ep=2 of the dp_shard ranks)"


def test_layout_relations_are_declared_for_the_search():
    from recipetune.core import expr

    w = ReferenceWorkload()
    holds = {i.name: i.expr for i in w.invariants() if i.kind == "holds"}
    assert holds["parallel layout"] == LAYOUT_RELATION and RELATIONS.items() <= holds.items()
    assert expr.evaluate(LAYOUT_RELATION, resolve(nproc=4, dp_shard=2, tp=2))
    assert expr.evaluate(LAYOUT_RELATION, resolve(nproc=4, pp=2, dp_shard=2, pp_microbatches=2))
    assert not expr.evaluate(LAYOUT_RELATION, resolve(nproc=2, dp_shard=2, tp=2))
    # stages divide layers: the preset's layer count is part of the relation (the model is a name)
    stages = RELATIONS["pipeline stages divide the model's layers"]
    assert expr.evaluate(stages, resolve(model="tiny", pp=2, pp_schedule="ZBVZeroBubble"))  # 4 stages, 4 layers
    assert not expr.evaluate(stages, resolve(model="nano", pp=2, pp_schedule="ZBVZeroBubble"))  # 4 stages, 2 layers
    assert not expr.evaluate(stages, resolve(model="small", pp=4))  # 6 layers
    assert not expr.evaluate(stages, resolve(pp_schedule="GPipe"))  # a schedule without a pipeline


def test_search_repairs_a_broken_pipeline_and_the_static_check_names_it():
    from recipetune.guard.static import static_check

    w = ReferenceWorkload()
    base = w.resolve({**BASE, "model": "tiny", "nproc": 2})
    space = {"pp": [1, 2], "pp_microbatches": [1, 2, 4], "pp_schedule": ["1F1B", "ZBVZeroBubble"],
             "dp_replicate": [0, 1, 2]}
    # the analyst asks for pp=2: one pipeline micro-batch is too few for 2 stages, dp_replicate=0 follows
    fixed = w.relations().repair(base.with_(pp=2), keep={"pp"}, space=space)
    assert fixed.ok and fixed.recipe["pp_microbatches"] == 2 and "pp_microbatches 1 -> 2" in fixed.note
    assert check_recipe(dict(fixed.recipe)) == []
    # back to pp=1: the pipeline knobs return to their defaults
    back = w.relations().repair(fixed.recipe.with_(pp=1), keep={"pp"}, space=space)
    assert back.ok and back.recipe["pp_microbatches"] == 1
    # experts over 2 ranks from a pipelined MoE recipe: ep needs dp_shard=2, which leaves no room for the
    # pipeline, whose schedule and micro-batches then return to their defaults: the coupled relations' knobs
    # move too (the relation broken first, ep's, has only dp_shard)
    moe = w.resolve({**BASE, "model": "tiny-moe", "nproc": 2, "pp": 2, "pp_microbatches": 2,
                     "pp_schedule": "Interleaved1F1B"})
    space = {**space, "dp_shard": [1, 2], "ep": [1, 2]}
    ep = w.relations().repair(moe.with_(ep=2), keep={"ep"}, space=space)
    assert ep.ok, ep.note
    assert {k: ep.recipe[k] for k in ("ep", "dp_shard", "pp", "pp_microbatches", "pp_schedule")} == {
        "ep": 2, "dp_shard": 2, "pp": 1, "pp_microbatches": 1, "pp_schedule": "1F1B"}
    assert check_recipe(dict(ep.recipe)) == []
    broken = static_check(w, base, base.with_(pp=2, pp_microbatches=2, pp_schedule="Interleaved1F1B", model="tiny",
                                              nproc=2))
    assert not broken  # 4 stages of 4 layers
    nano = w.resolve({**BASE, "nproc": 2})
    (relation, *_) = static_check(w, nano, nano.with_(pp=2, pp_microbatches=2, pp_schedule="Interleaved1F1B"))
    assert relation.rule == "relation" and relation.knob == "pipeline stages divide the model's layers"


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
    assert knobs["fsdp_param_dtype"].role != SPEED and knobs["float8"].role != SPEED
    assert all(knobs[k].role == SPEED for k in ("dp_shard", "dp_replicate", "tp", "sequence_parallel",
                                                "reshard_after_forward", "compile", "compile_mode"))


def test_float8_is_refused_clearly_without_torchao_or_gpu():
    problems = check_recipe(resolve(float8="tensorwise"))
    assert len(problems) == 1 and "float8='tensorwise'" in problems[0]
    assert "torchao" in problems[0] or "GPU" in problems[0]


def test_playbook_rules_for_the_layout_knobs():
    from recipetune.engine.playbook import load_playbook
    from recipetune.engine.proposers import AnalystProposer

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


# --- experts, pipelines, long sequences (issue 35) ----------------------------------------------------


def test_pipeline_stages_compose_to_the_model_with_its_gradient():
    # Without processes: the stages of a split run in order give the model's logits, and the MoE balance
    # loss each stage adds to its own backward gives the whole model's gradient (the tied embedding's
    # as the sum of its two copies', which pipeline.py adds up after backward).
    import torch
    import torch.nn.functional as F

    from recipetune.trainer.model import PRESETS, Transformer
    from recipetune.trainer.pipeline import split, stage_ids

    torch.manual_seed(0)
    model = Transformer(PRESETS["nano-moe"])
    x, y = torch.randint(0, 256, (2, 2, 16)).unbind(0)
    logits, aux = model(x)
    (F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") + aux).backward()
    first, last = split(model, [0, 1], 2, stage_batch=2)
    assert list(first.layers) == ["0"] and list(last.layers) == ["1"] and last.tok_emb is None
    out = last(first(x))
    torch.testing.assert_close(out, logits, rtol=0, atol=1e-6)
    F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="sum").backward()
    torch.testing.assert_close(first.layers["0"].ffn.router.weight.grad, model.layers["0"].ffn.router.weight.grad)
    torch.testing.assert_close(first.tok_emb.weight.grad + last.lm_head.weight.grad, model.tok_emb.weight.grad)
    assert [stage_ids("ZBVZeroBubble", 2, r) for r in (0, 1)] == [[0, 3], [1, 2]]
    assert [stage_ids("Interleaved1F1B", 2, r) for r in (0, 1)] == [[0, 2], [1, 3]]


@pytest.mark.slow
def test_expert_and_pipeline_layouts_train_the_same_curve(tmp_path, single):
    # Each against one process with the same forward batch: an MoE's balance loss is computed over each
    # forward's micro-batch (a product of two batch means), so another split trains another curve
    # (docs/parallel.md: nano-moe, micro-batch 16 against 4, 0.0067 nats in 8 steps).
    moe = dict(model="nano-moe", expert_impl="grouped")
    tiny_moe = dict(moe, model="tiny-moe")
    cases = {
        # experts split over the 2 FSDP ranks, tokens dispatched by all-to-all, capacity limit on
        "ep": (dict(nproc=2, dp_shard=2, ep=2, capacity_factor=1.25, **moe), dict(capacity_factor=1.25, **moe)),
        # 1F1B over 2 stages with the tied embedding split between them
        "pp-1f1b": (dict(nproc=2, pp=2, pp_microbatches=2), dict()),
        # zero-bubble, V-shaped: 4 stages of tiny-moe's 4 blocks, rank 0 holding the first and the last; the
        # balance loss joins each stage's split backward (input, then weight gradients)
        "pp-zbv": (dict(nproc=2, pp=2, pp_schedule="ZBVZeroBubble", pp_microbatches=2, model="tiny-moe"),
                   dict(model="tiny-moe", micro_batch_size=4)),
        # 3-D: pipeline x FSDP2 with experts parallel over its ranks, 2 pipeline micro-batches of 2, on the
        # campaign's tiny-moe (2 blocks a stage), where a rank's experts receive no token at times
        "pp-fsdp-ep": (dict(nproc=4, pp=2, dp_shard=2, ep=2, pp_microbatches=2, micro_batch_size=4, **tiny_moe),
                       dict(micro_batch_size=2, **tiny_moe)),
        # pipeline x tensor parallel with sequence parallelism
        "pp-tp-sp": (dict(nproc=4, pp=2, tp=2, sequence_parallel=True, pp_microbatches=2), dict()),
    }
    refs = {}
    for name, (knobs, reference) in cases.items():
        key = json.dumps(reference, sort_keys=True)
        if key not in refs:
            refs[key] = single if not reference else run(tmp_path, f"single-{len(refs)}", **reference)
        ref = refs[key]
        result = run(tmp_path, name, **knobs)
        assert result.losses() == pytest.approx(ref.losses(), rel=1e-5, abs=1e-6), name
        assert [e.val_loss for e in result.evals] == pytest.approx([e.val_loss for e in ref.evals], rel=1e-5), name
        stream = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        steps = [s for s in stream if "loss" in s]
        if knobs.get("ep", 1) > 1:
            assert all(s["a2a_s"] > 0 and s["a2a_s_max"] >= s["a2a_s"] for s in steps), name
        if knobs.get("pp", 1) > 1:
            assert all(0 <= s["pp_bubble"] <= s["pp_bubble_max"] < 1 for s in steps), name
            assert all(len(s["stage_mem_bytes"]) == 2 for s in steps), name
        if knobs.get("model", "").endswith("moe"):
            assert all(s["expert_imbalance"] >= 1 for s in steps), name
        if knobs.get("capacity_factor"):  # the limit did drop slots, in both runs alike
            assert all(s["expert_drop"] > 0 for s in steps), name


def test_context_parallel_is_refused_on_cpu_with_the_reason(tmp_path):
    from recipetune.trainer.__main__ import main

    (tmp_path / "r.json").write_text(json.dumps({**BASE, "nproc": 2, "cp": 2, "device": "cpu"}))
    assert main(["--recipe", str(tmp_path / "r.json"), "--steps", "2", "--out", str(tmp_path)]) == 2
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "invalid" and "cp=2 needs CUDA" in status["cause"]
    assert "_scaled_dot_product_flash_attention_for_cpu" in status["cause"]


def test_profile_reads_the_per_rank_figures_of_the_stream(tmp_path):
    # The analyst's facts for an MoE or pipelined run come from the metrics stream's extra fields, over the
    # measured steps; memory headroom counts the fullest pipeline stage, not rank 0's.
    from recipetune.core.measure import RunResult, StepRecord
    from recipetune.engine.researcher import SearchContext
    from recipetune.engine.tree import Tree
    from recipetune.speed.facts import BRIEFING, device_memory_bytes, profile_facts

    w = ReferenceWorkload()
    recipe = w.resolve({**BASE, "model": "nano-moe", "nproc": 4, "pp": 2, "dp_shard": 2, "ep": 2,
                        "pp_microbatches": 2, "micro_batch_size": 4})
    lines = [{"step": i, "loss": 4.0, "tokens": 512, "step_time_s": 0.5, "peak_mem_bytes": 2**30,
              "a2a_s": 0.1 if i > 2 else 9.0, "a2a_s_max": 0.2, "pp_bubble": 0.35, "pp_bubble_max": 0.5,
              "expert_imbalance": 1.8, "expert_drop": 0.0, "stage_mem_bytes": [2**30, 3 * 2**30]}
             for i in range(1, 11)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"device": "cpu", "n_experts": 4, "accumulation_steps": 1}))
    result = RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", warmup_steps=2, n_devices=4,
                       out_dir=str(tmp_path),
                       steps=[StepRecord(**{k: x[k] for k in ("step", "loss", "tokens", "step_time_s",
                                                                "peak_mem_bytes")}) for x in lines])
    ctx = SearchContext(w, recipe, None, Tree(recipe, result), seed=0, **BRIEFING)
    facts = profile_facts(ctx.tree.root, ctx)
    assert facts["a2a_share"] == pytest.approx(0.2) and facts["a2a_max_share"] == pytest.approx(0.4)  # warm-up out
    assert facts["pp_bubble"] == pytest.approx(0.35) and facts["expert_imbalance"] == pytest.approx(1.8)
    assert facts["n_experts"] == 4 and facts["stage_mem_gb"] == pytest.approx(3.0)
    assert facts["stage_mem_spread"] == pytest.approx(3.0)
    assert facts["mem_headroom"] == pytest.approx(1 - 3 * 2**30 / device_memory_bytes("cpu"))


def test_playbook_rules_for_experts_and_pipelines():
    from recipetune.engine.playbook import load_playbook
    from recipetune.engine.proposers import AnalystProposer

    analyst = AnalystProposer(load_playbook(builtin=PLAYBOOK))
    moe = dict(resolve(nproc=2, dp_shard=2, ep=2, model="nano-moe"), n_devices=2, n_experts=4, device="cpu",
               accum_steps=1, data_share=0.0, optim_share=0.0, compute_share=0.5, mem_headroom=0.9, mfu=0.1,
               a2a_share=0.1, a2a_max_share=0.12, expert_imbalance=1.2, expert_drop=0.0)
    pipe = dict(resolve(nproc=2, pp=2, pp_microbatches=2), n_devices=2, n_experts=0, device="cpu", accum_steps=1,
                data_share=0.0, optim_share=0.0, compute_share=0.5, mem_headroom=0.9, mfu=0.1, pp_bubble=0.2)

    def fired(base: dict, **facts) -> set[str]:
        return {rule.name for rule in analyst.fired({**base, **facts})}

    assert "grouped-experts" in fired(moe) and "grouped-experts" not in fired(moe, expert_impl="grouped")
    assert "grouped-experts" not in fired(pipe)  # a dense model has no experts to group
    # all-to-all: a quarter of the slowest rank's step, and not just under it
    assert "less-expert-parallel" in fired(moe, a2a_max_share=0.26)
    assert "less-expert-parallel" not in fired(moe, a2a_max_share=0.24)
    # imbalance sends the all-to-all waiting on one rank: both the load and the wait must show
    assert "balance-expert-parallel" in fired(moe, expert_imbalance=1.6, a2a_max_share=0.2)
    assert "balance-expert-parallel" not in fired(moe, expert_imbalance=1.6, a2a_max_share=0.13)
    assert "balance-expert-parallel" not in fired(moe, expert_imbalance=1.4, a2a_max_share=0.2)
    assert "expert-parallel" in fired(moe, ep=1) and "expert-parallel" not in fired(moe)
    assert "cap-expert-load" in fired(moe, expert_imbalance=2.1) and "cap-expert-load" not in fired(moe)
    # the bubble: more micro-batches and an interleaved schedule above 20%, fewer stages above 40%
    assert not {"more-pipeline-microbatches", "interleaved-pipeline", "less-pipeline"} & fired(pipe, pp_bubble=0.19)
    assert {"more-pipeline-microbatches", "interleaved-pipeline"} <= fired(pipe, pp_bubble=0.21)
    assert "less-pipeline" not in fired(pipe, pp_bubble=0.39) and "less-pipeline" in fired(pipe, pp_bubble=0.41)
    assert "less-pipeline" not in fired(pipe, pp_bubble=0.41, mem_headroom=0.2)
    assert "zero-bubble-pipeline" in fired(pipe, pp_bubble=0.16, pp_schedule="Interleaved1F1B")
    assert "zero-bubble-pipeline" not in fired(pipe, pp_bubble=0.14, pp_schedule="Interleaved1F1B")
    assert "pipeline-for-memory" in fired(pipe, pp=1, mem_headroom=0.05)
