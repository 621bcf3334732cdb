"""A renamed copy among the training rows' families (issue 50, data/decontam.py: ``families``): a
one-token copy is none where another training row fills its frame with another value, whichever
batch or worker judged that row; at the edge (one other row), beside the cases it must still remove."""

from __future__ import annotations

import pytest
from ft_fixtures import write_jsonl

from recipetune.data import runtime
from recipetune.data.chain import run_chain
from recipetune.data.decontam import FAMILY, ContaminationIndex
from recipetune.data.ops import Decontaminate
from recipetune.finetune.task import Splits, TaskConfig


def index() -> ContaminationIndex:
    """200 rows of three names no other row has (``kilo,lima,mike`` among them): every one-token copy of
    one keeps two names of chance 200 x 1/200 x 1/200, a copy by the frames' chance alone."""
    rows = ["kilo,lima,mike"] + [f"u{k}a,u{k}b,u{k}c" for k in range(199)]
    return ContaminationIndex({"validation": [[r] for r in rows[::2]], "test": [[r] for r in rows[1::2]]},
                              Decontaminate(op="decontaminate", near_threshold=1.0))


COPY = ("validation", "renamed copy")


@pytest.mark.parametrize("beside, hits", [
    ([], [COPY]),  # alone: a copy
    (["kilo,lima,yank"], [None, None]),  # one other value in the same frame: a family, neither is a copy
    (["kilo,lima,zulu"], [COPY, COPY]),  # the same row twice fills it one way: still a copy (both)
    (["kilo,yank,mike"], [COPY, COPY]),  # another frame of the input: each its own, filled once
    (["kilo,lima,mike"], [COPY, ("validation", "same input")]),  # the input itself fills no frame
    (["u3a,u3b,zulu"], [COPY, COPY]),  # the same value in another input's frame
])
def test_a_renamed_copy_is_none_where_another_training_row_fills_its_frame(beside, hits):
    assert index().hits_batch([["kilo,lima,zulu"], *([b] for b in beside)]) == hits


def test_the_family_is_of_all_the_rows_judged_together_not_of_one_row():
    """Judged alone (``judge_batch``), each is a copy, with the frame it fills: only all the rows say
    which frames a family fills."""
    judged = index().judge_batch([["kilo,lima,zulu"], ["kilo,lima,yank"]])
    assert [j.hit for j in judged] == [COPY, COPY]
    assert judged[0].renamed.split()[0] == judged[1].renamed.split()[0] and judged[0].fills == (judged[0].renamed,)


def _splits(tmp_path, family: bool) -> Splits:
    evals = ["kilo,lima,mike"] + [f"u{k}a,u{k}b,u{k}c" for k in range(199)]
    train = [{"q": f"t{k}x,t{k}y,t{k}z", "a": "1"} for k in range(300)]
    train[5] = {"q": "kilo,lima,zulu", "a": "1"}
    if family:
        train[280] = {"q": "kilo,lima,yank", "a": "1"}  # batches apart, and in the other worker's half
    paths = {"train": write_jsonl(tmp_path / "train.jsonl", train),
             "validation": write_jsonl(tmp_path / "validation.jsonl", [{"q": e, "a": "1"} for e in evals[::2]]),
             "test": write_jsonl(tmp_path / "test.jsonl", [{"q": e, "a": "1"} for e in evals[1::2]])}
    return Splits(TaskConfig(prompt="{q}", target="a", files={s: str(p) for s, p in paths.items()}), paths)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("renamed, family, rows, removed, kept", [
    ("remove", False, 299, {"overlaps validation (renamed copy)": 1}, {}),
    ("remove", True, 300, {}, {f"overlaps validation ({FAMILY})": 2}),
    ("report", True, 300, {}, {f"overlaps validation ({FAMILY})": 2}),
    ("keep", True, 300, {}, {}),
])
def test_a_data_step_finds_the_family_across_batches_and_workers(tmp_path, monkeypatch, workers, renamed, family,
                                                                 rows, removed, kept):
    """The rows are judged 50 a batch, in two forked workers: the family (rows 5 and 280) is seen only
    over all of them, in the parent; its rows are kept and counted, unless renamed copies are kept unsaid."""
    import recipetune.data.chain as chain_mod

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(runtime, "BATCH", 50)
    monkeypatch.setattr(runtime, "PARALLEL_MIN_ROWS", 100)
    monkeypatch.setattr(chain_mod, "PARALLEL_MIN_ROWS", 100)
    step = Decontaminate(op="decontaminate", near_threshold=1.0, renamed=renamed)
    out, version = run_chain([step], _splits(tmp_path, family), tmp_path, use_cache=False, workers=workers)
    assert len(out) == rows
    assert version.operators[0].removed == removed and version.operators[0].kept == kept


def test_a_change_to_any_module_of_the_rule_is_a_change_to_every_cached_step():
    """The rule lives in several modules (the frames' chance, the anchors, what a field carries): each is
    in the code a data step's cache key covers, not only the module that holds the index."""
    from pathlib import Path

    from recipetune.data import anchors, carries, chain, decontam, frames, minhash, text

    assert {Path(m.__file__) for m in (anchors, carries, decontam, frames, minhash, text)} <= set(chain.code_files())


def test_data_run_shows_the_rows_a_family_kept(tmp_path, monkeypatch):
    """`recipetune data run`'s table says what the step kept, not only what it removed."""
    from rich.console import Console

    from recipetune.finetune.cli import chain_table

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    step = Decontaminate(op="decontaminate", near_threshold=1.0)
    _, version = run_chain([step], _splits(tmp_path, True), tmp_path, use_cache=False, workers=1)
    console = Console(width=400, record=True)
    console.print(chain_table(version))
    assert f"│ kept: 2 overlaps validation ({FAMILY})" in console.export_text()
