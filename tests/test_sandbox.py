"""The sandbox that runs generated programs (finetune/sandbox.py) and the ``exec_output`` metric on it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from recipetune.finetune import metrics as ftm
from recipetune.finetune import sandbox

SLOW = 30.0  # seconds a program that should finish is given: a busy machine never turns it into a timeout


@pytest.fixture(autouse=True)
def _patient(monkeypatch):
    monkeypatch.setattr(sandbox, "TIMEOUT_S", SLOW)


@pytest.mark.parametrize("source,fault,stdout", [
    ("print(347 + 589)", None, "936\n"),
    ("print(1 +", "crash", ""),                                         # a syntax error
    ("raise ValueError('no')", "crash", ""),
    ("print(1)\nimport os; os.system('echo pwned')", "crash", "1\n"),   # refused, after what it printed
    ("import subprocess; subprocess.run(['true'])", "crash", ""),
    ("import os; os.fork()", "crash", ""),
    ("import socket; socket.create_connection(('127.0.0.1', 9))", "crash", ""),
    ("open('written', 'w').write('x')", "crash", ""),
    ("import os; os.open('written', os.O_WRONLY | os.O_CREAT)", "crash", ""),
    ("print(len(open(__import__('os').__file__).read()) > 0)", None, "True\n"),  # reading is allowed
    ("x = 'a' * 10**10", "crash", ""),                                  # memory: a MemoryError here
    ("print('x' * 10**7)", "output_limit", None),                      # a huge output is cut, not kept
    ("while True: print('y' * 1000)", "output_limit", None),
])
def test_each_program_ends_as_its_own_run(source, fault, stdout):
    run = sandbox.run_program(source)
    assert run.fault == fault, run.detail
    if stdout is not None:
        assert run.stdout == stdout
    assert len(run.stdout.encode()) <= sandbox.MAX_OUTPUT


def test_an_endless_program_is_killed_at_its_timeout_and_a_slow_one_too():
    assert sandbox.run_program("while True: pass", timeout_s=0.5).fault == "timeout"
    slow = sandbox.run_program("import time; time.sleep(60); print(936)", timeout_s=0.5)  # right, but too late
    assert slow.fault == "timeout" and slow.stdout == ""


def test_a_refused_or_fatal_program_does_not_reach_or_spoil_the_driver(tmp_path):
    pid = os.getpid()
    runs = sandbox.run_programs([
        f"import os; os.kill({pid}, 9)",                 # the driver's process: refused
        "import sys; sys.exit(3)",
        f"open({str(tmp_path / 'x')!r}, 'w')",          # a file outside: refused
        "print(7)",
        f"import os; print(os.getcwd() != {os.getcwd()!r})",  # it runs elsewhere, in an empty folder
    ])
    assert [r.fault for r in runs] == ["crash", "crash", "crash", None, None]
    assert runs[3].stdout == "7\n" and runs[4].stdout == "True\n"
    assert not (tmp_path / "x").exists() and os.getpid() == pid


def test_programs_run_in_order_and_one_bad_one_spoils_no_other():
    sources = ["print(1)", "while True: pass", "print(2)", "print('z' * 10**6)", "print(3", "print(4)"]
    runs = sandbox.run_programs(sources, timeout_s=1.0)
    assert [r.fault for r in runs] == [None, "timeout", None, "output_limit", "crash", None]
    assert [r.stdout for i, r in enumerate(runs) if i in (0, 2, 5)] == ["1\n", "2\n", "4\n"]


def test_a_program_sees_no_environment_and_no_arguments(monkeypatch):
    monkeypatch.setenv("RECIPETUNE_SECRET", "x")
    run = sandbox.run_program("import os, sys; print(sorted(os.environ), sys.argv)")
    assert run.fault is None and run.stdout.strip() in ("[] ['-c']", "['LC_CTYPE'] ['-c']")


@pytest.mark.parametrize("pred,target,right,kind", [
    ("print(5)", "print(2 + 3)", True, None),                 # any program printing the same is right
    ("print(5)   ", "print(2 + 3)", True, None),
    ("print('5   ')", "print(2 + 3)", True, None),             # trailing whitespace of a line ignored
    ("print(); print(5); print()", "print(2 + 3)", True, None),  # blank lines around it ignored
    ("print(' 5')", "print(2 + 3)", True, None),               # as every metric: surrounding whitespace
    ("print('5 5')", "print(2 + 3)", False, "wrong"),
    ("print(6)", "print(2 + 3)", False, "near_miss"),
    ("print(7)", "print(20 + 30)", False, "wrong_number"),
    ("print(2 +", "print(2 + 3)", False, "crash"),
    ("while True: pass", "print(2 + 3)", False, "timeout"),
    ("print(float('nan'))", "print(2 + 3)", False, "non_finite"),
    ("print(1e400)", "print(2 + 3)", False, "non_finite"),
    ("print(float('inf'))", "print(float('inf'))", True, None),  # the reference's own inf is an answer
    ("print('x' * 10**6)", "print(2 + 3)", False, "output_limit"),
    ("print(5)", "print(2 +", False, "bad_reference"),        # the data's program does not run
    ("", "print(2 + 3)", False, "empty"),
])
def test_exec_output_scores_what_the_program_prints(pred, target, right, kind, monkeypatch):
    if kind == "timeout":
        monkeypatch.setattr(sandbox, "TIMEOUT_S", 0.5)
    [run] = ftm.execute([pred], [target])
    assert run.right is right
    assert ftm.score("exec_output", [pred], [target], runs=[run]) == float(right)
    assert ftm.example_score("exec_output", pred, target, run=run) == float(right)
    assert ftm.error_kind(pred, target, False, None, None, run=run) == kind
    assert kind in (None, *ftm.ERROR_KINDS)


def test_exec_output_through_evaluate_counts_each_cause(monkeypatch):
    from recipetune.finetune.experiment import evaluate
    from recipetune.finetune.task import TaskConfig

    class Echo:  # a route whose answer is written after the prompt's "|"
        def prompt(self, task, row):
            return task.render(row)

        def generate(self, prompts, settings):
            return [SimpleNamespace(text=p.split("|")[1], truncated=False) for p in prompts]

    monkeypatch.setattr(sandbox, "TIMEOUT_S", 1.0)
    files = {"train": "a.jsonl", "validation": "b.jsonl", "test": "c.jsonl"}
    task = TaskConfig(files=files, prompt="{q}", target="a", metric="exec_output", metrics=["exact_match"])
    answers = ["print(2 + 3)", "print(5)", "while True: pass", "import os; os.system('ls')", "print(6)"]
    rows = [{"q": f"x|{a}", "a": "print(2 + 3)"} for a in answers]
    ev, preds = evaluate(Echo(), task, rows, "validation", None)
    assert ev.value == pytest.approx(2 / 5) and ev.metrics["exact_match"] == pytest.approx(1 / 5)
    assert [p.error for p in preds] == [None, None, "timeout", "crash", "near_miss"]
    assert {g.kind: g.count for g in ev.errors} == {"timeout": 1, "crash": 1, "near_miss": 1}
