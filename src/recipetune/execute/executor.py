"""Where trials run: the Executor interface and the local, one-at-a-time executor.

A throughput measurement needs the hardware to itself, so the local executor runs one trial at a
time, in the caller's thread: Ctrl-C then reaches the wait loop of ``run_process``, which kills
the run's whole process group before the campaign stops.

``submit`` runs one trial; ``call`` runs one of the guard's measurements (the baseline profile, a
final verdict: several runs that must see the same hardware) as a single unit on one placement.
``parallel`` says how many trials the campaign may keep in flight; ``close`` stops what is left.
execute/factory.py makes the one a campaign's ``execute:`` section names.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.workloads.base import ProgressFn, Workload

T = TypeVar("T")


class TrialLost(Exception):
    """The process or node running a trial died (after its retries): no result exists."""


class Executor(Protocol):
    parallel: int

    def submit(
        self,
        workload: Workload,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None,
        progress: ProgressFn | None = None,
    ) -> Future[RunResult]: ...

    def call(self, fn: Callable[..., T], workload: Workload | None, *args: Any, **kwargs: Any) -> Future[T]:
        """``fn(workload, *args, **kwargs)`` on one placement (a guard measurement); with no workload,
        ``fn(*args, **kwargs)`` (a fine-tuning child, a final evaluation)."""

    def close(self) -> None: ...


def _done(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    future: Future[T] = Future()
    try:
        future.set_result(fn(*args, **kwargs))
    except Exception as e:  # the caller sees it through the future, as with any executor
        future.set_exception(e)
    return future


class LocalExecutor:
    """Runs each trial to completion before ``submit`` returns; the future is already done."""

    parallel = 1

    def submit(
        self,
        workload: Workload,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None,
        progress: ProgressFn | None = None,
    ) -> Future[RunResult]:
        return _done(workload.run, recipe, steps, out_dir, timeout_s=timeout_s, progress=progress)

    def call(self, fn: Callable[..., T], workload: Workload | None, *args: Any, **kwargs: Any) -> Future[T]:
        return _done(fn, *args, **kwargs) if workload is None else _done(fn, workload, *args, **kwargs)

    def close(self) -> None:
        pass
