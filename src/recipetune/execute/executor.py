"""Where trials run: the Executor interface and the local, one-at-a-time executor.

A throughput measurement needs the hardware to itself, so the local executor runs one trial at a
time, in the caller's thread: Ctrl-C then reaches the wait loop of ``run_process``, which kills
the run's whole process group before the campaign stops.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from recipetune.measure import RunResult
from recipetune.recipe import Recipe
from recipetune.workloads.base import ProgressFn, Workload


class Executor(Protocol):
    def submit(
        self,
        workload: Workload,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None,
        progress: ProgressFn | None = None,
    ) -> Future[RunResult]: ...


class LocalExecutor:
    """Runs each trial to completion before ``submit`` returns; the future is already done."""

    def submit(
        self,
        workload: Workload,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None,
        progress: ProgressFn | None = None,
    ) -> Future[RunResult]:
        future: Future[RunResult] = Future()
        try:
            future.set_result(workload.run(recipe, steps, out_dir, timeout_s=timeout_s, progress=progress))
        except Exception as e:  # the caller sees it through the future, as with any executor
            future.set_exception(e)
        return future
