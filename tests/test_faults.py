"""Faults injected into whole `recipetune tune` campaigns (issue 22), each bounded, loopback only and
cleaned up after itself; docs/distributed.md has the table of what each does.

- the study's PostgreSQL server (tests/fixtures/postgres_server.py) restarted while a trial runs:
  the driver waits and reconnects; the same outage past ``execute.db_retry_s`` stops it, resumable;
- two drivers on one study never start more runs than the shared budget;
- 20 random ``kill -9`` of the driver's process group, each followed by ``--resume``;
- a full disk in the campaign folder (a small tmpfs; root only).

The drivers are `recipetune tune` processes on test_search_campaign.py's fake workload and guard
(a trial is a subprocess writing a few metrics lines, ~0.25 s a step with ``FAKE_STEP_DELAY``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from postgres_server import PostgresServer, binaries  # noqa: E402
from test_search_campaign import PATIENCE_S, records, wait_for, write_campaign_file  # noqa: E402

from recipetune.engine import database  # noqa: E402
from recipetune.engine.database import StoreUnavailable  # noqa: E402
from recipetune.engine.store import CampaignStore  # noqa: E402

DRIVER = str(Path(__file__).resolve().parent / "test_search_campaign.py")  # `recipetune tune` with the fakes
ENDED = ("passed", "rejected", "failed")


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("psycopg")
    bindir = binaries()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql); .ci/run installs it")
    pg = PostgresServer(bindir).start()
    yield pg
    pg.stop()


def tune(f: Path, out: Path, *extra: str, delay: float = 0.0, gate: Path | None = None, held_from: int = 0,
         **popen) -> subprocess.Popen:
    """`recipetune tune` on the fakes; with ``gate``, trials from ``held_from`` on wait until it exists."""
    env = {**os.environ, "FAKE_STEP_DELAY": str(delay),
           **({"FAKE_GATE": str(gate), "FAKE_GATE_FROM": str(held_from)} if gate else {})}
    return subprocess.Popen([sys.executable, DRIVER, "tune", str(f), "--out", str(out), *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen)


def lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def trial_lines(out: Path, number: int) -> int:
    """Metrics lines trial ``number`` wrote so far (0 before it starts)."""
    return max((lines(m) for m in (out / "trials").glob(f"{number:04d}-*/metrics.jsonl")), default=0)


def assert_each_recipe_ran_once(recs: list, budget: int) -> list:
    ran = [r for r in recs if r.status in ENDED and r.attrs.get("ran")]
    ids = [r.attrs["recipe_id"] for r in ran]
    assert len(ids) == budget and len(set(ids)) == budget, [(r.number, r.status, r.attrs.get("recipe_id"))
                                                            for r in recs]
    assert all(r.state in ("COMPLETE", "FAIL") for r in recs)  # nothing left RUNNING
    return ran


# -- the study's database server restarted ------------------------------------------------------------


def test_postgres_restarted_mid_trial_the_driver_reconnects_and_loses_nothing(server, tmp_path):
    url = server.create_database("restart")
    f, out = write_campaign_file(tmp_path, budget=4), tmp_path / "campaign"
    gate = tmp_path / "gate"  # trial 1 waits there until the server is down, however slow the machine
    proc = tune(f, out, f"search.storage={url}", delay=0.25, gate=gate, held_from=1)
    wait_for(lambda: any(r.number == 1 and "run_dir" in r.attrs for r in records(out, url)), proc,
             "trial 1 never started")
    server.halt()  # every connection of the driver is cut while trial 1 runs
    try:
        gate.touch()
        # Trial 1 runs to its end without the database; the driver then needs it to close the trial.
        wait_for(lambda: trial_lines(out, 1) >= 4, proc, "trial 1 did not finish while the database was down")
    finally:
        server.boot()  # the same server, data and port: a restart
    assert proc.wait(timeout=PATIENCE_S) == 0, proc.stderr.read().decode()[-3000:]
    assert "unreachable; retrying" in proc.stderr.read().decode()

    recs = records(out, url)
    assert_each_recipe_ran_once(recs, 4)
    assert not [r for r in recs if r.status == "interrupted"]  # the trial in flight was kept, not lost
    assert recs[1].attrs["status"] in ENDED and lines(Path(recs[1].attrs["run_dir"]) / "metrics.jsonl") == 4
    assert json.loads((out / "verdict.json").read_text())["decision"] in ("APPROVED", "KEEP BASELINE")


def test_database_down_past_the_bound_stops_the_driver_resumably(server, tmp_path):
    url = server.create_database("outage")
    store = CampaignStore(tmp_path / "campaign", url, db_retry_s=1.0)
    store.create({})
    store.storage.engine.dispose()
    server.halt()
    # The store's clock advances only by its own backoff sleeps, so the bound is checked on what the
    # store waited, not on how fast a loaded machine answers a refused connection.
    clock = [0.0]
    waited = lambda s: clock.__setitem__(0, clock[0] + s)  # noqa: E731
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(database, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=waited))
            with pytest.raises(StoreUnavailable, match=r"did not answer for 1s \(execute.db_retry_s\)") as e:
                store.records()
        assert 0 < clock[0] <= 1.0  # it waited, and not past the bound
        assert f"postgres@127.0.0.1:{server.port}/outage" in str(e.value)  # which database, named
    finally:
        server.boot()
    assert store.records() == []  # the same store works again once the server is back


def test_two_drivers_on_one_study_never_exceed_the_shared_budget(server, tmp_path):
    url = server.create_database("budget")
    budget = 4
    f, out = write_campaign_file(tmp_path, budget=budget), tmp_path / "campaign"
    # Every trial waits at a gate until both drivers hold one running: on a loaded machine the first
    # driver could otherwise spend the whole budget before the second has imported torch.
    gate = tmp_path / "gate"
    first = tune(f, out, f"search.storage={url}", "--executor", "local", delay=0.3, gate=gate)
    wait_for(lambda: (out / "baseline_profile.json").exists(), first, "the first driver did not start")
    second = tune(f, out, f"search.storage={url}", "--resume", delay=0.3, gate=gate)
    wait_for(lambda: len({r.attrs.get("driver") for r in records(out, url) if r.status == "running"}) == 2,
             second, "the two drivers never had a trial running each")
    gate.touch()
    codes = [first.wait(timeout=PATIENCE_S), second.wait(timeout=PATIENCE_S)]
    assert codes == [0, 0], first.stderr.read().decode()[-2000:] + second.stderr.read().decode()[-2000:]
    recs = records(out, url)
    ran = assert_each_recipe_ran_once(recs, budget)  # together, exactly the budget: not one run more
    assert len({r.attrs["driver"] for r in ran}) == 2, [r.attrs["driver"] for r in ran]  # both drivers ran some
    for r in recs:
        if r.status == "unrun":  # a driver that found the budget spent by the other closed its trial unrun
            assert not r.attrs["ran"] and "shared budget" in r.attrs["cause"]


# -- kill -9, twenty times --------------------------------------------------------------------------------


def started(out: Path) -> int:
    """Trial folders in the campaign: one per run started."""
    return len(list((out / "trials").iterdir())) if (out / "trials").exists() else 0


@pytest.mark.slow
def test_twenty_random_kill_9_then_resume_keeps_every_finished_trial_once(tmp_path):
    budget, rng = 24, random.Random(22)
    # A space of 35 recipes (mode crash and nan fail at once or half-way: failed runs of the budget).
    f = write_campaign_file(tmp_path, budget=budget, knobs={"speed": [1, 2, 3, 4], "impl": ["a", "b", "c"],
                                                            "mode": ["ok", "crash", "nan"]})
    out, study = tmp_path / "campaign", tmp_path / "campaign" / "study.db"
    kept: dict[int, str] = {}  # every finished trial seen so far: number -> recipe id
    kills, mid_trial = 0, 0
    while kills < 20:
        before = started(out)
        proc = tune(f, out, *(("--resume",) if study.exists() else ()), delay=0.1, start_new_session=True)
        # A random moment once this session has started a trial (the driver's imports take ~3 s, which a
        # kill would only repeat; a trial ~0.6 s): about half the kills land before it ends.
        wait_for(lambda p=proc, n=before: started(out) > n or p.poll() is not None, proc, "no trial started")
        deadline = time.monotonic() + rng.uniform(0.0, 1.0)
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the fault's timing is the point: a random moment
        if proc.poll() is not None:
            break  # it finished the campaign before its kill
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its trainer
        proc.wait()
        kills += 1
        recs = records(out)
        mid_trial += any(r.state == "RUNNING" and r.attrs.get("ran") for r in recs)
        # Finished: closed in the study. (A trial killed while it was being closed has its status
        # written but is still RUNNING: --resume fails it as interrupted and its recipe runs again.)
        now = {r.number: r.attrs["recipe_id"] for r in recs if r.status in ENDED and r.state != "RUNNING"}
        assert {n: now.get(n) for n in kept} == kept  # nothing finished was lost or changed
        kept = now
    assert kills == 20, f"the campaign finished after {kills} kills: {proc.returncode}"
    res = subprocess.run([sys.executable, DRIVER, "tune", str(f), "--out", str(out), "--resume"],
                         capture_output=True, text=True, timeout=PATIENCE_S)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = records(out)
    assert_each_recipe_ran_once(recs, budget)
    assert {r.number: r.attrs["recipe_id"] for r in recs if r.number in kept} == kept
    assert json.loads((out / "verdict.json").read_text())["decision"] in ("APPROVED", "KEEP BASELINE")
    assert mid_trial >= 5, mid_trial  # many of the kills caught a trial running
    print(f"20 kills, {mid_trial} mid-trial; {len(kept)} trials finished before the last resume")


# -- a full disk ---------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs at ``tmp_path/disk`` (root only: skipped elsewhere), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or 'not root'})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_disk_full_stops_with_a_clear_error_nothing_half_written_and_resume_works(small_disk, tmp_path):
    budget = 4
    f, out = write_campaign_file(tmp_path, budget=budget), small_disk / "campaign"
    proc = tune(f, out, delay=0.1)
    wait_for(lambda: trial_lines(out, 1) >= 1, proc, "trial 1 never started")
    ballast = small_disk / "ballast"
    with ballast.open("wb") as b:  # fill what is left of the disk while trial 1 runs
        try:
            while True:
                b.write(b"\0" * 65536)
                b.flush()
        except OSError:
            pass
    code = proc.wait(timeout=PATIENCE_S)
    err = " ".join(proc.stderr.read().decode().split())
    assert code == 1, err[-3000:]
    assert f"no space left on the device of the campaign folder {out}" in err, err[-3000:]
    assert "resume with" in err.lower()
    assert_whole(out)

    ballast.unlink()  # space freed
    res = subprocess.run([sys.executable, DRIVER, "tune", str(f), "--out", str(out), "--resume"],
                         capture_output=True, text=True, timeout=PATIENCE_S)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert_each_recipe_ran_once(records(out), budget)
    assert json.loads((out / "verdict.json").read_text())["decision"] in ("APPROVED", "KEEP BASELINE")
    assert_whole(out)


def assert_whole(folder: Path) -> None:
    """Every JSON file the campaign wrote parses, and every line of its JSON-lines files."""
    for path in [*folder.rglob("*.json"), *folder.rglob("*.jsonl")]:
        if path.name == "metrics.jsonl":
            continue  # the trainer's own stream (a fake one here): a trial cut off by the disk is rerun
        text = path.read_text()
        try:
            for line in text.splitlines() if path.suffix == ".jsonl" else [text]:
                json.loads(line)
        except ValueError as e:
            raise AssertionError(f"{path.relative_to(folder)} is half-written ({len(text)} chars): {e}") from None
    assert not list(folder.rglob("*.tmp*")), "a temporary file of an atomic write was left"
