"""The guard's loss-only runs: submitted as independent units, stored, and reused.

A parity run measures loss, not time, so the runs of a look (each seed's baseline and candidate) are
submitted to the executor at once (``measured=False``): on Ray each holds a placement of its own,
across the cluster; locally, as many run side by side as the machine's devices hold
(execute/executor.py). A verdict's wall time then approaches (runs / placements) x one run.

A run is stored under the runs folder by what determines it: the workload's code
(``Workload.code_fingerprint``), the recipe with its seed, and the step count. Every later verdict
against the same baseline in that folder (a campaign's other finalists, a later ``verify``, a
resumed campaign) finds the run there and reuses it instead of training it again; two verdicts
asking for the same run at once share one submission. Only finished runs are reused; a failed one
is run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.execute.executor import Executor, LocalExecutor
from recipetune.workloads.base import Workload

_LOCK = threading.Lock()
_INFLIGHT: dict[Path, Future[RunResult]] = {}  # runs being trained for some verdict of this process


def stored(path: Path, recipe: Recipe) -> RunResult | None:
    """The finished, successful run stored at ``path`` for ``recipe``, if there is one."""
    try:
        result = RunResult.model_validate_json((path / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return result if result.ok and result.recipe == dict(recipe) else None


class Runs:
    """The runs one verdict asks for: ``start`` gives a future per run; ``launched`` and ``reused``
    count what that cost. Without a ``folder`` nothing is stored and each run goes to its own
    ``out_dir``."""

    def __init__(self, workload: Workload, executor: Executor | None = None, folder: Path | None = None,
                 timeout_s: float | None = None):
        self.workload, self.folder, self.timeout_s = workload, folder, timeout_s
        self.executor = executor if executor is not None else LocalExecutor()
        self.launched = 0  # runs trained for this verdict
        self.steps_launched = 0  # their steps, in all (a verdict's budget counts runs by length)
        self.reused = 0  # runs found stored or in flight for another verdict
        self.seconds = 0.0  # training seconds of the runs launched (their wall times, summed)
        self._code: str | None = None

    def at_once(self, recipe: Recipe) -> int:
        """How many loss-only runs of ``recipe`` the executor runs side by side."""
        return max(1, self.executor.loss_runs_at_once(self.workload, recipe))

    def has(self, recipe: Recipe, steps: int, repeat: int = 0) -> bool:
        """Whether the run is stored (or in flight for another verdict): it would cost nothing."""
        if self.folder is None:
            return False
        path = self.folder / self.key(recipe, steps, repeat)
        with _LOCK:
            return stored(path, recipe) is not None or (path in _INFLIGHT and not _INFLIGHT[path].done())

    def key(self, recipe: Recipe, steps: int, repeat: int = 0) -> str:
        """The run's name in the folder. ``repeat``: which repeat of a recipe without a seed knob (a
        trainer that seeds itself gives each repeat its own run; with a seed, the seed tells them apart)."""
        if self._code is None:
            self._code = self.workload.code_fingerprint()
        text = "\0".join([self._code, recipe.canonical_json(), str(steps), str(repeat)])
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def start(self, recipe: Recipe, steps: int, out_dir: Path, repeat: int = 0) -> Future[RunResult]:
        """A run of ``recipe`` for ``steps`` steps: stored, in flight, or submitted now. ``out_dir``
        names it in the verdict's folder (a link to the stored run when there is a folder)."""
        if self.folder is None:
            return self._submit(recipe, steps, out_dir)
        path = self.folder / self.key(recipe, steps, repeat)
        with _LOCK:
            done = stored(path, recipe)
            if done is not None:
                self.reused += 1
                future: Future[RunResult] = Future()
                future.set_result(done)
            elif path in _INFLIGHT and not _INFLIGHT[path].done():
                self.reused += 1
                future = _INFLIGHT[path]
            else:
                future = _INFLIGHT[path] = self._submit(recipe, steps, path)
        _link(out_dir, path)
        return future

    def _submit(self, recipe: Recipe, steps: int, path: Path) -> Future[RunResult]:
        self.launched += 1
        self.steps_launched += steps
        future = self.executor.submit(self.workload, recipe, steps, path, self.timeout_s, measured=False)
        future.add_done_callback(self._count)
        return future

    def _count(self, future: Future[RunResult]) -> None:
        with contextlib.suppress(Exception):
            self.seconds += future.result().wall_s

    def store(self, result: RunResult, steps: int, recipe: Recipe, repeat: int = 0) -> RunResult:
        """Keep a run made elsewhere (the baseline profile's) under its key, for later verdicts."""
        if self.folder is None or not result.ok:
            return result
        path = self.folder / self.key(recipe, steps, repeat)
        if stored(path, recipe) is None and Path(result.out_dir).resolve() != path.resolve():
            path.mkdir(parents=True, exist_ok=True)
            tmp = path / "result.json.tmp"
            tmp.write_text(result.model_dump_json())
            tmp.replace(path / "result.json")
        return result

    def fetch(self, recipe: Recipe, steps: int, repeat: int = 0) -> RunResult | None:
        """The stored run of ``recipe`` for ``steps`` steps, if any (counted as reused)."""
        if self.folder is None:
            return None
        done = stored(self.folder / self.key(recipe, steps, repeat), recipe)
        if done is not None:
            self.reused += 1
        return done


def _link(name: Path, target: Path) -> None:
    """``name`` -> ``target``, relative, so that a verdict's folder shows where each run lives."""
    if name.resolve() == target.resolve():
        return
    name.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if name.is_symlink():
            name.unlink()
        if not name.exists():
            name.symlink_to(os.path.relpath(target, name.parent), target_is_directory=True)


def wait_all(futures: list[Future[RunResult]], on_done: Callable[[int], None] | None = None) -> list[RunResult]:
    """The results of ``futures`` in order; ``on_done(k)`` as each finishes. On any interruption the
    runs not started yet are cancelled (those running stop when the executor closes)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    try:
        pending = set(futures)
        done_count = 0
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            done_count += len(finished)
            if on_done:
                on_done(done_count)
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise
