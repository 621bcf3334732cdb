"""The guard against the cases built to fool it: poisons at the edge of detection beside equivalent recipes.

    python benchmarks/guard_poisons.py tests/fixtures/edge-campaign.yaml \\
        equiv:micro_batch=16,grad_accum=4 order:order_seed=7 aa: \\
        drop:micro_batch=16,grad_accum=4,poison=drop short:micro_batch=16,grad_accum=4,poison=short \\
        stale:micro_batch=16,grad_accum=4,poison=stale lr10:micro_batch=16,grad_accum=4,poison=lr10

Each case is ``name:knob=value,...`` (empty: the baseline itself, an A/A). The baseline is profiled
once, as a campaign does; every case then gets the whole ``final_verdict`` at the file's guard
settings (defaults unless its guard: section or ``--set section.field=value`` says otherwise), and
a markdown row: the parity mode, the verdict and why the looks stopped, the loss difference, T, the
smallest detectable difference, and the cost: parity runs trained, runs reused (stored by an
earlier case against the same baseline, as a campaign's finalists share them; ``--no-reuse``: each
case on its own), the seeds the plan reached, the parity test's seconds and the verdict's.

``--ray-nodes N``: the verdicts' runs go to a Ray cluster of N simulated nodes of one CPU each on
this machine (``ray.cluster_utils``), instead of the local executor. Verdicts are kept under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import yaml

from recipetune.config import load_campaign
from recipetune.execute.executor import Executor, LocalExecutor
from recipetune.guard.baseline import profile_baseline
from recipetune.guard.runs import Runs
from recipetune.guard.verdict import final_verdict


def parse_case(text: str) -> tuple[str, dict[str, str]]:
    name, _, edits = text.partition(":")
    return name, {k: yaml.safe_load(v) for k, v in (e.split("=", 1) for e in edits.split(",") if e)}


def measures(parity: dict) -> str:
    """Each loss measure's outcome with its T: ``train holds (T 0.0053), val fails (T 0.0111)``."""
    return ", ".join(f"{m['measure'].split()[0]} {m['outcome']} (T {m['tolerance']:.4f})"
                     for m in parity.get("measures") or []) or "-"


def ray_executor(nodes: int, campaign) -> tuple[Executor, object]:
    import ray
    from ray.cluster_utils import Cluster

    from recipetune.execute.ray import RayExecutor

    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    settings = campaign.config.execute.model_copy(update={"executor": "ray", "parallel": 1})
    executor = RayExecutor(settings, campaign.workload.n_devices(campaign.baseline), campaign.path)

    def stop() -> None:
        executor.close()
        ray.shutdown()
        cluster.shutdown()

    return executor, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path)
    parser.add_argument("cases", nargs="+", help="name:knob=value,... (empty edits: A/A)")
    parser.add_argument("--set", nargs="*", default=[], help="section.field=value overrides of the file")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-reuse", action="store_true", help="no stored runs: every case trains its own")
    parser.add_argument("--ray-nodes", type=int, default=0, help="run on a simulated Ray cluster of N nodes")
    args = parser.parse_args()
    campaign = load_campaign(args.campaign, args.set)
    settings, base, workload = campaign.config.guard, campaign.baseline, campaign.workload
    out = (args.out or Path("runs") / f"poisons-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    executor, stop = ray_executor(args.ray_nodes, campaign) if args.ray_nodes else (LocalExecutor(), None)
    folder = None if args.no_reuse else out / "guard-runs"
    try:
        t0 = time.monotonic()
        profile = profile_baseline(workload, base, settings.parity.steps, settings, out / "baseline",
                                   runs=Runs(workload, executor, folder, settings.timeout_s))
        where = f"a Ray cluster of {args.ray_nodes} nodes" if args.ray_nodes else "the local executor"
        print(f"{args.campaign}: baseline profiled in {time.monotonic() - t0:.0f} s; T = {profile.loss_tolerance:.4f} "
              f"({profile.loss_reference_kind}); runs under {out}, on {where}, "
              f"{workload.kind} runs {Runs(workload, executor).at_once(base)} at a time\n")
        print("| case | change | mode | verdict | stop | loss diff | T | detectable | measures | parity runs | reused "
              "| seeds | speed-up | parity s | s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for text in args.cases:
            name, edits = parse_case(text)
            cand = workload.resolve({**dict(base), **edits})
            t0 = time.monotonic()
            v = final_verdict(workload, base, cand, settings, out / name, profile=profile, executor=executor,
                              runs_folder=folder)
            p = v.parity
            det = p.get("detectable")
            seeds = len(p.get("seeds") or [])
            diff, tol = p.get("mean_diff", float("nan")), p.get("tolerance", float("nan"))
            print(f"| {name} | {cand.describe_diff(base) or 'none (A/A)'} | {p.get('mode', '-')} | {v.decision} | "
                  f"{v.stop or '-'} | {diff:+.4f} | {tol:.4f} | "
                  f"{'-' if det is None else f'{det:.4f}'} | {measures(p)} | {int(v.cost.get('parity_runs', 0))} | "
                  f"{int(v.cost.get('parity_reused', 0))} | {seeds} | "
                  f"{'-' if v.speedup is None else f'{v.speedup:.2f}x'} | {v.cost.get('parity_s', 0):.0f} | "
                  f"{time.monotonic() - t0:.0f} |", flush=True)
    finally:
        if stop is not None:
            stop()
        else:
            executor.close()


if __name__ == "__main__":
    main()
