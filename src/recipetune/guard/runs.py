"""The guard's loss-only runs: submitted as independent units, stored, and reused.

A parity run measures loss, not time, so the runs of a look (each seed's baseline and candidate) are
submitted to the executor at once (``measured=False``): on Ray each holds a placement of its own,
across the cluster; locally, as many run side by side as the machine's devices hold
(execute/executor.py). A verdict's wall time then approaches (runs / placements) x one run.

A run is stored under the runs folder by what determines it: the workload's code
(``Workload.code_fingerprint``: for a command workload its files, data, packages,
workloads/fingerprint.py), the recipe with its seed, and the step count. Every later verdict
against the same baseline in that folder (a campaign's other finalists, a later ``verify``, a
resumed campaign) finds the run there and reuses it instead of training it again. Only finished
runs are reused; a failed one is run again. A run not reused because the code changed since it was
made is named with what changed (``notes``): each stored run keeps the fingerprint it was made
with, and the folder keeps each fingerprint's manifest (``manifests/``).

Two verdicts asking for one run train it once: in one process they share its future; across
processes and machines sharing the folder, the run's lock file (core/files.py: FileLock) lets one
train it while the others wait and then reuse it; a lock whose holder died (kill -9, a lost node)
is taken over. Every stored file is written whole (a temporary name, then a rename); a stored result
that is corrupt or cut off anyway is set aside (renamed, with a note naming it) and trained again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from recipetune.core.console import Note
from recipetune.core.errors import ConfigError
from recipetune.core.filenames import RESULT, STORE_FILE
from recipetune.core.files import FileLock, write_atomic
from recipetune.core.measure import RunResult
from recipetune.core.process import STOP_FILE
from recipetune.core.recipe import Recipe
from recipetune.execute.executor import Executor, LocalExecutor
from recipetune.workloads.base import Workload
from recipetune.workloads.fingerprint import changes

_LOCK = threading.Lock()
_INFLIGHT: dict[Path, Future[RunResult]] = {}  # runs being trained for some verdict of this process
_JOINED: set[Path] = set()  # of those, the runs another verdict of this process waits for too
FINGERPRINT_FILE = "fingerprint.json"  # in a stored run: the fingerprint it was made with
MANIFESTS = "manifests"  # fingerprint -> its manifest, to say what changed since
POLL_S = 0.5  # how often a run waiting for another process's looks again
_OURS = re.compile(r"[0-9a-f]{20}(\.lock(\.break)?)?|store\.json(\.tmp.*)?|manifests|\.probe-.*")


def stored(path: Path, recipe: Recipe) -> RunResult | None:
    """The finished, successful run stored at ``path`` for ``recipe``, if there is one."""
    try:
        result = RunResult.model_validate_json((path / RESULT).read_text())
    except (OSError, ValueError):
        return None
    return result if result.ok and result.recipe == dict(recipe) else None


def _resolved(result: RunResult) -> Future[RunResult]:
    future: Future[RunResult] = Future()
    future.set_result(result)
    return future


def _experiment(recipe: Recipe, steps: int, repeat: int) -> str:
    """The run's name whatever the code: stored runs of the same experiment made with other code."""
    return hashlib.sha256(f"{recipe.canonical_json()}\0{steps}\0{repeat}".encode()).hexdigest()[:20]


class Runs:
    """The runs one verdict asks for: ``start`` gives a future per run (loss-only, on the executor),
    ``produce`` makes a measured one (the baseline profile's); ``launched`` and ``reused`` count what
    that cost, ``notes`` what a verdict should say about the store. Without a ``folder`` nothing is
    stored and each run goes to its own ``out_dir``."""

    def __init__(self, workload: Workload, executor: Executor | None = None, folder: Path | None = None,
                 timeout_s: float | None = None, progress: Callable[[str], None] | None = None):
        self.workload, self.folder, self.timeout_s, self.progress = workload, folder, timeout_s, progress
        self.executor = executor if executor is not None else LocalExecutor()
        self.launched = 0  # runs trained for this verdict
        self.steps_launched = 0  # their steps, in all (a verdict's budget counts runs by length)
        self.reused = 0  # runs found stored or in flight for another verdict (or another process)
        self.seconds = 0.0  # training seconds of the runs launched (their wall times, summed)
        self._code: str | None = None
        self._manifest: dict[str, str] = {}
        self._index: dict[str, list[tuple[float, str]]] | None = None  # experiment -> (time, fingerprint)
        self._missed: dict[str, int] = {}  # what changed, in words -> stored runs it kept from reuse
        self._set_aside: list[str] = []
        self._counts = threading.Lock()
        self._trained: dict[Path, int] = {}  # where each run this verdict submitted trains -> its steps

    @property
    def notes(self) -> list[str]:
        """Stored runs not reused and why; stored results set aside."""
        return [f"{n} stored run(s) not reused, trained again: since they were made, {said}"
                for said, n in self._missed.items()] + list(self._set_aside)

    def at_once(self, recipe: Recipe) -> int:
        """How many loss-only runs of ``recipe`` the executor runs side by side."""
        return max(1, self.executor.loss_runs_at_once(self.workload, recipe))

    def has(self, recipe: Recipe, steps: int, repeat: int = 0) -> bool:
        """Whether the run is stored (or in flight for another verdict or process): it costs nothing."""
        if self.folder is None:
            return False
        path = self.folder / self.key(recipe, steps, repeat)
        with _LOCK:
            if stored(path, recipe) is not None or (path in _INFLIGHT and not _INFLIGHT[path].done()):
                return True
        return FileLock(_lock_path(path)).held_by_other()

    def key(self, recipe: Recipe, steps: int, repeat: int = 0) -> str:
        """The run's name in the folder. ``repeat``: which repeat of a recipe without a seed knob (a
        trainer that seeds itself gives each repeat its own run; with a seed, the seed tells them apart)."""
        if self._code is None:
            self._code, self._manifest = self.workload.code_identity()
        text = "\0".join([self._code, recipe.canonical_json(), str(steps), str(repeat)])
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def start(self, recipe: Recipe, steps: int, out_dir: Path, repeat: int = 0) -> Future[RunResult]:
        """A run of ``recipe`` for ``steps`` steps: stored, in flight, or submitted now. ``out_dir``
        names it in the verdict's folder (a link to the stored run when there is a folder)."""
        if self.folder is None:
            return self._submit(recipe, steps, out_dir)
        path = self.folder / self.key(recipe, steps, repeat)
        with _LOCK:
            future = _INFLIGHT.get(path)
            if future is not None and not future.done():
                self._count(reused=1)
                _JOINED.add(path)
            else:
                future = self._claim(recipe, steps, repeat, path)
                if not future.done():
                    _INFLIGHT[path] = future
                    _JOINED.discard(path)
        _link(out_dir, path)
        return future

    def stop(self, out_dir: Path, why: str, reached: int) -> bool:
        """Stop a run this verdict trains (``out_dir``: its name in the verdict's folder) at about step
        ``reached``, because its evidence is no longer needed: its stop file, the word every runner
        heeds (core/process.py: STOP_FILE; on a shared folder, on any node). The run ends unfinished
        and is not stored; its steps past ``reached`` leave the verdict's budget. A run found stored,
        or one another verdict waits for too, is not stopped (False)."""
        path = out_dir.resolve()
        with _LOCK:
            steps = self._trained.get(path)
            if steps is None or path in _JOINED:
                return False
        write_atomic(path / STOP_FILE, json.dumps({"why": why, "step": reached}))
        self._count(steps=-max(0, steps - reached))
        return True

    def _claim(self, recipe: Recipe, steps: int, repeat: int, path: Path) -> Future[RunResult]:
        done = stored(path, recipe)
        if done is not None:
            self._count(reused=1)
            return _resolved(done)
        lock = FileLock(_lock_path(path))
        if lock.acquire():
            return self._train(recipe, steps, repeat, path, lock)
        # Another process (or machine) trains it now: wait for it, then reuse what it stored.
        self._count(reused=1)
        future: Future[RunResult] = Future()
        threading.Thread(target=self._wait, args=(recipe, steps, repeat, path, lock, future), daemon=True,
                         name="run-wait").start()
        return future

    def _train(self, recipe: Recipe, steps: int, repeat: int, path: Path, lock: FileLock) -> Future[RunResult]:
        """Holding the run's lock: what an earlier holder stored, or the run submitted now."""
        try:
            done = self._load(path, recipe)
            if done is not None:
                lock.release()
                self._count(reused=1)
                return _resolved(done)
            self._explain(recipe, steps, repeat)
            future = self._submit(recipe, steps, path)
        except BaseException:
            lock.release()
            raise

        # The verdict sees the run done only once it is kept and its lock released: whoever looks
        # next finds it stored, never a lock still held by a finished run.
        outer: Future[RunResult] = Future()

        def kept(f: Future[RunResult]) -> None:
            try:
                if not f.cancelled() and f.exception() is None and f.result().ok:
                    self._keep(f.result(), path, recipe, steps, repeat)
            finally:
                lock.release()
                _copy(f, outer)

        future.add_done_callback(kept)
        outer.add_done_callback(lambda o: future.cancel() if o.cancelled() else None)
        return outer

    def _wait(self, recipe: Recipe, steps: int, repeat: int, path: Path, lock: FileLock,
              future: Future[RunResult]) -> None:
        """Until the holder releases the run (or is found dead), then as ``_train``: its stored result,
        or, when it failed or died, the run trained here."""
        while not future.cancelled():
            if lock.acquire():
                self._count(reused=-1)
                try:
                    inner = self._train(recipe, steps, repeat, path, lock)
                except BaseException as e:
                    with contextlib.suppress(Exception):
                        future.set_exception(e)
                    return
                inner.add_done_callback(lambda f: _copy(f, future))
                return
            time.sleep(POLL_S)  # a poll of the lock file: the holder's run is the work

    def produce(self, recipe: Recipe, steps: int, make: Callable[[], RunResult], repeat: int = 0
                ) -> tuple[RunResult, bool]:
        """A measured run (the baseline profile's), made by ``make`` here unless stored, and whether
        it was reused. Under the run's lock: two processes profiling one baseline make each run once,
        the second waits for the first's and reuses it."""
        if self.folder is None:
            return make(), False
        path = self.folder / self.key(recipe, steps, repeat)
        lock = FileLock(_lock_path(path))
        while not lock.acquire():
            done = stored(path, recipe)
            if done is not None:
                self._count(reused=1)
                return done, True
            time.sleep(POLL_S)  # another process makes it now
        try:
            done = self._load(path, recipe)
            if done is not None:
                self._count(reused=1)
                return done, True
            self._explain(recipe, steps, repeat)
            result = make()
            if result.ok:
                self._keep(result, path, recipe, steps, repeat)
            return result, False
        finally:
            lock.release()

    def adopt(self, recipe: Recipe, steps: int, result: RunResult, repeat: int = 0) -> bool:
        """Keep a finished run made elsewhere (a search trial of ``steps`` steps at the baseline's seed) as
        this run, so that a verdict asking for it reuses it instead of training it again; whether it was
        kept. Nothing is replaced: a run already stored, or being made by someone else, stays."""
        if self.folder is None or not result.ok or result.recipe != dict(recipe):
            return False
        path = self.folder / self.key(recipe, steps, repeat)
        lock = FileLock(_lock_path(path))
        if not lock.acquire():
            return False
        try:
            if stored(path, recipe) is not None:
                return False
            self._keep(result, path, recipe, steps, repeat)
            return True
        finally:
            lock.release()

    def _submit(self, recipe: Recipe, steps: int, path: Path) -> Future[RunResult]:
        self._count(launched=1, steps=steps)
        with self._counts:
            self._trained[path.resolve()] = steps
        future = self.executor.submit(self.workload, recipe, steps, path, self.timeout_s, measured=False)
        future.add_done_callback(self._timed)
        return future

    def _count(self, launched: int = 0, reused: int = 0, steps: int = 0, seconds: float = 0.0) -> None:
        with self._counts:
            self.launched += launched
            self.reused += reused
            self.steps_launched += steps
            self.seconds += seconds

    def _timed(self, future: Future[RunResult]) -> None:
        with contextlib.suppress(Exception):
            self._count(seconds=future.result().wall_s)

    def _load(self, path: Path, recipe: Recipe) -> RunResult | None:
        """``stored``, under the run's lock: a result that cannot be read is set aside, with a note."""
        file = path / RESULT
        try:
            text = file.read_text()
        except OSError:
            return None
        try:
            result = RunResult.model_validate_json(text)
        except ValueError:
            aside = file.with_name(f"{RESULT}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
            file.replace(aside)
            self._say(f"the stored result {file} was corrupt or cut off ({len(text)} bytes): set aside as "
                      f"{aside.name}, and the run trained again", self._set_aside)
            return None
        return result if result.ok and result.recipe == dict(recipe) else None

    def _keep(self, result: RunResult, path: Path, recipe: Recipe, steps: int, repeat: int) -> None:
        """Store a finished run under its key (a copy of its result when it was made elsewhere), with
        the fingerprint it was made with, the fingerprint's manifest, and the folder's workload."""
        assert self.folder is not None and self._code is not None
        if Path(result.out_dir).resolve() != path.resolve():
            write_atomic(path / RESULT, result.model_dump_json())
        manifest = self.folder / MANIFESTS / f"{self._code}.json"
        if not manifest.exists():
            write_atomic(manifest, json.dumps(self._manifest, indent=1, sort_keys=True))
        if not (self.folder / STORE_FILE).exists():
            write_atomic(self.folder / STORE_FILE, json.dumps({"workload": self.workload.identity()}))
        write_atomic(path / FINGERPRINT_FILE, json.dumps({"fingerprint": self._code, "recipe": dict(recipe),
                                                          "steps": steps, "repeat": repeat,
                                                          "experiment": _experiment(recipe, steps, repeat)}))

    def _explain(self, recipe: Recipe, steps: int, repeat: int) -> None:
        """A run about to be trained: if the folder holds it made with other code, say what changed."""
        assert self.folder is not None
        if self._index is None:
            self._index = {}
            for file in self.folder.glob(f"*/{FINGERPRINT_FILE}"):
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    info = json.loads(file.read_text())
                    self._index.setdefault(info["experiment"], []).append((file.stat().st_mtime, info["fingerprint"]))
        others = [(t, fp) for t, fp in self._index.get(_experiment(recipe, steps, repeat), []) if fp != self._code]
        if not others:
            return
        old = max(others)[1]
        try:
            said = "; ".join(changes(json.loads((self.folder / MANIFESTS / f"{old}.json").read_text()),
                                     self._manifest)) or "nothing recorded changed"
        except (OSError, ValueError):
            said = f"the trainer's fingerprint changed ({old} -> {self._code}; no manifest of {old} is stored)"
        with self._counts:
            first = said not in self._missed
            self._missed[said] = self._missed.get(said, 0) + 1
        if first:
            self._say(f"stored runs of this baseline are not reused: since they were made, {said}", None)

    def _say(self, message: str, keep: list[str] | None) -> None:
        if keep is not None:
            keep.append(message)
        if self.progress is not None:
            self.progress(Note(message))


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _copy(source: Future[RunResult], target: Future[RunResult]) -> None:
    if target.cancelled():
        return
    with contextlib.suppress(Exception):  # InvalidStateError: cancelled meanwhile
        if source.cancelled():
            target.cancel()
        elif source.exception() is not None:
            target.set_exception(source.exception())
        else:
            target.set_result(source.result())


def check_folder(folder: Path, workload: Workload, option: str = "--runs") -> None:
    """Refuse, before anything runs, a runs folder that cannot serve: a file, a place this process
    cannot write (tried by writing, since root passes every permission check), the runs of another
    trainer, or a folder that holds other things than runs."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == folder else f"cannot be created: {existing} is a file"
        raise ConfigError(folder, "", f"{what}, not a folder; the guard stores its runs in a folder: give "
                                      f"{option} another path")
    probe = existing / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        probe.unlink()
    except OSError as e:
        raise ConfigError(folder, "", f"cannot be written ({e.strerror} in {existing}); give {option} a folder "
                                      "this user can write") from None
    if existing != folder:
        return
    try:
        info = json.loads((folder / STORE_FILE).read_text())
    except (OSError, ValueError):
        info = None
    if isinstance(info, dict) and info.get("workload") != workload.identity():
        raise ConfigError(folder, "", f"holds the runs of another workload ({json.dumps(info.get('workload'))}; "
                                      f"this one is {json.dumps(workload.identity())}): give {option} another "
                                      "folder, or delete this one")
    foreign = sorted(p.name for p in folder.iterdir() if not _OURS.fullmatch(p.name))
    if info is None and foreign:
        raise ConfigError(folder, "", f"is not a runs folder: it holds {', '.join(foreign[:3])}"
                                      f"{' ...' if len(foreign) > 3 else ''}; give {option} an empty or new folder")


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
