"""The built-in reference trainer as a workload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from recipetune.core.batch import BATCH_SPLITS
from recipetune.core.measure import RunResult
from recipetune.core.process import STOP_FILE, run_process
from recipetune.core.recipe import KnobSet, Recipe
from recipetune.trainer.knobs import check_recipe, reference_knobs
from recipetune.trainer.layout import RELATIONS
from recipetune.workloads import warm
from recipetune.workloads.base import Invariant, ProgressFn, Workload, build_result, code_digest, count_lines


class ReferenceWorkload(Workload):
    kind = "reference"
    sample_order_fixed = True  # its sampler draws the same global batches whatever the micro-batching

    def __init__(self) -> None:
        self._knobs = reference_knobs()

    def knobs(self) -> KnobSet:
        return self._knobs

    def invariants(self) -> list[Invariant]:
        # Sample order depends only on (seed, step, data, seq_len, global batch): keeping these
        # keeps it. Every semantic and invariant knob is also held fixed by its role.
        return [
            Invariant("global batch in tokens", "global_batch_size * seq_len"),
            Invariant("sequence length", "seq_len"),
            Invariant("sample order", "seed"),
            Invariant("model", "model"),
            Invariant("data", "data"),
            # data-parallel ranks x micro-batch x accumulation = global batch (pp, cp, tp ranks share a batch)
            Invariant("nproc x micro_batch_size x accumulation = global_batch_size",
                      BATCH_SPLITS, "holds"),
            *(Invariant(name, relation, kind="holds") for name, relation in RELATIONS.items()),
        ]

    def check(self, recipe: Recipe) -> list[str]:
        return check_recipe(dict(recipe))

    def n_devices(self, recipe: Recipe) -> int:
        return int(recipe["nproc"])

    def cpu_threads(self, recipe: Recipe) -> int | None:
        threads = int(recipe["num_threads"])  # 0: PyTorch's default, as many as it finds
        return threads * int(recipe["nproc"]) if threads and str(recipe["device"]) == "cpu" else None

    def code_fingerprint(self) -> str:
        # The trainer is part of this package: its sources (and the versions they run on) are its code.
        return code_digest(Path(__file__).resolve().parents[1] / "trainer", "reference")

    def flops_per_token(self, recipe: Recipe) -> float | None:
        from recipetune.trainer.presets import flops_per_token, get_model_config

        return flops_per_token(get_model_config(str(recipe["model"])), int(recipe["seq_len"]))

    def prepare(self, recipe: Recipe) -> None:
        if int(recipe["nproc"]) == 1 and warm.enabled():
            warm.Launcher.start()  # its imports (seconds) run while the driver plans and profiles

    def command(self, recipe: Recipe, steps: int, out_dir: Path) -> list[str]:
        trainer = ["-m", "recipetune.trainer", "--recipe", str(out_dir / "recipe.json"),
                   "--steps", str(steps), "--out", str(out_dir)]
        nproc = int(recipe["nproc"])
        if nproc == 1:
            return [sys.executable, *trainer]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", *trainer]

    def run(
        self,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None = None,
        progress: ProgressFn | None = None,
        extra_args: list[str] | None = None,
    ) -> RunResult:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "recipe.json").write_text(json.dumps(dict(recipe), indent=2, sort_keys=True))
        metrics = out_dir / "metrics.jsonl"
        for stale in (metrics, out_dir / "status.json", out_dir / "run.json", out_dir / STOP_FILE):
            stale.unlink(missing_ok=True)
        on_poll = (lambda: progress(count_lines(metrics))) if progress else None
        argv = self.command(recipe, steps, out_dir) + (extra_args or [])
        launch = run_process
        if argv[:3] == [sys.executable, "-m", "recipetune.trainer"] and warm.enabled():
            argv, launch = argv[3:], warm.run_warm  # a fork of a process that imported torch once
        outcome = launch(argv, log_dir=out_dir, timeout_s=timeout_s, env={"PYTHONUNBUFFERED": "1"}, on_poll=on_poll,
                         stop_file=out_dir / STOP_FILE, timed=[metrics])
        try:
            run_info = json.loads((out_dir / "run.json").read_text())
        except (OSError, json.JSONDecodeError):
            run_info = {"n_devices": self.n_devices(recipe), "flops_per_token": self.flops_per_token(recipe)}
        return build_result(recipe, outcome, out_dir, steps, metrics, run_info)
