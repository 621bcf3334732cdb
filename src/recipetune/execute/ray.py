"""Trials on a Ray cluster, each on hardware of its own.

Every trial (and every guard measurement: the baseline profile, a final verdict's interleaved A/B
pairs) holds a placement group for its whole run: ``nodes`` bundles of the campaign's
``execute.resources``, packed on one node (``STRICT_PACK``) or, for a multi-node trial, one per
node (``STRICT_SPREAD``). The run's task asks for the whole bundle, so Ray sets
``CUDA_VISIBLE_DEVICES`` to exactly its GPUs: no two measured runs share a device. A ``--parallel``
the cluster cannot hold at once is refused before anything starts.

Faults: a task whose worker process or node dies is rerun by Ray (``execute.retries``, once by
default; a placement group's bundles on a dead node are rescheduled onto a live one). The rerun
first kills the previous attempt's trainer if it is still alive on that node. A trial that dies
on every attempt comes back as ``TrialLost`` with Ray's cause; the campaign records it and goes on.
Each attempt is a line of ``attempts.jsonl`` in the trial's folder (node, worker pid).

The campaign folder must be on a filesystem every node sees (NFS, Lustre, ...): runs write their
logs and metrics stream there, the driver reads them back; a fine-tuning child also reads the
experiment file, the task's files and the base model. ``check_shared`` proves it before the first
trial: a task on every live node finds each of these at the same path with the same content (a
file's size and hash; a folder through a token file the driver writes there and removes), or the
campaign is refused naming the path and the node.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.exceptions import NodeDiedError, RayError, RayTaskError, TaskUnschedulableError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from recipetune.core.errors import ConfigError
from recipetune.core.measure import RunResult
from recipetune.core.process import kill_orphans
from recipetune.core.recipe import Recipe
from recipetune.execute.config import ExecuteConfig, TrialResources
from recipetune.execute.executor import TrialLost
from recipetune.workloads.base import ProgressFn, Workload

T = TypeVar("T")


def connect(address: str | None, file: str | Path = "campaign") -> None:
    """Join the cluster at ``address`` ('auto', ray://...), or start a local Ray instance."""
    if ray.is_initialized():
        return
    try:
        # A Ray instance started here (no address) stays on the loopback interface: it serves this
        # machine only, and nothing of it listens on a network address.
        local = {"_node_ip_address": "127.0.0.1"} if address is None else {}
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False, **local)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"at {address}" if address else "on this machine"
        raise ConfigError(file, "--ray-address", f"cannot reach a Ray cluster {where}: {e}") from None


def placements(resources: TrialResources, nodes: list[dict[str, float]]) -> int:
    """How many trials of ``resources`` the live ``nodes`` (Ray's per-node resource totals) hold at once."""
    bundle = resources.bundle()
    per_node = [min(int(n.get(k, 0.0) // v) for k, v in bundle.items()) for n in nodes]
    if resources.nodes == 1:
        return sum(per_node)
    # A multi-node trial takes one bundle on each of ``nodes`` distinct nodes.
    fits = sorted((c for c in per_node if c > 0), reverse=True)
    trials = 0
    while len(fits) >= resources.nodes:
        trials += 1
        fits = sorted((c - 1 if i < resources.nodes else c for i, c in enumerate(fits)), reverse=True)
        fits = [c for c in fits if c > 0]
    return trials


def check_capacity(settings: ExecuteConfig, nodes: list[dict[str, float]], devices: int, file: str | Path) -> None:
    """Refuse resources or a parallelism that would make trials share hardware (ConfigError, exit 2)."""
    res = settings.resources
    if res.gpus and devices > res.gpus * res.nodes:
        raise ConfigError(file, "execute.resources.gpus",
                          f"the baseline runs on {devices} devices but a trial holds {res.gpus:g} GPU(s) x "
                          f"{res.nodes} node(s); give each trial at least as many GPUs as it uses")
    fit = placements(res, nodes)
    if fit == 0:
        raise ConfigError(file, "execute.resources",
                          f"no {res.nodes} node(s) of the cluster can hold {res.bundle()} each "
                          f"(nodes: {[{k: v for k, v in n.items() if k in res.bundle()} for n in nodes]})")
    if settings.parallel > fit:
        raise ConfigError(file, "--parallel",
                          f"{settings.parallel} trials in flight need {settings.parallel} placements of "
                          f"{res.nodes} x {res.bundle()}, the cluster holds {fit} at once; more would make "
                          f"trials share hardware or queue: use --parallel {fit} or less")


def _fingerprint(path: Path) -> str:
    """A file's size and the hash of its first MiB: cheap, and enough to tell another copy apart."""
    with path.open("rb") as f:
        return f"{path.stat().st_size}:{hashlib.sha256(f.read(1 << 20)).hexdigest()}"


@ray.remote(num_cpus=0)
def _probe(expected: list[tuple[str, str]]) -> list[str]:
    """On one node: each (path, fingerprint) the driver sees, as this node sees it; what differs."""
    problems = []
    for path, want in expected:
        p = Path(path)
        try:
            have = _fingerprint(p)
        except OSError as e:
            problems.append(f"{path}: {e.strerror or e}")
            continue
        if have != want:
            problems.append(f"{path}: not the driver's copy (size:sha256 {have.split(':')[0]} bytes here)")
    return problems


def check_shared(paths: Sequence[Path], file: str | Path, timeout_s: float = 120.0) -> None:
    """Refuse (ConfigError) unless every live node sees each of ``paths`` at the same path: a file
    with the same content, a folder (or, for one not created yet, the folder it will be created in)
    through a token file written there for the check and removed after it."""
    expected: list[tuple[str, str]] = []
    tokens: list[Path] = []
    try:
        for raw in dict.fromkeys(Path(p).resolve() for p in paths):
            if raw.is_file():
                expected.append((str(raw), _fingerprint(raw)))
                continue
            folder = raw
            while not folder.is_dir():  # a campaign folder not created yet: the one that will hold it
                folder = folder.parent
            token = folder / f".recipetune-shared-check-{secrets.token_hex(8)}"
            token.write_text(secrets.token_hex(16))
            tokens.append(token)
            expected.append((str(token), _fingerprint(token)))
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        refs = [_probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(expected) for n in nodes]
        deadline = time.monotonic() + timeout_s
        answers: list[list[str] | None] = []
        for node, ref in zip(nodes, refs, strict=True):
            try:
                answers.append(ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0)))
            except (TaskUnschedulableError, NodeDiedError):
                # The node left between the listing and the probe: it runs nothing of this campaign.
                # One still alive that cannot take the probe is a cluster fault, not a gap to skip.
                if _alive(node["NodeID"]):
                    raise
                answers.append(None)
    finally:
        for token in tokens:
            token.unlink(missing_ok=True)
    for node, problems in zip(nodes, answers, strict=True):
        if problems:
            where = f"{node.get('NodeManagerAddress', '?')} (node {node['NodeID'][:12]})"
            raise ConfigError(file, "execute", f"node {where} does not see the campaign's files as this driver "
                              f"does: {'; '.join(problems)}. Every node needs the campaign folder and the files "
                              "the runs read at the same paths: put them on a filesystem the whole cluster "
                              "mounts (docs/distributed.md)")


def _alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """Variables the trainer inherits; a Ray worker is reused, so they are put back afterwards."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _note_attempt(out_dir: Path) -> int:
    """One line per attempt; the previous attempt's trainer, if its worker died here, is killed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "attempts.jsonl"
    previous = log.read_text().count("\n") if log.exists() else 0
    if previous:
        kill_orphans(str(out_dir))
    with log.open("a") as f:
        f.write(json.dumps({"attempt": previous + 1, "node": ray.util.get_node_ip_address(),
                            "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                            "placement_group": ray.get_runtime_context().get_placement_group_id(),
                            "time": time.time()}) + "\n")
    return previous + 1


class Spread(Workload):
    """A workload whose every run spans the nodes of a placement group: this process runs rank 0,
    a task on each other bundle runs the same command with its rank (``RECIPETUNE_NODE_RANK``,
    ``RECIPETUNE_NNODES``, ``RECIPETUNE_NPROC_PER_NODE``, ``MASTER_ADDR``, ``MASTER_PORT``; what
    ``torchrun --nnodes ... --node-rank ...`` needs). Rank r > 0 keeps its logs in ``node-r/``."""

    def __init__(self, inner: Workload, pg: PlacementGroup | None, resources: TrialResources):
        self.inner, self.pg, self.resources = inner, pg, resources
        self.kind = inner.kind

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")  # absent while unpickling
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def knobs(self):  # type: ignore[no-untyped-def]
        return self.inner.knobs()

    def invariants(self):  # type: ignore[no-untyped-def]
        return self.inner.invariants()

    def check(self, recipe: Recipe) -> list[str]:
        return self.inner.check(recipe)

    def flops_per_token(self, recipe: Recipe) -> float | None:
        return self.inner.flops_per_token(recipe)

    def n_devices(self, recipe: Recipe) -> int:
        return self.inner.n_devices(recipe)

    def command(self, recipe: Recipe, steps: int, out_dir: Path) -> list[str]:
        return self.inner.command(recipe, steps, out_dir)

    def resolve(self, values: dict) -> Recipe:
        return self.inner.resolve(values)

    def run(self, recipe: Recipe, steps: int, out_dir: Path, timeout_s: float | None = None,
            progress: ProgressFn | None = None) -> RunResult:
        res = self.resources
        env = {"RECIPETUNE_NNODES": str(res.nodes), "RECIPETUNE_NPROC_PER_NODE": str(res.procs()),
               "MASTER_ADDR": ray.util.get_node_ip_address(), "MASTER_PORT": str(_free_port())}
        others = [
            _rank_task.options(**_task_options(res, self.pg, rank, retries=0)).remote(
                self.inner, recipe, steps, str(out_dir / f"node-{rank}"), timeout_s,
                {**env, "RECIPETUNE_NODE_RANK": str(rank)})
            for rank in range(1, res.nodes)
        ]
        with _environ({**env, "RECIPETUNE_NODE_RANK": "0"}):
            result = self.inner.run(recipe, steps, out_dir, timeout_s=timeout_s, progress=progress)
        for rank, ref in enumerate(others, start=1):
            other = ray.get(ref)
            if result.ok and not other.ok:
                result = result.model_copy(update={"status": other.status,
                                                   "cause": f"node rank {rank}: {other.cause}"})
        return result


@ray.remote
def _rank_task(workload: Workload, recipe: Recipe, steps: int, out_dir: str, timeout_s: float | None,
               env: dict[str, str]) -> RunResult:
    with _environ(env):
        return workload.run(recipe, steps, Path(out_dir), timeout_s=timeout_s)


@ray.remote
def _unit_task(fn: Callable[..., Any], workload: Workload | None, note_dir: str | None, args: tuple,
               kwargs: dict) -> Any:
    if note_dir is not None:
        _note_attempt(Path(note_dir))
    return fn(*args, **kwargs) if workload is None else fn(workload, *args, **kwargs)


def _run(workload: Workload, recipe: Recipe, steps: int, out_dir: Path, timeout_s: float | None) -> RunResult:
    return workload.run(recipe, steps, out_dir, timeout_s=timeout_s)


def _task_options(res: TrialResources, pg: PlacementGroup | None, bundle: int, retries: int) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": res.cpus, "num_gpus": res.gpus, "resources": dict(res.custom),
                               "max_retries": retries}
    if pg is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle)
    return options


class RayExecutor:
    """Trials (and guard measurements) as Ray tasks, each in a placement group of its own."""

    def __init__(self, settings: ExecuteConfig, devices: int = 1, file: str | Path = "campaign",
                 shared: Sequence[Path] = ()):
        connect(settings.ray_address, file)
        self.settings, self.res = settings, settings.resources
        self.parallel = settings.parallel
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        check_capacity(settings, nodes, devices, file)
        if shared:
            check_shared(shared, file)
        self._lock = threading.Lock()
        self._inflight: dict[Future, tuple[PlacementGroup, list[ray.ObjectRef]]] = {}

    def submit(self, workload: Workload, recipe: Recipe, steps: int, out_dir: Path, timeout_s: float | None,
               progress: ProgressFn | None = None, measured: bool = True) -> Future[RunResult]:
        # Progress callbacks stay in the driver: a remote run reports only its end. A loss-only run
        # (measured=False) holds a placement of its own like any other: the cluster runs as many at
        # once as it has placements, across its nodes.
        return self._start(_run, workload, (recipe, steps, out_dir, timeout_s), {}, note_dir=out_dir)

    def loss_runs_at_once(self, workload: Workload, recipe: Recipe) -> int:
        return max(1, placements(self.res, [n["Resources"] for n in ray.nodes() if n.get("Alive")]))

    def call(self, fn: Callable[..., T], workload: Workload | None, *args: Any, **kwargs: Any) -> Future[T]:
        kwargs.pop("progress", None)
        return self._start(fn, workload, args, kwargs, note_dir=None)

    def _start(self, fn: Callable[..., Any], workload: Workload | None, args: tuple, kwargs: dict,
               note_dir: Path | None) -> Future:
        res = self.res
        pg = placement_group([res.bundle()] * res.nodes, strategy="STRICT_PACK" if res.nodes == 1 else "STRICT_SPREAD")
        if res.nodes > 1 and workload is not None:
            workload = Spread(workload, pg, res)
        ref = _unit_task.options(**_task_options(res, pg, 0, self.settings.retries)).remote(
            fn, workload, None if note_dir is None else str(note_dir), args, kwargs)
        future: Future = Future()
        with self._lock:
            self._inflight[future] = (pg, [ref])
        threading.Thread(target=self._wait, args=(future, pg, ref), daemon=True).start()
        return future

    def _wait(self, future: Future, pg: PlacementGroup, ref: ray.ObjectRef) -> None:
        try:
            value = ray.get(ref)  # queues until the placement group is placed, then runs
        except RayTaskError as e:  # the code raised: the caller sees that exception
            cause = e.cause if isinstance(e.cause, BaseException) else e
            future.set_exception(cause if isinstance(cause, Exception) else RuntimeError(str(cause)))
        except RayError as e:  # the process or node died on every attempt
            tries = self.settings.retries + 1
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            future.set_exception(TrialLost(f"{type(e).__name__} after {tries} attempt(s): {first}"))
        except Exception as e:
            future.set_exception(e)
        else:
            future.set_result(value)
        finally:
            with self._lock:
                self._inflight.pop(future, None)
            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    def close(self) -> None:
        """Stop what is still running: a cancelled task gets KeyboardInterrupt, which kills its trainer."""
        with self._lock:
            inflight = list(self._inflight.items())
        for _, (_, refs) in inflight:
            for ref in refs:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
        deadline = time.monotonic() + 10
        for future, _ in inflight:
            with contextlib.suppress(Exception):
                future.exception(timeout=max(0.0, deadline - time.monotonic()))
