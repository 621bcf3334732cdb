"""The run store under change, concurrency and faults (guard/runs.py, workloads/fingerprint.py,
core/files.py: FileLock; issue 44).

A stored run is reused only for the same experiment: the trainer nanoGPT-shaped
(tests/fixtures/nanoshape: train.py imports model.py and execs configurator.py), model.py edited
between two verdicts sharing one runs folder, trains again and names model.py; the HF route sees
transformers' version through the trainer interpreter's package metadata. Two processes train each
run once; a lock whose holder died is taken over; a cut-off result is set aside; a kill during the
profile loses only the run in flight; a bad runs folder is exit 2 before anything runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.core.files import FileLock
from recipetune.core.measure import RunResult, StepRecord
from recipetune.guard.runs import FINGERPRINT_FILE, STORE_FILE, Runs
from recipetune.workloads.command import CommandSpec, CommandWorkload, SpecError

runner = CliRunner()
FIXTURE = Path(__file__).parent / "fixtures" / "nanoshape"
ARGV = ["{python}", "train.py", "--seed={seed}", "--micro_batch={micro_batch}", "--grad_accum={grad_accum}",
        "--steps={steps}", "--out={out_dir}"]
KNOBS = {"seed": {"default": 0, "means": "seed"},
         "micro_batch": {"default": 4, "choices": [2, 4, 8], "means": "micro_batch"},
         "grad_accum": {"derive": "16 // micro_batch", "low": 1, "high": 16, "means": "grad_accum"}}
GUARD = {"parity": {"steps": 20, "seeds": 3}, "speed": {"pairs": 3, "first_pairs": 2, "steps": 8}, "timeout_s": 120}


def trainer(folder: Path, **workload: object) -> Path:
    """The nanoGPT-shaped trainer copied to ``folder``, and its campaign file there."""
    shutil.copytree(FIXTURE, folder, dirs_exist_ok=True)
    doc = {"workload": {"kind": "command", "argv": ARGV, "knobs": KNOBS, **workload},
           "baseline": {"micro_batch": 4}, "run": {"steps": 20, "timeout_s": 120}, "guard": GUARD,
           "search": {"knobs": {"micro_batch": [2, 8]}, "strategy": "grid", "budget": {"trials": 2},
                      "steps_per_trial": 20, "finalists": 1}}
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def workload(folder: Path, **fields: object) -> CommandWorkload:
    return CommandWorkload(CommandSpec.model_validate({"argv": ARGV, "knobs": KNOBS, **fields}), folder)


def edit_lr(folder: Path, lr: float) -> None:
    model = folder / "model.py"
    model.write_text(model.read_text().replace("LR = 0.05", f"LR = {lr}"))


def test_a_changed_model_file_trains_again_and_the_verdict_names_it(tmp_path):
    """The issue's case: the second verify reused all six runs of the old code and said nothing."""
    camp = trainer(tmp_path / "nano")
    store = tmp_path / "store"
    args = ["verify", str(camp), str(camp), "micro_batch=8", "--runs", str(store), "--json"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "v1")])
    # Parity is what the runs store keeps: it holds (the candidate replays the baseline's batches). Speed is
    # measured on the shared cores, so a busy machine may keep the baseline for timing (exit 3); never reject.
    assert first.exit_code in (0, 3), first.output
    assert json.loads(first.stdout)["parity"]["outcome"] == "holds", first.output
    again = json.loads(runner.invoke(app, [*args, "--out", str(tmp_path / "v2")]).stdout)
    assert again["cost"]["parity_runs"] == 0 and again["cost"]["parity_reused"] == 6  # profile 3, candidate 3
    edit_lr(tmp_path / "nano", 0.08)  # model.py, imported by train.py; the command line is unchanged
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "v3")])
    doc = json.loads(res.stdout)
    assert doc["cost"]["parity_runs"] == 3 and doc["cost"]["parity_reused"] == 0, doc["cost"]
    said = [n for n in doc["notes"] if "not reused" in n]
    assert said and "model.py changed" in said[0] and "train.py" not in said[0], doc["notes"]
    assert "model.py changed" in res.stderr  # said while it runs too, before the runs train
    assert json.loads((tmp_path / "v3" / "baseline" / "profile.json").read_text())["final_losses"] != \
        json.loads((tmp_path / "v1" / "baseline" / "profile.json").read_text())["final_losses"]


def test_the_fingerprint_covers_code_data_declared_variables_and_nothing_outside(tmp_path, monkeypatch):
    trainer(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.bin").write_bytes(b"\0" * 1000)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("")
    (tmp_path / ".venv" / "site.py").write_text("x = 1")
    (tmp_path / "runs" / "verify-1").mkdir(parents=True)
    (tmp_path / "runs" / "verify-1" / "notes.py").write_text("x = 1")
    monkeypatch.setenv("NANO_MODE", "a")
    wl = workload(tmp_path, fingerprint_env=["NANO_MODE"])
    before = wl.code_manifest()
    assert {"code:train.py", "code:model.py", "code:configurator.py", "data:data/train.bin", "env:NANO_MODE",
            "python", "package:pydantic"} <= set(before)
    assert not [k for k in before if ".venv" in k or "runs/" in k]  # environments, recipetune's own output
    (tmp_path / ".venv" / "site.py").write_text("x = 2")
    (tmp_path / "runs" / "verify-1" / "notes.py").write_text("x = 2")
    (tmp_path / "README.md").write_text("not code")
    assert workload(tmp_path, fingerprint_env=["NANO_MODE"]).code_fingerprint() == wl.code_fingerprint()
    (tmp_path / "data" / "train.bin").write_bytes(b"\1" * 1001)  # by size and time, never read
    monkeypatch.setenv("NANO_MODE", "b")
    now = workload(tmp_path, fingerprint_env=["NANO_MODE"]).code_manifest()
    assert now["data:data/train.bin"] != before["data:data/train.bin"] and now["env:NANO_MODE"] == "b"
    # a declared data version replaces the files; declared code globs replace every *.py
    declared = workload(tmp_path, data_fingerprint="owt-v3", code=["train.py", "model.py"]).code_manifest()
    assert declared["data"] == "owt-v3" and not [k for k in declared if k.startswith("data:")]
    assert "code:configurator.py" not in declared and "code:model.py" in declared


@pytest.mark.parametrize(("fields", "field", "expected"), [
    ({"code": ["nothing/*.py"]}, "code.0", "matches no file"),
    ({"code": ["!train.py"]}, "code", "at least one glob"),
    ({"fingerprint_env": ["NOT-A-NAME"]}, "fingerprint_env", "not an environment variable name"),
])
def test_bad_fingerprint_fields_exit_2_naming_the_field(tmp_path, fields, field, expected):
    camp = trainer(tmp_path, **fields)
    res = runner.invoke(app, ["verify", str(camp), str(camp), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    named = (f"workload.{field}", f"workload.command.{field}")  # pydantic's union tag, where it checked
    assert any(n in res.output for n in named) and expected in res.output, res.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "guard-runs").exists()
    with pytest.raises((SpecError, ValueError)):
        workload(tmp_path, **fields)


def test_the_hf_route_sees_the_trainers_transformers_version(tmp_path):
    """An HF Trainer script is a command workload: its interpreter's transformers version is in the
    fingerprint. A newer version is simulated by a dist-info on the trainer's PYTHONPATH (metadata
    only: nothing reinstalled, nothing imported into this process)."""
    trainer(tmp_path)
    store = tmp_path / "store"
    plain = workload(tmp_path)
    recipe = plain.resolve({})
    first = Runs(plain, folder=store)
    assert first.start(recipe, 6, tmp_path / "v1" / "x").result().ok
    site = tmp_path / "site"
    (site / "transformers-99.1.0.dist-info").mkdir(parents=True)
    (site / "transformers-99.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: transformers\nVersion: 99.1.0\n")
    newer = workload(tmp_path, env={"PYTHONPATH": str(site)})
    assert newer.code_manifest()["package:transformers"] == "99.1.0"
    assert plain.code_manifest()["package:transformers"] != "99.1.0"
    runs = Runs(newer, folder=store)
    assert runs.start(recipe, 6, tmp_path / "v2" / "x").result().ok and runs.launched == 1
    assert any("transformers " in n and "-> 99.1.0" in n for n in runs.notes), runs.notes


def test_a_truncated_result_is_set_aside_and_trained_again(tmp_path):
    trainer(tmp_path)
    wl = workload(tmp_path)
    store, recipe = tmp_path / "store", wl.resolve({})
    runs = Runs(wl, folder=store)
    runs.start(recipe, 6, tmp_path / "v1" / "x").result()
    result = store / runs.key(recipe, 6) / "result.json"
    text = result.read_text()
    result.write_text(text[: len(text) // 2])  # cut off, as a full disk or a copy stopped half-way leaves it
    again = Runs(wl, folder=store)
    assert not again.has(recipe, 6)
    assert again.start(recipe, 6, tmp_path / "v2" / "x").result().ok and again.launched == 1
    aside = list(result.parent.glob("result.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == text[: len(text) // 2]
    assert len(again.notes) == 1 and str(result) in again.notes[0] and aside[0].name in again.notes[0]
    assert Runs(wl, folder=store).start(recipe, 6, tmp_path / "v3" / "x").result().ok  # and reused after


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_lock_whose_holder_died_is_taken_over_and_a_live_one_is_not(tmp_path):
    path = tmp_path / "run.lock"

    def left(host: str, pid: int, age_s: float = 0.0) -> None:
        path.write_text(json.dumps({"host": host, "pid": pid, "since": time.time() - age_s, "token": "x"}))
        os.utime(path, (time.time() - age_s, time.time() - age_s))

    left(socket.gethostname(), dead_pid())  # kill -9 on this host: the pid is gone
    lock = FileLock(path)
    assert "is gone" in lock.stale() and lock.acquire() and json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()
    assert not path.exists()
    left("another-node", 1, age_s=600)  # another machine, silent for 10 minutes: its heartbeat is stale
    assert "heartbeat" in FileLock(path).stale() and FileLock(path).acquire()
    left("another-node", 1, age_s=5)  # another machine, beating: never taken, whatever its pid here
    assert not FileLock(path).stale() and not FileLock(path).acquire()
    left(socket.gethostname(), os.getpid())  # alive on this host (another thread of this process)
    assert not FileLock(path).acquire() and FileLock(path).held_by_other()


def test_a_run_held_by_another_process_is_waited_for_and_reused(tmp_path):
    """A holder on this host is alive: the run waits; once it is gone without storing, it is trained."""
    trainer(tmp_path)
    wl = workload(tmp_path)
    store, recipe = tmp_path / "store", wl.resolve({})
    runs = Runs(wl, folder=store)
    lock = store / (runs.key(recipe, 6) + ".lock")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store.mkdir()
        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": holder.pid, "since": time.time()}))
        assert runs.has(recipe, 6)  # in flight elsewhere: costs this verdict nothing
        future = runs.start(recipe, 6, tmp_path / "v" / "x")
        assert not future.done() and runs.reused == 1
    finally:
        holder.kill()
        holder.wait()
    assert future.result(timeout=60).ok and (runs.launched, runs.reused) == (1, 0)  # its holder died
    assert not lock.exists()


@pytest.mark.slow
def test_two_verifies_at_once_train_each_run_once_and_both_decide_as_one_alone(tmp_path):
    camp = trainer(tmp_path / "nano")
    log = tmp_path / "trained.jsonl"
    env = {**os.environ, "TRAINED_LOG": str(log), "PYTHONPATH": os.pathsep.join(sys.path)}

    def verify(name: str, store: Path) -> subprocess.Popen:
        argv = [sys.executable, "-m", "recipetune", "verify", str(camp), str(camp), "micro_batch=8", "--json",
                "--runs", str(store), "--out", str(tmp_path / name)]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    alone = verify("alone", tmp_path / "store-alone")
    alone_out, _ = alone.communicate(timeout=600)
    trained_alone = [line for line in log.read_text().splitlines() if "/speed/" not in line]  # profile, parity
    log.unlink()
    pair = [verify(f"both-{k}", tmp_path / "store") for k in (1, 2)]
    outs = [p.communicate(timeout=600) for p in pair]
    docs = [json.loads(o[0]) for o in outs]
    first = json.loads(alone_out)
    # the same proof of parity as alone, from the same runs; the speed pairs are measured by both at once on
    # the shared cores, so a busy machine may leave one short of telling (KEEP BASELINE), never the other way
    assert all((d["parity"]["outcome"], d["stop"]) == (first["parity"]["outcome"], first["stop"]) for d in docs)
    assert all(d["decision"] in (first["decision"], "KEEP BASELINE") for d in docs), [o[1][-2000:] for o in outs]
    assert all(p.returncode == (alone.returncode if d["decision"] == first["decision"] else 3)
               for p, d in zip(pair, docs, strict=True))
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    stored = [r for r in runs if "/speed/" not in r["out"]]  # the speed pairs are measured by each verdict
    assert len(stored) == len(trained_alone) == 6  # the profile's 3 and the candidate's 3, once
    assert len({(r["seed"], r["micro_batch"], r["steps"]) for r in stored}) == len(stored)  # each run once
    # the candidate's 3 runs trained by one; the other reused them, and the profile's runs were split
    assert sum(d["cost"]["parity_runs"] for d in docs) == 3 and sum(d["cost"]["parity_reused"] for d in docs) == 6


def descendants_killed(proc: subprocess.Popen) -> None:
    """kill -9 the process and every process it started (trainers run in sessions of their own), as a
    preempted node does. Linux: the tree is read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [proc.pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while any(running(pid) for pid in tree[1:]) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the orphans are gone: the kill is asynchronous


def running(pid: int) -> bool:
    try:
        return ") Z" not in Path(f"/proc/{pid}/stat").read_text()  # a zombie has stopped
    except OSError:
        return False


@pytest.mark.slow
def test_a_campaign_killed_during_its_profile_keeps_the_finished_runs(tmp_path):
    """Killed while the profile's second run trains (the first finished): the resumed campaign reuses
    the first, trains the second again (its lock taken over from the dead process) and goes on."""
    camp = trainer(tmp_path / "nano")
    log, hold = tmp_path / "trained.jsonl", tmp_path / "go"
    env = {**os.environ, "TRAINED_LOG": str(log), "HOLD_SEED": "1", "HOLD_FILE": str(hold),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "recipetune", "tune", str(camp), "--out", str(tmp_path / "c")]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (log.exists() and '"seed": 1' in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)  # waiting for the held run to start: a poll, not work
    descendants_killed(proc)
    assert len(list((tmp_path / "c" / "guard-runs").glob(f"*/{FINGERPRINT_FILE}"))) == 1  # run 1 kept
    assert len(list((tmp_path / "c" / "guard-runs").glob("*.lock"))) == 1  # run 2's, its holder dead
    hold.touch()
    res = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    profile = [json.loads(line) for line in log.read_text().splitlines() if "/baseline/" in line]
    assert [r["seed"] for r in profile] == [0, 1, 1, 2]  # seed 0 once; seed 1 lost to the kill, trained again
    assert json.loads((tmp_path / "c" / "verdict.json").read_text())["decision"] in ("APPROVED", "KEEP BASELINE")
    assert not list((tmp_path / "c" / "guard-runs").glob("*.lock"))


@pytest.mark.parametrize("case", ["file", "under-a-file", "read-only", "another-workload", "not-a-runs-folder"])
def test_a_bad_runs_folder_exits_2_before_anything_runs(tmp_path, monkeypatch, case):
    camp = trainer(tmp_path / "nano")
    runs = tmp_path / "store"
    if case == "file":
        runs.write_text("")
    elif case == "under-a-file":
        (tmp_path / "afile").write_text("")
        runs = tmp_path / "afile" / "store"
    elif case == "read-only":  # root passes os.access: the check writes, and here writing fails
        runs.mkdir()
        real_open = os.open

        def refused(path, flags, *args, **kw):
            if ".probe-" in str(path):
                raise PermissionError(13, "Permission denied")
            return real_open(path, flags, *args, **kw)

        monkeypatch.setattr(os, "open", refused)
    elif case == "another-workload":
        runs.mkdir()
        (runs / STORE_FILE).write_text(json.dumps({"workload": {"kind": "command", "trainer": "/elsewhere"}}))
    else:
        runs.mkdir()
        (runs / "study.db").write_text("")
    expected = {"file": "is a file", "under-a-file": "is a file", "read-only": "cannot be written",
                "another-workload": "another workload", "not-a-runs-folder": "not a runs folder"}[case]
    res = runner.invoke(app, ["verify", str(camp), str(camp), "micro_batch=8", "--runs", str(runs),
                              "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert expected in res.output and str(runs) in res.output.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_a_trial_run_kept_is_the_verdicts_candidate_run_and_nothing_replaces_a_stored_one(tmp_path):
    trainer(tmp_path / "nano")
    wl = workload(tmp_path / "nano")
    recipe = wl.resolve({"micro_batch": 8})
    steps = [StepRecord(step=i, loss=2.0, tokens=64, step_time_s=0.01) for i in range(1, 21)]
    trial = RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=steps,
                      out_dir=str(tmp_path / "trials" / "0001"))
    runs = Runs(wl, folder=tmp_path / "store")
    assert not runs.has(recipe, 20)
    assert runs.adopt(recipe, 20, trial)
    assert runs.has(recipe, 20) and not runs.has(recipe, 40)  # the same steps only
    got = runs.start(recipe, 20, tmp_path / "verdict" / "parity" / "seed-0").result()
    assert got.losses() == trial.losses() and runs.launched == 0 and runs.reused == 1
    assert not runs.adopt(recipe, 20, trial.model_copy(update={"steps": steps[:5]}))  # the stored one stays
    other = wl.resolve({"micro_batch": 2})
    assert not runs.adopt(other, 20, trial.model_copy(update={"status": "crash"}))  # only a finished run
    assert not runs.adopt(other, 20, trial)  # a result is kept only under its own recipe


@pytest.mark.slow
def test_a_campaign_trains_its_winners_first_parity_run_once(tmp_path):
    """The search trial of the winner ran at the baseline's seed for the parity steps: the final verdict
    reuses it as its first candidate run instead of training it again."""
    camp = trainer(tmp_path / "nano")
    log = tmp_path / "trained.jsonl"
    env = {**os.environ, "TRAINED_LOG": str(log), "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run([sys.executable, "-m", "recipetune", "tune", str(camp), "--out", str(tmp_path / "c")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    finals = json.loads((tmp_path / "c" / "verdicts.json").read_text())
    assert finals, "no finalist reached the guard"
    micro = finals[0]["verdict"]["candidate"]["micro_batch"]
    trained = [json.loads(line) for line in log.read_text().splitlines()]
    first = [r for r in trained if r["micro_batch"] == micro and r["seed"] == 0 and r["steps"] == 20]
    assert len(first) == 1, first  # the trial; the verdict's first candidate run is that one
    assert finals[0]["verdict"]["cost"]["parity_reused"] == 1  # the trial's (the profile's are the profile)
