"""The live trial table (view/live.py) at 80, 120 and 200 columns: no line wider than the terminal,
no word cut in two across lines, and at 80 the columns a user needs to follow a campaign."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from recipetune.engine.job import Row
from recipetune.view.live import Columns, LiveReporter, _clip

SPEED = Columns(figure="tok/s/dev", score="speed-up", check="loss check", figure_fmt=",.0f", score_fmt=".2f",
                unit="x", none_better="nothing faster has passed screening")
LONG_WORD = "supercalifragilisticexpialidociouslyoverlongidentifier"
ROWS = [
    Row("a", 1, "micro_batch_size 4 -> 16, activation_checkpointing false -> true, lr 0.003 -> 0.0042426",
        "passed", 123456.0, 1.234, "within T (0.0123 nats of the baseline's 0.0456)",
        f"a larger micro-batch amortises the per-step overhead of the optimizer {LONG_WORD} the loss should "
        "stay within its tolerance because the global batch is unchanged", "analyst"),
    Row("b", 2, "compile false -> true", "failed", None, None, "", "x", "llm",
        cause=f"RuntimeError: CUDA_ERROR_OUT_OF_MEMORY_{LONG_WORD.upper()} at step 12 while compiling the graph"),
    Row("c", 3, "fused_adam false -> true", "running"),
]


def _render(width: int) -> str:
    reporter = LiveReporter(SPEED)
    for row in ROWS:
        reporter.row(row)
    reporter.progress("c", 12, 30)
    console = Console(width=width, record=True, color_system=None)
    console.print(reporter.render())
    return console.export_text()


def _words(text: str) -> set[str]:
    return set(re.findall(r"[^\s│┃┏┓┗┛┡┩└┘━─┳┻╇┴]+", text))


WHOLE = _words(" ".join(" ".join((r.change, r.check, r.cause, r.rationale, r.source + ":", r.status)) for r in ROWS))


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_table_fits_and_never_cuts_a_word_across_lines(width: int):
    text = _render(width)
    assert max(len(line) for line in text.splitlines()) <= width, text
    reference = _words(_render(1000))  # every cell on one line: the words as the table shows them
    for word in _words(text):
        if word.endswith("…"):  # shortened: the start of one whole word, never continued below
            assert any(w.startswith(word[:-1]) for w in WHOLE | reference), (word, text)
        else:
            assert word in WHOLE | reference, (word, text)


def test_at_80_columns_the_essentials_stay_and_the_rationale_goes():
    text = _render(80)
    for header in ("#", "change", "status", "speed-up", "loss check"):
        assert header in text
    assert "rationale" not in text and "amortises" not in text
    assert "running 12/30" in text and "1.23x" in text and "passed" in text
    assert "micro_batch_size" in text  # the change is wrapped, not dropped


def test_wider_terminals_get_the_figure_and_the_rationale():
    wide = _render(200)
    assert "tok/s/dev" in wide and "123,456" in wide and "analyst: a larger" in wide


def test_clip_cuts_between_words():
    assert _clip("short", 10) == "short"
    assert _clip("alpha beta gamma delta", 13) == "alpha beta…"
    assert _clip("alpha beta gamma", 11) == "alpha beta…"  # the cut falls on the space: beta kept
    assert _clip("x " + LONG_WORD, 20) == "x " + LONG_WORD[:17] + "…"  # one long identifier: cut inside it


def test_a_running_trial_shows_its_steps_time_and_eta_and_the_campaign_its_runs(monkeypatch):
    from recipetune.view import live

    clock = iter([100.0, 110.0, 110.0, 110.0, 110.0, 110.0])
    monkeypatch.setattr(live.time, "monotonic", lambda: next(clock, 110.0))
    reporter = live.LiveReporter(SPEED)
    reporter.row(Row("1", 1, "micro_batch_size=4", "running"))  # starts at 100 s
    reporter.progress("1", 5, 20)  # 10 s later: 5 of 20 steps, so 30 s to go
    assert reporter.running("1") == " 5/20 0:10 eta 0:30"
    reporter.campaign(2, 8, 125.0)
    assert reporter.campaign_text.plain == "2/8 runs, 2:05 of search, eta 6:15"
    reporter.campaign(8, 8, 4000.0)
    assert reporter.campaign_text.plain == "8/8 runs, 1:06:40 of search"
    reporter.campaign(4, 8, 70.0, ended=True)  # a stop rule ended it: no time to go
    assert reporter.campaign_text.plain == "4/8 runs, 1:10 of search"
