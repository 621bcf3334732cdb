"""Evidence in parallel and reused (guard/runs.py, execute/executor.py, core/process.py: MACHINE).

Real subprocesses, no training: a run is a small Python command that records when it starts and
ends. Loss-only runs share the machine up to its capacity (proven by two runs that each wait for the
other to start: they can only finish side by side), a measured run never shares it, closing the
executor kills the loss runs in flight, GPUs are handed out one run each, and a run stored by one
verdict is reused by the next, in flight or finished, until the trainer's code changes.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from recipetune.core.process import MACHINE, Machine, Share, sharing
from recipetune.execute.executor import LocalExecutor, local_share
from recipetune.guard.runs import Runs
from recipetune.workloads.command import CommandSpec, CommandWorkload

# A run: note its start in the shared folder, wait (a bounded poll) until the run named by `wait_for`
# has started too (0: nobody), write a 12-step metrics stream, note its end.
SCRIPT = """
import json, os, sys, time
folder, me, partner, steps, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
os.makedirs(out, exist_ok=True)
open(os.path.join(folder, me + ".started"), "w").close()
deadline = time.monotonic() + 120
while partner != "0" and not os.path.exists(os.path.join(folder, partner + ".started")):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.02)
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for s in range(1, steps + 1):
        f.write(json.dumps({"step": s, "loss": 2.0 - 0.01 * s, "tokens": 64, "step_time_s": 0.01}) + "\\n")
open(os.path.join(folder, me + ".ended"), "w").close()
"""


def workload(folder: Path, threads: int = 1) -> CommandWorkload:
    (folder / "run.py").write_text(SCRIPT)
    spec = CommandSpec.model_validate({
        "argv": ["{python}", "run.py", str(folder), "{name}", "{partner}", "{steps}", "{out_dir}"],
        "env": {"OMP_NUM_THREADS": str(threads)},
        "knobs": {"name": {"default": "a"}, "partner": {"default": "0"}, "seed": {"default": 0, "means": "seed"}},
    })
    return CommandWorkload(spec, folder)


def test_two_loss_runs_share_the_machine_and_a_measured_run_waits_for_them(tmp_path):
    wl = workload(tmp_path)
    ex = LocalExecutor(loss_runs=2)
    base = wl.resolve({})
    assert ex.loss_runs_at_once(wl, base) == min(2, local_share(wl, base).capacity)
    if ex.loss_runs_at_once(wl, base) < 2:
        pytest.skip("one core: loss runs cannot share it")
    # Each waits for the other to start: they can only both finish if they ran side by side.
    a = ex.submit(wl, base.with_(name="a", partner="b"), 12, tmp_path / "a", 120, measured=False)
    b = ex.submit(wl, base.with_(name="b", partner="a"), 12, tmp_path / "b", 120, measured=False)
    assert a.result().ok and b.result().ok, (a.result().cause, b.result().cause)
    # A measured run asked for while loss runs hold the machine starts only when they have ended, and
    # a loss run asked for meanwhile waits behind it.
    (tmp_path / "go.started").unlink(missing_ok=True)
    c = ex.submit(wl, base.with_(name="c", partner="go"), 12, tmp_path / "c", 120, measured=False)
    while not (tmp_path / "c.started").exists():
        threading.Event().wait(0.02)
    measured: list = []
    waiter = threading.Thread(target=lambda: measured.append(ex.submit(wl, base.with_(name="m"), 12, tmp_path / "m",
                                                                         120)))
    waiter.start()
    while MACHINE.waiting == 0:
        threading.Event().wait(0.02)
    d = ex.submit(wl, base.with_(name="d"), 12, tmp_path / "d", 120, measured=False)
    (tmp_path / "go.started").touch()  # c may end now
    waiter.join()
    assert c.result().ok and measured[0].result().ok and d.result().ok

    def at(name: str) -> int:
        return (tmp_path / name).stat().st_mtime_ns

    assert at("c.ended") <= at("m.started") and at("m.ended") <= at("d.started")
    ex.close()


def test_closing_the_executor_kills_the_loss_runs_in_flight(tmp_path):
    wl = workload(tmp_path)
    ex = LocalExecutor(loss_runs=1)
    base = wl.resolve({})
    stuck = ex.submit(wl, base.with_(name="s", partner="never"), 12, tmp_path / "s", 600, measured=False)
    while not (tmp_path / "s.started").exists():
        threading.Event().wait(0.02)
    # Asked for only now: submitted together, the pool's two threads may take the machine in either order.
    queued = ex.submit(wl, base.with_(name="q"), 12, tmp_path / "q", 600, measured=False)
    ex.close()  # Ctrl-C in the driver: nothing may keep running
    assert stuck.exception() is not None and not (tmp_path / "s.ended").exists()
    assert queued.cancelled() or queued.exception() is not None
    assert not (tmp_path / "q.started").exists()


def test_gpus_are_handed_out_one_run_each():
    machine = Machine()
    share = Share(1, 2, gpus=True)
    seen: list[dict] = []
    inside = threading.Barrier(2)

    def run() -> None:
        with sharing(share), machine.use() as env:
            seen.append(env)
            inside.wait(timeout=30)  # both hold their GPU at once

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in seen) == ["0", "1"]


def test_local_share_counts_threads_on_a_cpu_and_devices_on_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr("recipetune.execute.executor.visible_gpus", lambda: 0)
    wl = workload(tmp_path, threads=1)
    cpu = local_share(wl, wl.resolve({}))
    assert cpu.units == 1 and not cpu.gpus
    assert local_share(workload(tmp_path, threads=10_000), wl.resolve({})).units == cpu.capacity  # takes them all
    monkeypatch.setattr("recipetune.execute.executor.visible_gpus", lambda: 8)
    gpu = local_share(wl, wl.resolve({}), at_once=3)
    assert gpu.gpus and gpu.units == 1 and gpu.capacity == 3


def test_a_stored_run_is_reused_by_the_next_verdict_until_the_code_changes(tmp_path):
    wl = workload(tmp_path)
    recipe = wl.resolve({"name": "r"})
    store = tmp_path / "guard-runs"
    first = Runs(wl, folder=store)
    a = first.start(recipe, 12, tmp_path / "v1" / "parity" / "seed-0").result()
    assert a.ok and first.launched == 1 and first.reused == 0
    assert (tmp_path / "v1" / "parity" / "seed-0").is_symlink()
    second = Runs(wl, folder=store)
    b = second.start(recipe, 12, tmp_path / "v2" / "parity" / "seed-0").result()
    assert second.launched == 0 and second.reused == 1 and b.losses() == a.losses()
    assert second.has(recipe, 12) and not second.has(recipe, 13) and not second.has(recipe.with_(seed=1), 12)
    # The same recipe of a changed trainer is another experiment
    changed = CommandWorkload(CommandSpec.model_validate({**wl.spec.model_dump(), "env": {"OMP_NUM_THREADS": "2"}}),
                              tmp_path)
    assert Runs(changed, folder=store).key(recipe, 12) != second.key(recipe, 12)


def test_two_verdicts_asking_for_one_run_at_once_train_it_once(tmp_path):
    wl = workload(tmp_path)
    store = tmp_path / "guard-runs"
    waiting = wl.resolve({"name": "w", "partner": "go"})
    one, two = Runs(wl, folder=store), Runs(wl, folder=store)
    f1 = one.start(waiting, 12, tmp_path / "v1" / "x")
    f2 = two.start(waiting, 12, tmp_path / "v2" / "x")  # still in flight: shared, not trained again
    (tmp_path / "go.started").touch()
    assert f1.result().ok and f2.result().ok and f1 is f2
    assert (one.launched, two.launched, two.reused) == (1, 0, 1)


def test_a_run_a_verdict_no_longer_needs_is_stopped_unless_another_verdict_waits_for_it(tmp_path):
    # guard/looks_steps.py stops a longer pair whose middle look decided: through the run's stop file, as a
    # search's pruner does; a stopped run is not stored, and its untrained steps leave the verdict's budget
    wl = workload(tmp_path)
    store = tmp_path / "guard-runs"
    stuck = wl.resolve({"name": "s", "partner": "never"})
    runs = Runs(wl, folder=store)
    future = runs.start(stuck, 12, tmp_path / "v1" / "x")
    while not (tmp_path / "s.started").exists():
        threading.Event().wait(0.02)
    assert runs.stop(tmp_path / "v1" / "x", "the middle look decided", 4)
    result = future.result()
    assert result.status == "pruned" and runs.steps_launched == 4 and not Runs(wl, folder=store).has(stuck, 12)
    # one another verdict of this process waits for too runs on; a run found stored is not this verdict's
    shared = wl.resolve({"name": "w", "partner": "go"})
    one, two = Runs(wl, folder=store), Runs(wl, folder=store)
    f1, f2 = one.start(shared, 12, tmp_path / "v2" / "x"), two.start(shared, 12, tmp_path / "v3" / "x")
    assert not one.stop(tmp_path / "v2" / "x", "no longer needed", 0) and not two.stop(tmp_path / "v3" / "x", "", 0)
    (tmp_path / "go.started").touch()
    assert f1.result().ok and f2.result().ok


def test_a_failed_run_is_not_reused(tmp_path):
    wl = workload(tmp_path)
    store = tmp_path / "guard-runs"
    broken = wl.resolve({"name": "f", "partner": "never"})
    runs = Runs(wl, folder=store, timeout_s=1)
    assert not runs.start(broken, 12, tmp_path / "v1" / "x").result().ok  # killed for its timeout
    again = Runs(wl, folder=store, timeout_s=1)
    assert not again.has(broken, 12)
    again.start(broken, 12, tmp_path / "v2" / "x").result()
    assert again.launched == 1


def test_a_stored_result_names_its_recipe(tmp_path):
    wl = workload(tmp_path)
    store = tmp_path / "guard-runs"
    runs = Runs(wl, folder=store)
    recipe = wl.resolve({"name": "k"})
    runs.start(recipe, 12, tmp_path / "v" / "x").result()
    stored = json.loads((store / runs.key(recipe, 12) / "result.json").read_text())
    assert stored["recipe"] == dict(recipe) and stored["status"] == "ok"
    assert sys.executable  # the run used this interpreter ({python})
