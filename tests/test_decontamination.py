"""Decontamination's rule, each mode beside the case it must not reject: copies found in what varies
between rows, never in a template or an instruction every row repeats (data/decontam.py)."""

from __future__ import annotations

import random

import pytest
from ft_fixtures import write_jsonl

from recipetune.data.chain import run_chain
from recipetune.data.decontam import ContaminationIndex
from recipetune.data.ops import Decontaminate
from recipetune.data.text import Boilerplate, tokens
from recipetune.finetune.task import Splits, TaskConfig

INSTRUCTION = "Read the function below and count its parameters. Answer with a number only."
rng = random.Random(0)
NAMES = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(4, 9))) for _ in range(400)]


def function(i: int) -> str:
    a, b, c = NAMES[3 * i % 400], NAMES[(3 * i + 1) % 400], NAMES[(3 * i + 2) % 400]
    return f"def {a}_{i}({b}, {c}=None):\n    total = {b} * {i} + len({c} or [])\n    return total - {i % 7}"


def settings(**kw) -> Decontaminate:
    return Decontaminate(op="decontaminate", **kw)


def code_index(**kw) -> ContaminationIndex:
    evals = {"validation": [[f"{INSTRUCTION}\n{function(i)}"] for i in range(0, 60)],
             "test": [[f"{INSTRUCTION}\n{function(i)}"] for i in range(60, 120)]}
    return ContaminationIndex(evals, settings(**kw))


def test_a_shared_instruction_is_not_evidence_but_a_copy_of_what_varies_is():
    index = code_index()
    clean = [[f"{INSTRUCTION}\n{function(i)}"] for i in range(200, 260)]
    assert index.hits_batch(clean) == [None] * len(clean)  # the case: every row shares it
    copy = f"{INSTRUCTION}\n{function(70)}"
    variant = copy.upper().replace(" ", "  \t")
    renamed = copy.replace(NAMES[210 % 400] + "_70", "widget_factory")
    reworded = "How many parameters does this function take? Reply with a number.\n" + function(70)
    hits = index.hits_batch([[copy], [variant], [renamed], [reworded]])
    assert [h[0] for h in hits] == ["test"] * 4
    assert index.hits([function(10)]) == ("validation", "8-grams")  # the instruction dropped: still a copy


def test_long_inputs_need_the_minimum_share_of_their_ngrams():
    """A training row holding under half a long input's n-grams is an idiom in common, over half a copy."""
    words = [f"w{i}" for i in range(40)]
    index = ContaminationIndex({"validation": [], "test": [[" ".join(words)]]}, settings(near_threshold=1.0))
    total = len(words) - 8 + 1  # 33 distinct 8-grams
    for keep, found in ((16, False), (17, True)):  # 16/33 < 0.5 <= 17/33
        # the first (keep + 7) words hold exactly `keep` of the input's 8-grams; then unrelated words
        text = " ".join(words[: keep + 7] + [f"x{i}" for i in range(30)])
        assert (index.hits([text]) is not None) == found, (keep, total)


@pytest.mark.parametrize("text, hit", [
    ("347+589=", ("test", "same input")),
    ("347 + 589 =", ("test", "same input")),  # spacing
    ("What is 347+589=", ("test", "contains a whole input")),  # words put before it
    ("347+598=", None), ("1347+589=", None), ("347*589=", None), ("347+589", None),  # other problems
])
def test_short_inputs_are_copies_only_whole(text, hit):
    index = ContaminationIndex({"validation": [["12+34="]], "test": [["347+589="], ["928+666="]]}, settings())
    assert index.hits([text]) == hit


@pytest.mark.parametrize("text, hit", [
    ("Return True if the future was cancelled", "same input"),
    ("Docs: return true if the FUTURE was cancelled.", "contains a whole input"),
    ("Return True if the widget was cancelled", "renamed copy"),  # one name renamed
    ("Return True if the widget was destroyed", None),  # two words changed: another docstring
    ("Return True if the future is running", None),
    # (a word inserted before the last, "... was not cancelled", reads as the last renamed: a copy)
])
def test_a_short_input_with_one_name_renamed_is_a_copy(text, hit):
    """Seven tokens, under the 8-gram: found whole, or with one name renamed, through its anchors."""
    index = ContaminationIndex({"validation": [["Close the selector and release its resources."]],
                                "test": [["Return True if the future was cancelled"]]}, settings())
    found = index.hits([text])
    assert (found and found[1]) == hit


def test_a_rename_needs_enough_words_left_alike():
    """Two one-argument signatures share only a keyword and punctuation: another function, not a copy."""
    index = ContaminationIndex({"validation": [], "test": [["def isabs(s):"], ["def get_item(self, key, default):"]]},
                               settings())
    assert index.hits(["def isdir(s):"]) is None
    assert index.hits(["def get_entry(self, key, default):"])[1] == "renamed copy"  # 4 words left alike


def test_one_number_changed_is_a_copy_where_the_rest_says_which_input_it_is():
    """Issue 46 (this verdict was None before): a word problem with one quantity changed keeps its
    wording and its other values, as a name renamed does; a sum with one number changed keeps one
    number (another sum), an input whose only varying value changed is another input of its template
    (test_an_input_that_is_almost_all_template_counts_whole)."""
    index = ContaminationIndex({"validation": [], "test": [["Add 12 apples to 35 pears and count them"]]},
                               settings())
    assert index.hits(["Add 12 apples to 36 pears and count them"])[1] == "renamed copy"
    assert index.hits(["Add 12 plums to 35 pears and count them"])[1] == "renamed copy"
    assert index.hits(["Add 12 apples to 36 plums and count them"]) is None  # two changed: another problem
    assert index.hits(["Add 12 apples to pears pears and count them"]) is None  # a number for a word: no type


def test_an_input_that_is_almost_all_template_counts_whole():
    """Eval rows that differ in one number: a training row must be that input, not just share the number."""
    evals = {"validation": [[f"Compute the checksum of block number {i} using crc32"] for i in range(5)],
             "test": [[f"Compute the checksum of block number {i} using crc32"] for i in range(5, 10)]}
    index = ContaminationIndex(evals, settings())
    assert index.hits(["Compute the checksum of block number 7 using crc32"]) == ("test", "same input")
    assert index.hits(["Please: compute the CHECKSUM of block number 7 using crc32!"]) == (
        "test", "contains a whole input")
    assert index.hits(["Compute the checksum of block number 17 using crc32"]) is None
    assert index.hits(["Parse header line 7 of the response"]) is None  # the number alone is no copy


def test_near_duplicates_need_enough_text_for_the_estimate():
    long_doc = "Return the number of bytes written to the underlying stream, counting headers"
    index = ContaminationIndex({"validation": [["928+666="]], "test": [[long_doc]]}, settings(ngram=30))
    assert index.hits(["928+866="]) is None  # 8 characters: MinHash would guess
    edited = long_doc.replace("stream,", "stream;")  # no name renamed; Jaccard 0.9 over character 5-grams
    assert index.hits([edited]) == ("test", "near-duplicate")
    assert ContaminationIndex({"validation": [], "test": [[long_doc]]}, settings(ngram=30, near_threshold=1.0)
                              ).hits([edited]) is None


def test_boilerplate_is_a_phrase_in_the_given_share_of_evaluation_rows():
    rows = [tokens(f"please answer this {i}") for i in range(95)] + [tokens("unrelated words here")] * 5
    assert ("please", "answer", "this") in Boilerplate(rows, 0.95).phrases
    assert not Boilerplate(rows, 0.96).phrases - {("unrelated", "words", "here")}
    assert Boilerplate(rows, 1.0).phrases == set()  # common_share 1: nothing is boilerplate
    tiny = [tokens("a b c"), tokens("a b c d")]
    assert Boilerplate(tiny, 0.05).phrases == set()  # fewer rows than MIN_COMMON_ROWS share it


def test_the_chain_keeps_rows_that_share_the_template_or_instruction(tmp_path, monkeypatch):
    """The issue's task end to end: the instruction in the field, or in the template; only copies go."""
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    for template, field in (("{prompt}\nAnswer: ", lambda f: f"{INSTRUCTION}\n{f}"),
                            (INSTRUCTION + "\n{prompt}\nAnswer: ", lambda f: f)):
        rows = lambda ids, field=field: [{"prompt": field(function(i)), "answer": "2"} for i in ids]  # noqa: E731
        train = rows(range(200, 300)) + rows([65]) + [{"prompt": field(function(5)).lower(), "answer": "2"}]
        paths = {s: write_jsonl(tmp_path / f"{s}.jsonl", r) for s, r in
                 (("train", train), ("validation", rows(range(60))), ("test", rows(range(60, 120))))}
        task = TaskConfig(prompt=template, target="answer", files={k: str(v) for k, v in paths.items()})
        kept, version = run_chain([Decontaminate(op="decontaminate")], Splits(task, paths), tmp_path)
        assert len(kept) == 100
        assert version.operators[0].removed == {"overlaps test (8-grams)": 1, "overlaps validation (8-grams)": 1}


def test_a_row_that_overlaps_both_splits_is_reported_as_test():
    """Its example is withheld only as test text: validation found first must not show it."""
    doc = "Return the number of bytes written to the underlying stream, counting headers"
    index = ContaminationIndex({"validation": [[doc]], "test": [[doc.replace("stream,", "stream;")]]},
                               settings())
    assert index.hits([doc])[0] == "test"  # a whole copy of validation, a near copy of test
    near = ContaminationIndex({"validation": [[doc.replace("headers", "header")]],
                               "test": [[doc.replace("stream,", "stream;")]]}, settings(ngram=30, min_tokens=30))
    assert near.hits([doc]) == ("test", "near-duplicate")


# -- short inputs: a copy only where the copied text carries the question (issue 37) ---------------------

CLASSIFY = "Classify the Python expression by the kind of its outermost node."


def expression_index(*inputs: str, common: tuple[str, ...] = ()) -> ContaminationIndex:
    """Alpaca rows (a fixed instruction, a short expression as the input), 200 evaluation inputs: the
    given ones, ``common`` words each in 3% of them (6 inputs), the rest distinct attribute reads."""
    rows = [[CLASSIFY, x] for x in inputs]
    rows += [[CLASSIFY, f"{word}.part_{k}"] for word in common for k in range(6)]
    rows += [[CLASSIFY, f"obj_{k}.field_{k}"] for k in range(200 - len(rows))]
    return ContaminationIndex({"validation": rows[::2], "test": rows[1::2]}, settings())


@pytest.mark.parametrize("text, hit", [
    ('self.write("u")', None),  # a string literal inside a call: another expression (3 of 7 tokens)
    ("x[1:]", "same input"),
    ("print(x[1:])", "contains a whole input"),  # 5 of 8 tokens
    ("x[1:] or one two three four", "contains a whole input"),  # 5 of 10: as much again around it
    ("x[1:] or one two three four five", None),  # 5 of 11: a longer question that holds it
])
def test_a_short_input_counts_inside_a_field_only_where_it_is_most_of_it(text, hit):
    """The issue's false removals: a short evaluation input inside a longer training input counts only
    where it is at least half of what the field says (``contain_share``), at the edge and past it."""
    index = expression_index("x[1:]", '"u"')
    found = index.hits([CLASSIFY, text])
    assert (found and found[1]) == hit


def test_a_short_input_under_another_instruction_is_a_copy_in_its_own_field():
    """The instruction is a field of its own: a reworded one leaves the input field the evaluation
    input, however short (re-instructed); a one-token input at the start of a longer field is not
    one (before, the shared instruction ahead of it made `select.POLLOUT` a copy of `select`)."""
    index = expression_index("select", "x[1:]")
    assert index.hits(["Name the node type of this expression.", "select"])[0] == "validation"
    assert index.hits(["Name the node type of this expression.", "x[1:]"]) is not None
    assert index.hits([CLASSIFY, "select.POLLOUT"]) is None
    assert index.hits([CLASSIFY, "select"]) == ("validation", "same input")


def test_a_short_input_with_one_name_changed_needs_a_rare_word_left_alike():
    """Two words left alike say which input a renamed copy is of when they are improbable together (a
    legitimate input matches `self.flush_buffers(_)` by chance 200 x 8/200 x 1/200 = 0.04 times);
    common ones (`self`, `close` in 3%) say nothing: `self.close(y)` is another call than
    `self.close(x)`. Four words alike need no rarity. Inside longer code, each place the copy could lie
    at is one more chance (issue 50, third round: before, one rare word was enough however many):
    inside `print(...)` 4 places, 0.16, no copy."""
    index = expression_index("self.flush_buffers(x)", "self.close(x)", "os.path.join(root, name)",
                             common=("self", "close"))
    assert index.hits([CLASSIFY, "self.flush_buffers(y)"])[1] == "renamed copy"  # flush_buffers is rare
    assert index.hits([CLASSIFY, "self.close(y)"]) is None
    assert index.hits([CLASSIFY, "os.path.join(root, leaf)"])[1] == "renamed copy"  # os, path, join, root
    assert index.hits([CLASSIFY, "print(self.flush_buffers(y))"]) is None  # 4 places: 0.16
    assert index.hits([CLASSIFY, "self.flush_buffers(y) + self.total_size() + 1"]) is None  # 6 of 14
    few = ContaminationIndex({"validation": [["self.flush_buffers(x)"]], "test": []}, settings())
    assert few.hits(["self.flush_buffers(y)"]) is None  # of 1 input, no word is known to be rare


def test_a_short_input_is_no_copy_through_its_ngrams_inside_longer_code():
    """A 10-token input shares all its 8-grams with a longer expression around it: that is no copy
    either, unless the input is at least half of the field."""
    index = expression_index("'<%s at %#x>'")
    assert index.hits([CLASSIFY, "'<%s at %#x>' % (self.name, id(self))"]) is None
    assert index.hits([CLASSIFY, "'<%s at %#x>' % args"]) is not None  # 10 of 12


def test_an_input_of_several_fields_is_found_with_text_around_one_of_them():
    """A chat turn and the turn after it: words before and after the copied turn's text, and its
    shared opening (`Return`, masked as boilerplate) counted as part of the copy."""
    system = "You answer with the module name only."
    evals = [[system, f'I found this docstring: "Return the {w} of the stream."', f"It is called get_{w}."]
             for w in ("size", "name", "mode", "owner", "encoding", "position")]
    index = ContaminationIndex({"validation": evals[:3], "test": evals[3:]}, settings())
    copy = [system, 'see notes I found this docstring: "Return the mode of the stream." from a review',
            "It is called get_mode."]
    assert index.hits(copy) == ("validation", "contains a whole input")
    longer = [system, 'I found this docstring: "Return the mode of the stream." We looked at it for a long '
                      "while and found nothing else in the module that explains it", "It is called get_mode."]
    assert index.hits(longer) is None  # the docstring is under half of its turn
