"""Every data operator, the chain's cache and data version, and decontamination of a planted overlap."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
from ft_fixtures import write_jsonl
from pydantic import TypeAdapter, ValidationError

from recipetune.data import operators, ops, runtime
from recipetune.data.chain import ChainError, run_chain, with_decontamination
from recipetune.data.decontam import ContaminationIndex
from recipetune.finetune.task import Splits, TaskConfig

OP = TypeAdapter(ops.Operator)


def ctx(tmp_path: Path, index: ContaminationIndex | None = None) -> runtime.Context:
    return runtime.Context(
        render=lambda r: f"Q: {r['q']}", prompt_fields=["q"], base_dir=tmp_path, out_dir=tmp_path / "out",
        read_file=lambda path, field: [{"q": f"extra {i}", "a": "x"} for i in range(10)],
        contamination_index=lambda settings: index,
    )


def run(op: dict, rows: list[dict], tmp_path: Path, index=None) -> runtime.Outcome:
    return operators.apply(OP.validate_python(op), rows, ctx(tmp_path, index))


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
    operators.apply(OP.validate_python({"op": "export", "path": "dump.csv"}), ROWS, c)
    assert c.exports[0][0] == tmp_path / "out" / "dump.csv" and not (tmp_path / "out").exists()
    operators.write_rows(c.exports[0][0], c.exports[0][1])
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


# --- the chain on Arrow: typed columns, derived fingerprints, the cache, workers, memory ----------------

def typed_task(tmp_path: Path, n: int = 12, **task) -> Splits:
    """Rows with a list-of-dicts column (``messages``) and an integer column beside the prompt's."""
    train = [{"q": f"Question number {i} about the topic {i % 4}", "a": str(i % 3), "n": i,
              "messages": [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": "hi"}]}
             for i in range(n)]
    train.append(dict(train[1]))  # an exact duplicate
    val = [{"q": "Sort the list of integers in place", "a": "x", "n": 0, "messages": []}]
    test = [{"q": "Compute the checksum of a block", "a": "y", "n": 0, "messages": []}]
    paths = {s: write_jsonl(tmp_path / f"{s}.jsonl", rows) for s, rows in
             (("train", train), ("validation", val), ("test", test))}
    return Splits(TaskConfig(prompt="Q: {q}", target="a", files={s: str(p) for s, p in paths.items()}, **task),
                  paths)


def test_typed_columns_survive_the_chain(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    splits = typed_task(tmp_path)
    chain = [OP.validate_python(op) for op in ({"op": "dedup_exact"}, {"op": "convert", "templates": {"t": "{q}!"}},
                                               {"op": "sample", "n": 10}, {"op": "export", "path": "out.jsonl"})]
    rows, version = run_chain(chain, splits, tmp_path, out_dir=tmp_path / "run")
    assert len(rows) == 10 and version.operators[0].removed == {"exact duplicate": 1}
    first = rows[0]
    assert first["messages"] == [{"role": "user", "content": "hello 0"}, {"role": "assistant", "content": "hi"}]
    assert isinstance(first["n"], int) and first["t"] == first["q"] + "!"
    # a typed value is read as its text: the integer 0 is "0", one character
    kept, _ = run_chain([OP.validate_python({"op": "filter_length", "field": "n", "min_chars": 1})], splits, tmp_path)
    assert len(kept) == 13 and 0 in kept["n"]
    exported = [json.loads(line) for line in (tmp_path / "run" / "out.jsonl").read_text().splitlines()]
    assert exported[0]["messages"][0] == {"role": "user", "content": "hello 0"} and exported[0]["n"] == 0
    # a CSV mixed in: its integers are cast to the training data's strings, its missing columns are nulls
    (tmp_path / "more.csv").write_text("q,a\n" + "".join(f"Another question {i},{i}\n" for i in range(20)))
    mixed, _ = run_chain([OP.validate_python({"op": "mix", "sources": [{"path": "more.csv", "ratio": 0.5}]})],
                         splits, tmp_path)
    added = [r for r in mixed if r["q"].startswith("Another")]
    assert len(mixed) == 26 and len(added) == 13 and all(isinstance(r["a"], str) for r in mixed)
    assert all(r["messages"] is None and r["n"] is None for r in added)
    assert mixed.features["messages"] == splits.train.features["messages"]


def test_a_file_that_cannot_be_cast_is_a_chain_error_naming_the_field(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    splits = typed_task(tmp_path)
    write_jsonl(tmp_path / "bad.jsonl", [{"q": "What", "a": "x", "n": "not a number"}])
    with pytest.raises(ChainError) as e:
        run_chain([OP.validate_python({"op": "mix", "sources": [{"path": "bad.jsonl", "ratio": 0.2}]})],
                  splits, tmp_path)
    assert e.value.field == "data.0.sources.0.path" and "'n'" in str(e.value)
    with pytest.raises(ChainError) as e:
        run_chain([OP.validate_python({"op": "load", "path": "bad.jsonl"})], splits, tmp_path)
    assert e.value.field == "data.0.path" and "'n'" in str(e.value)


def fingerprints(version) -> list[tuple[str, str]]:
    return [(s.fingerprint_in, s.fingerprint_out) for s in version.operators]


def test_fingerprints_are_derived_stable_and_change_with_config_and_files(tmp_path, monkeypatch):
    splits = planted(tmp_path)
    chain = [OP.validate_python({"op": "dedup_exact"}), OP.validate_python({"op": "sample", "n": 4, "seed": 1})]
    _, v1 = run_chain(chain, splits, tmp_path, cache=tmp_path / "c1")
    _, v2 = run_chain(chain, splits, tmp_path, cache=tmp_path / "c2", use_cache=False)
    assert fingerprints(v1) == fingerprints(v2) and v1.id == v2.id == v1.operators[-1].fingerprint_out
    # another seed: the sample's output and what follows change, what comes before does not
    _, v3 = run_chain([chain[0], OP.validate_python({"op": "sample", "n": 4, "seed": 2})], splits, tmp_path,
                      use_cache=False)
    assert v3.operators[0].fingerprint_out == v1.operators[0].fingerprint_out
    assert v3.operators[1].fingerprint_out != v1.operators[1].fingerprint_out and v3.id != v1.id
    # another validation file: only decontamination reads it
    rows = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    write_jsonl(tmp_path / "validation.jsonl", [*rows, {"q": "Reverse the words of a sentence", "a": "r"}])
    _, v4 = run_chain(chain, planted_splits(tmp_path), tmp_path, use_cache=False)
    assert fingerprints(v4)[:2] == fingerprints(v1)[:2] and fingerprints(v4)[2] != fingerprints(v1)[2]
    # one training row changed: the source's fingerprint (its file's sha256) and so every step's
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    rows[0]["q"] += " twice"
    write_jsonl(tmp_path / "train.jsonl", rows)
    _, v5 = run_chain(chain, planted_splits(tmp_path), tmp_path, use_cache=False)
    assert all(a != b for a, b in zip(fingerprints(v5), fingerprints(v4), strict=True))


def planted_splits(tmp_path: Path) -> Splits:
    task = TaskConfig(prompt="Q: {q}", target="a", files={"train": "t", "validation": "v", "test": "x"})
    return Splits(task, {s: tmp_path / f"{s}.jsonl" for s in ("train", "validation", "test")})


def test_a_cache_hit_recomputes_nothing_and_is_memory_mapped(tmp_path, monkeypatch):
    import recipetune.data.chain as chain_mod

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    splits = planted(tmp_path)
    chain = [OP.validate_python({"op": "dedup_near", "threshold": 0.7}), OP.validate_python({"op": "filter_length",
                                                                                             "min_chars": 5})]
    rows, v1 = run_chain(chain, splits, tmp_path)

    def fail(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr(chain_mod, "apply", fail)
    monkeypatch.setattr(splits, "contamination_index", fail)
    again, v2 = run_chain(chain, splits, tmp_path)
    assert again.to_list() == rows.to_list() and all(s.cached for s in v2.operators)
    assert [s.removed for s in v2.operators] == [s.removed for s in v1.operators] and v2.id == v1.id
    assert again.cache_files and all(str(tmp_path / "cache") in f["filename"] for f in again.cache_files)


def many_rows(tmp_path: Path, n: int) -> Splits:
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    train = [{"q": " ".join(rng.choice(words) for _ in range(rng.randint(3, 14))), "a": str(i)} for i in range(n)]
    for i in range(0, n, 10):
        train[i + 1]["q"] = train[i]["q"].upper()  # exact duplicates
    test = [{"q": " ".join(rng.choice(words) for _ in range(12)), "a": "t"} for _ in range(20)]
    train[5]["q"] = test[3]["q"]  # a copy of a test input
    val = [{"q": " ".join(rng.choice(words) for _ in range(12)), "a": "v"} for _ in range(20)]
    paths = {s: write_jsonl(tmp_path / f"{s}.jsonl", rows) for s, rows in
             (("train", train), ("validation", val), ("test", test))}
    return Splits(TaskConfig(prompt="Q: {q}", target="a", files={s: str(p) for s, p in paths.items()}), paths)


CHAIN = [{"op": "dedup_exact"}, {"op": "dedup_near", "threshold": 0.8}, {"op": "filter_length", "min_chars": 12},
         {"op": "filter_regex", "pattern": "w1", "field": "q"}, {"op": "convert", "templates": {"t": "{q}/{a}"}},
         {"op": "decontaminate", "ngram": 13}, {"op": "sample", "fraction": 0.9}]


def test_workers_give_the_same_rows_as_one_process(tmp_path, monkeypatch):
    import datasets

    import recipetune.data.chain as chain_mod

    monkeypatch.setattr(runtime, "PARALLEL_MIN_ROWS", 100)  # parallel from 100 rows, not 20,000
    monkeypatch.setattr(chain_mod, "PARALLEL_MIN_ROWS", 100)
    procs: list[int | None] = []
    inner = datasets.Dataset.map

    def counted(self, *args, **kwargs):
        procs.append(kwargs.get("num_proc"))
        return inner(self, *args, **kwargs)

    monkeypatch.setattr(datasets.Dataset, "map", counted)
    splits = many_rows(tmp_path, 600)
    chain = [OP.validate_python(op) for op in CHAIN]
    one, v1 = run_chain(chain, splits, tmp_path, use_cache=False, workers=1)
    assert set(procs) == {None}
    two, v2 = run_chain(chain, splits, tmp_path, use_cache=False, workers=2)
    assert 2 in procs
    assert one.to_list() == two.to_list()
    assert v1.model_dump(exclude={"operators"}) == v2.model_dump(exclude={"operators"})
    assert [s.model_dump(exclude={"seconds"}) for s in v1.operators] == [s.model_dump(exclude={"seconds"})
                                                                        for s in v2.operators]
    removed = collections.Counter()
    for step in v1.operators:
        removed.update(step.removed)
    assert removed["exact duplicate"] == 60 and removed["overlaps test (same input)"] == 1


def test_the_chain_never_holds_all_rows_as_python_objects(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    splits = many_rows(tmp_path, 3000)
    calls: list[str] = []

    def guard(name):
        inner = getattr(datasets.Dataset, name)

        def wrapped(self, *args, **kwargs):
            if len(self) > 100:  # a few examples, the evaluation rows: fine; the training rows: never
                calls.append(f"{name} of {len(self)} rows")
            return inner(self, *args, **kwargs)

        return wrapped

    for name in ("__iter__", "to_list", "to_dict", "to_pandas", "__getitem__"):
        monkeypatch.setattr(datasets.Dataset, name, guard(name))
    rows, version = run_chain([OP.validate_python(op) for op in CHAIN], splits, tmp_path)
    assert not calls
    assert version.rows_in == 3000 and 2000 < version.rows_out < 2700
    # the result is Arrow on disk, memory-mapped from the cache: no copy in memory
    assert rows.cache_files and rows._indices is None and len(rows) == version.rows_out


def test_rows_dropped_at_load_are_in_the_data_version(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    rows = [{"q": f"question {i}", "a": str(i)} for i in range(5)] + [{"q": "no answer", "a": ""}]
    paths = {"train": write_jsonl(tmp_path / "train.jsonl", rows),
             "validation": write_jsonl(tmp_path / "validation.jsonl", [{"q": "v", "a": "1"}]),
             "test": write_jsonl(tmp_path / "test.jsonl", [{"q": "t", "a": "2"}])}
    task = TaskConfig(prompt="Q: {q}", target="a", files={s: str(p) for s, p in paths.items()},
                      incomplete_rows="drop")
    splits = Splits(task, paths)
    _, version = run_chain([], splits, tmp_path)
    assert version.dropped_at_load == splits.dropped == {"train": {"empty target": 1}}
    assert version.rows_in == 5
