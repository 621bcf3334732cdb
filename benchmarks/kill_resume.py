"""Kill -9 a speed campaign again and again, resume it each time, and compare with one never killed.

    python benchmarks/kill_resume.py [--kills-per-phase 7] [--delay 0.5] [--seed 0] [--work DIR]

The campaign is the smallest that has all three phases: the nanoGPT-shaped trainer of the run
store's tests (tests/fixtures/nanoshape: pure Python, a fraction of a second per run; its step time is
modelled, so that the decision cannot depend on the machine's load and any difference is the store's),
a baseline profile of 3 seeds, a search of 2 trials (``--strategy``, the tree search by default),
and the final verdict on the best one (3 parity runs, then interleaved speed pairs). First it runs
uninterrupted. Then the same campaign in another folder is killed (SIGKILL to the driver and every
trainer it started, as a preempted node loses them) and resumed with ``--resume``, until it has been
killed ``--kills-per-phase`` times in each phase (the profile, the search, the final verdict) or has
finished. A kill lands at a random moment
(seeded) within ``--delay`` seconds (0.5) after the attempt started its first trainer in that phase:
a short delay cuts the phase's next run in flight, a longer one lets some of its runs finish first.
It prints, and writes as JSON to ``DIR/kill_resume.json``:

- kills per phase, and the seconds of both campaigns (the killed one's includes every restart);
- trainer runs started: uninterrupted, and in all across the kills (the difference is what the kills
  cost: the runs in flight at each kill, and the speed pairs of a verdict killed mid-way, which are
  never reused because they must be measured interleaved);
- the baseline profile's runs trained in all (3 when nothing is lost; before issue 44 every resume
  started the profile again at run 1/3);
- finished runs stored at the moment of each kill, in all (each would have been trained again
  without the store);
- the decision and the approved recipe of both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "nanoshape"
CAMPAIGN = {
    "workload": {
        "kind": "command",
        "argv": ["{python}", "train.py", "--seed={seed}", "--micro_batch={micro_batch}",
                 "--grad_accum={grad_accum}", "--steps={steps}", "--out={out_dir}"],
        "knobs": {"seed": {"default": 0, "means": "seed"},
                  "micro_batch": {"default": 32, "choices": [16, 32, 64], "means": "micro_batch"},
                  "grad_accum": {"derive": "256 // micro_batch", "low": 1, "high": 16, "means": "grad_accum"}},
    },
    "baseline": {"micro_batch": 32},
    "run": {"steps": 150, "timeout_s": 300},
    "search": {"knobs": {"micro_batch": [16, 64]}, "strategy": "mcts", "budget": {"trials": 2},
               "steps_per_trial": 150, "finalists": 1},
    "guard": {"parity": {"steps": 150, "seeds": 3}, "speed": {"pairs": 3, "first_pairs": 2, "steps": 40},
              "timeout_s": 300},
}


def phase(folder: Path) -> str:
    if (folder / "verdict.json").exists():
        return "done"
    if (folder / "final").exists():
        return "final verdict"
    if (folder / "baseline_profile.json").exists():
        return "search"
    return "profile"


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and every process it started (trainers run in sessions of their own)."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=60)
    proc.wait()


def started(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def stored_runs(folder: Path) -> int:
    return len(list((folder / "guard-runs").glob("*/fingerprint.json")))


def tune(camp: Path, out: Path, log: Path, resume: bool) -> subprocess.Popen:
    env = {**os.environ, "TRAINED_LOG": str(log), "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-m", "recipetune", "tune", str(camp), "--out", str(out), *(["--resume"] if resume else [])]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def outcome(folder: Path) -> dict:
    doc = json.loads((folder / "verdict.json").read_text())
    return {"decision": doc.get("decision"), "recipe": doc.get("recipe")}


def killed_campaign(camp: Path, out: Path, log: Path, per_phase: int, rng: random.Random, delay: float) -> dict:
    kills: dict[str, int] = {"profile": 0, "search": 0, "final verdict": 0}
    stored_at_kills, attempts, t0 = 0, 0, time.monotonic()
    while phase(out) != "done":
        proc = tune(camp, out, log, resume=attempts > 0)
        attempts += 1
        if not attempt(proc, out, log, kills, per_phase, rng, delay):
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"the resumed campaign failed (exit {proc.returncode}):\n{err[-3000:]}")
            continue
        stored_at_kills += stored_runs(out)
        print(f"  kill {sum(kills.values())}: during the {phase(out)} ({stored_runs(out)} runs stored)", flush=True)
    return {"kills": kills, "attempts": attempts, "seconds": round(time.monotonic() - t0, 1),
            "stored_runs_at_kills": stored_at_kills}


def attempt(proc: subprocess.Popen, out: Path, log: Path, kills: dict[str, int], per_phase: int,
            rng: random.Random, delay: float) -> bool:
    """Kill the attempt once it has started a trainer in a phase still short of kills, at a random
    moment within ``delay`` seconds after (True); False when it ran to its end."""
    armed, before = "", 0
    while proc.poll() is None:
        where = phase(out)
        if where != armed:  # a new phase: wait for its first trainer of this attempt
            armed, before = where, started(log)
        if kills.get(where, per_phase) < per_phase and started(log) > before:
            time.sleep(rng.uniform(0.0, delay))  # the kill's moment: random, within a run or a few
            if proc.poll() is None and phase(out) == where:
                kill_tree(proc)
                kills[where] += 1
                return True
        time.sleep(0.05)  # polling the campaign's folder: the campaign is the work
    return False


def profile_runs(log: Path) -> int:
    return sum('/baseline/' in line for line in log.read_text().splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills-per-phase", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--delay", type=float, default=0.5, help="a kill lands up to this long after a trainer starts")
    ap.add_argument("--strategy", default="mcts", help="the search's strategy (grid: see docs/benchmarks.md)")
    args = ap.parse_args()
    CAMPAIGN["search"]["strategy"] = args.strategy
    work = args.work or Path(tempfile.mkdtemp(prefix="kill-resume-"))
    shutil.copytree(FIXTURE, work / "trainer", dirs_exist_ok=True)
    camp = work / "trainer" / "campaign.yaml"
    camp.write_text(yaml.safe_dump(CAMPAIGN))

    print("uninterrupted campaign ...", flush=True)
    t0 = time.monotonic()
    proc = tune(camp, work / "whole", work / "whole.jsonl", resume=False)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the uninterrupted campaign failed:\n{err[-3000:]}")
    whole = {"seconds": round(time.monotonic() - t0, 1), "runs_started": started(work / "whole.jsonl"),
             "profile_runs": profile_runs(work / "whole.jsonl"), **outcome(work / "whole")}
    print(f"  {whole}", flush=True)

    print("killed and resumed campaign ...", flush=True)
    killed = killed_campaign(camp, work / "killed", work / "killed.jsonl", args.kills_per_phase,
                             random.Random(args.seed), args.delay)
    killed |= {"runs_started": started(work / "killed.jsonl"), "profile_runs": profile_runs(work / "killed.jsonl"),
               **outcome(work / "killed")}
    report = {"uninterrupted": whole, "killed": killed, "same_decision": whole["decision"] == killed["decision"]
              and whole["recipe"] == killed["recipe"], "kills": sum(killed["kills"].values()),
              "runs_lost": killed["runs_started"] - whole["runs_started"]}
    (work / "kill_resume.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
