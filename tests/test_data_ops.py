"""Every data operator, the chain's cache and data version, and decontamination of a planted overlap."""

from __future__ import annotations

from pathlib import Path

import pytest
from ft_fixtures import write_jsonl
from pydantic import TypeAdapter, ValidationError

from recipetune.data import ops
from recipetune.data.chain import ChainError, run_chain, with_decontamination
from recipetune.data.text import ContaminationIndex
from recipetune.finetune.task import Splits, TaskConfig

OP = TypeAdapter(ops.Operator)


def ctx(tmp_path: Path, index: ContaminationIndex | None = None) -> ops.Context:
    return ops.Context(
        render=lambda r: f"Q: {r['q']}", prompt_fields=["q"], base_dir=tmp_path, out_dir=tmp_path / "out",
        read_file=lambda path, field: [{"q": f"extra {i}", "a": "x"} for i in range(10)],
        contamination_index=lambda settings: index,
    )


def run(op: dict, rows: list[dict], tmp_path: Path, index=None) -> ops.Outcome:
    return ops.apply(OP.validate_python(op), rows, ctx(tmp_path, index))


ROWS = [{"q": "What is two plus two", "a": "4"}, {"q": "what is  TWO plus two", "a": "4"},
        {"q": "Name the capital of France please", "a": "Paris"}, {"q": "hi", "a": "hello"},
        {"q": "spam spam spam spam spam spam spam spam", "a": "eggs"}, {"q": "Привет, как дела у тебя", "a": "ok"}]


def test_dedup_exact_normalises_case_and_spaces(tmp_path):
    out = run({"op": "dedup_exact"}, ROWS, tmp_path)
    assert len(out.rows) == 5 and out.removed == {"exact duplicate": 1}
    assert out.examples[0]["row"]["q"] == "what is  TWO plus two"


def test_dedup_near_removes_a_small_edit(tmp_path):
    rows = [{"q": "Return the absolute value of the argument x", "a": "1"},
            {"q": "Return the absolute value of the argument y.", "a": "2"},
            {"q": "Open a file and return a stream object", "a": "3"}]
    out = run({"op": "dedup_near", "threshold": 0.7}, rows, tmp_path)
    assert [r["a"] for r in out.rows] == ["1", "3"]
    assert sum(out.removed.values()) == 1


def test_filters(tmp_path):
    assert len(run({"op": "filter_length", "min_chars": 8}, ROWS, tmp_path).rows) == 5  # "Q: hi" is 5
    assert len(run({"op": "filter_length", "field": "q", "max_chars": 25}, ROWS, tmp_path).rows) == 4
    charset = run({"op": "filter_charset", "field": "q", "charset": "ascii"}, ROWS, tmp_path)
    assert all("Привет" not in r["q"] for r in charset.rows) and len(charset.rows) == 5
    cyr = run({"op": "filter_charset", "field": "q", "charset": "cyrillic"}, ROWS, tmp_path)
    assert [r["a"] for r in cyr.rows] == ["ok"]
    rep = run({"op": "filter_repetition", "field": "q", "ngram": 2, "max_fraction": 0.5}, ROWS, tmp_path)
    assert all(r["a"] != "eggs" for r in rep.rows) and len(rep.rows) == 5
    rx = run({"op": "filter_regex", "field": "a", "pattern": r"^\d+$"}, ROWS, tmp_path)
    assert [r["a"] for r in rx.rows] == ["4", "4"]
    drop = run({"op": "filter_regex", "field": "a", "pattern": r"^\d+$", "keep": "no_match"}, ROWS, tmp_path)
    assert len(drop.rows) == 4


def test_load_convert_sample_mix(tmp_path):
    loaded = run({"op": "load", "path": "other.jsonl"}, ROWS, tmp_path)
    assert len(loaded.rows) == 10 and loaded.added == 10
    conv = run({"op": "convert", "rename": {"q": "question"}, "templates": {"text": "{question} -> {a}"},
                "keep": ["question", "text"]}, [{"q": " hi ", "a": "x"}], tmp_path)
    assert conv.rows.to_list() == [{"question": "hi", "text": "hi  -> x"}]
    s1 = run({"op": "sample", "n": 3, "seed": 1}, ROWS, tmp_path)
    s2 = run({"op": "sample", "n": 3, "seed": 1}, ROWS, tmp_path)
    assert s1.rows.to_list() == s2.rows.to_list() and len(s1.rows) == 3 and s1.removed == {"not sampled": 3}
    assert len(run({"op": "sample", "fraction": 0.5}, ROWS, tmp_path).rows) == 3
    mixed = run({"op": "mix", "sources": [{"path": "other.jsonl", "ratio": 0.25}]}, ROWS, tmp_path)
    assert len(mixed.rows) == 8 and mixed.added == 2  # 6 rows are 75% of 8


def test_augment_and_synthesize(tmp_path):
    aug = run({"op": "augment", "rules": ["uppercase"]}, ROWS[:2], tmp_path)
    assert len(aug.rows) == 4 and aug.rows[2]["q"] == "WHAT IS TWO PLUS TWO" and aug.rows[2]["a"] == "4"
    syn = run({"op": "synthesize", "n": 5, "slots": {"a": {"range": [1, 9]}, "b": {"choices": [10, 20]}},
               "fields": {"q": "{a}*{b}", "a": "={a}*{b}"}}, [], tmp_path)
    assert len(syn.rows) == 5
    for r in syn.rows:
        x, y = r["q"].split("*")
        assert int(r["a"]) == int(x) * int(y)


def test_export_is_written_by_the_chain_at_the_end(tmp_path):
    c = ctx(tmp_path)
    ops.apply(OP.validate_python({"op": "export", "path": "dump.csv"}), ROWS, c)
    assert c.exports[0][0] == tmp_path / "out" / "dump.csv" and not (tmp_path / "out").exists()
    ops.write_rows(c.exports[0][0], c.exports[0][1])
    assert (tmp_path / "out" / "dump.csv").read_text().count("\n") == len(ROWS) + 1


@pytest.mark.parametrize("bad", [
    {"op": "nope"}, {"op": "filter_regex", "pattern": "("}, {"op": "sample"}, {"op": "export", "path": "x.txt"},
    {"op": "mix", "sources": [{"path": "a", "ratio": 0.6}, {"path": "b", "ratio": 0.5}]},
    {"op": "dedup_exact", "bogus": 1},
])
def test_bad_operator_configs_are_refused(bad):
    with pytest.raises(ValidationError):
        OP.validate_python(bad)


def test_decontamination_is_always_on():
    chain, at = with_decontamination([OP.validate_python({"op": "dedup_exact"}),
                                      OP.validate_python({"op": "export"})])
    assert [op.op for op in chain] == ["dedup_exact", "decontaminate", "export"] and at == 1


def planted(tmp_path: Path) -> Splits:
    test = [{"q": f"Compute the checksum of block number {i} using crc32 and return it", "a": str(i)}
            for i in range(5)]
    val = [{"q": "Sort the list of integers in place and return None", "a": "v"}]
    train = [{"q": f"Parse the header line {i} of an HTTP response into a dict", "a": str(i)} for i in range(6)]
    train.append(dict(test[0]))  # exact copy of a test row
    train.append({"q": "compute the checksum of block number 3 using CRC32 and return it!", "a": "3"})  # near
    train.append({"q": "Sort the list of integers in place and return None.", "a": "leak"})  # validation
    task = TaskConfig(prompt="Q: {q}", target="a", files={"train": "t", "validation": "v", "test": "x"})
    paths = {s: write_jsonl(tmp_path / f"{s}.jsonl", rows) for s, rows in
             (("train", train), ("validation", val), ("test", test))}
    return Splits(task, paths)


def test_planted_train_test_overlap_is_found_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    splits = planted(tmp_path)
    rows, version = run_chain([OP.validate_python({"op": "decontaminate", "ngram": 13})], splits, tmp_path)
    assert len(rows) == 6 and all(r["a"] != "leak" for r in rows)
    removed = version.operators[0].removed
    # the test rows share a template phrase (5 of 6 evaluation rows): only the block number varies, so
    # the exact copy has the same varying text, and the edited copy contains the whole test input
    assert removed == {"overlaps test (same input)": 1, "overlaps test (contains a whole input)": 1,
                       "overlaps validation (contains a whole input)": 1}
    # the data version shows removed training rows, but withholds those that overlap test
    assert "crc32" not in str(version.model_dump()).lower() and "leak" in str(version.model_dump())
    # with the template phrase counted as evidence (common_share 1), and no near-duplicates, an input shorter
    # than the n-gram must be contained whole: the edited copy ("CRC32 ... it!") still is, case and
    # punctuation apart; but no phrase of a template is enough on its own
    rows2, v2 = run_chain([OP.validate_python({"op": "decontaminate", "ngram": 30, "near_threshold": 1.0,
                                               "common_share": 1.0})], splits, tmp_path)
    assert len(rows2) == 6 and v2.operators[0].removed == {
        "overlaps test (same input)": 1, "overlaps test (contains a whole input)": 1,
        "overlaps validation (contains a whole input)": 1}


def test_chain_cache_and_version(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    splits = planted(tmp_path)
    chain = [OP.validate_python({"op": "dedup_exact"}), OP.validate_python({"op": "sample", "n": 4})]
    rows, v1 = run_chain(chain, splits, tmp_path)
    rows2, v2 = run_chain(chain, splits, tmp_path)
    assert rows.to_list() == rows2.to_list() and v1.id == v2.id
    assert [s.cached for s in v2.operators] == [True, True, True] and not any(s.cached for s in v1.operators)
    assert [s.op for s in v1.operators] == ["dedup_exact", "sample", "decontaminate"] and v1.operators[2].implicit
    assert v1.operators[1].fingerprint_in == v1.operators[0].fingerprint_out and v1.rows_out == len(rows)
    with pytest.raises(ChainError) as e:
        run_chain([OP.validate_python({"op": "filter_length", "min_chars": 10_000})], splits, tmp_path)
    assert e.value.field == "data.0.op" and "leaves no training rows" in str(e.value)
