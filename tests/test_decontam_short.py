"""Decontamination's one-token copies and embedded copies (issue 46): each rule at its edge, beside the
equivalent case it must keep (data/decontam.py)."""

from __future__ import annotations

import random

import pytest
from ft_fixtures import write_jsonl
from typer.testing import CliRunner

from recipetune.data.chain import run_chain
from recipetune.data.decontam import ContaminationIndex
from recipetune.data.ops import Decontaminate
from recipetune.finetune.task import Splits, TaskConfig

rng = random.Random(0)
SYLLABLES = ["ma", "ri", "so", "fi", "no", "ah", "li", "am", "yu", "ki", "che", "pri", "ya", "om", "ar", "le"]
NAMES = sorted({"".join(rng.sample(SYLLABLES, 3)) for _ in range(400)})  # a few hundred: each in few inputs
ITEMS = [f"{a}{b}s" for a in ("red ", "blue ", "green ", "old ", "new ") for b in ("apple", "pencil", "marble",
                                                                                   "sticker", "cookie", "book")]
# two types of problem: a word in every input of one type (`buys`, `sells`) is the task's own vocabulary
TEMPLATES = {"buys": "{a} has {x} {item} and buys {y} more from {b} at the market. How many {item} has {a}?",
             "sells": "{a} has {x} {item} and sells {y} more to {b} at the market. How many {item} has {a}?"}


def settings(**kw) -> Decontaminate:
    return Decontaminate(op="decontaminate", **kw)


def problem(kind: str, r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    return TEMPLATES[kind].format(a=a.title(), b=b.title(), item=r.choice(ITEMS), x=r.randint(2, 999),
                                  y=r.randint(2, 999))


def problems_index(**kw) -> tuple[ContaminationIndex, list[str]]:
    r = random.Random(1)
    evals = [problem(kind, r) for kind in ("buys", "sells") for _ in range(100)]
    return ContaminationIndex({"validation": [[e] for e in evals[::2]], "test": [[e] for e in evals[1::2]]},
                              settings(**kw)), evals


def test_one_token_changed_in_a_medium_input_is_a_copy():
    """A problem with one name, or one number, changed: before issue 46 only inputs under 2 x ngram
    (16) varying tokens were aligned, and names only; one changed token costs the 8-gram rule up to 8
    of an input's v - 7 n-grams (under min_overlap up to v = 22). A problem of the same type with two
    values changed is another problem."""
    index, evals = problems_index(near_threshold=1.0)
    e = evals[0]  # "... buys ...", a validation row
    name = e.split()[0]
    number = next(w for w in e.split() if w.isdigit())
    assert index.hits([e.replace(name, "Gustav")]) == ("validation", "renamed copy")
    assert index.hits([e.replace(f" {number} ", " 1234 ", 1)]) == ("validation", "renamed copy")
    two = e.replace(name, "Gustav").replace(f" {number} ", " 1234 ", 1)
    assert index.hits([two]) is None


def test_a_row_one_token_from_an_input_of_another_type_is_no_copy():
    """`buys` -> `sells` with `from` -> `to` turns a problem of one type into one of the other (two
    changes); a number for a word is no change of a name or a number either. Beside them, the same row
    with a name changed is a copy, and so is the row with only its verb changed (the word is in half the
    evaluation inputs: the task's vocabulary): the problem's people, items and numbers all left in place
    say which input it is (issue 50, third round: before, a word of the task's structure changed was
    never a copy; a meeting moved from Monday to Sunday, all else kept, was missed)."""
    index, evals = problems_index(near_threshold=1.0)
    e = evals[0]
    assert index.hits([e.replace("buys", "sells").replace("from", "to")]) is None  # (the other template)
    assert index.hits([e.replace("buys", "swaps")]) == ("validation", "renamed copy")  # the verb changed
    other = e.split()[10]  # the name the problem's person deals with (`from Kofi`)
    assert index.hits([e.replace(f" {other} ", " 12 ")]) is None  # a number for a name: no type
    assert index.hits([e.replace(f" {other} ", " Gustav ")]) == ("validation", "renamed copy")


def test_a_masked_slot_that_differs_is_a_second_change():
    """`around 6 pm` is in every evaluation input (masked as boilerplate, 6 its one value): a training row
    with it at 7 and one name changed differs in two tokens, not one; with the name alone, a copy."""
    r = random.Random(2)
    evals = [f"Book a table for {r.randint(2, 99)} at {r.choice(NAMES).title()} Kitchen under "
             f"{r.choice(ITEMS)} {r.randint(100, 999)} around 6 pm please" for _ in range(120)]
    index = ContaminationIndex({"validation": [[e] for e in evals], "test": []}, settings(near_threshold=1.0))
    e = evals[0]
    renamed = e.replace(f" {e.split()[6]} ", " Gustav ")
    assert index.hits([renamed]) == ("validation", "renamed copy")
    assert index.hits([renamed.replace("around 6", "around 7")]) is None


def test_a_long_input_with_one_token_changed_is_found_inside_a_longer_row():
    """A 20-token input, one name changed, inside 60 tokens of other text: found through its anchors
    (a long input carries its question wherever it is); its 8-grams alone (5 of 13 left) were not enough."""
    words = [f"w{i}" for i in range(20)]
    index = ContaminationIndex({"validation": [], "test": [[" ".join(words)]]}, settings(near_threshold=1.0))
    changed = [*words[:10], "zz", *words[11:]]
    other = [f"x{i}" for i in range(30)]
    assert index.hits([" ".join(other + changed + other)]) == ("test", "renamed copy")
    assert index.hits([" ".join(other + changed[:-1] + other)]) is None  # and its last word gone: two changes


@pytest.mark.parametrize("extra, found", [(0, True), (1, False)])
def test_an_embedded_medium_input_at_the_length_limit(extra, found):
    """A 12-token input (under 2 x ngram) inside a row with as much text again around it is a copy
    (contain_share 0.5); one token more and it is a longer question that holds it."""
    text = "Return the number of open sockets held by the pool manager now"
    index = ContaminationIndex({"validation": [["Close the selector and release its resources."]],
                                "test": [[text]]}, settings(near_threshold=1.0))
    around = [f"x{i}" for i in range(12 + extra)]
    row = " ".join(around[:5] + [text] + around[5:])
    assert (index.hits([row]) is not None) is found


def test_short_rows_and_short_inputs():
    """A two-name input with one changed keeps one name: another input; a row that is a prefix of an
    input (shorter than it) holds no copy of it."""
    evals = [[f"obj_{k}.field_{k}"] for k in range(150)] + [["sessions.expire_all(force)"]]
    index = ContaminationIndex({"validation": evals, "test": []}, settings())
    assert index.hits(["obj_3.other"]) is None
    assert index.hits(["sessions.expire_all"]) is None
    assert index.hits(["sessions.expire_all(force)"]) == ("validation", "same input")
    assert index.hits(["sessions.expire_all(now)"]) == ("validation", "renamed copy")  # `expire_all` is rare


def _chain(tmp_path, monkeypatch, renamed: str):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    r = random.Random(3)
    rows = [{"question": problem(kind, r), "answer": "1"} for kind in ("buys", "sells") for _ in range(60)]
    first = rows[1]["question"]
    copy = first.replace(first.split()[0], "Gustav")
    train = [{"question": problem("buys", r), "answer": "1"} for _ in range(30)] + [{"question": copy, "answer": "1"}]
    paths = {s: write_jsonl(tmp_path / f"{s}.jsonl", x) for s, x in
             (("train", train), ("validation", rows[::2]), ("test", rows[1::2]))}
    task = TaskConfig(prompt="{question}\nAnswer: ", target="answer", files={k: str(v) for k, v in paths.items()})
    return run_chain([settings(renamed=renamed, near_threshold=1.0)], Splits(task, paths), tmp_path)


@pytest.mark.parametrize("renamed, rows, removed, kept", [
    ("remove", 30, {"overlaps test (renamed copy)": 1}, {}),
    ("report", 31, {}, {"overlaps test (renamed copy)": 1}),
    ("keep", 31, {}, {}),
])
def test_the_task_says_whether_renamed_copies_count(tmp_path, monkeypatch, renamed, rows, removed, kept):
    """Removed and counted apart (the default), kept and counted in the data version, or kept."""
    out, version = _chain(tmp_path, monkeypatch, renamed)
    assert len(out) == rows
    assert version.operators[0].removed == removed and version.operators[0].kept == kept


def test_a_renamed_copy_kept_is_still_removed_as_another_copy():
    """With renamed copies kept, a row that is also a whole copy of another input is that copy: a
    docstring in one field, a renamed copy of a long test input in the other."""
    words = [f"w{i}" for i in range(20)]
    index = ContaminationIndex({"validation": [["Return True if the future was cancelled"]],
                                "test": [[" ".join(words)]]}, settings(renamed="keep", near_threshold=1.0))
    renamed = " ".join([*words[:10], "zz", *words[11:]])
    assert index.hits([renamed]) == ("test", "renamed copy")  # (the operator keeps it)
    assert index.hits(["Return True if the future was cancelled", renamed]) == ("validation",
                                                                               "contains a whole input")


def test_a_third_input_of_a_frame_two_evaluation_inputs_fill_is_no_copy():
    """Two evaluation inputs one name apart (issue 50: methods that share a parameter list): the name is
    what tells the task's inputs apart, and a training row with a third name is one more of them."""
    index = ContaminationIndex({"validation": [["Return True if the future was cancelled"]],
                                "test": [["Return True if the widget was cancelled"]]},
                               settings(near_threshold=1.0))
    assert index.hits(["Return True if the future was cancelled"]) == ("validation", "same input")
    assert index.hits(["Return True if the gadget was cancelled"]) is None
    alone = ContaminationIndex({"validation": [["Return True if the future was cancelled"]], "test": []},
                               settings(near_threshold=1.0))
    assert alone.hits(["Return True if the gadget was cancelled"]) == ("validation", "renamed copy")


def test_a_bad_renamed_value_exits_2_naming_it(tmp_path):
    from ft_fixtures import experiment_file, reverse_task

    from recipetune.cli import app

    files = reverse_task(tmp_path)
    path = experiment_file(tmp_path, files, {"kind": "reference", "path": "base"},
                           data=[{"op": "decontaminate", "renamed": "sometimes"}])
    out = tmp_path / "never"
    res = CliRunner().invoke(app, ["data", "run", str(path), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "renamed" in res.output and "remove" in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_a_word_in_a_tenth_of_the_inputs_is_no_name_to_rename():
    """Nothing masked (every phrase is rare): `buys` and `sells` are each in half of the inputs, the
    task's own vocabulary; changing one asks another question. A name changed beside it is a copy."""
    r = random.Random(4)
    evals = [[f"{a} {verb} {b} {r.randint(2, 99)}"] for verb in ("buys", "sells") for a, b in
             (r.sample(NAMES, 2) for _ in range(100))]
    index = ContaminationIndex({"validation": evals, "test": []}, settings())
    a, verb, b, n = evals[0][0].split()
    assert index.hits([f"{a} sells {b} {n}"]) is None
    assert index.hits([f"{a} {verb} gustav {n}"]) == ("validation", "renamed copy")


def test_a_value_masked_in_the_input_but_not_in_the_copy_is_still_one_change():
    """`silva " ,` is in one in 12 evaluation records (a shared phrase: masked; under a tenth, not the
    task's vocabulary), `okafor " ,` in none: the records' varying tokens differ by more than one
    change, the whole field by one token. Beside it, the same with the age changed too: two changes."""
    r = random.Random(5)
    evals = [[f'{{"id": {r.randint(1000, 99999)}, "name": "{r.choice(NAMES).title()} '
              f'{"Silva" if k % 12 == 0 else r.choice(NAMES).title()}", "age": {r.randint(18, 90)}}}']
             for k in range(150)]
    index = ContaminationIndex({"validation": evals, "test": []}, settings(near_threshold=1.0))
    e = evals[0][0]
    assert "Silva" in e
    copy = e.replace("Silva", "Okafor")
    assert index.hits([copy]) == ("validation", "renamed copy")
    age = e.rsplit(" ", 1)[1].rstrip("}")
    assert index.hits([copy.replace(f" {age}}}", " 101}")]) is None
