"""The analyst reading a GPU's signals, on CPU: profiles made from the H200's recorded results, the
profiler's summary on synthetic timelines, and each GPU rule at its threshold beside the case it must not take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipetune.core.measure import RunResult, StepRecord
from recipetune.core.recipe import SearchSpace
from recipetune.engine.playbook import load_playbook
from recipetune.engine.proposers import AnalystProposer
from recipetune.engine.researcher import SearchContext
from recipetune.engine.tree import Tree
from recipetune.speed import facts as speed_facts
from recipetune.speed.facts import BRIEFING, PLAYBOOK, profile_facts
from recipetune.trainer.model import flops_per_token, get_model_config
from recipetune.trainer.profile import busy_seconds, kernel_kind, kernel_summary
from recipetune.workloads.reference import ReferenceWorkload

H200 = json.loads((Path(__file__).parent / "fixtures" / "gpu_h200_profiles.json").read_text())
WORKLOAD = ReferenceWorkload()
PLAIN = WORKLOAD.resolve({"model": "gpt2-124m", "seq_len": 1024, "global_batch_size": 32, "micro_batch_size": 8,
                          "dtype": "bf16", "matmul_precision": "high", "device": "cuda", "attention": "math",
                          "optimizer_impl": "for-loop", "compile": "none"})
# examples/gpt2-gpu.yaml's search space
SPACE = SearchSpace.from_lists(WORKLOAD.knobs(), {
    "attention": ["math", "sdpa"], "compile": ["none", "regional", "model"],
    "compile_mode": ["default", "reduce-overhead"], "optimizer_impl": ["for-loop", "foreach", "fused"],
    "micro_batch_size": [8, 16, 32],
})
FLOPS = flops_per_token(get_model_config("gpt2-124m", vocab_size=256), 1024)


def h200_run(tmp_path: Path, name: str, profile: dict | None = None, figures: dict | None = None,
             **edits) -> tuple[RunResult, dict]:
    """A RunResult, run.json and profile.json as the trainer writes them, from the fixture's figures."""
    entry = H200["profiles"][name]
    figures = {**entry.get("derived", {}), **entry["recorded"], **(figures or {})}
    step = figures.get("step_time_s") or H200["tokens_per_step"] / figures["tokens_per_s"]
    recipe = PLAIN.with_(**{**entry["recipe"], **edits})
    out = tmp_path / name
    out.mkdir()
    accum = 32 // recipe["micro_batch_size"]
    (out / "run.json").write_text(json.dumps({"device": "cuda:0", "device_name": H200["device_name"],
                                              "accumulation_steps": accum, "n_experts": 0}))
    profile = figures.get("profile") if profile is None else profile
    if profile:
        (out / "profile.json").write_text(json.dumps(profile))
    steps = [StepRecord(step=i, loss=3.0, tokens=H200["tokens_per_step"], step_time_s=step,
                        compute_s=figures["compute_s"], optim_s=figures["optim_s"], data_s=figures.get("data_s"),
                        peak_mem_bytes=figures["peak_mem_bytes"]) for i in range(1, 26)]
    result = RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=steps, warmup_steps=2,
                       flops_per_token=FLOPS, peak_flops_per_device=989.4e12, out_dir=str(out),
                       environment={"gpu": H200["device_name"]})
    return result, dict(recipe)


@pytest.fixture(autouse=True)
def h200_memory(monkeypatch):
    # no GPU here: the device's memory as nvidia-smi gives it on an H200
    monkeypatch.setattr(speed_facts, "device_memory_bytes",
                        lambda device: H200["device_memory_bytes"] if device == "cuda" else 24 * 2**30)


def proposals(result: RunResult, n: int = 6) -> list[tuple[str, dict]]:
    recipe = WORKLOAD.resolve(result.recipe)
    ctx = SearchContext(WORKLOAD, recipe, SPACE, Tree(recipe, result), seed=0, **BRIEFING)
    found = AnalystProposer(load_playbook(builtin=PLAYBOOK)).propose(ctx.tree.root, ctx, n)
    return [(p.rationale.split(" ")[0].rstrip(":"), p.edits) for p in found]


def test_the_facts_of_the_recorded_plain_recipe(tmp_path):
    result, recipe = h200_run(tmp_path, "plain")
    root = Tree(WORKLOAD.resolve(recipe), result).root
    f = profile_facts(root, SearchContext(WORKLOAD, WORKLOAD.resolve(recipe), SPACE, Tree(root.recipe, result),
                                          seed=0, **BRIEFING))
    assert f["device"] == "cuda" and f["accum_steps"] == 4
    assert f["tokens_per_s"] == pytest.approx(119968, rel=1e-3)  # recorded
    assert f["mfu"] == pytest.approx(0.0757, abs=0.001)  # 119,968 tokens/s x 6.24e8 FLOPs / 989.4e12
    assert f["mem_headroom"] > 0.9 and f["attention_share"] == 0.20 and f["launch_gap_share"] == 0.04
    assert f["optimizer_kernel_share"] == 0.038


def test_from_the_plain_recipe_the_analyst_proposes_what_an_engineer_sets(tmp_path):
    # The recorded tune never tried compilation in 6 trials: now it is among the first three proposals.
    got = proposals(h200_run(tmp_path, "plain")[0])
    first = got[:4]
    assert first[0] == ("gpu-attention-share", {"attention": "sdpa"})
    assert ("gpu-far-from-peak", {"compile": "model"}) in first[:3]
    assert ("gpu-memory-headroom", {"micro_batch_size": 32}) in first
    assert ("gpu-optimizer-share", {"optimizer_impl": "fused"}) in got


def test_from_the_recorded_sdpa_fused_run_it_proposes_compile_and_the_largest_micro_batch(tmp_path):
    # Every figure here was recorded on the H200 (17.7% MFU, 9.9 GiB of 141 GiB); no profile was taken then.
    got = proposals(h200_run(tmp_path, "sdpa_fused", profile={})[0])
    rules = [r for r, _ in got]
    assert ("gpu-far-from-peak", {"compile": "model"}) in got
    assert ("gpu-memory-headroom", {"micro_batch_size": 32}) in got
    assert not {"gpu-attention-share", "gpu-optimizer-share", "sdpa-attention", "fused-optimizer"} & set(rules)
    assert "gpu-launch-bound" not in rules and "gpu-cuda-graphs" not in rules  # no profile: unknown, not fired


@pytest.mark.parametrize(("gaps", "fires"), [(0.10, False), (0.14, False), (0.16, True), (0.30, True)])
def test_a_launch_bound_compiled_step_gets_cuda_graphs_at_the_threshold_only(tmp_path, gaps, fires):
    profile = {**H200["profiles"]["plain"]["derived"]["profile"], "launch_gap_share": gaps,
               "gpu_busy": 1 - gaps}
    result, _ = h200_run(tmp_path, "plain", profile=profile, compile="model", attention="sdpa")
    got = proposals(result, 10)
    assert (("gpu-cuda-graphs", {"compile_mode": "reduce-overhead"}) in got) == fires


@pytest.mark.parametrize(("share", "fires"), [(0.02, False), (0.04, True)])
def test_the_optimizer_share_rule_at_its_edge(tmp_path, share, fires):
    profile = {**H200["profiles"]["plain"]["derived"]["profile"], "optimizer_share": share}
    result, _ = h200_run(tmp_path, "plain", profile=profile, figures={"optim_s": 0.0})
    got = proposals(result, 10)
    assert (("gpu-optimizer-share", {"optimizer_impl": "fused"}) in got) == fires


def test_the_same_figures_on_a_cpu_fire_no_gpu_rule(tmp_path):
    result, recipe = h200_run(tmp_path, "plain")
    (Path(result.out_dir) / "run.json").write_text(json.dumps({"device": "cpu", "accumulation_steps": 4}))
    result = result.model_copy(update={"recipe": {**recipe, "device": "cpu"}, "environment": {}})
    assert not [r for r, _ in proposals(result, 10) if r.startswith("gpu-")]


# -- the profiler's summary ---------------------------------------------------------------------

KERNELS = {  # names in the forms torch.profiler reports on H100/H200-class GPUs
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    "__5x_cublas": "matmul",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT": "matmul",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, cutlass::bfloat16_t>>":
        "attention",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
    "namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)": "attention",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4>>": "optimizer",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": "other",
    "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0": "other",
}


@pytest.mark.parametrize(("name", "kind"), KERNELS.items())
def test_kernel_kinds(name, kind):
    assert kernel_kind(name) == kind


def test_busy_time_counts_overlapping_streams_once():
    assert busy_seconds([(0.0, 1.0), (0.5, 1.5), (2.0, 3.0), (2.2, 2.4)]) == pytest.approx(2.5)
    assert busy_seconds([]) == 0.0


def test_the_summary_of_a_launch_bound_timeline():
    # 3 steps of 10 ms: kernels cover 6 ms of each, with 4 ms of gaps between launches
    kernels = []
    for s in range(3):
        t = s * 0.010
        kernels += [("nvjet_tst_gemm", t, t + 0.003), ("cunn_SoftMaxForward", t + 0.004, t + 0.005),
                    ("vectorized_elementwise_kernel", t + 0.006, t + 0.007), ("FusedAdamMathFunctor", t + 0.008,
                                                                               t + 0.009)]
    f = kernel_summary(kernels, optimizer_s=0.0, wall_s=0.030, steps=3)
    assert f["gpu_busy"] == pytest.approx(0.6) and f["launch_gap_share"] == pytest.approx(0.4)
    assert f["matmul_share"] == pytest.approx(0.3) and f["attention_share"] == pytest.approx(0.1)
    assert f["optimizer_share"] == pytest.approx(0.1) and f["other_share"] == pytest.approx(0.1)
    assert f["kernel_s"] == pytest.approx(0.006)
    # a for-loop optimizer's kernels are plain elementwise ones: its range's device time counts instead
    assert kernel_summary(kernels, optimizer_s=0.009, wall_s=0.030, steps=3)["optimizer_share"] == pytest.approx(0.3)
    assert kernel_summary(kernels, 0.0, 0.0, 3) == {}


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # the window forced on a CPU, below
def test_the_profiler_runs_only_on_a_gpu_and_its_glue_writes_profile_json(tmp_path):
    import torch

    from recipetune.trainer.profile import StepProfiler

    assert not StepProfiler(torch.device("cpu"), True, 40, tmp_path).window  # nothing on a CPU
    assert not StepProfiler(torch.device("cuda"), False, 40, tmp_path).window  # nor on another rank
    assert not StepProfiler(torch.device("cuda"), True, 11, tmp_path).window  # nor in a run too short
    assert StepProfiler(torch.device("cuda"), True, 40, tmp_path).window == range(37, 40)
    # the window forced on a CPU: the profiler's events are read as on a GPU (here without device events)
    profiler = StepProfiler(torch.device("cpu"), True, 12, tmp_path)
    profiler.window = range(9, 12)
    model = torch.nn.Linear(16, 16)
    records = []
    for k in range(12):
        profiler.before(k)
        model(torch.randn(4, 16)).sum().backward()
        records.append({"step_time_s": 0.01})
        profiler.after(k, records[-1])
    assert [bool(r.get("profiled")) for r in records] == [False] * 9 + [True] * 3
    written = json.loads((tmp_path / "profile.json").read_text())
    assert written["profiled_steps"] == 3 and written["gpu_busy"] == 0.0  # no kernels on a CPU


def test_profiled_steps_are_left_out_of_throughput():
    steps = [StepRecord(step=i, loss=3.0, tokens=1000, step_time_s=0.1, profiled=i > 17) for i in range(1, 21)]
    steps[-1] = steps[-1].model_copy(update={"step_time_s": 5.0})  # the profiler's own cost
    result = RunResult(recipe={}, recipe_id="x", status="ok", steps=steps, warmup_steps=2)
    assert len(result.measured()) == 15 and result.summary().tokens_per_s == pytest.approx(10_000)
