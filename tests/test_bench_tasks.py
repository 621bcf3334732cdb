"""FT-Bench's issue-37 tasks (finetune/bench_tasks.py): chat-recall (the answer is in an earlier turn)
and exec-expr (code scored by running it)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from recipetune.core.files import read_yaml
from recipetune.finetune import bench_tasks as ftbench
from recipetune.finetune import metrics as ftm
from recipetune.finetune.experiment import ExperimentSpec

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"chat-recall": "ft-chat-recall.yaml", "exec-expr": "ft-exec-expr.yaml"}


def _spec(name: str) -> tuple[ExperimentSpec, dict]:
    raw = read_yaml(ROOT / "examples" / TASKS[name])
    search = raw.pop("search")
    return ExperimentSpec.model_validate(raw), search


def _key(name: str, row: dict) -> str:
    if name == "chat-recall":  # the user turns
        return "\n".join(m["content"] for m in row["messages"] if m["role"] == "user")
    return row["phrase"]


@pytest.mark.parametrize("name", TASKS)
def test_generated_the_same_every_time_disjoint_and_sized(name):
    first = ftbench.GENERATORS[name]()
    assert ftbench.GENERATORS[name]() == first
    keys = {s: {_key(name, r) for r in rows} for s, rows in first.items()}
    assert sum(len(k) for k in keys.values()) == sum(len(rows) for rows in first.values())  # each input once
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    assert {s: len(rows) for s, rows in first.items()} == {"train": 3000, "validation": 200, "test": 200}
    assert all(ftbench._split_of(k) == s for s, ks in keys.items() for k in ks)  # by a hash, as the others


@pytest.mark.parametrize("name", TASKS)
def test_example_files_parse_and_read_their_rows(name):
    spec, search = _spec(name)
    assert spec.task.builtin == name and spec.recipe.threads == 1 and spec.model.path == "base"
    assert set(search["knobs"]) <= set(type(spec.recipe).model_fields) and search["seeds"] == [1, 2, 3]
    rows = ftbench.GENERATORS[name]()
    for r in rows["validation"]:
        answer = spec.task.answer(r)
        assert answer and re.fullmatch(spec.task.answer_pattern, answer)
        assert len(spec.task.render(r)) + len(answer) + 1 <= spec.recipe.max_seq_len  # nothing truncated


def test_chat_recall_needs_an_earlier_turn():
    spec, _ = _spec("chat-recall")
    task, rows = spec.task, ftbench.recall_rows()
    assert task.format == "chat"
    for r in rows["validation"]:
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["user", "assistant"] * 3
        first, second, question = (r["messages"][i]["content"] for i in (0, 2, 4))
        facts = dict(re.fullmatch(r"(\w+) is (\d+)\.", t).groups() for t in (first, second))
        asked = re.fullmatch(r"What is (\w+)\?", question).group(1)
        assert task.answer(r) == f"{asked} is {facts[asked]}" and facts[asked] not in question
        assert len(facts) == 2 and len(set(facts.values())) == 2
    # the last user message alone: the best it can do is each question's most common training answer
    def last(r):
        return r["messages"][4]["content"]

    by_question: dict[str, Counter] = {}
    for r in rows["train"]:
        by_question.setdefault(last(r), Counter())[task.answer(r)] += 1
    assert sum(len(c) > 1 for c in by_question.values()) > 0.9 * len(by_question)  # it recurs, answered otherwise
    val = rows["validation"]
    guess = [by_question[last(r)].most_common(1)[0][0] if last(r) in by_question else "50" for r in val]
    targets = [task.answer(r) for r in val]
    assert ftm.exact_match(guess, targets) <= 0.05  # chance is 1 in 90
    # either earlier number, without reading which was asked: one in two
    first_number = [f"{last(r)[8:-1]} is {re.search(r'[0-9]+', r['messages'][0]['content']).group()}" for r in val]
    assert 0.4 <= ftm.exact_match(first_number, targets) <= 0.6


def test_exec_expr_reference_programs_print_their_phrase():
    spec, _ = _spec("exec-expr")
    assert spec.task.metric == "exec_output"
    rows = ftbench.exec_rows()["validation"]
    shapes = [re.escape(p).replace(r"\{a\}", "[0-9]+").replace(r"\{b\}", "[0-9]+").replace(r"\{w\}", "[a-z]+")
              for p, _ in ftbench.EXEC_OPS]
    ops = Counter(next(i for i, shape in enumerate(shapes) if re.fullmatch(shape, r["phrase"])) for r in rows)
    assert len(ops) == len(ftbench.EXEC_OPS) and min(ops.values()) >= 5  # every kind of phrase, evaluated
    programs = [r["program"] for r in rows]
    runs = ftm.execute(programs, programs)
    assert all(r.right for r in runs)
    # what the metric accepts beyond the reference text: the printed value itself
    printed = [f"print({r.got.stdout.strip()!r})" if not r.got.stdout.strip().lstrip("-").isdigit()
               else f"print({r.got.stdout.strip()})" for r in runs]
    assert ftm.score("exec_output", printed, programs) == 1.0
    assert ftm.score("exact_match", printed, programs) < 0.1
