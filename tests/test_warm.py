"""Warm starts: a fork of a launcher that imported torch once is still a fresh, killable run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipetune.trainer import data
from recipetune.workloads.reference import ReferenceWorkload
from recipetune.workloads.warm import Launcher

# A wait on another process ends when what it waits for happens; this bound only stops a hung test.
PATIENCE_S = 300.0
W = ReferenceWorkload()
RECIPE = W.resolve({"model": "nano", "seq_len": 32, "global_batch_size": 4, "micro_batch_size": 2,
                    "device": "cpu", "num_threads": 1, "eval_batches": 1})


@pytest.fixture
def warm(monkeypatch):
    monkeypatch.setenv("RECIPETUNE_WARM_START", "1")
    Launcher.close()  # launchers an earlier test left idle in this process are not this test's
    yield
    Launcher.close()


def test_warm_run_trains_like_a_cold_one(warm, tmp_path, monkeypatch):
    W.prepare(RECIPE)  # a campaign starts the launcher before it plans: its imports overlap the driver's
    launchers = Launcher.processes()
    assert len(launchers) == 1
    a = W.run(RECIPE, 4, tmp_path / "warm1", timeout_s=120)  # its corpus now preloaded in the launcher
    assert Launcher.processes() == launchers
    b = W.run(RECIPE, 4, tmp_path / "warm2", timeout_s=120)
    assert Launcher.processes() == launchers  # runs one after another: one launcher, a fresh child per run
    monkeypatch.setenv("RECIPETUNE_WARM_START", "0")
    cold = W.run(RECIPE, 4, tmp_path / "cold", timeout_s=120)
    assert a.status == b.status == cold.status == "ok", (a.cause, b.cause, cold.cause)
    assert a.losses() == b.losses() == cold.losses()  # same seed, same data: the same maths
    assert (tmp_path / "warm2" / "stderr.log").exists() and (tmp_path / "warm2" / "run.json").exists()


def test_warm_run_timeout_and_invalid_recipe(warm, tmp_path):
    slow = W.run(RECIPE, 100_000, tmp_path / "slow", timeout_s=2)
    assert slow.status == "timeout"
    bad = W.run(RECIPE.with_(data=str(tmp_path / "missing")), 3, tmp_path / "bad", timeout_s=60)
    assert bad.status == "invalid" and "missing" in bad.cause
    assert W.run(RECIPE, 2, tmp_path / "after", timeout_s=120).ok  # the launcher survived both


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            if f"\nPPid:\t{pid}\n" in status.read_text():
                out.append(int(status.parent.name))
    return out


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    with contextlib.suppress(OSError):
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    return False


def test_launcher_kills_its_run_when_the_driver_dies(tmp_path):
    # A driver killed with SIGKILL must not leave a trainer running (it would skew the next measurement).
    # The run is far longer than any wait here: only the launcher's kill can end it.
    code = (f"import os, sys; os.environ['RECIPETUNE_WARM_START'] = '1'; from pathlib import Path; "
            f"from recipetune.workloads.warm import Launcher; from tests.test_warm import W, RECIPE; "
            f"W.run(RECIPE, 10**9, Path({str(tmp_path / 'run')!r}), timeout_s=None)")
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.pathsep
                              .join([os.environ.get("PYTHONPATH", ""), os.getcwd()])})
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + PATIENCE_S  # a guard against a hung start only
        while not (metrics.exists() and metrics.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling for the run's first step, not standing in for work
        assert metrics.exists(), "the warm run never started"
        [launcher] = children(driver.pid)
        trainers = children(launcher)
        assert trainers, "the run is not the launcher's child"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + PATIENCE_S  # the launcher notices within 0.2 s on a quiet machine
    while any(running(pid) for pid in trainers) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the trainer to end
    left = [pid for pid in trainers if running(pid)]
    for pid in left:  # not left behind by a failing test either
        os.kill(pid, signal.SIGKILL)
    assert not left, "the trainer kept running after its driver died"


def test_preloaded_corpus_is_reused_until_its_file_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    data.preload("corpus.txt")
    first = data.load_corpus("corpus.txt")
    assert data.load_corpus("corpus.txt") is first  # a fork finds it in memory: no read, no hash
    assert data.load_corpus("corpus.txt", val_fraction=0.1) is not first  # another split is loaded apart
    Path("corpus.txt").write_text("a different text, of another length\n" * 40)
    changed = data.load_corpus("corpus.txt")
    assert changed is not first and changed.fingerprint != first.fingerprint
    data.preload(str(tmp_path))  # a folder's files could change unseen: never preloaded
    assert all(key[0] != str(tmp_path) for key in data._PRELOADED)


def test_the_driver_does_not_import_torch():
    # Only the runs train; the driver checks recipes and counts FLOPs from the torch-free presets.
    code = ("import sys; from pathlib import Path; from recipetune.config import load_campaign; "
            "c = load_campaign(Path('examples/tiny-campaign.yaml'), []); c.workload.check(c.baseline); "
            "c.workload.flops_per_token(c.baseline); import recipetune.speed.job; "
            "assert 'torch' not in sys.modules, 'the driver imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
