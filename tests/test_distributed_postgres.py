"""The study in a real PostgreSQL server started by this module (tests/fixtures/postgres_server.py):
a campaign killed with -9 and resumed runs every trial once; two drivers on one study never run a
recipe twice, and when one dies the other fails its trial as interrupted instead of leaving it
RUNNING. The drivers are `recipetune tune` processes (test_search_campaign.py's fake workload)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from postgres_server import PostgresServer, binaries  # noqa: E402
from test_search_campaign import PATIENCE_S, records, wait_for, write_campaign_file  # noqa: E402

pytest.importorskip("psycopg")
DRIVER = str(Path(__file__).resolve().parent / "test_search_campaign.py")  # `recipetune tune` with the fakes


@pytest.fixture(scope="module")
def server():
    bindir = binaries()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql); .ci/run installs it")
    pg = PostgresServer(bindir).start()
    yield pg
    pg.stop()


def tune(f: Path, out: Path, url: str, *extra: str, delay: float = 0.0, gate: Path | None = None,
         held_from: int = 0) -> subprocess.Popen:
    """`recipetune tune` on the fakes; with ``gate``, trials from ``held_from`` on wait until it exists."""
    env = {**os.environ, "FAKE_STEP_DELAY": str(delay),
           **({"FAKE_GATE": str(gate), "FAKE_GATE_FROM": str(held_from)} if gate else {})}
    return subprocess.Popen([sys.executable, DRIVER, "tune", str(f), f"search.storage={url}", "--out", str(out),
                             *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finished(recs: list) -> list:
    return [r for r in recs if r.status in ("passed", "rejected", "failed")]


def test_killed_campaign_resumes_with_every_trial_once(server, tmp_path):
    url = server.create_database("resume")
    f, out = write_campaign_file(tmp_path, budget=2), tmp_path / "campaign"
    proc = tune(f, out, url, gate=tmp_path / "gate", held_from=1)  # trial 1 is running when the kill comes
    wait_for(lambda: any(r.number == 1 and "run_dir" in r.attrs for r in records(out, url)), proc,
             "trial 1 never started")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {r.number: r.attrs["recipe_id"] for r in finished(records(out, url))}
    assert len(before) == 1 and records(out, url)[1].state == "RUNNING"
    assert not (out / "study.db").exists()  # the study lives in PostgreSQL

    res = subprocess.run([sys.executable, DRIVER, "tune", str(f), f"search.storage={url}", "--out", str(out),
                          "--resume"], capture_output=True, text=True, timeout=PATIENCE_S)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = records(out, url)
    ids = [r.attrs["recipe_id"] for r in finished(recs)]
    assert len(ids) == 2 and len(set(ids)) == 2  # the budget, each recipe once
    assert {r.number: r.attrs["recipe_id"] for r in finished(recs) if r.number in before} == before
    assert recs[1].status == "interrupted" and recs[1].state == "FAIL"
    assert all(r.state != "RUNNING" for r in recs)
    assert json.loads((out / "verdict.json").read_text())["decision"] in ("APPROVED", "KEEP BASELINE")


def test_two_drivers_on_one_study(server, tmp_path):
    url = server.create_database("team")
    f, out = write_campaign_file(tmp_path, budget=6), tmp_path / "campaign"
    # Every trial waits at a gate until the second driver holds one: on a loaded machine the first
    # driver could otherwise spend the whole budget before the second has imported torch.
    gate = tmp_path / "gate"
    first = tune(f, out, url, delay=0.4, gate=gate)
    wait_for(lambda: (out / "baseline_profile.json").exists(), first, "the first driver did not start")
    second = tune(f, out, url, "--resume", delay=0.4, gate=gate)  # a teammate joins the same study
    pid = str(second.pid)
    wait_for(lambda: any(r.attrs.get("driver", "").endswith(f":{pid}") for r in records(out, url)), second,
             "the second driver opened no trial")
    running = [r.number for r in records(out, url) if r.state == "RUNNING" and
               r.attrs.get("driver", "").endswith(f":{first.pid}")]
    assert running  # the first driver's trial waits at the gate: it dies mid-trial
    first.send_signal(signal.SIGKILL)
    first.wait()
    gate.touch()
    assert second.wait(timeout=PATIENCE_S) == 0, second.stderr.read().decode()[-3000:]

    recs = records(out, url)
    ran = [r for r in finished(recs) if r.attrs.get("ran")]
    ids = [r.attrs["recipe_id"] for r in ran]
    assert len(ids) == len(set(ids)) >= 6  # no recipe ran twice; the shared budget was spent
    assert {r.attrs["driver"].rsplit(":", 1)[1] for r in ran} >= {pid}
    assert all(r.state in ("COMPLETE", "FAIL") for r in recs)  # nothing stuck RUNNING
    for r in recs:
        if r.number in running:  # the dead driver's trial, failed by the other as interrupted
            assert r.status == "interrupted" and "interrupted" in r.attrs["cause"]
