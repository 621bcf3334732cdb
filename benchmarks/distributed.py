"""What the driver costs per trial, and what a second trial in flight buys (docs/distributed.md).

    python benchmarks/distributed.py examples/distributed-fake.yaml --trials 8 --repeats 2

Runs the same campaign (same seed, the real guard) with the local executor at parallelism 1, then
on a local Ray instance (``--ray-cpus`` logical CPUs, one per trial) at parallelism 1 and 2, each
``--repeats`` times in fresh folders, in an interleaved order. For each it reports:

- search wall: the search phase alone (baseline profile and final verdicts excluded);
- run wall: the trainers' own wall time summed over the trials (``wall_s`` of each result.json);
- driver overhead per trial: (search wall - run wall) / trials, at parallelism 1 only: everything
  the driver and the executor add around a run (proposal, static check, study writes, screening,
  with Ray also the placement group, scheduling and the task's result);
- the driver's CPU time per trial (this process, every thread);
- total wall: the whole campaign (profile, search, verdicts).
The machine's load average is printed before and after: on a shared machine the figures move.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from recipetune.config import load_campaign
from recipetune.execute.executor import LocalExecutor
from recipetune.speed import job as campaign_mod
from recipetune.speed.plan import plan


def measure(file: Path, overrides: list[str], out: Path) -> dict:
    campaign = load_campaign(file, overrides)
    p = plan(campaign, out)
    settings = campaign.config.execute
    if settings.executor == "ray":
        from recipetune.execute.ray import RayExecutor

        executor = RayExecutor(settings, campaign.workload.n_devices(campaign.baseline), file)
    else:
        executor = LocalExecutor()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    outcome = campaign_mod.run(p, executor=executor)
    total, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    runs = [r for r in p.store.records() if r.attrs.get("ran")]
    run_wall = sum(json.loads((Path(r.attrs["run_dir"]) / "result.json").read_text())["wall_s"] for r in runs)
    search = float(p.store.study.user_attrs["search_elapsed_s"])
    n = len(runs)
    return {"trials": n, "total_s": total, "search_s": search, "run_wall_s": run_wall,
            "overhead_per_trial_s": (search - run_wall) / n if settings.parallel == 1 else None,
            "driver_cpu_per_trial_s": cpu / n, "decision": outcome.decision}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path, nargs="?", default=Path("examples/distributed-fake.yaml"))
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="folder for every campaign (default runs/dist-TIME)")
    args = parser.parse_args()
    out = args.out or Path("runs") / f"dist-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs")

    import ray

    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")  # loopback only
    configs = {"local p1": ["execute.executor=local", "execute.parallel=1"],
               "ray p1": ["execute.executor=ray", "execute.parallel=1"],
               "ray p2": ["execute.executor=ray", "execute.parallel=2"]}
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for rep in range(args.repeats):
        for name, overrides in configs.items():  # interleaved: slow drifts of the machine hit every config
            folder = out / f"{name.replace(' ', '-')}-{rep}"
            r = measure(args.campaign, [f"search.budget.trials={args.trials}", *overrides], folder)
            results[name].append(r)
            print(f"{name} #{rep}: {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})}",
                  flush=True)
    ray.shutdown()
    print(f"load average after: {os.getloadavg()}")
    print(f"\n{'config':10} {'search s':>9} {'run wall s':>10} {'overhead/trial s':>16} {'driver cpu/trial s':>18} "
          f"{'total s':>8}")
    for name, rs in results.items():
        def med(key: str, rs: list[dict] = rs) -> str:
            vals = [r[key] for r in rs if r[key] is not None]
            return f"{statistics.median(vals):.2f}" if vals else "-"

        print(f"{name:10} {med('search_s'):>9} {med('run_wall_s'):>10} {med('overhead_per_trial_s'):>16} "
              f"{med('driver_cpu_per_trial_s'):>18} {med('total_s'):>8}")
    (out / "summary.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
